"""Writes tests/data/quants/iq_quantize.fix: what ggml's i-quant quantizers write (ggml_quantize_chunk of
llama-cpp-python 0.3.36's build, the function llama-quantize calls) for rows of real weights and of
random data, with importance weights and, for the types ggml quantizes without them, with none.
rust/tensor/tests/quantize_iq.rs replays every section through the crate's quantizers.

Layout (little endian):
  b"FIQQ", u32 n_per_row
  u32 n_row_sets,  each: u32 n_rows, f32[n_rows * n_per_row]
  u32 n_weight_sets, each: f32[n_per_row]
  u32 n_sections,  each: u32 ggml type id, u32 row set, i32 weight set (-1: none), u8[n_rows * row_bytes]

Row sets: rows of the tiny llama's ffn_down (512 wide) and of its attn_q (two 256-wide rows side by side);
Gaussian rows with a few outliers; Laplacian rows; and edge rows (zeros, a constant, one non-zero value,
values near the smallest normal float, a row of one sign). Weight sets: the tiny llama's own imatrix for
those matrices (llama-imatrix's means, as llama-quantize loads them), random Gamma weights, and weights
with zero columns (a column the calibration text never reached).

Run from the repository root after tests/data/make_tiny_types.py:
PYTHONPATH=.venv/lib/python3.11/site-packages /work/bench-venv/bin/python rust/tensor/tests/gen_iq_quantize_fixtures.py
"""

import ctypes
import struct
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"
OUT = DATA / "quants" / "iq_quantize.fix"
N_PER_ROW = 512

LIB = Path(llama_cpp.__file__).parent / "lib"
BASE = ctypes.CDLL(str(LIB / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
BASE.ggml_quantize_init.argtypes = [ctypes.c_int]
BASE.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
BASE.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
BASE.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
BASE.ggml_row_size.restype = ctypes.c_size_t
BASE.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                     ctypes.c_int64, ctypes.c_void_p]
BASE.ggml_quantize_chunk.restype = ctypes.c_size_t

#: name -> ggml type id
TYPES = {"iq2_xxs": 16, "iq2_xs": 17, "iq3_xxs": 18, "iq1_s": 19, "iq3_s": 21, "iq2_s": 22, "iq1_m": 29}


def tensors(path: Path) -> dict[str, np.ndarray]:
    return {t.name: np.asarray(t.data, dtype=np.float32) for t in gguf.GGUFReader(path).tensors}


def imatrix_means(path: Path) -> dict[str, np.ndarray]:
    """llama-quantize's load_imatrix: the sums divided by the count."""
    t = tensors(path)
    return {k[: -len(".in_sum2")]: (v.reshape(-1) / t[k[: -len(".in_sum2")] + ".counts"].reshape(-1)[0]).astype(np.float32)
            for k, v in t.items() if k.endswith(".in_sum2")}


def row_sets(rng: np.random.Generator) -> list[np.ndarray]:
    w = tensors(DATA / "models" / "tiny-llama-f32.gguf")
    down = w["blk.0.ffn_down.weight"].reshape(-1, N_PER_ROW)[:8]
    q = w["blk.1.attn_q.weight"].reshape(-1, 256)[:16].reshape(8, N_PER_ROW)
    gauss = rng.standard_normal((8, N_PER_ROW)).astype(np.float32) * 0.02
    for r in gauss:
        r[rng.integers(0, N_PER_ROW, 3)] *= 12.0
    laplace = rng.laplace(0.0, 0.05, (6, N_PER_ROW)).astype(np.float32)
    edge = np.zeros((6, N_PER_ROW), dtype=np.float32)
    edge[1] = 0.5
    edge[2, 77] = -3.0
    edge[3] = rng.standard_normal(N_PER_ROW).astype(np.float32) * np.float32(1e-37)
    edge[4] = np.abs(rng.standard_normal(N_PER_ROW)).astype(np.float32)
    edge[5] = np.where(np.arange(N_PER_ROW) % 32 < 8, 0.0, rng.standard_normal(N_PER_ROW)).astype(np.float32)
    return [np.ascontiguousarray(s, dtype=np.float32) for s in (down, q, gauss, laplace, edge)]


def weight_sets(rng: np.random.Generator) -> list[np.ndarray]:
    means = imatrix_means(DATA / "imatrix" / "tiny-llama-f32.imatrix.gguf")
    down = means["blk.0.ffn_down.weight"]
    q = np.concatenate([means["blk.1.attn_q.weight"]] * 2)
    gamma = rng.gamma(0.7, 1.0, N_PER_ROW).astype(np.float32)
    holes = rng.gamma(2.0, 0.5, N_PER_ROW).astype(np.float32)
    holes[rng.integers(0, N_PER_ROW, 60)] = 0.0
    return [np.ascontiguousarray(s, dtype=np.float32) for s in (down, q, gamma, holes)]


#: (row set, weight set) pairs recorded with weights; every row set is also recorded without
WEIGHTED = [(0, 0), (1, 1), (2, 2), (3, 3), (4, 2), (4, 3), (2, 3)]


def quantize(tid: int, rows: np.ndarray, weights: np.ndarray | None) -> bytes:
    n_rows = rows.shape[0]
    out = ctypes.create_string_buffer(BASE.ggml_row_size(tid, N_PER_ROW) * n_rows)
    qw = None if weights is None else weights.ctypes.data_as(ctypes.c_void_p)
    size = BASE.ggml_quantize_chunk(tid, rows.ctypes.data_as(ctypes.c_void_p), out, 0, n_rows, N_PER_ROW, qw)
    assert size == len(out.raw)
    return out.raw


def main() -> None:
    rng = np.random.default_rng(27)
    rows, weights = row_sets(rng), weight_sets(rng)
    sections = []
    for tid in TYPES.values():
        BASE.ggml_quantize_init(tid)
        for r, w in WEIGHTED:
            sections.append(struct.pack("<IIi", tid, r, w) + quantize(tid, rows[r], weights[w]))
        if not BASE.ggml_quantize_requires_imatrix(tid):
            for r in range(len(rows)):
                sections.append(struct.pack("<IIi", tid, r, -1) + quantize(tid, rows[r], None))
    blob = b"FIQQ" + struct.pack("<I", N_PER_ROW)
    blob += struct.pack("<I", len(rows)) + b"".join(struct.pack("<I", len(r)) + r.tobytes() for r in rows)
    blob += struct.pack("<I", len(weights)) + b"".join(w.tobytes() for w in weights)
    blob += struct.pack("<I", len(sections)) + b"".join(sections)
    OUT.write_bytes(blob)
    print(f"{OUT}: {len(sections)} sections, {len(blob)} bytes")


if __name__ == "__main__":
    main()
