"""Record llama.cpp's image decoding and preprocessing for tests/test_media.py (issue 38).

1. Writes the test images tests/data/images/pre-*.png (deterministic pixel formulas).
2. Builds benches/mtmd_preprocess_harness.cpp with g++ against the vendored llama.cpp headers,
   linked to llama-cpp-python 0.3.36's libmtmd.so (the preprocessors and stb_image it exports).
3. Runs, per test image, stb_image's decoding and each family's mtmd preprocessor, and writes
   tests/data/preprocess/goldens.json: per output image its shape, the sha256 of its float32
   bytes and a few statistics (the arrays are up to 9.6 MB each: the hash is the exact record).

    /work/main/.venv/bin/python benches/record_preprocess.py            # images, build, record
    /work/main/.venv/bin/python benches/record_preprocess.py --compare  # + max |diff| vs media.py

The families' clip_hparams are spelled out below from clip.cpp's load_hparams (independently of
ferrollama.generation.media, whose per-family defaults the test then checks against them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "tests" / "data" / "images"
GOLDENS = ROOT / "tests" / "data" / "preprocess" / "goldens.json"
LLAMA_CPP = Path("/work/src/llama_cpp_python-0.3.36/vendor/llama.cpp")
LIBMTMD_DIR = Path("/work/main/.bench-venv/lib/python3.11/site-packages/llama_cpp/lib")
HARNESS_SRC = ROOT / "benches" / "mtmd_preprocess_harness.cpp"

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)
BILINEAR, BICUBIC, LANCZOS = 0, 1, 2  # clip-model.h's resize_algo
PAD_NONE, PAD_CEIL, PAD_NEAREST = 0, 1, 2  # clip-model.h's pad_style


# ---------------------------------------------------------------------------------------------
# test images
# ---------------------------------------------------------------------------------------------


def pattern(width: int, height: int, seed: int) -> np.ndarray:
    """RGB uint8: gradients, ripples and a hashed speckle, so resizes round in every direction."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    r = 127.5 + 127.5 * np.sin(x / (3.0 + seed) + y / 11.0)
    g = 255.0 * x / max(width - 1, 1)
    b = 255.0 * ((x * 7 + y * 13 + seed * 31) % 97) / 96.0
    return np.stack([r, g, b], axis=2).round().astype(np.uint8)


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def write_raw_png(path: Path, width: int, depth: int, colour_type: int, rows: list[bytes], extra: bytes = b"") -> None:
    """A PNG Pillow cannot write (16-bit RGB(A), 2- and 4-bit grey, an RGB tRNS key) from
    filtered-type-0 rows: IHDR, optional chunks, IDAT, IEND."""
    ihdr = struct.pack(">IIBBBBB", width, len(rows), depth, colour_type, 0, 0, 0)
    idat = zlib.compress(b"".join(b"\x00" + row for row in rows), 9)
    chunks = png_chunk(b"IHDR", ihdr) + extra + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunks)


def packed_rows(values: np.ndarray, depth: int) -> list[bytes]:
    """Rows of `depth`-bit samples packed big-endian, each padded to a whole byte."""
    rows = []
    for row in values:
        bits = "".join(format(int(v), f"0{depth}b") for v in row)
        bits += "0" * (-len(bits) % 8)
        rows.append(int(bits, 2).to_bytes(len(bits) // 8, "big"))
    return rows


def write_raw_pngs(paths: dict[str, Path]) -> None:
    def save(name: str, *args: object, **kwargs: object) -> None:
        paths[name] = IMAGES / name
        write_raw_png(paths[name], *args, **kwargs)

    rgb16 = pattern(25, 19, 10).astype(np.uint16) * 257 + np.arange(25, dtype=np.uint16)[None, :, None]
    save("pre-rgb16.png", 25, 16, 2, [row.astype(">u2").tobytes() for row in rgb16])
    rgba16 = np.concatenate([rgb16, rgb16[:, :, :1] ^ 0x5A5A], axis=2)
    save("pre-rgba16.png", 25, 16, 6, [row.astype(">u2").tobytes() for row in rgba16])
    save("pre-gray-alpha16.png", 25, 16, 4, [row.astype(">u2").tobytes() for row in rgba16[:, :, 1:3]])
    for depth in (2, 4):
        grey = pattern(23, 7, depth)[:, :, 2] >> (8 - depth)
        save(f"pre-gray{depth}.png", 23, depth, 0, packed_rows(grey, depth))
    rgb = pattern(21, 9, 16)
    key = png_chunk(b"tRNS", rgb[0, 0].astype(">u2").tobytes())  # one colour is transparent
    save("pre-rgb-trns.png", 21, 8, 2, [row.tobytes() for row in rgb], extra=key)


def write_images() -> dict[str, Path]:
    IMAGES.mkdir(parents=True, exist_ok=True)
    paths = {}

    def save(name: str, image: Image.Image, **options: object) -> None:
        paths[name] = IMAGES / name
        image.save(paths[name], **options)

    save("pre-square.png", Image.fromarray(pattern(64, 64, 1)))
    save("pre-wide.png", Image.fromarray(pattern(200, 50, 2)))
    save("pre-tall.png", Image.fromarray(pattern(37, 101, 3)))
    save("pre-large.png", Image.fromarray(pattern(1100, 700, 4)), optimize=True)
    rgba = np.concatenate([pattern(48, 40, 5), (np.arange(48 * 40) % 256).astype(np.uint8).reshape(40, 48, 1)], axis=2)
    save("pre-alpha.png", Image.fromarray(rgba))
    save("pre-gray.png", Image.fromarray(pattern(45, 30, 6)[:, :, 0]))
    grey16 = (np.arange(33 * 21, dtype=np.uint32).reshape(21, 33) * 97 % 65536).astype(np.uint16)
    save("pre-gray16.png", Image.fromarray(grey16))
    grey_alpha = np.stack([pattern(30, 20, 7)[:, :, 0], pattern(30, 20, 8)[:, :, 2]], axis=2)
    save("pre-gray-alpha.png", Image.fromarray(grey_alpha))
    palette = Image.fromarray(pattern(40, 30, 9)).quantize(colors=16, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    save("pre-palette.png", palette, transparency=3)
    write_raw_pngs(paths)
    save("pre-line.png", Image.fromarray(pattern(300, 3, 12)))
    save("pre-dot.png", Image.fromarray(pattern(1, 1, 13)))
    # over Qwen-VL's 4096-token pixel limit, small on disk: a tiled patch deflates well
    save("pre-huge.png", Image.fromarray(np.tile(pattern(52, 30, 14), (50, 50, 1))), optimize=True)
    save("pre-gif.gif", Image.fromarray(pattern(40, 30, 15)).quantize(64), transparency=5)
    save("pre-photo.jpg", Image.fromarray(pattern(64, 48, 11)), quality=90, subsampling=2)
    return paths


# the images each family is preprocessed on (decoded by stb_image first)
PREPROCESS_IMAGES = [
    "pre-square.png", "pre-wide.png", "pre-tall.png", "pre-alpha.png", "pre-gray.png", "pre-large.png",
    "pre-line.png", "pre-dot.png", "pre-huge.png",
]


# ---------------------------------------------------------------------------------------------
# families: VisionParams (what the GGUF gives) and the clip_hparams clip.cpp derives from them
# ---------------------------------------------------------------------------------------------


def tokens_to_pixels(n_tokens: int, patch_size: int, n_merge: int) -> int:
    """clip_hparams::set_limit_image_tokens."""
    return n_tokens * patch_size * patch_size * n_merge * n_merge


LLAVA16_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]

FAMILIES = [
    {
        "name": "gemma3",
        "projector": "gemma3",
        "params": {"image_size": 896, "patch_size": 14, "image_mean": HALF, "image_std": HALF},
        "kind": "fixed",
        "hparams": {"image_size": 896, "patch_size": 14, "n_merge": 4, "image_resize_algo": BILINEAR},
    },
    {
        "name": "qwen2.5vl",
        "projector": "qwen2.5vl_merger",
        "params": {"image_size": 560, "patch_size": 14, "image_mean": CLIP_MEAN, "image_std": CLIP_STD},
        "kind": "dyn",
        "hparams": {
            "image_size": 560, "patch_size": 14, "n_merge": 2, "image_resize_algo": BICUBIC,
            "image_min_pixels": tokens_to_pixels(8, 14, 2), "image_max_pixels": tokens_to_pixels(4096, 14, 2),
        },
    },
    {
        "name": "qwen3vl",
        "projector": "qwen3vl_merger",
        "params": {"image_size": 768, "patch_size": 16, "image_mean": HALF, "image_std": HALF},
        "kind": "dyn",
        "hparams": {
            "image_size": 768, "patch_size": 16, "n_merge": 2, "image_resize_algo": BICUBIC,
            "image_min_pixels": tokens_to_pixels(8, 16, 2), "image_max_pixels": tokens_to_pixels(4096, 16, 2),
        },
    },
    {
        "name": "qwen2.5vl-custom-tokens",
        "projector": "qwen2.5vl_merger",
        "params": {
            "image_size": 560, "patch_size": 14, "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
            "image_min_tokens": 64, "image_max_tokens": 128,
        },
        "kind": "dyn",
        "hparams": {
            "image_size": 560, "patch_size": 14, "n_merge": 2, "image_resize_algo": BICUBIC,
            "image_min_pixels": tokens_to_pixels(64, 14, 2), "image_max_pixels": tokens_to_pixels(128, 14, 2),
        },
    },
    {
        "name": "idefics3",
        "projector": "idefics3",
        "params": {
            "image_size": 512, "patch_size": 16, "image_mean": HALF, "image_std": HALF,
            "n_merge": 4, "image_longest_edge": 1536,
        },
        "kind": "idefics3",
        "hparams": {
            "image_size": 512, "patch_size": 16, "n_merge": 4, "image_resize_algo": LANCZOS,
            "image_longest_edge": 1536,
        },
    },
    {
        "name": "idefics3-no-longest-edge",
        "projector": "idefics3",
        "params": {"image_size": 384, "patch_size": 14, "image_mean": HALF, "image_std": HALF, "n_merge": 3},
        "kind": "idefics3",
        "hparams": {"image_size": 384, "patch_size": 14, "n_merge": 3, "image_resize_algo": LANCZOS},
    },
    {
        "name": "idefics3-custom-tokens",
        "projector": "idefics3",
        "params": {
            "image_size": 512, "patch_size": 16, "image_mean": HALF, "image_std": HALF,
            "n_merge": 4, "image_longest_edge": 1536, "image_max_tokens": 256,
        },
        "kind": "idefics3",
        "hparams": {
            "image_size": 512, "patch_size": 16, "n_merge": 4, "image_resize_algo": LANCZOS,
            "image_longest_edge": 1536, "image_max_pixels": tokens_to_pixels(256, 16, 4),
        },
    },
    {
        "name": "lfm2",
        "projector": "lfm2",
        "params": {"image_size": 512, "patch_size": 16, "image_mean": HALF, "image_std": HALF, "n_merge": 2},
        "kind": "lfm2",
        "hparams": {
            "image_size": 512, "patch_size": 16, "n_merge": 2, "image_resize_algo": BILINEAR,
            "image_resize_algo_rf": BILINEAR, "image_resize_algo_ov": BILINEAR,
            "image_min_pixels": tokens_to_pixels(64, 16, 2), "image_max_pixels": tokens_to_pixels(256, 16, 2),
        },
    },
    {
        "name": "llava-1.5",
        "projector": "mlp",
        "params": {"image_size": 336, "patch_size": 14, "image_mean": CLIP_MEAN, "image_std": CLIP_STD},
        "kind": "fixed",
        "hparams": {"image_size": 336, "patch_size": 14, "image_pad_color": [122, 116, 104]},
    },
    {
        "name": "llava-1.6",
        "projector": "mlp",
        "params": {
            "image_size": 336, "patch_size": 14, "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
            "grid_pinpoints": LLAVA16_PINPOINTS,
        },
        "kind": "llava_uhd",
        "hparams": {
            "image_size": 336, "patch_size": 14, "image_pad_color": [122, 116, 104],
            "pinpoints": [v for p in LLAVA16_PINPOINTS for v in p],
        },
    },
    {
        # llava-uhd without pinpoints: an overview and a grid of slices of about 448x448
        "name": "minicpmv-2.6",
        "projector": "resampler",
        "params": {"image_size": 448, "patch_size": 14, "image_mean": HALF, "image_std": HALF},
        "kind": "llava_uhd",
        "hparams": {"image_size": 448, "patch_size": 14},
    },
    {
        "name": "pixtral",
        "projector": "pixtral",
        "params": {"image_size": 1024, "patch_size": 16, "image_mean": CLIP_MEAN, "image_std": CLIP_STD},
        "kind": "dyn",
        "hparams": {
            "image_size": 1024, "patch_size": 16, "n_merge": 1, "image_resize_algo": BICUBIC,
            "image_min_pixels": tokens_to_pixels(8, 16, 1), "image_max_pixels": tokens_to_pixels(1024, 16, 1),
        },
    },
    {
        "name": "gemma4",
        "projector": "gemma4v",
        "params": {"image_size": 768, "patch_size": 16, "image_mean": HALF, "image_std": HALF},
        "kind": "dyn",
        "hparams": {
            "image_size": 768, "patch_size": 16, "n_merge": 3, "image_resize_algo": BICUBIC,
            "image_min_pixels": tokens_to_pixels(70, 16, 3), "image_max_pixels": tokens_to_pixels(1120, 16, 3),
        },
    },
]


# img_tool::resize alone, through the fixed-size preprocessor with mean 0 and std 1 (the entry
# is then the resized image / 255): every algorithm and padding style, square targets up and down
RESIZE_SWEEP = [
    {"image_size": size, "image_resize_algo": algo, "image_resize_pad": pad, "image_pad_color": [1, 2, 250]}
    for size in (59, 223)
    for algo in (BILINEAR, BICUBIC, LANCZOS)
    for pad in (PAD_NONE, PAD_CEIL, PAD_NEAREST)
]


def resize_family(hparams: dict) -> dict:
    name = "resize-{image_size}-algo{image_resize_algo}-pad{image_resize_pad}".format(**hparams)
    return {"name": name, "kind": "fixed", "params": {"image_mean": (0, 0, 0), "image_std": (1, 1, 1)},
            "hparams": {"patch_size": 1, **hparams}}


def harness_args(family: dict) -> list[str]:
    hparams = dict(family["hparams"])
    hparams["image_mean"] = family["params"]["image_mean"]
    hparams["image_std"] = family["params"]["image_std"]
    return [f"{k}={','.join(map(repr, v)) if isinstance(v, (list, tuple)) else v}" for k, v in hparams.items()]


# ---------------------------------------------------------------------------------------------
# the harness
# ---------------------------------------------------------------------------------------------


def build_harness(out_dir: Path) -> Path:
    binary = out_dir / "mtmd_preprocess_harness"
    include = [LLAMA_CPP / "ggml" / "include", LLAMA_CPP / "tools" / "mtmd", LLAMA_CPP / "include"]
    command = ["g++", "-std=c++17", "-O2", *(f"-I{p}" for p in include), str(HARNESS_SRC),
               f"-L{LIBMTMD_DIR}", "-lmtmd", f"-Wl,-rpath,{LIBMTMD_DIR}", "-o", str(binary)]
    subprocess.run(command, check=True)
    return binary


def read_rgb(path: Path) -> np.ndarray:
    raw = path.read_bytes()
    nx, ny = struct.unpack("<ii", raw[:8])
    return np.frombuffer(raw[8:], dtype=np.uint8).reshape(ny, nx, 3)


def read_preprocessed(path: Path) -> dict:
    """The harness's out.f32: entries, overview (or None), grid."""
    raw = path.read_bytes()
    offset = 0

    def i32() -> int:
        nonlocal offset
        (value,) = struct.unpack_from("<i", raw, offset)
        offset += 4
        return value

    def image() -> np.ndarray:
        nonlocal offset
        nx, ny = i32(), i32()
        array = np.frombuffer(raw, dtype="<f4", count=nx * ny * 3, offset=offset).reshape(ny, nx, 3)
        offset += nx * ny * 3 * 4
        return array

    entries = [image() for _ in range(i32())]
    overview = image() if i32() else None
    return {"entries": entries, "overview": overview, "grid": [i32(), i32()]}


def describe(array: np.ndarray) -> dict:
    little = np.ascontiguousarray(array, dtype="<f4")
    return {
        "shape": list(array.shape),
        "sha256": hashlib.sha256(little.tobytes()).hexdigest(),
        "mean": float(little.astype(np.float64).mean()),
        "min": float(little.min()),
        "max": float(little.max()),
    }


def record_case(binary: Path, family: dict, rgb_file: Path, work: Path) -> dict:
    out = work / "out.f32"
    subprocess.run([str(binary), "preprocess", family["kind"], str(rgb_file), str(out), *harness_args(family)], check=True)
    result = read_preprocessed(out)
    return {
        "entries": [describe(e) for e in result["entries"]],
        "overview": None if result["overview"] is None else describe(result["overview"]),
        "grid": result["grid"],
    }, result


def compare(family: dict, rgb: np.ndarray, expected: dict) -> float:
    """max |media.py - mtmd| over the case's images (inf when the shapes differ)."""
    sys.path.insert(0, str(ROOT / "python"))
    from ferrollama.generation import media

    got = media.preprocess_image(family["projector"], rgb, media.VisionParams(**family["params"]))
    pairs = list(zip(got.entries, expected["entries"]))
    if len(got.entries) != len(expected["entries"]) or (got.overview is None) != (expected["overview"] is None):
        return float("inf")
    if got.overview is not None:
        pairs.append((got.overview, expected["overview"]))
    worst = 0.0
    for mine, theirs in pairs:
        if mine.shape != theirs.shape:
            return float("inf")
        worst = max(worst, float(np.abs(mine - theirs).max()))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", action="store_true", help="also print max |diff| of media.py vs mtmd")
    args = parser.parse_args()

    paths = write_images()
    goldens: dict = {"llama_cpp": "llama-cpp-python 0.3.36 libmtmd.so", "decode": {}, "families": [], "resizes": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        binary = build_harness(work)
        rgb_files = {}
        for name, path in sorted(paths.items()):
            rgb_files[name] = work / f"{name}.rgb"
            subprocess.run([str(binary), "decode", str(path), str(rgb_files[name])], check=True)
            rgb = read_rgb(rgb_files[name])
            goldens["decode"][name] = {"shape": list(rgb.shape), "sha256": hashlib.sha256(rgb.tobytes()).hexdigest()}
            if name.endswith(".jpg"):
                # stb_image's JPEG decoder is not libjpeg's: keep its pixels to measure the gap
                goldens["decode"][name]["rgb_hex"] = rgb.tobytes().hex()
        for family in FAMILIES:
            cases = {}
            for name in PREPROCESS_IMAGES:
                cases[name], raw = record_case(binary, family, rgb_files[name], work)
                if args.compare:
                    diff = compare(family, read_rgb(rgb_files[name]), raw)
                    print(f"{family['name']:28} {name:16} max|diff| {diff:.3g}", flush=True)
            goldens["families"].append({**{k: family[k] for k in ("name", "projector", "params", "kind", "hparams")}, "cases": cases})
        for hparams in RESIZE_SWEEP:
            family = resize_family(hparams)
            cases = {name: record_case(binary, family, rgb_files[name], work)[0] for name in PREPROCESS_IMAGES}
            goldens["resizes"].append({"hparams": hparams, "cases": {n: c["entries"][0] for n, c in cases.items()}})
    GOLDENS.parent.mkdir(parents=True, exist_ok=True)
    GOLDENS.write_text(json.dumps(goldens, indent=1) + "\n")
    print(f"wrote {GOLDENS}")


if __name__ == "__main__":
    main()
