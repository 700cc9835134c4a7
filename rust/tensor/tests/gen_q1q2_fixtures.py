"""Writes the fixtures of Q1_0 and Q2_0 (tests/data/quants/q1q2_*.fix) from ggml as
llama-cpp-python 0.3.36 builds it on this AVX2 machine, called through ctypes:

q1q2_vec_dot.fix (vec_dot.fix's layout, see gen_dot_fixtures.py, under b"FVDX"): the dot
    products llama.cpp runs on x86, ggml_vec_dot_q1_0_q8_0 (its AVX2 kernel) and
    ggml_vec_dot_q2_0_q8_0 (x86 has none: the generic C one), of rows of the tiny models and
    random rows against activations quantized by ggml's quantize_row_q8_0. Two sections per
    type, of 2 and 3 blocks (Q1_0) and of 4 and 7 blocks (Q2_0: a kernel's group of four blocks
    and the three left over).
q1q2_dequant.fix (lowbit_dequant.fix's layout, b"FDQX"): random rows (every code value, sane
    scales) and dequantize_row_q1_0 / dequantize_row_q2_0's values.
q1_0.fix, q2_0.fix (gen_fixtures.py's layout, b"FQFX"): its rows of the tiny models and their
    values by dequantize_row_q1_0 / dequantize_row_q2_0 (the gguf package has no dequantizer
    for these types).
q1q2_quantize.fix (b"FQZX", u32 section count; per section u32 type id, u32 n, u32 rows R,
    then R x n f32 values, n f32 importance weights, R rows by quantize_row_*_ref, R rows by
    quantize_q1_0 / quantize_q2_0 with the importance weights): random rows and rows of edge
    cases (zeros, -0.0, ties of roundf, values far below the f16 range).

The gguf package (0.19) does not know Q2_0, so the tiny models' rows are read with
ferrollama's own header reader. Run from the repository root after
tests/data/make_tiny_types.py models Q1_0 Q2_0:
PYTHONPATH=.venv/lib/python3.11/site-packages:python /work/bench-venv/bin/python rust/tensor/tests/gen_q1q2_fixtures.py
"""

import ctypes
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gen_dot_fixtures as G  # noqa: E402
from gen_lowbit_fixtures import f16_scale_at, random_rows  # noqa: E402
from gen_fixtures import PICKS  # noqa: E402
from ferrollama.cli.inspect import read_header  # noqa: E402

QUANTS = G.ROOT / "tests" / "data" / "quants"
OUT = QUANTS / "q1q2_vec_dot.fix"
OUT_DEQUANT = QUANTS / "q1q2_dequant.fix"
OUT_QUANTIZE = QUANTS / "q1q2_quantize.fix"

# name, ggml type id, vec_dot function, activation type, block elements, block bytes, how
# random blocks get sane scales (gen_lowbit_fixtures.TYPES's layout); then the two row lengths
TYPES = [
    ("q1_0", 41, "ggml_vec_dot_q1_0_q8_0", "q8_0", 128, 18, f16_scale_at(0)),
    ("q2_0", 42, "ggml_vec_dot_q2_0_q8_0", "q8_0", 64, 18, f16_scale_at(0)),
]
LENGTHS = {"q1_0": (256, 384), "q2_0": (256, 448)}

for _fn in ("quantize_row_q1_0_ref", "quantize_row_q2_0_ref", "dequantize_row_q1_0", "dequantize_row_q2_0"):
    getattr(G.BASE, _fn).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
for _fn in ("quantize_q1_0", "quantize_q2_0"):
    getattr(G.BASE, _fn).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    getattr(G.BASE, _fn).restype = ctypes.c_size_t


def model_rows(name: str, tensor: str, rows: list[int], nbytes: int | None = None) -> list[bytes]:
    """Rows of a tiny model's tensor (their first `nbytes`)."""
    path = G.MODELS / f"tiny-llama-{name}.gguf"
    header = read_header(str(path))
    t = next(t for t in header.tensors if t.name == tensor)
    data = path.read_bytes()[header.data_offset + t.offset:][:t.nbytes]
    row_bytes = t.nbytes // (t.n_elements // t.shape[0])
    return [data[r * row_bytes:r * row_bytes + (nbytes or row_bytes)] for r in rows]


def dequantize(name: str, data: bytes, n: int) -> np.ndarray:
    out = np.zeros(n, dtype="<f4")
    getattr(G.BASE, f"dequantize_row_{name}")(ctypes.c_char_p(data), out.ctypes.data, n)
    return out


def model_fix(name: str) -> bytes:
    """gen_fixtures.py's sections of a tiny model, values by ggml's dequantizer."""
    body = b""
    for tensor, rows in PICKS:
        data = model_rows(name, tensor, rows)
        cols = len(data[0]) // 18 * {"q1_0": 128, "q2_0": 64}[name]
        values = dequantize(name, b"".join(data), len(rows) * cols)
        body += struct.pack("<I", len(tensor)) + tensor.encode() + struct.pack("<II", len(rows), cols)
        body += struct.pack(f"<{len(rows)}I", *rows) + values.tobytes()
    return b"FQFX" + struct.pack("<I", len(PICKS)) + body


def dot_sections(rng: np.random.Generator) -> list[bytes]:
    sections = []
    for ty in TYPES:
        name, _, _, _, qk, size, scales = ty
        for tensor, n, picks in zip(["blk.0.attn_q.weight", "blk.1.ffn_down.weight"], LENGTHS[name],
                                    [[0, 1, 2, 77, 200, 255], [3, 100, 255]]):
            nb = n // qk
            rows = model_rows(name, tensor, picks, nb * size) + random_rows(rng, 4, nb, size, scales)
            sections.append(G.section(ty, n, rows))
    return sections


def dequant_section(ty: tuple, rows: list[bytes], n: int) -> bytes:
    name, tid = ty[0], ty[1]
    data = b"".join(rows)
    return struct.pack("<III", tid, n, len(rows)) + data + dequantize(name, data, len(rows) * n).tobytes()


def edge_rows(qk: int) -> np.ndarray:
    """Blocks of edge cases, one per row of 2 blocks: zeros (and -0.0), exact halves of the
    maximum (roundf's ties), a maximum far below f16's range, one value alone."""
    halves = np.tile(np.float32([2.0, 1.0, -1.0, -0.0, 0.5, -0.5, 0.0, -2.0]), qk // 8)
    zeros = np.where(np.arange(qk) % 2 == 0, np.float32(0.0), np.float32(-0.0))
    tiny = halves * np.float32(1e-9)
    lone = np.zeros(qk, dtype=np.float32)
    lone[qk // 3] = -3.5
    return np.stack([np.concatenate(p) for p in ([zeros, halves], [tiny, lone], [-halves, zeros])]).astype(np.float32)


def quantize_section(ty: tuple, rng: np.random.Generator) -> bytes:
    name, tid, qk, size = ty[0], ty[1], ty[4], ty[5]
    n = 2 * qk
    values = np.concatenate([edge_rows(qk), (rng.standard_normal((5, n)) * rng.uniform(0.01, 3.0, (5, 1)))])
    values = np.ascontiguousarray(values, dtype=np.float32)
    weights = np.ascontiguousarray(rng.uniform(0.0, 4.0, n), dtype=np.float32)
    ref = ctypes.create_string_buffer(len(values) * n // qk * size)
    getattr(G.BASE, f"quantize_row_{name}_ref")(values.ctypes.data, ref, values.size)
    weighted = ctypes.create_string_buffer(len(ref))
    getattr(G.BASE, f"quantize_{name}")(values.ctypes.data, weighted, len(values), n, weights.ctypes.data)
    head = struct.pack("<III", tid, n, len(values))
    return head + values.astype("<f4").tobytes() + weights.astype("<f4").tobytes() + ref.raw + weighted.raw


def main() -> None:
    rng = np.random.default_rng(20261126)
    sections = dot_sections(rng)
    OUT.write_bytes(b"FVDX" + struct.pack("<I", len(sections)) + b"".join(sections))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(sections)} sections)")

    dequant = [dequant_section(ty, random_rows(rng, 4, 512 // ty[4], ty[5], ty[6]), 512) for ty in TYPES]
    OUT_DEQUANT.write_bytes(b"FDQX" + struct.pack("<I", len(dequant)) + b"".join(dequant))
    print(f"wrote {OUT_DEQUANT} ({OUT_DEQUANT.stat().st_size} bytes)")

    for ty in TYPES:
        out = QUANTS / f"{ty[0]}.fix"
        out.write_bytes(model_fix(ty[0]))
        print(f"wrote {out} ({out.stat().st_size} bytes)")

    quantized = [quantize_section(ty, rng) for ty in TYPES]
    OUT_QUANTIZE.write_bytes(b"FQZX" + struct.pack("<I", len(quantized)) + b"".join(quantized))
    print(f"wrote {OUT_QUANTIZE} ({OUT_QUANTIZE.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
