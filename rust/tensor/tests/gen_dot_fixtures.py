"""Writes tests/data/quants/vec_dot.fix and tiled.fix: llama.cpp's own x86 dot products and
k-quant matrix products, for the tensor crate's tests that the kernels reproduce them bit for
bit (tests/vec_dot.rs).

The numbers come from ggml's CPU backend as llama-cpp-python 0.3.36 builds it on an AVX-512
machine (the build that recorded tests/data/scenarios): `ggml_vec_dot_*` and the activation
quantizers `quantize_row_q8_0/_q8_1/_q8_K`, called through ctypes in its libggml-cpu.so.
Weight rows are real rows of the tiny models plus random blocks (every code value, random
scales); activations are a formula both sides compute exactly (`activation` below).

vec_dot.fix (little-endian): b"FVDX", u32 section count, then per section: u32 ggml type
id, u32 n (elements per row), u32 row count R, u32 activation count A, u32 activation seeds
(A), R weight rows (ggml bytes), A activation rows (ggml's quantized bytes), R x A f32
results (row-major: result[r * A + a]).

tiled.fix: the same layout under b"FTLX", the results those of ggml_mul_mat of the R rows
with the A = 8 activations (f32, quantized inside ggml), a product of 8 columns, which
ggml's CPU backend computes with its tiled k-quant kernel (ggml-cpu/tiled).

Run with a Python that has llama-cpp-python 0.3.36 and gguf, from the repository root:
PYTHONPATH=.venv/lib/python3.11/site-packages /work/bench-venv/bin/python rust/tensor/tests/gen_dot_fixtures.py
"""

import ctypes
import struct
from pathlib import Path

import numpy as np
import gguf
import llama_cpp

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "tests" / "data" / "models"
OUT = ROOT / "tests" / "data" / "quants" / "vec_dot.fix"
OUT_TILED = ROOT / "tests" / "data" / "quants" / "tiled.fix"

LIB = Path(llama_cpp.__file__).parent / "lib"
BASE = ctypes.CDLL(str(LIB / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
CPU = ctypes.CDLL(str(LIB / "libggml-cpu.so"))
CPU.ggml_cpu_init()


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class Tensor(ctypes.Structure):
    """struct ggml_tensor (ggml.h), up to the fields used here."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p)]


BASE.ggml_init.restype = ctypes.c_void_p
BASE.ggml_init.argtypes = [InitParams]
BASE.ggml_free.argtypes = [ctypes.c_void_p]
BASE.ggml_new_tensor_2d.restype = ctypes.c_void_p
BASE.ggml_new_tensor_2d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
BASE.ggml_mul_mat.restype = ctypes.c_void_p
BASE.ggml_mul_mat.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
BASE.ggml_new_graph.restype = ctypes.c_void_p
BASE.ggml_new_graph.argtypes = [ctypes.c_void_p]
BASE.ggml_build_forward_expand.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
CPU.ggml_graph_compute_with_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]

# name, ggml type id, vec_dot function, activation type, block elements, block bytes,
# byte offsets of the f16 scales (overwritten with sane values in random blocks)
TYPES = [
    ("q8_0", 8, "ggml_vec_dot_q8_0_q8_0", "q8_0", 32, 34, [0]),
    ("q4_0", 2, "ggml_vec_dot_q4_0_q8_0", "q8_0", 32, 18, [0]),
    ("q4_1", 3, "ggml_vec_dot_q4_1_q8_1", "q8_1", 32, 20, [0, 2]),
    ("q5_0", 6, "ggml_vec_dot_q5_0_q8_0", "q8_0", 32, 22, [0]),
    ("q5_1", 7, "ggml_vec_dot_q5_1_q8_1", "q8_1", 32, 24, [0, 2]),
    ("iq4_nl", 20, "ggml_vec_dot_iq4_nl_q8_0", "q8_0", 32, 18, [0]),
    ("q2_k", 10, "ggml_vec_dot_q2_K_q8_K", "q8_K", 256, 84, [80, 82]),
    ("q3_k", 11, "ggml_vec_dot_q3_K_q8_K", "q8_K", 256, 110, [108]),
    ("q4_k", 12, "ggml_vec_dot_q4_K_q8_K", "q8_K", 256, 144, [0, 2]),
    ("q5_k", 13, "ggml_vec_dot_q5_K_q8_K", "q8_K", 256, 176, [0, 2]),
    ("q6_k", 14, "ggml_vec_dot_q6_K_q8_K", "q8_K", 256, 210, [208]),
    ("iq4_xs", 23, "ggml_vec_dot_iq4_xs_q8_K", "q8_K", 256, 136, [0]),
]
ACT_BYTES = {"q8_0": (32, 34), "q8_1": (32, 36), "q8_K": (256, 292)}
SEEDS = [0, 1, 2]


def activation(n: int, seed: int) -> np.ndarray:
    """Exact in f32 on both sides: integers, one division by 250, one power-of-two-ish
    scale, every 37th value four times larger."""
    i = np.arange(n, dtype=np.int64)
    v = ((i * 7919 + seed * 104729 + 17) % 2001).astype(np.float32) - np.float32(1000)
    x = v / np.float32(250) * np.float32([1.0, 0.0625, 3.0][seed % 3])
    return np.where((i + seed) % 37 == 0, x * np.float32(4), x).astype(np.float32)


def quantize(act: str, x: np.ndarray) -> bytes:
    qk, size = ACT_BYTES[act]
    out = ctypes.create_string_buffer(len(x) // qk * size)
    fn = getattr(CPU, f"quantize_row_{act}")
    fn(x.ctypes.data_as(ctypes.c_void_p), out, ctypes.c_int64(len(x)))
    return out.raw


def vec_dot(fn_name: str, n: int, w: bytes, xq: bytes) -> float:
    s = ctypes.c_float()
    fn = getattr(CPU, fn_name)
    fn(ctypes.c_int(n), ctypes.byref(s), ctypes.c_size_t(0), ctypes.c_char_p(w), ctypes.c_size_t(0),
       ctypes.c_char_p(xq), ctypes.c_size_t(0), ctypes.c_int(1))
    return s.value


def mul_mat(tid: int, n: int, rows: list[bytes], xs: list[np.ndarray]) -> np.ndarray:
    """ggml_mul_mat(W, X) on the CPU backend: out[t][r] = row r . activation t."""
    ctx = BASE.ggml_init(InitParams(64 << 20, None, False))
    w = BASE.ggml_new_tensor_2d(ctx, tid, n, len(rows))
    x = BASE.ggml_new_tensor_2d(ctx, 0, n, len(xs))
    wbytes = b"".join(rows)
    ctypes.memmove(Tensor.from_address(w).data, wbytes, len(wbytes))
    xbytes = np.concatenate(xs).astype("<f4").tobytes()
    ctypes.memmove(Tensor.from_address(x).data, xbytes, len(xbytes))
    y = BASE.ggml_mul_mat(ctx, w, x)
    graph = BASE.ggml_new_graph(ctx)
    BASE.ggml_build_forward_expand(graph, y)
    assert CPU.ggml_graph_compute_with_ctx(ctx, graph, 1) == 0
    out = np.ctypeslib.as_array(ctypes.cast(Tensor.from_address(y).data, ctypes.POINTER(ctypes.c_float)),
                                shape=(len(xs) * len(rows),)).copy()
    BASE.ggml_free(ctx)
    return out.reshape(len(xs), len(rows))


def tiled_section(ty: tuple, n: int, rows: list[bytes]) -> bytes:
    _, tid, _, act, _, _, _ = ty
    seeds = list(range(8))
    xs = [activation(n, s) for s in seeds]
    out = mul_mat(tid, n, rows, xs)  # [token][row]
    results = [float(out[a][r]) for r in range(len(rows)) for a in range(len(seeds))]
    head = struct.pack("<IIII", tid, n, len(rows), len(seeds)) + struct.pack(f"<{len(seeds)}I", *seeds)
    acts = b"".join(quantize(act, x) for x in xs)
    return head + b"".join(rows) + acts + struct.pack(f"<{len(results)}f", *results)


def model_rows(name: str, tensor: str, rows: list[int], nbytes: int) -> list[bytes]:
    reader = gguf.GGUFReader(MODELS / f"tiny-llama-{name}.gguf")
    t = next(t for t in reader.tensors if t.name == tensor)
    data = np.array(t.data)
    return [data[r].tobytes()[:nbytes] for r in rows]


def random_rows(rng: np.random.Generator, count: int, blocks: int, size: int, scale_offs: list[int]) -> list[bytes]:
    rows = []
    for _ in range(count):
        b = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
        for o in scale_offs:
            # |scale| between about 2^-7 and 2^1, either sign
            h = (0x2000 + rng.integers(0, 0x2400, size=blocks)) | (rng.integers(0, 2, size=blocks) << 15)
            b[:, o] = h & 0xFF
            b[:, o + 1] = h >> 8
        rows.append(b.tobytes())
    return rows


def section(ty: tuple, n: int, rows: list[bytes]) -> bytes:
    name, tid, fn_name, act, _, _, _ = ty
    acts = [quantize(act, activation(n, s)) for s in SEEDS]
    results = [vec_dot(fn_name, n, w, xq) for w in rows for xq in acts]
    head = struct.pack("<IIII", tid, n, len(rows), len(acts)) + struct.pack(f"<{len(SEEDS)}I", *SEEDS)
    return head + b"".join(rows) + b"".join(acts) + struct.pack(f"<{len(results)}f", *results)


def dot_sections(types: list[tuple], random_blocks) -> list[bytes]:  # noqa: ANN001
    """Two sections per type: 256 elements from a 256-column matrix; then an odd number of
    32-element blocks (the pairing of IQ4_NL's and MXFP4's kernels leaves one) or two
    super-blocks, from the 512-column ffn_down. Each has model rows and four random ones
    (`random_blocks(type, count, blocks)`)."""
    sections = []
    for ty in types:
        name, _, _, _, qk, size, _ = ty
        for tensor, n, picks in [("blk.0.attn_q.weight", 256, [0, 1, 2, 77, 200, 255]),
                                 ("blk.1.ffn_down.weight", 288 if qk == 32 else 512, [3, 100, 255])]:
            nb = n // qk
            rows = model_rows(name, tensor, picks, nb * size) + random_blocks(ty, 4, nb)
            sections.append(section(ty, n, rows))
    return sections


def main() -> None:
    rng = np.random.default_rng(20240611)
    sections = dot_sections(TYPES, lambda ty, count, nb: random_rows(rng, count, nb, ty[5], ty[6]))
    OUT.write_bytes(b"FVDX" + struct.pack("<I", len(sections)) + b"".join(sections))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(sections)} sections)")

    # The tiled product: the k-quants and IQ4_XS, two super-blocks per row, 8 tokens.
    tiled = []
    for ty in TYPES:
        name, _, _, _, qk, size, offs = ty
        if qk != 256:
            continue
        rows = model_rows(name, "blk.1.ffn_down.weight", [3, 50, 100, 200, 255], 2 * size) + random_rows(rng, 4, 2, size, offs)
        tiled.append(tiled_section(ty, 512, rows))
    OUT_TILED.write_bytes(b"FTLX" + struct.pack("<I", len(tiled)) + b"".join(tiled))
    print(f"wrote {OUT_TILED} ({OUT_TILED.stat().st_size} bytes, {len(tiled)} sections)")


if __name__ == "__main__":
    main()
