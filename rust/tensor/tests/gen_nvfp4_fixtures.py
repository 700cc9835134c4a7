"""Writes the NVFP4 fixtures, recorded from llama-cpp-python 0.3.36 built on this AVX2 machine
(the build of the tiny models' records), in the layouts of gen_dot_fixtures.py and
gen_lowbit_fixtures.py:

- nvfp4_vec_dot.fix (b"FVDX"): ggml_vec_dot_nvfp4_q8_0 (AVX2) of rows of
  tiny-llama-nvfp4 and random rows (every code value, every scale byte) with Q8_0 activations;
- nvfp4_mul_mat.fix (b"FTLX", tiled.fix's layout): ggml_mul_mat of such rows with 8
  activation rows, what the CPU backend computes for a product of several tokens (it neither
  repacks NVFP4 nor takes it through its tiled product: the same vec_dot);
- nvfp4_dequant.fix (b"FDQX"): random rows and gguf.quants.dequantize's values;
- nvfp4_quantize.fix (b"FQNX", u32 row count, u32 n, then per row n f32 values and ggml's
  bytes): quantize_row_nvfp4_ref (through ggml_quantize_chunk) of random rows at scales from
  UE4M3's subnormals to past its largest value, with zero, tied and signed sub-blocks.

Run from the repository root after tests/data/make_tiny_types.py models NVFP4:
PYTHONPATH=.venv/lib/python3.11/site-packages /work/bench-venv/bin/python rust/tensor/tests/gen_nvfp4_fixtures.py
"""

import ctypes
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gen_dot_fixtures as G  # noqa: E402
import gen_lowbit_fixtures as LB  # noqa: E402

QUANTS = G.ROOT / "tests" / "data" / "quants"
NVFP4_ID = 40


def any_scales(rng: np.random.Generator, b: np.ndarray) -> None:
    """Random blocks keep random scale bytes: every UE4M3 code, the sign bit and 0x7F too."""


TYPE = ("nvfp4", NVFP4_ID, "ggml_vec_dot_nvfp4_q8_0", "q8_0", 64, 36, any_scales)


def quantize_rows(values: np.ndarray) -> bytes:
    G.BASE.ggml_row_size.restype = ctypes.c_size_t
    G.BASE.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    G.BASE.ggml_quantize_chunk.restype = ctypes.c_size_t
    G.BASE.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                           ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    rows, n = values.shape
    src = np.ascontiguousarray(values, dtype=np.float32)
    out = ctypes.create_string_buffer(rows * G.BASE.ggml_row_size(NVFP4_ID, n))
    G.BASE.ggml_quantize_chunk(NVFP4_ID, src.ctypes.data, out, 0, rows, n, None)
    return out.raw


def quantize_cases(rng: np.random.Generator, n: int) -> np.ndarray:
    """Rows at scales 2^-14 .. 2^12 (UE4M3 subnormals, normals, saturation at 448 * 6), one
    with zero sub-blocks, one of values on the E2M1 grid (ties between levels), one mixed."""
    rows = [rng.normal(size=n) * np.float32(2.0 ** e) for e in range(-14, 13, 2)]
    zeros = rng.normal(size=n)
    zeros[16:48] = 0.0
    rows.append(zeros)
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)
    ties = rng.choice(grid, size=n) * rng.choice([-1.0, 1.0], size=n)
    ties[::16] = 6.0  # every sub-block's amax 6: scale 1, midpoints tie
    ties[1::16] = 1.25
    ties[2::16] = -2.5
    rows.append(ties)
    rows.append(rng.normal(size=n) * np.exp(rng.normal(size=n) * 3))
    return np.array(rows, dtype=np.float32)


def main() -> None:
    rng = np.random.default_rng(20261126)
    random_rows = lambda ty, count, nb: LB.random_rows(rng, count, nb, ty[5], ty[6])  # noqa: E731
    sections = G.dot_sections([TYPE], random_rows)
    out = QUANTS / "nvfp4_vec_dot.fix"
    out.write_bytes(b"FVDX" + struct.pack("<I", len(sections)) + b"".join(sections))
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(sections)} sections)")

    rows = G.model_rows("nvfp4", "blk.1.ffn_down.weight", [3, 50, 100, 200, 255], 8 * 36) + random_rows(TYPE, 4, 8)
    out = QUANTS / "nvfp4_mul_mat.fix"
    out.write_bytes(b"FTLX" + struct.pack("<I", 1) + G.tiled_section(TYPE, 512, rows))
    print(f"wrote {out} ({out.stat().st_size} bytes)")

    dequant = LB.dequant_section(TYPE, random_rows(TYPE, 8, 8), 512)
    out = QUANTS / "nvfp4_dequant.fix"
    out.write_bytes(b"FDQX" + struct.pack("<I", 1) + dequant)
    print(f"wrote {out} ({out.stat().st_size} bytes)")

    n = 256
    values = quantize_cases(rng, n)
    q = quantize_rows(values)
    rb = len(q) // len(values)
    body = b"".join(values[r].astype("<f4").tobytes() + q[r * rb:(r + 1) * rb] for r in range(len(values)))
    out = QUANTS / "nvfp4_quantize.fix"
    out.write_bytes(b"FQNX" + struct.pack("<II", len(values), n) + body)
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
