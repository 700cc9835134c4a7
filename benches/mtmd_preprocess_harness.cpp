// Runs llama.cpp's own image decoding (stb_image, as mtmd_helper_bitmap_init_from_buf calls it) and
// image preprocessors (mtmd-image.cpp) from the libmtmd.so that llama-cpp-python 0.3.36 ships, so
// benches/record_preprocess.py can record what the vision encoder receives.
//
//   harness decode <image file> <out.rgb>
//       out.rgb: int32 nx, int32 ny, nx*ny*3 uint8 (stbi_load_from_memory(..., 3))
//   harness preprocess <fixed|dyn|llava_uhd|idefics3|lfm2> <in.rgb> <out.f32> key=value ...
//       out.f32: int32 n_entries, per entry {int32 nx, int32 ny, nx*ny*3 float32},
//                int32 has_overview [, int32 nx, int32 ny, floats], int32 grid_x, int32 grid_y
//
// Built by benches/record_preprocess.py (g++ against the vendored headers, linked to libmtmd.so).
// The preprocessors only read clip_hparams through clip_get_hparams(), defined here (the
// executable's definition takes precedence over libmtmd's), so no GGUF is needed.

#include "clip-model.h"
#include "mtmd-image.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

struct clip_ctx {
    clip_hparams hparams;
};

const clip_hparams * clip_get_hparams(const clip_ctx * ctx) {
    return &ctx->hparams;
}

projector_type clip_get_projector_type(const clip_ctx *) {
    return PROJECTOR_TYPE_UNKNOWN;
}

extern "C" unsigned char * stbi_load_from_memory(const unsigned char * buf, int len, int * x, int * y, int * comp, int req_comp);
extern "C" void stbi_image_free(void * data);
extern "C" const char * stbi_failure_reason(void);

static std::vector<unsigned char> read_file(const char * path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

static void write_i32(FILE * out, int32_t v) {
    fwrite(&v, sizeof v, 1, out);
}

static int decode(const char * image_path, const char * out_path) {
    std::vector<unsigned char> bytes = read_file(image_path);
    int nx = 0, ny = 0, nc = 0;
    unsigned char * rgb = stbi_load_from_memory(bytes.data(), (int) bytes.size(), &nx, &ny, &nc, 3);
    if (!rgb) {
        fprintf(stderr, "stb_image cannot decode %s: %s\n", image_path, stbi_failure_reason());
        return 3;
    }
    FILE * out = fopen(out_path, "wb");
    write_i32(out, nx);
    write_i32(out, ny);
    fwrite(rgb, 1, (size_t) nx * ny * 3, out);
    fclose(out);
    stbi_image_free(rgb);
    return 0;
}

static std::vector<float> parse_floats(const std::string & csv) {
    std::vector<float> values;
    std::stringstream ss(csv);
    std::string item;
    while (std::getline(ss, item, ',')) {
        values.push_back(std::strtof(item.c_str(), nullptr));
    }
    return values;
}

static std::array<uint8_t, 3> parse_color(const std::string & csv) {
    std::vector<float> v = parse_floats(csv);
    return {(uint8_t) v.at(0), (uint8_t) v.at(1), (uint8_t) v.at(2)};
}

// key=value arguments -> clip_hparams fields (names as in clip-model.h)
static void set_hparam(clip_hparams & hp, const std::string & key, const std::string & value) {
    const int iv = std::atoi(value.c_str());
    if      (key == "image_size")         hp.image_size = iv;
    else if (key == "patch_size")         hp.patch_size = iv;
    else if (key == "n_merge")            hp.n_merge = iv;
    else if (key == "image_min_pixels")   hp.image_min_pixels = iv;
    else if (key == "image_max_pixels")   hp.image_max_pixels = iv;
    else if (key == "image_longest_edge") hp.image_longest_edge = iv;
    else if (key == "image_resize_algo")  hp.image_resize_algo = (resize_algo) iv;
    else if (key == "image_resize_pad")   hp.image_resize_pad = (pad_style) iv;
    else if (key == "image_pad_color")    hp.image_pad_color = parse_color(value);
    else if (key == "image_resize_algo_rf") hp.image_resize_algo_rf = (resize_algo) iv;
    else if (key == "image_resize_algo_ov") hp.image_resize_algo_ov = (resize_algo) iv;
    else if (key == "image_pad_rf")       hp.image_pad_rf = (pad_style) iv;
    else if (key == "image_pad_ov")       hp.image_pad_ov = (pad_style) iv;
    else if (key == "image_pad_color_rf") hp.image_pad_color_rf = parse_color(value);
    else if (key == "image_pad_color_ov") hp.image_pad_color_ov = parse_color(value);
    else if (key == "image_mean" || key == "image_std") {
        std::vector<float> v = parse_floats(value);
        float * dst = key == "image_mean" ? hp.image_mean : hp.image_std;
        for (int i = 0; i < 3; i++) dst[i] = v.at(i);
    } else if (key == "pinpoints") {
        std::vector<float> v = parse_floats(value);
        for (size_t i = 0; i + 1 < v.size(); i += 2) {
            hp.image_res_candidates.push_back({(int) v[i], (int) v[i + 1]});
        }
    } else {
        fprintf(stderr, "unknown hparam %s\n", key.c_str());
        exit(2);
    }
}

static std::unique_ptr<mtmd_image_preprocessor> make_preprocessor(const std::string & kind, const clip_ctx * ctx) {
    if (kind == "fixed")     return std::make_unique<mtmd_image_preprocessor_fixed_size>(ctx);
    if (kind == "dyn")       return std::make_unique<mtmd_image_preprocessor_dyn_size>(ctx);
    if (kind == "llava_uhd") return std::make_unique<mtmd_image_preprocessor_llava_uhd>(ctx);
    if (kind == "idefics3")  return std::make_unique<mtmd_image_preprocessor_idefics3>(ctx);
    if (kind == "lfm2")      return std::make_unique<mtmd_image_preprocessor_lfm2>(ctx);
    fprintf(stderr, "unknown preprocessor %s\n", kind.c_str());
    exit(2);
}

static void write_f32_image(FILE * out, const clip_image_f32 & img) {
    write_i32(out, img.nx());
    write_i32(out, img.ny());
    const std::vector<float> & buf = img.get_ro_buf();
    fwrite(buf.data(), sizeof(float), buf.size(), out);
}

static int preprocess(int argc, char ** argv) {
    const std::string kind = argv[2];
    std::vector<unsigned char> rgb_file = read_file(argv[3]);
    int32_t nx, ny;
    memcpy(&nx, rgb_file.data(), 4);
    memcpy(&ny, rgb_file.data() + 4, 4);

    clip_ctx ctx;
    for (int i = 5; i < argc; i++) {
        const std::string arg = argv[i];
        const size_t eq = arg.find('=');
        set_hparam(ctx.hparams, arg.substr(0, eq), arg.substr(eq + 1));
    }

    clip_image_u8 img;
    img.set_size({nx, ny}, false);
    img.cpy_buf(std::vector<uint8_t>(rgb_file.begin() + 8, rgb_file.end()));

    mtmd_image_preproc_out result = make_preprocessor(kind, &ctx)->preprocess(img);

    FILE * out = fopen(argv[4], "wb");
    write_i32(out, (int32_t) result.entries.size());
    for (const clip_image_f32 & entry : result.entries) {
        write_f32_image(out, entry);
    }
    write_i32(out, result.has_overview() ? 1 : 0);
    if (result.has_overview()) {
        write_f32_image(out, result.overview);
    }
    write_i32(out, result.grid_x);
    write_i32(out, result.grid_y);
    fclose(out);
    return 0;
}

// the preprocessors' LOG_DBG lines (slice grids) would fill the recorder's terminal
static void log_warnings_only(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN && level != GGML_LOG_LEVEL_CONT) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    g_logger_state.log_callback = log_warnings_only;
    if (argc == 4 && std::string(argv[1]) == "decode") {
        return decode(argv[2], argv[3]);
    }
    if (argc >= 5 && std::string(argv[1]) == "preprocess") {
        return preprocess(argc, argv);
    }
    fprintf(stderr, "usage: harness decode <image> <out.rgb> | harness preprocess <kind> <in.rgb> <out.f32> key=value...\n");
    return 2;
}
