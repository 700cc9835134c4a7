"""Images in (issue 38): ferrollama.generation.media against llama.cpp's libmtmd.

The records (tests/data/preprocess/goldens.json, from benches/record_preprocess.py) hold what
llama-cpp-python 0.3.36's libmtmd.so makes of the tests/data/images/pre-* images: stb_image's
decoding, and each projector family's preprocessed float32 images (sha256 of their bytes).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import struct
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ferrollama.generation import media
from ferrollama.generation.media import MediaError, MediaLimits

DATA = Path(__file__).parent / "data"
IMAGES = DATA / "images"
GOLDENS = json.loads((DATA / "preprocess" / "goldens.json").read_text())
EXACT_DECODES = {name: record for name, record in GOLDENS["decode"].items() if not name.endswith(".jpg")}


def sha256_of(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def f32_sha256(array: np.ndarray) -> str:
    return sha256_of(np.asarray(array, dtype="<f4"))


# ---------------------------------------------------------------------------------------------
# decoding: stb_image's pixels
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXACT_DECODES))
def test_decodes_to_stb_image_pixels(name: str) -> None:
    """PNG: RGB, RGBA (alpha dropped), grey, grey+alpha, palette with tRNS, 16-bit grey and RGB;
    GIF with a transparent index (black, as stb draws it)."""
    rgb = media.load_image(IMAGES / name)
    assert rgb.dtype == np.uint8
    assert list(rgb.shape) == EXACT_DECODES[name]["shape"]
    assert sha256_of(rgb) == EXACT_DECODES[name]["sha256"]


def test_jpeg_decodes_within_stb_images_gap() -> None:
    """stb_image's own JPEG decoder (IDCT, chroma upsampling, YCbCr->RGB in its fixed point) is
    not libjpeg's, which Pillow uses: on the recorded 4:2:0 JPEG the measured gap is at most 2
    levels on 6% of the samples (mean 0.08). 4:2:2 JPEGs differ more: on the same pixels saved
    4:2:2, stb and libjpeg differ by up to 113 levels in column W-2 (their h2v1 chroma upsampling
    at the right edge), which is why only the 4:2:0 image is recorded with a bound."""
    record = GOLDENS["decode"]["pre-photo.jpg"]
    stb = np.frombuffer(bytes.fromhex(record["rgb_hex"]), dtype=np.uint8).reshape(record["shape"])
    diff = np.abs(media.load_image(IMAGES / "pre-photo.jpg").astype(np.int16) - stb)
    assert diff.max() <= 2
    assert diff.mean() < 0.1


def test_rgba_alpha_is_dropped_not_composited() -> None:
    rgba = np.zeros((2, 3, 4), dtype=np.uint8)
    rgba[..., :3] = [[[10, 20, 30]]]
    rgba[..., 3] = 0  # fully transparent: a compositing loader would give the background
    assert (media.load_image(Image.fromarray(rgba)) == rgba[..., :3]).all()
    assert (media.load_image(rgba) == rgba[..., :3]).all()


def test_exif_orientation_is_not_applied() -> None:
    """stb_image ignores EXIF: a 'rotate 90' tag leaves the stored pixels as they are."""
    pixels = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    exif = Image.Exif()
    exif[0x0112] = 6
    encoded = io.BytesIO()
    Image.fromarray(pixels).save(encoded, format="PNG", exif=exif)
    assert (media.load_image(encoded.getvalue()) == pixels).all()


# ---------------------------------------------------------------------------------------------
# preprocessing: mtmd-image.cpp's float32 images, bit for bit
# ---------------------------------------------------------------------------------------------

PREPROCESS_CASES = [
    pytest.param(family, image, id=f"{family['name']}-{image}")
    for family in GOLDENS["families"]
    for image in family["cases"]
]


def assert_image_matches(got: np.ndarray, record: dict, what: str) -> None:
    assert list(got.shape) == record["shape"], what
    assert got.dtype == np.float32, what
    stats = (float(got.astype(np.float64).mean()), float(got.min()), float(got.max()))
    assert f32_sha256(got) == record["sha256"], (
        f"{what}: (mean, min, max) {stats} vs mtmd {(record['mean'], record['min'], record['max'])}"
    )


@pytest.mark.parametrize(("family", "image"), PREPROCESS_CASES)
def test_preprocessing_is_mtmds(family: dict, image: str) -> None:
    """The family's VisionParams (what the GGUF gives) -> the same encoder inputs as libmtmd, given
    the clip_hparams clip.cpp's load_hparams derives (spelled out in the record)."""
    record = family["cases"][image]
    params = media.VisionParams(**family["params"])
    result = media.preprocess_image(family["projector"], media.load_image(IMAGES / image), params)
    assert [result.grid_x, result.grid_y] == record["grid"]
    assert len(result.entries) == len(record["entries"])
    for index, (entry, entry_record) in enumerate(zip(result.entries, record["entries"])):
        assert_image_matches(entry, entry_record, f"entry {index}")
    if record["overview"] is None:
        assert result.overview is None
    else:
        assert_image_matches(result.overview, record["overview"], "overview")


RESIZE_CASES = [
    pytest.param(sweep["hparams"], image, record, id="{image_size}-algo{image_resize_algo}-pad{image_resize_pad}-".format(**sweep["hparams"]) + image)
    for sweep in GOLDENS["resizes"]
    for image, record in sweep["cases"].items()
]


@pytest.mark.parametrize(("hparams", "image", "record"), RESIZE_CASES)
def test_resize_is_img_tools(hparams: dict, image: str, record: dict) -> None:
    """img_tool::resize alone (recorded as the fixed-size preprocessor's u8 / 255): every
    algorithm, stretched and letterboxed (ceil and nearest), up and down."""
    size = hparams["image_size"]
    resized = media.resize(
        media.load_image(IMAGES / image),
        size,
        size,
        media.ResizeAlgo(hparams["image_resize_algo"]),
        media.PadStyle(hparams["image_resize_pad"]),
        tuple(hparams["image_pad_color"]),
    )
    assert_image_matches(resized.astype(np.float32) / np.float32(255), record, "resized")


@pytest.mark.parametrize(
    ("projector", "params", "image_shape", "grid"),
    [
        ("gemma3", {"image_size": 896, "patch_size": 14}, (50, 200, 3), (16, 16)),  # 256 tokens
        ("qwen2.5vl_merger", {"image_size": 560, "patch_size": 14}, (101, 37, 3), (2, 5)),  # 56x140
        ("qwen3vl_merger", {"image_size": 768, "patch_size": 16}, (700, 1100, 3), (34, 22)),
        ("mlp", {"image_size": 336, "patch_size": 14}, (64, 64, 3), (24, 24)),  # 576 tokens
    ],
)
def test_merged_patch_grid(projector: str, params: dict, image_shape: tuple, grid: tuple) -> None:
    half = (0.5, 0.5, 0.5)
    rgb = np.zeros(image_shape, dtype=np.uint8)
    result = media.preprocess_image(projector, rgb, media.VisionParams(image_mean=half, image_std=half, **params))
    assert result.merged_patch_grid(result.entries[0]) == grid


def test_records_cover_every_family() -> None:
    recorded = {family["projector"] for family in GOLDENS["families"]}
    assert {"gemma3", "qwen2.5vl_merger", "qwen3vl_merger", "idefics3", "lfm2", "mlp", "pixtral", "gemma4v",
            "resampler"} <= recorded
    tiled = [c for f in GOLDENS["families"] for c in f["cases"].values() if c["grid"] != [0, 0]]
    assert len(tiled) >= 4  # llava-1.6, idefics3, lfm2 and minicpmv tile pre-large.png


def test_unknown_projector_type_is_refused() -> None:
    params = media.VisionParams(image_size=224, patch_size=14, image_mean=(0.5,) * 3, image_std=(0.5,) * 3)
    with pytest.raises(MediaError, match="no image preprocessing for projector type 'whisper'"):
        media.preprocess_image("whisper", np.zeros((4, 4, 3), dtype=np.uint8), params)


def test_preprocessing_refuses_a_non_rgb_array() -> None:
    params = media.VisionParams(image_size=224, patch_size=14, image_mean=(0.5,) * 3, image_std=(0.5,) * 3)
    with pytest.raises(MediaError, match="expected an RGB uint8"):
        media.preprocess_gemma3(np.zeros((4, 4), dtype=np.uint8), params)


# ---------------------------------------------------------------------------------------------
# loading paths
# ---------------------------------------------------------------------------------------------

SQUARE = IMAGES / "pre-square.png"


@pytest.fixture(scope="module")
def square_rgb() -> np.ndarray:
    return media.load_image(SQUARE)


def test_every_source_kind_gives_the_same_pixels(square_rgb: np.ndarray) -> None:
    encoded = SQUARE.read_bytes()
    data_uri = "data:image/png;base64," + base64.b64encode(encoded).decode()
    sources = [
        str(SQUARE),
        SQUARE,
        encoded,
        bytearray(encoded),
        Image.open(SQUARE),
        square_rgb.copy(),
        data_uri,
        SQUARE.as_uri(),
        "file://localhost" + str(SQUARE),
    ]
    for source in sources:
        assert (media.load_image(source) == square_rgb).all(), type(source).__name__
    assert (media.load_image_url(data_uri) == square_rgb).all()


def test_grey_array_is_replicated() -> None:
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert (media.load_image(grey) == grey[:, :, None]).all()
    assert media.load_image(grey).shape == (3, 4, 3)


def test_data_uri_without_base64_is_percent_decoded(square_rgb: np.ndarray) -> None:
    from urllib.parse import quote_from_bytes

    uri = "data:image/png," + quote_from_bytes(SQUARE.read_bytes())
    assert (media.load_image(uri) == square_rgb).all()


# ---------------------------------------------------------------------------------------------
# error paths
# ---------------------------------------------------------------------------------------------


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width: int, height: int) -> bytes:
    """A small PNG whose IHDR declares width x height: a decompression bomb's header."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 64)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (b"not an image at all", "cannot decode image"),
        (b"", "cannot decode image"),
        (SQUARE.read_bytes()[:200], "cannot decode image"),  # truncated PNG
        (png_header_only(10_000, 10_000), "10000x10000 = 100000000 pixels, over the 67108864-pixel limit"),
        # past twice Pillow's own MAX_IMAGE_PIXELS, Image.open refuses it first
        (png_header_only(100_000, 100_000), "image too large: .* could be decompression bomb"),
        ("data:image/png;base64,@@@notbase64", "bad data URI: invalid base64"),
        ("data:image/png;base64", "bad data URI: no ','"),
        ("data:text/plain;base64,aGVsbG8=", "media type 'text/plain' is not an image"),
        ("data:image/png;base64,aGVsbG8=", "cannot decode image"),
        ("ftp://example.com/cat.png", "unsupported image URL scheme 'ftp'"),
        ("gopher://example.com/cat.png", "unsupported image URL scheme 'gopher'"),
        ("file://example.com/tmp/cat.png", "names a remote host"),
        ("/nonexistent/dir/cat.png", "cannot read image file /nonexistent/dir/cat.png"),
        (np.zeros((4, 4, 3), dtype=np.float32), "must be uint8"),
        (np.zeros((4, 4, 2), dtype=np.uint8), r"must be \(H, W\)"),
        (np.zeros((0, 4, 3), dtype=np.uint8), "no pixels"),
        (12345, "cannot load an image from a int"),
    ],
    ids=[
        "garbage", "empty", "truncated-png", "huge-declared-size", "huger-declared-size",
        "bad-base64", "data-uri-no-comma", "data-uri-not-image", "data-uri-not-decodable",
        "ftp", "gopher", "file-url-remote-host", "missing-file", "float-array", "two-channel-array",
        "empty-array", "int",
    ],
)
def test_bad_sources_raise_media_error(source: object, message: str) -> None:
    with pytest.raises(MediaError, match=message):
        media.load_image(source)


def test_lazily_opened_truncated_pil_image_raises_media_error() -> None:
    truncated = Image.open(io.BytesIO(SQUARE.read_bytes()[:300]))  # the header reads fine
    with pytest.raises(MediaError, match="cannot decode image: image file is truncated"):
        media.load_image(truncated)


def test_media_error_is_a_value_error() -> None:
    assert issubclass(MediaError, ValueError)


def test_byte_and_pixel_limits_are_configurable() -> None:
    encoded = SQUARE.read_bytes()
    with pytest.raises(MediaError, match=f"image is {len(encoded)} bytes, over the 100-byte limit"):
        media.load_image(encoded, MediaLimits(max_bytes=100))
    with pytest.raises(MediaError, match="over the 100-byte limit"):
        media.load_image(SQUARE, MediaLimits(max_bytes=100))
    with pytest.raises(MediaError, match="over the 100-byte limit|holds over 100 bytes"):
        media.load_image("data:image/png;base64," + base64.b64encode(encoded).decode(), MediaLimits(max_bytes=100))
    with pytest.raises(MediaError, match="64x64 = 4096 pixels, over the 4095-pixel limit"):
        media.load_image(encoded, MediaLimits(max_pixels=4095))
    with pytest.raises(MediaError, match="over the 4095-pixel limit"):
        media.load_image(np.zeros((64, 64, 3), dtype=np.uint8), MediaLimits(max_pixels=4095))
    assert media.load_image(encoded, MediaLimits(max_pixels=4096)).shape == (64, 64, 3)


# ---------------------------------------------------------------------------------------------
# http(s) fetches, from a server on 127.0.0.1
# ---------------------------------------------------------------------------------------------

SLOW_SECONDS = 1.5


class ImageHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        route = getattr(self, "route_" + self.path.strip("/").replace("-", "_").replace(".", "_"), None)
        if route is None:
            self.send_error(404, "no such image")
            return
        route()

    def send_body(self, body: bytes, length: bool = True) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def route_square_png(self) -> None:
        self.send_body(SQUARE.read_bytes())

    def route_big(self) -> None:
        self.send_body(b"\0" * 5000)

    def route_big_no_length(self) -> None:
        self.send_body(b"\0" * 5000, length=False)

    def route_slow(self) -> None:
        time.sleep(SLOW_SECONDS)
        self.send_body(SQUARE.read_bytes())

    def route_trickle(self) -> None:
        """Each read within the timeout, the whole body not."""
        self.send_response(200)
        self.end_headers()
        for _ in range(8):
            self.wfile.write(b"\0" * 10)
            self.wfile.flush()
            time.sleep(SLOW_SECONDS / 4)

    def route_no_content(self) -> None:
        self.send_response(204)
        self.end_headers()

    def route_to_ftp(self) -> None:
        self.send_response(302)
        self.send_header("Location", "ftp://127.0.0.1/cat.png")
        self.end_headers()

    def route_to_square(self) -> None:
        self.send_response(302)
        self.send_header("Location", "/square.png")
        self.end_headers()


class QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the client hanging up on a too-big or too-slow body is the point of those tests


@pytest.fixture(scope="module")
def server_url() -> str:
    server = QuietServer(("127.0.0.1", 0), ImageHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_image_is_fetched(server_url: str, square_rgb: np.ndarray) -> None:
    assert (media.load_image(f"{server_url}/square.png") == square_rgb).all()
    assert (media.load_image(f"{server_url}/to-square") == square_rgb).all()


@pytest.mark.parametrize(
    ("path", "limits", "message"),
    [
        ("/missing", MediaLimits(), "HTTP 404"),
        ("/no-content", MediaLimits(), "HTTP 204, not 200"),
        ("/big", MediaLimits(max_bytes=1000), "5000 bytes, over the 1000-byte limit"),
        ("/big-no-length", MediaLimits(max_bytes=1000), "body over the 1000-byte limit"),
        ("/slow", MediaLimits(timeout=SLOW_SECONDS / 3), "timed out"),
        ("/trickle", MediaLimits(timeout=SLOW_SECONDS / 2), "timed out after"),
        ("/to-ftp", MediaLimits(), "redirects to 'ftp://127.0.0.1/cat.png', not http"),
    ],
    ids=["404", "204", "too-big-declared", "too-big-streamed", "slow", "trickle", "redirect-to-ftp"],
)
def test_http_failures_raise_media_error(server_url: str, path: str, limits: MediaLimits, message: str) -> None:
    with pytest.raises(MediaError, match=message):
        media.load_image(server_url + path, limits)


def test_unreachable_host_raises_media_error() -> None:
    # port 9 (discard) on loopback: nothing listens in the test environment -> connection refused
    with pytest.raises(MediaError, match="fetching http://127.0.0.1:9/x.png failed"):
        media.load_image("http://127.0.0.1:9/x.png", MediaLimits(timeout=2))
