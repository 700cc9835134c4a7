"""Images in, as llama.cpp's libmtmd takes them (issue 38): loading and preprocessing.

Loading (:func:`load_image`) turns what users pass (a path, bytes, a PIL image, a uint8 array, an
OpenAI ``image_url`` string) into mtmd's bitmap: an RGB uint8 array (H, W, 3), decoded the way
``mtmd_helper_bitmap_init_from_buf`` (tools/mtmd/mtmd-helper.cpp) decodes with stb_image and
``req_comp = 3``: alpha dropped (not composited), grey replicated, palettes expanded, 16-bit samples
reduced to their high byte, GIF transparency black, EXIF orientation ignored. PNG, GIF, BMP, TGA and
PNM pixels are stb_image's bit for bit (tests/test_media.py); JPEG goes through Pillow's libjpeg,
whose IDCT, chroma upsampling and colour conversion are not stb's (a level or two apart, more at the
right edge of 4:2:2 images). Formats stb_image lacks (WebP, TIFF, ...) are accepted.

Preprocessing (:func:`preprocess_image`, or one ``preprocess_<family>`` per projector family) turns
that bitmap and the projector's hyper-parameters into what clip.cpp feeds the encoder, with
mtmd-image.cpp's own arithmetic (llama.cpp as vendored by llama-cpp-python 0.3.36): its
Pillow-compatible fixed-point resize, its letterbox padding, float32 size rounding, and the
normalisation ``(u8 / 255 - mean) / std`` in float32. Each image is a float32 array (ny, nx, 3),
clip_image_f32's interleaved layout.

This module only imports numpy, Pillow and the standard library.
"""

from __future__ import annotations

import base64
import binascii
import enum
import io
import math
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass, replace
from typing import Callable, Union

import numpy as np
from PIL import Image

__all__ = [
    "MediaError",
    "MediaLimits",
    "VisionParams",
    "PreprocessedImage",
    "ResizeAlgo",
    "PadStyle",
    "load_image",
    "load_image_url",
    "decode_image",
    "preprocess_image",
    "preprocess_gemma3",
    "preprocess_qwen_vl",
    "preprocess_idefics3",
    "preprocess_lfm2",
    "preprocess_llava",
    "preprocess_pixtral",
    "preprocess_gemma4",
    "resize",
]


class MediaError(ValueError):
    """An image that cannot be loaded: undecodable, too large, a bad URI or a failed fetch."""


@dataclass(frozen=True)
class MediaLimits:
    """Bounds on what :func:`load_image` accepts.

    ``max_pixels`` is the decompression-bomb guard: it is checked on the size the image header
    declares, before the pixels are decoded. ``timeout`` (seconds) bounds a whole http(s) fetch.
    """

    max_bytes: int = 20 * 2**20
    max_pixels: int = 64 * 2**20
    timeout: float = 10.0


DEFAULT_LIMITS = MediaLimits()

ImageSource = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, Image.Image, np.ndarray]


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------


def load_image(source: ImageSource, limits: MediaLimits = DEFAULT_LIMITS) -> np.ndarray:
    """The RGB uint8 array (H, W, 3) mtmd's bitmap would hold for ``source``.

    A ``str`` is read as an OpenAI ``image_url`` (see :func:`load_image_url`): a data URI, a
    ``file://`` or ``http(s)://`` URL, or a plain path. Raises :class:`MediaError`.
    """
    if isinstance(source, str):
        return load_image_url(source, limits)
    if isinstance(source, os.PathLike):
        return decode_image(_read_file(os.fspath(source), limits), limits)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return decode_image(bytes(source), limits)
    if isinstance(source, Image.Image):
        _check_pixels(source.width, source.height, limits)
        try:
            return _pil_to_rgb(source)  # an Image.open()ed image decodes only now
        except (OSError, SyntaxError, ValueError, EOFError) as error:
            raise MediaError(f"cannot decode image: {error}") from error
    if isinstance(source, np.ndarray):
        return _array_to_rgb(source, limits)
    raise MediaError(f"cannot load an image from a {type(source).__name__}")


def load_image_url(url: str, limits: MediaLimits = DEFAULT_LIMITS) -> np.ndarray:
    """An OpenAI ``image_url``: ``data:`` URI, ``file://`` URL, ``http(s)://`` URL or plain path.

    Other schemes (ftp, ...) are refused.
    """
    return decode_image(image_url_bytes(url, limits), limits)


def image_url_bytes(url: str, limits: MediaLimits = DEFAULT_LIMITS) -> bytes:
    """The encoded image behind an ``image_url`` (what :func:`load_image_url` decodes)."""
    scheme = _url_scheme(url)
    if scheme == "":
        return _read_file(url, limits)
    if scheme == "data":
        return _data_uri_bytes(url, limits)
    if scheme == "file":
        return _read_file(_file_url_path(url), limits)
    if scheme in ("http", "https"):
        return _fetch_http(url, limits)
    raise MediaError(f"unsupported image URL scheme {scheme!r} (data, file, http and https are)")


def decode_image(data: bytes, limits: MediaLimits = DEFAULT_LIMITS) -> np.ndarray:
    """Decode an encoded image (PNG, JPEG, GIF, BMP, ...) to mtmd's RGB uint8 bitmap."""
    if len(data) > limits.max_bytes:
        raise MediaError(f"image is {len(data)} bytes, over the {limits.max_bytes}-byte limit")
    try:
        # Pillow's own bomb warning would fire on declared sizes we refuse just below anyway
        # (catch_warnings is process-wide before Python 3.14: at worst, racing threads leave
        # that one warning ignored)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                _check_pixels(image.width, image.height, limits)
                image.load()
                return _pil_to_rgb(image)
    except MediaError:
        raise
    except Image.DecompressionBombError as error:
        raise MediaError(f"image too large: {error}") from error
    except (OSError, SyntaxError, ValueError, EOFError) as error:
        raise MediaError(f"cannot decode image: {error}") from error


def _check_pixels(width: int, height: int, limits: MediaLimits) -> None:
    if width <= 0 or height <= 0:
        raise MediaError(f"image has no pixels ({width}x{height})")
    if width * height > limits.max_pixels:
        raise MediaError(
            f"image is {width}x{height} = {width * height} pixels, over the {limits.max_pixels}-pixel limit"
        )


# 16-bit grey modes: stb_image keeps each sample's high byte (stbi__convert_16_to_8), where
# Pillow's convert("RGB") would clip at 255
_WIDE_GREY_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def _pil_to_rgb(image: Image.Image) -> np.ndarray:
    """stb_image's req_comp=3 conversion: Pillow's convert("RGB") drops alpha as stb does (no
    compositing), replicates grey and expands palettes; EXIF orientation is left alone as stb does."""
    if image.mode in _WIDE_GREY_MODES:
        grey = np.clip(np.asarray(image).astype(np.int64) >> 8, 0, 255).astype(np.uint8)
        return np.ascontiguousarray(np.repeat(grey[:, :, None], 3, axis=2))
    if image.format == "GIF":
        return _gif_to_rgb(image)
    if image.mode != "RGB":
        image = image.convert("RGB")
    return np.array(image, dtype=np.uint8)


def _gif_to_rgb(image: Image.Image) -> np.ndarray:
    """stb_image draws a GIF's first frame on a zeroed RGBA canvas: transparent pixels (and any
    the frame leaves undrawn) stay black, where Pillow would show their palette colour."""
    rgba = np.array(image.convert("RGBA"), dtype=np.uint8)
    rgba[rgba[:, :, 3] == 0] = 0
    return np.ascontiguousarray(rgba[:, :, :3])


def _array_to_rgb(array: np.ndarray, limits: MediaLimits) -> np.ndarray:
    if array.dtype != np.uint8:
        raise MediaError(f"image array must be uint8, not {array.dtype}")
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    elif not (array.ndim == 3 and array.shape[2] in (3, 4)):
        raise MediaError(f"image array must be (H, W), (H, W, 3) or (H, W, 4), not {array.shape}")
    _check_pixels(array.shape[1], array.shape[0], limits)
    return np.ascontiguousarray(array[:, :, :3])


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def _url_scheme(url: str) -> str:
    """The URL's scheme, lower-case; "" for a plain path (a Windows drive letter is no scheme)."""
    match = _SCHEME.match(url)
    if match is None or len(match.group(1)) == 1:
        return ""
    return match.group(1).lower()


def _read_file(path: str, limits: MediaLimits) -> bytes:
    try:
        size = os.path.getsize(path)
        if size > limits.max_bytes:
            raise MediaError(f"image file {path} is {size} bytes, over the {limits.max_bytes}-byte limit")
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise MediaError(f"cannot read image file {path}: {error.strerror or error}") from error


def _file_url_path(url: str) -> str:
    parsed = urllib.parse.urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise MediaError(f"file URL {url!r} names a remote host")
    return urllib.request.url2pathname(parsed.path)


def _data_uri_bytes(uri: str, limits: MediaLimits) -> bytes:
    header, comma, payload = uri.partition(",")
    if not comma:
        raise MediaError("bad data URI: no ',' before the data")
    parameters = header[len("data:") :].split(";")
    media_type = parameters[0].strip().lower()
    if media_type and not media_type.startswith("image/"):
        raise MediaError(f"bad data URI: media type {media_type!r} is not an image")
    # base64 takes 4 characters per 3 bytes: refuse oversized payloads before decoding them
    if len(payload) * 3 // 4 > limits.max_bytes:
        raise MediaError(f"data URI holds over {limits.max_bytes} bytes")
    if "base64" not in (p.strip().lower() for p in parameters[1:]):
        return urllib.parse.unquote_to_bytes(payload)
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except binascii.Error as error:
        raise MediaError(f"bad data URI: invalid base64 ({error})") from error


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """urllib follows redirects to ftp too: a fetched image stays on http(s)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201
        if _url_scheme(newurl) not in ("http", "https"):
            raise MediaError(f"image URL redirects to {newurl!r}, not http(s)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_HTTP_CHUNK = 64 * 1024


def _fetch_http(url: str, limits: MediaLimits) -> bytes:
    """GET ``url``: at most ``max_bytes``, and ``timeout`` seconds for the whole fetch, checked
    between reads (each read waits at most ``timeout`` itself)."""
    deadline = time.monotonic() + limits.timeout
    opener = urllib.request.build_opener(_HttpOnlyRedirects)
    request = urllib.request.Request(url, headers={"User-Agent": "ferrollama"})
    try:
        with opener.open(request, timeout=limits.timeout) as response:
            if response.status != 200:
                raise MediaError(f"fetching {url}: HTTP {response.status}, not 200")
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
                raise MediaError(f"fetching {url}: {declared} bytes, over the {limits.max_bytes}-byte limit")
            return _read_body(response, url, limits, deadline)
    except MediaError:
        raise
    except urllib.error.HTTPError as error:
        raise MediaError(f"fetching {url}: HTTP {error.code} {error.reason}") from error
    except urllib.error.URLError as error:
        raise MediaError(f"fetching {url} failed: {error.reason}") from error
    except TimeoutError as error:
        raise MediaError(f"fetching {url}: timed out after {limits.timeout} s") from error
    except OSError as error:
        raise MediaError(f"fetching {url} failed: {error}") from error


def _read_body(response, url: str, limits: MediaLimits, deadline: float) -> bytes:  # noqa: ANN001
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read1(_HTTP_CHUNK):  # what has arrived: the deadline holds mid-body
        size += len(chunk)
        if size > limits.max_bytes:
            raise MediaError(f"fetching {url}: body over the {limits.max_bytes}-byte limit")
        if time.monotonic() > deadline:
            raise MediaError(f"fetching {url}: timed out after {limits.timeout} s")
        chunks.append(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------------------------------------
# mtmd-image.cpp's image tools (img_tool)
# ---------------------------------------------------------------------------------------------


class ResizeAlgo(enum.IntEnum):
    """clip-model.h's resize_algo."""

    BILINEAR = 0
    BICUBIC = 1
    LANCZOS = 2


class PadStyle(enum.IntEnum):
    """clip-model.h's pad_style: NONE stretches, CEIL and NEAREST letterbox (size and offset
    rounded up / to nearest)."""

    NONE = 0
    CEIL = 1
    NEAREST = 2


_FILTER_SUPPORT = {ResizeAlgo.BILINEAR: 1.0, ResizeAlgo.BICUBIC: 2.0, ResizeAlgo.LANCZOS: 3.0}
_PRECISION_BITS = 32 - 8 - 2  # resize_pillow's fixed point: 22 fractional bits
_BICUBIC_A = -0.5  # Pillow's (and resize_pillow's) bicubic, not PyTorch's -0.75


def _sinc(v: float) -> float:
    if v == 0.0:
        return 1.0
    pi_v = v * 3.141592653589793238462643383279502884
    return math.sin(pi_v) / pi_v


def _filter_weight(algo: ResizeAlgo, x: float) -> float:
    """resize_pillow's resample_filter (math.sin is the C library's sin, as std::sin)."""
    if algo == ResizeAlgo.LANCZOS:
        return _sinc(x) * _sinc(x / 3.0) if -3.0 <= x < 3.0 else 0.0
    x = abs(x)
    if algo == ResizeAlgo.BILINEAR:
        return 1.0 - x if x < 1.0 else 0.0
    a = _BICUBIC_A
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _fixed_point(weight: float) -> int:
    # Pillow adds +/- 0.5 then truncates toward zero (int() truncates as C's cast does)
    scaled = weight * float(1 << _PRECISION_BITS)
    return int(scaled + (-0.5 if weight < 0 else 0.5))


def _resample_coefficients(in_size: int, out_size: int, algo: ResizeAlgo) -> tuple[np.ndarray, np.ndarray]:
    """resize_pillow's precompute_weights: per output pixel, its first input pixel and its ksize
    fixed-point weights (0 past its window)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = _FILTER_SUPPORT[algo] * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    first = np.zeros(out_size, dtype=np.int64)
    weights = np.zeros((out_size, ksize), dtype=np.int64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        ss = 1.0 / filterscale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        taps = [_filter_weight(algo, ((x + xmin) - center + 0.5) * ss) for x in range(xmax)]
        total = _sum_in_order(taps)
        if total != 0.0:
            taps = [w / total for w in taps]
        weights[xx, :xmax] = [_fixed_point(w) for w in taps]
        first[xx] = xmin
    return first, weights


def _sum_in_order(values: list[float]) -> float:
    """Left-to-right float64 sum, as the C loop accumulates (math.fsum would round differently)."""
    total = 0.0
    for v in values:
        total += v
    return total


def _resample_rows(pixels: np.ndarray, out_size: int, algo: ResizeAlgo) -> np.ndarray:
    """One pass of resize_pillow along axis 0 (resample_vertical; resample_horizontal on the
    transposed image): int32 fixed-point sums with the 0.5 rounding bias, >> 22, clipped to uint8.
    The sums are integers, so their order does not matter: whole rows are added tap by tap."""
    in_size = pixels.shape[0]
    first, weights = _resample_coefficients(in_size, out_size, algo)
    weights = weights.astype(np.int32)
    acc = np.full((out_size, *pixels.shape[1:]), 1 << (_PRECISION_BITS - 1), dtype=np.int32)
    term = np.empty_like(acc)
    for k in range(weights.shape[1]):
        if not weights[:, k].any():
            continue
        # taps past a window have weight 0: clamping their index keeps them in range, adding 0
        rows = pixels[np.minimum(first + k, in_size - 1)]
        np.multiply(rows, weights[:, k, None, None], out=term)
        acc += term
    acc >>= _PRECISION_BITS
    return np.clip(acc, 0, 255).astype(np.uint8)


def _resample_columns(pixels: np.ndarray, out_size: int, algo: ResizeAlgo) -> np.ndarray:
    columns_first = np.ascontiguousarray(pixels.transpose(1, 0, 2))  # gathering rows is the fast way
    return np.ascontiguousarray(_resample_rows(columns_first, out_size, algo).transpose(1, 0, 2))


def _resize_pillow(rgb: np.ndarray, width: int, height: int, algo: ResizeAlgo) -> np.ndarray:
    """img_tool::resize_pillow: horizontal pass then vertical pass, each only when that side changes.
    (Pillow's own Image.resize is not bit-identical: it differs on 37x101 -> 59x59, for one.)"""
    if not (0 < width <= 65536 and 0 < height <= 65536):
        raise MediaError(f"resize target {width}x{height} is out of range (max 65536)")
    out = rgb
    if width != rgb.shape[1]:
        out = _resample_columns(out, width, algo)
    if height != rgb.shape[0]:
        out = _resample_rows(out, height, algo)
    return out.copy() if out is rgb else out


def _f32(x: float) -> np.float32:
    return np.float32(x)


def _c_round(x: float) -> int:
    """std::round: halves away from zero (Python's round() goes to even)."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def resize(
    rgb: np.ndarray,
    width: int,
    height: int,
    algo: ResizeAlgo,
    pad: PadStyle = PadStyle.CEIL,
    pad_color: tuple[int, int, int] = (0, 0, 0),
) -> np.ndarray:
    """img_tool::resize: to (width, height), stretched (PadStyle.NONE) or letterboxed in pad_color."""
    src_h, src_w = rgb.shape[:2]
    if (src_w, src_h) == (width, height):
        return rgb.copy()
    if pad == PadStyle.NONE:
        return _resize_pillow(rgb, width, height, algo)
    # float32 as in clip.cpp: the scale, the scaled sides and the NEAREST offsets
    scale = min(_f32(width) / _f32(src_w), _f32(height) / _f32(src_h))
    to_int = _c_round if pad == PadStyle.NEAREST else math.ceil
    new_w = min(int(to_int(float(_f32(src_w) * scale))), width)
    new_h = min(int(to_int(float(_f32(src_h) * scale))), height)
    resized = _resize_pillow(rgb, new_w, new_h, algo)
    canvas = np.empty((height, width, 3), dtype=np.uint8)
    canvas[:, :] = pad_color
    if pad == PadStyle.NEAREST:
        off_x = _c_round(float(_f32(width - new_w) / _f32(2.0)))
        off_y = _c_round(float(_f32(height - new_h) / _f32(2.0)))
    else:
        off_x, off_y = (width - new_w) // 2, (height - new_h) // 2
    _composite(canvas, resized, off_x, off_y)
    return canvas


def _composite(canvas: np.ndarray, image: np.ndarray, off_x: int, off_y: int) -> None:
    """img_tool::composite: draw image at (off_x, off_y), clipped to the canvas."""
    h, w = image.shape[:2]
    x0, y0 = max(off_x, 0), max(off_y, 0)
    x1, y1 = min(off_x + w, canvas.shape[1]), min(off_y + h, canvas.shape[0])
    if x0 < x1 and y0 < y1:
        canvas[y0:y1, x0:x1] = image[y0 - off_y : y1 - off_y, x0 - off_x : x1 - off_x]


def _crop(rgb: np.ndarray, x: int, y: int, w: int, h: int) -> np.ndarray:
    """img_tool::crop (the region must lie inside the image, as its asserts require)."""
    if not (x >= 0 and y >= 0 and w > 0 and h > 0 and x + w <= rgb.shape[1] and y + h <= rgb.shape[0]):
        raise MediaError(f"crop {w}x{h}+{x}+{y} outside a {rgb.shape[1]}x{rgb.shape[0]} image")
    return rgb[y : y + h, x : x + w].copy()


def _calc_size_preserved_ratio(
    width: int, height: int, align: int, min_pixels: int = 0, max_pixels: int = 0, longest_edge: int = 0
) -> tuple[int, int]:
    """img_tool::calc_size_preserved_ratio (transformers' smart_resize), in clip.cpp's float32."""
    if width <= 0 or height <= 0:
        return 0, 0
    f = _f32(align)

    def round_by(x: np.float32) -> int:
        return _c_round(float(_f32(x) / f)) * align

    def ceil_by(x: np.float32) -> int:
        return int(math.ceil(float(_f32(x) / f))) * align

    def floor_by(x: np.float32) -> int:
        return int(math.floor(float(_f32(x) / f))) * align

    if longest_edge > 0:
        scale = min(_f32(longest_edge) / _f32(width), _f32(longest_edge) / _f32(height))
        w_bar, h_bar = ceil_by(_f32(width) * scale), ceil_by(_f32(height) * scale)
    else:
        w_bar, h_bar = max(align, round_by(_f32(width))), max(align, round_by(_f32(height)))
    if max_pixels > 0 and h_bar * w_bar > max_pixels:
        beta = np.sqrt(_f32(height) * _f32(width) / _f32(max_pixels))
        h_bar = max(align, floor_by(_f32(height) / beta))
        w_bar = max(align, floor_by(_f32(width) / beta))
    elif min_pixels > 0 and h_bar * w_bar < min_pixels:
        beta = np.sqrt(_f32(min_pixels) / (_f32(height) * _f32(width)))
        h_bar, w_bar = ceil_by(_f32(height) * beta), ceil_by(_f32(width) * beta)
    return w_bar, h_bar


def _normalize(rgb: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """clip_image_f32::from_u8 then normalize: u8 / 255 then (x - mean) / std, all float32."""
    x = rgb.astype(np.float32) / np.float32(255.0)
    return (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# hyper-parameters and results
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VisionParams:
    """A projector's preprocessing hyper-parameters, as its GGUF gives them (clip.vision.*).

    ``None`` means "the family's default", which each ``preprocess_<family>`` fills in as clip.cpp's
    load_hparams does. ``image_min_tokens`` / ``image_max_tokens`` are llama.cpp's custom limits
    (--image-min-tokens / --image-max-tokens). ``grid_pinpoints`` are (width, height) pairs.
    """

    image_size: int
    patch_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    n_merge: int | None = None
    image_min_tokens: int = 0
    image_max_tokens: int = 0
    image_longest_edge: int = 0
    grid_pinpoints: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class _Hparams:
    """clip_hparams' preprocessing fields, defaults as in clip-model.h."""

    image_size: int
    patch_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    n_merge: int = 1
    image_longest_edge: int = 0
    image_min_pixels: int = -1
    image_max_pixels: int = -1
    image_resize_algo: ResizeAlgo = ResizeAlgo.BICUBIC
    image_resize_pad: PadStyle = PadStyle.CEIL
    image_pad_color: tuple[int, int, int] = (0, 0, 0)
    image_res_candidates: tuple[tuple[int, int], ...] = ()
    image_resize_algo_rf: ResizeAlgo = ResizeAlgo.BICUBIC
    image_resize_algo_ov: ResizeAlgo = ResizeAlgo.BICUBIC
    image_pad_rf: PadStyle = PadStyle.CEIL
    image_pad_ov: PadStyle = PadStyle.NONE
    image_pad_color_rf: tuple[int, int, int] = (0, 0, 0)
    image_pad_color_ov: tuple[int, int, int] = (0, 0, 0)


def _hparams(params: VisionParams, n_merge_default: int, **family: object) -> _Hparams:
    hp = _Hparams(
        image_size=params.image_size,
        patch_size=params.patch_size,
        image_mean=tuple(params.image_mean),
        image_std=tuple(params.image_std),
        n_merge=n_merge_default if params.n_merge is None else params.n_merge,
        image_longest_edge=params.image_longest_edge,
        image_res_candidates=tuple(tuple(p) for p in params.grid_pinpoints),
    )
    return replace(hp, **family)


def _limit_image_tokens(hp: _Hparams, params: VisionParams, n_min: int | None, n_max: int | None) -> _Hparams:
    """clip_hparams::set_limit_image_tokens: token limits (custom ones first) to pixel limits.
    With n_min / n_max None (the no-argument overload) only custom limits apply."""
    patch_area = hp.patch_size * hp.patch_size * hp.n_merge * hp.n_merge
    tokens_min = params.image_min_tokens or n_min
    tokens_max = params.image_max_tokens or n_max
    return replace(
        hp,
        image_min_pixels=hp.image_min_pixels if tokens_min is None else tokens_min * patch_area,
        image_max_pixels=hp.image_max_pixels if tokens_max is None else tokens_max * patch_area,
    )


@dataclass
class PreprocessedImage:
    """mtmd_image_preproc_out: the encoder's inputs.

    ``entries`` are float32 (ny, nx, 3) images in clip.cpp's order (the slices / tiles, row-major,
    or the single image); ``overview`` is the llava-uhd style downscaled whole image (None when the
    family has none); ``grid_x`` / ``grid_y`` the tile grid (0 when untiled). Where the overview
    goes in the token stream (before or after the tiles) is the family's mtmd_context setting.
    ``patch_size`` and ``n_merge`` are the ones the family ran with (its defaults filled in).
    clip.cpp's encoder input ("inp_raw", ne = [nx, ny, 3]) is an entry made planar:
    ``entry.transpose(2, 0, 1)``, as clip_image_batch_encode copies it.
    """

    entries: list[np.ndarray]
    overview: np.ndarray | None = None
    grid_x: int = 0
    grid_y: int = 0
    patch_size: int = 0
    n_merge: int = 1

    def merged_patch_grid(self, image: np.ndarray) -> tuple[int, int]:
        """(x, y) patches of one entry or the overview after the projector's n_merge x n_merge
        merge: e.g. Qwen-VL's token grid; families adding separator tokens (Pixtral's row
        breaks) add those on top."""
        side = self.patch_size * self.n_merge
        return image.shape[1] // side, image.shape[0] // side


def _check_params(rgb: np.ndarray, hp: _Hparams) -> None:
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.shape[0] == 0 or rgb.shape[1] == 0:
        raise MediaError(f"expected an RGB uint8 (H, W, 3) image, got {rgb.dtype} {rgb.shape}")
    if hp.patch_size <= 0 or hp.n_merge <= 0 or hp.image_size < 0:
        raise MediaError(f"bad vision hyper-parameters: {hp}")


# ---------------------------------------------------------------------------------------------
# mtmd-image.cpp's preprocessors
# ---------------------------------------------------------------------------------------------


def _fixed_size(rgb: np.ndarray, hp: _Hparams) -> PreprocessedImage:
    """mtmd_image_preprocessor_fixed_size: one image_size x image_size image."""
    size = hp.image_size
    resized = resize(rgb, size, size, hp.image_resize_algo, hp.image_resize_pad, hp.image_pad_color)
    return PreprocessedImage([_normalize(resized, hp.image_mean, hp.image_std)])


def _dyn_size(rgb: np.ndarray, hp: _Hparams) -> PreprocessedImage:
    """mtmd_image_preprocessor_dyn_size: sides aligned to patch_size * n_merge within the pixel limits."""
    if hp.image_min_pixels <= 0 or hp.image_max_pixels <= 0:
        raise MediaError("dynamic-size preprocessing needs positive image_min_pixels and image_max_pixels")
    width, height = _calc_size_preserved_ratio(
        rgb.shape[1], rgb.shape[0], hp.patch_size * hp.n_merge, hp.image_min_pixels, hp.image_max_pixels
    )
    resized = resize(rgb, width, height, hp.image_resize_algo, hp.image_resize_pad, hp.image_pad_color)
    return PreprocessedImage([_normalize(resized, hp.image_mean, hp.image_std)])


@dataclass(frozen=True)
class _SliceInstructions:
    """mtmd_image_preprocessor_llava_uhd::slice_instructions; slices are (x, y, w, h)."""

    overview_size: tuple[int, int]
    refined_size: tuple[int, int] = (0, 0)
    grid_size: tuple[int, int] = (0, 0)
    slices: tuple[tuple[int, int, int, int], ...] = ()


def _select_best_resolution(width: int, height: int, candidates: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """llava_uhd::select_best_resolution: most effective pixels, then least waste (float32 scale)."""
    best = (0, 0)
    best_effective, best_wasted = 0, np.iinfo(np.int32).max
    for cand_w, cand_h in candidates:
        scale = min(_f32(cand_w) / _f32(width), _f32(cand_h) / _f32(height))
        target_w, target_h = int(_f32(width) * scale), int(_f32(height) * scale)
        effective = min(target_w * target_h, width * height)
        wasted = cand_w * cand_h - effective
        if effective > best_effective or (effective == best_effective and wasted < best_wasted):
            best, best_effective, best_wasted = (cand_w, cand_h), effective, wasted
    return best


def _tile_slices(refined_w: int, refined_h: int, tile: int) -> tuple[tuple[int, int, int, int], ...]:
    """Row-major tiles of side ``tile`` over the refined image, the last ones cut to fit."""
    return tuple(
        (x, y, min(tile, refined_w - x), min(tile, refined_h - y))
        for y in range(0, refined_h, tile)
        for x in range(0, refined_w, tile)
    )


def _llava_uhd_instructions(width: int, height: int, hp: _Hparams) -> _SliceInstructions:
    """llava_uhd::get_slice_instructions: an image that fits is its overview alone; a larger one
    is sliced on the best pinpoint (llava-1.6) or, without pinpoints, on the grid that best
    keeps its aspect ratio (minicpmv)."""
    slice_size = hp.image_size
    if not (width > slice_size or height > slice_size):
        return _SliceInstructions(overview_size=(slice_size, slice_size))
    if not hp.image_res_candidates:
        return _minicpmv_instructions(width, height, hp)
    refined_w, refined_h = _select_best_resolution(width, height, hp.image_res_candidates)
    return _SliceInstructions(
        overview_size=(slice_size, slice_size),
        refined_size=(refined_w, refined_h),
        grid_size=(refined_w // slice_size, refined_h // slice_size),
        slices=_tile_slices(refined_w, refined_h, slice_size),
    )


_MAX_SLICE_NUMS = 9  # llava_uhd's max_slice_nums (minicpmv's)


def _ensure_divide(length: int, patch_size: int) -> int:
    """llava_uhd::ensure_divide: the length rounded (float32, halves away) to a multiple of
    patch_size, at least patch_size."""
    return max(int(_c_round(_f32(length) / _f32(patch_size)) * patch_size), patch_size)


def _best_resize(width: int, height: int, scale_resolution: int, patch_size: int, allow_upscale: bool) -> tuple[int, int]:
    """llava_uhd::get_best_resize: an area over scale_resolution² (or any, with allow_upscale)
    scaled to it keeping the aspect ratio (float32), then both sides to multiples of patch_size."""
    if width * height > scale_resolution * scale_resolution or allow_upscale:
        r = _f32(width) / _f32(height)
        height = int(_f32(scale_resolution) / np.sqrt(r))
        width = int(_f32(height) * r)
    return _ensure_divide(width, patch_size), _ensure_divide(height, patch_size)


def _best_grid(multiple: int, log_ratio: np.float32) -> tuple[int, int]:
    """llava_uhd::get_best_grid: among the (columns, rows) factorings of multiple - 1, multiple
    and multiple + 1 slices (not 1, at most 9), the first whose log aspect ratio is nearest
    (errors in double, kept in float32)."""
    counts = [n for n in (multiple - 1, multiple, multiple + 1) if n != 1 and n <= _MAX_SLICE_NUMS]
    best, min_error = (1, 1), np.float32(np.inf)
    for n in counts:
        for m in range(1, n + 1):
            if n % m:
                continue
            error = np.float32(abs(float(log_ratio) - math.log(m / (n // m))))
            if error < min_error:
                best, min_error = (m, n // m), error
    return best


def _minicpmv_instructions(width: int, height: int, hp: _Hparams) -> _SliceInstructions:
    """llava_uhd::get_slice_instructions without pinpoints (minicpmv): the overview resized to
    about image_size² pixels, the image resized (get_refine_size) to a grid of equal slices of
    about image_size² pixels each, sides multiples of patch_size * n_merge."""
    slice_size, patch = hp.image_size, hp.patch_size * hp.n_merge
    overview = _best_resize(width, height, slice_size, patch, allow_upscale=False)
    # log() of a float is C's double log; the ratio is float32, its ceiling a double
    log_ratio = np.float32(math.log(float(_f32(width) / _f32(height))))
    ratio = _f32(width) * _f32(height) / _f32(slice_size * slice_size)
    multiple = int(min(math.ceil(float(ratio)), _MAX_SLICE_NUMS))
    grid_x, grid_y = _best_grid(multiple, log_ratio)
    cell_w, cell_h = _ensure_divide(width, grid_x) // grid_x, _ensure_divide(height, grid_y) // grid_y
    best_w, best_h = _best_resize(cell_w, cell_h, slice_size, patch, allow_upscale=True)
    refined_w, refined_h = best_w * grid_x, best_h * grid_y
    slice_w, slice_h = refined_w // grid_x, refined_h // grid_y
    slices = tuple((x * slice_w, y * slice_h, slice_w, slice_h) for y in range(grid_y) for x in range(grid_x))
    return _SliceInstructions(overview_size=overview, refined_size=(refined_w, refined_h), grid_size=(grid_x, grid_y),
                              slices=slices)


def _slice_image(rgb: np.ndarray, inst: _SliceInstructions, hp: _Hparams) -> tuple[np.ndarray, list[np.ndarray]]:
    """llava_uhd::slice_image: the overview, and the slices cropped from the refined image."""
    overview = resize(rgb, *inst.overview_size, hp.image_resize_algo_ov, hp.image_pad_ov, hp.image_pad_color_ov)
    if not inst.slices:
        return overview, []
    refined = resize(rgb, *inst.refined_size, hp.image_resize_algo_rf, hp.image_pad_rf, hp.image_pad_color_rf)
    return overview, [_crop(refined, *s) for s in inst.slices]


def _sliced_output(overview: np.ndarray, slices: list[np.ndarray], grid: tuple[int, int], hp: _Hparams) -> PreprocessedImage:
    """llava_uhd::preprocess's output: normalised overview, slices and grid."""
    return PreprocessedImage(
        entries=[_normalize(s, hp.image_mean, hp.image_std) for s in slices],
        overview=_normalize(overview, hp.image_mean, hp.image_std),
        grid_x=grid[0],
        grid_y=grid[1],
    )


def _llava_uhd(rgb: np.ndarray, hp: _Hparams) -> PreprocessedImage:
    inst = _llava_uhd_instructions(rgb.shape[1], rgb.shape[0], hp)
    overview, slices = _slice_image(rgb, inst, hp)
    return _sliced_output(overview, slices, inst.grid_size, hp)


def _idefics3(rgb: np.ndarray, hp: _Hparams) -> PreprocessedImage:
    """mtmd_image_preprocessor_idefics3: a tile grid of image_size tiles plus an overview."""
    if hp.image_longest_edge > 0 and hp.image_min_pixels <= 0 and hp.image_max_pixels <= 0:
        return _idefics3_longest_edge(rgb, hp)
    tile = hp.image_size
    refined_w, refined_h = _calc_size_preserved_ratio(
        rgb.shape[1], rgb.shape[0], tile, max(0, hp.image_min_pixels), max(0, hp.image_max_pixels), hp.image_longest_edge
    )
    inst = _SliceInstructions(
        overview_size=(tile, tile),
        refined_size=(refined_w, refined_h),
        grid_size=(math.ceil(float(_f32(refined_w) / _f32(tile))), math.ceil(float(_f32(refined_h) / _f32(tile)))),
        slices=_tile_slices(refined_w, refined_h, tile),
    )
    overview, slices = _slice_image(rgb, inst, hp)
    return _sliced_output(overview, slices, inst.grid_size, hp)


def _idefics3_longest_edge(rgb: np.ndarray, hp: _Hparams) -> PreprocessedImage:
    """The idefics3 path for GGUFs with only a preprocessor longest edge: longer side to it
    (the other side made even), then up to multiples of the tile size, both stretched."""
    height, width = rgb.shape[:2]
    tile, longest = hp.image_size, hp.image_longest_edge
    aspect = width / height  # double, as in mtmd-image.cpp
    if width >= height:
        resized_w, resized_h = longest, int(longest / aspect)
        resized_h += resized_h % 2
    else:
        resized_w, resized_h = int(longest * aspect), longest
        resized_w += resized_w % 2
    grid_x, grid_y = (resized_w + tile - 1) // tile, (resized_h + tile - 1) // tile
    algo = hp.image_resize_algo
    resized = resize(rgb, resized_w, resized_h, algo, PadStyle.NONE)
    refined = resize(resized, grid_x * tile, grid_y * tile, algo, PadStyle.NONE)
    overview = resize(refined, tile, tile, algo, PadStyle.NONE)
    slices = [_crop(refined, x * tile, y * tile, tile, tile) for y in range(grid_y) for x in range(grid_x)]
    return _sliced_output(overview, slices, (grid_x, grid_y), hp)


# mtmd_image_preprocessor_lfm2's constants (LFM2.5-VL's processor_config.json)
_LFM2_MIN_TILES, _LFM2_MAX_TILES, _LFM2_MAX_PIXELS_TOLERANCE, _LFM2_TILE_SIZE = 2, 10, 2.0, 512


def _lfm2_should_tile(width: int, height: int, hp: _Hparams) -> bool:
    """lfm2::should_tile: the aligned image over max_pixels * 2 (double; nearbyint rounds to even)."""
    align = hp.patch_size * hp.n_merge

    def round_by(x: int) -> int:
        return round(float(_f32(x)) / align) * align  # Python's round() is nearbyint's ties-to-even

    h_bar = max(hp.patch_size, round_by(height))
    w_bar = max(hp.patch_size, round_by(width))
    return float(h_bar) * float(w_bar) > float(hp.image_max_pixels) * _LFM2_MAX_PIXELS_TOLERANCE


def _lfm2_target_ratios() -> list[tuple[int, int]]:
    """lfm2::get_target_ratios: (w, h) grids of min..max tiles, by tile count (stable sort)."""
    ratios: list[tuple[int, int]] = []
    for n in range(_LFM2_MIN_TILES, _LFM2_MAX_TILES + 1):
        for w in range(1, n + 1):
            for h in range(1, n + 1):
                if _LFM2_MIN_TILES <= w * h <= _LFM2_MAX_TILES and (w, h) not in ratios:
                    ratios.append((w, h))
    return sorted(ratios, key=lambda r: r[0] * r[1])


def _lfm2_grid(width: int, height: int) -> tuple[int, int]:
    """lfm2::get_grid_layout / find_closest_aspect_ratio, in float32."""
    aspect = _f32(width) / _f32(height)
    area = _f32(width * height)
    best_diff, best = _f32(np.finfo(np.float32).max), (1, 1)
    for w, h in _lfm2_target_ratios():
        diff = abs(aspect - _f32(w) / _f32(h))
        if diff < best_diff:
            best_diff, best = diff, (w, h)
        elif diff == best_diff and area > _f32(0.5) * _f32(_LFM2_TILE_SIZE * _LFM2_TILE_SIZE * w * h):
            best = (w, h)
    return best


def _lfm2(rgb: np.ndarray, hp: _Hparams) -> PreprocessedImage:
    """mtmd_image_preprocessor_lfm2: one smart-resized image, or 512 tiles plus a thumbnail."""
    height, width = rgb.shape[:2]
    overview_size = _calc_size_preserved_ratio(
        width, height, hp.patch_size * hp.n_merge, hp.image_min_pixels, hp.image_max_pixels
    )
    if not _lfm2_should_tile(width, height, hp):
        # a single image is an entry, not an overview (no <|img_thumbnail|>)
        (single, _) = _slice_image(rgb, _SliceInstructions(overview_size=overview_size), hp)
        return PreprocessedImage([_normalize(single, hp.image_mean, hp.image_std)])
    grid_w, grid_h = _lfm2_grid(width, height)
    tile = _LFM2_TILE_SIZE
    inst = _SliceInstructions(
        overview_size=overview_size,
        refined_size=(tile * grid_w, tile * grid_h),
        grid_size=(grid_w, grid_h),
        slices=tuple((col * tile, row * tile, tile, tile) for row in range(grid_h) for col in range(grid_w)),
    )
    overview, slices = _slice_image(rgb, inst, hp)
    return _sliced_output(overview, slices, inst.grid_size, hp)


# ---------------------------------------------------------------------------------------------
# the families: clip.cpp's load_hparams settings, then mtmd.cpp's choice of preprocessor
# ---------------------------------------------------------------------------------------------


def _run(rgb: np.ndarray, hp: _Hparams, preprocessor: Callable[[np.ndarray, _Hparams], PreprocessedImage]) -> PreprocessedImage:
    _check_params(rgb, hp)
    result = preprocessor(rgb, hp)
    result.patch_size, result.n_merge = hp.patch_size, hp.n_merge
    return result


def preprocess_gemma3(rgb: np.ndarray, params: VisionParams) -> PreprocessedImage:
    """Gemma 3 (PROJECTOR_TYPE_GEMMA3): fixed image_size square, bilinear, letterboxed in black."""
    hp = _hparams(params, n_merge_default=4, image_resize_algo=ResizeAlgo.BILINEAR)
    return _run(rgb, hp, _fixed_size)


def preprocess_qwen_vl(rgb: np.ndarray, params: VisionParams) -> PreprocessedImage:
    """Qwen2-VL, Qwen2.5-VL, Qwen3-VL: smart resize to multiples of patch_size * n_merge within
    8..4096 tokens, bicubic. The tokens are (nx / (patch_size*n_merge)) x (ny / (patch_size*n_merge))."""
    hp = _hparams(params, n_merge_default=2, image_resize_algo=ResizeAlgo.BICUBIC)
    return _run(rgb, _limit_image_tokens(hp, params, 8, 4096), _dyn_size)


def preprocess_idefics3(rgb: np.ndarray, params: VisionParams) -> PreprocessedImage:
    """Idefics3 / SmolVLM: image_size tiles of the image resized to its longest edge, plus an overview."""
    hp = _hparams(params, n_merge_default=1, image_resize_algo=ResizeAlgo.LANCZOS)
    return _run(rgb, _limit_image_tokens(hp, params, None, None), _idefics3)


def preprocess_lfm2(rgb: np.ndarray, params: VisionParams) -> PreprocessedImage:
    """LFM2-VL: smart resize within 64..256 tokens, or 512x512 tiles plus a thumbnail; bilinear."""
    bilinear = ResizeAlgo.BILINEAR
    hp = _hparams(
        params, n_merge_default=1, image_resize_algo=bilinear, image_resize_algo_rf=bilinear, image_resize_algo_ov=bilinear
    )
    return _run(rgb, _limit_image_tokens(hp, params, 64, 256), _lfm2)


_LLAVA_PAD_COLOR = (122, 116, 104)  # the CLIP mean as bytes, clip.cpp's llava letterbox colour


def preprocess_llava(rgb: np.ndarray, params: VisionParams) -> PreprocessedImage:
    """LLaVA (mlp, mlp_norm, ldp, ldpv2 projectors): 1.5 pads to a square in the mean colour;
    1.6 (grid pinpoints) adds anyres tiles of the best pinpoint, letterboxed in black."""
    if params.grid_pinpoints:
        hp = _hparams(params, n_merge_default=1, image_pad_color=_LLAVA_PAD_COLOR, image_resize_algo=ResizeAlgo.BICUBIC)
        return _run(rgb, hp, _llava_uhd)
    hp = _hparams(params, n_merge_default=1, image_pad_color=_LLAVA_PAD_COLOR, image_pad_color_rf=_LLAVA_PAD_COLOR)
    return _run(rgb, hp, _fixed_size)


def preprocess_minicpmv(rgb: np.ndarray, params: VisionParams) -> PreprocessedImage:
    """MiniCPM-V (resampler): llava-uhd slicing without pinpoints, bicubic; an image that fits
    is stretched to image_size², a larger one gives an overview and a grid of slices."""
    return _run(rgb, _hparams(params, n_merge_default=1), _llava_uhd)


def preprocess_pixtral(rgb: np.ndarray, params: VisionParams) -> PreprocessedImage:
    """Pixtral / Mistral Small 3.x: smart resize within 8..1024 tokens, bicubic (n_merge 1 unless
    the GGUF has a spatial merge size)."""
    hp = _hparams(params, n_merge_default=1, image_resize_algo=ResizeAlgo.BICUBIC)
    return _run(rgb, _limit_image_tokens(hp, params, 8, 1024), _dyn_size)


def preprocess_gemma4(rgb: np.ndarray, params: VisionParams, unified: bool = False) -> PreprocessedImage:
    """Gemma 4 (gemma4v; ``unified`` for gemma4uv, whose patches are patch_size * n_merge with
    no merge): smart resize within 70..1120 tokens, bicubic."""
    hp = _hparams(params, n_merge_default=3, image_resize_algo=ResizeAlgo.BICUBIC)
    if unified:
        hp = replace(hp, patch_size=hp.patch_size * hp.n_merge, n_merge=1)
    return _run(rgb, _limit_image_tokens(hp, params, 70, 1120), _dyn_size)


def _gemma4_unified(rgb: np.ndarray, params: VisionParams) -> PreprocessedImage:
    return preprocess_gemma4(rgb, params, unified=True)


# clip.projector_type names (clip-impl.h's PROJECTOR_TYPE_NAMES) -> preprocessing
PREPROCESSORS: dict[str, Callable[[np.ndarray, VisionParams], PreprocessedImage]] = {
    "gemma3": preprocess_gemma3,
    "qwen2vl_merger": preprocess_qwen_vl,
    "qwen2.5vl_merger": preprocess_qwen_vl,
    "qwen3vl_merger": preprocess_qwen_vl,
    "idefics3": preprocess_idefics3,
    "lfm2": preprocess_lfm2,
    "mlp": preprocess_llava,
    "mlp_norm": preprocess_llava,
    "ldp": preprocess_llava,
    "ldpv2": preprocess_llava,
    "pixtral": preprocess_pixtral,
    "resampler": preprocess_minicpmv,
    "gemma4v": preprocess_gemma4,
    "gemma4uv": _gemma4_unified,
}


def preprocess_image(projector_type: str, rgb: np.ndarray, params: VisionParams) -> PreprocessedImage:
    """The encoder inputs for ``rgb`` (from :func:`load_image`) under the named projector type."""
    try:
        preprocessor = PREPROCESSORS[projector_type]
    except KeyError:
        raise MediaError(f"no image preprocessing for projector type {projector_type!r}") from None
    return preprocessor(rgb, params)
