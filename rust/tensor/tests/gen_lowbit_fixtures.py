"""Writes the dot-product fixtures of the tensor types added in issue 27 (MXFP4, ternary,
i-quants): tests/data/quants/lowbit_vec_dot.fix and lowbit_repacked.fix.

Unlike vec_dot.fix (gen_dot_fixtures.py, recorded on an AVX-512 machine), these numbers come
from llama-cpp-python 0.3.36 built on this AVX2 machine: ggml's AVX2 `ggml_vec_dot_*` of
each type against its activation type, and for MXFP4 (which llama.cpp repacks on AVX2 when a
matrix has a multiple of 8 rows) its repacked kernel `ggml_gemv_mxfp4_8x8_q8_0` over groups
of 8 rows. The file layout is vec_dot.fix's (see gen_dot_fixtures.py), under b"FVDX" and
b"FRPX". Rows: real rows of the tiny models plus random blocks (every code value, sane scales).
Also lowbit_dequant.fix: random blocks of each type and gguf.quants.dequantize's values; and
lowbit_tiled.fix (tiled.fix's layout): ggml_mul_mat of rows of the types llama.cpp takes
through its tiled product with 8 activation rows.

Run from the repository root after tests/data/make_tiny_types.py models:
/work/bench-venv/bin/python rust/tensor/tests/gen_lowbit_fixtures.py
"""

import ctypes
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gen_dot_fixtures as G  # noqa: E402

OUT = G.ROOT / "tests" / "data" / "quants" / "lowbit_vec_dot.fix"
OUT_REPACKED = G.ROOT / "tests" / "data" / "quants" / "lowbit_repacked.fix"
OUT_TILED = G.ROOT / "tests" / "data" / "quants" / "lowbit_tiled.fix"
OUT_DEQUANT = G.ROOT / "tests" / "data" / "quants" / "lowbit_dequant.fix"


def mxfp4_scales(rng: np.random.Generator, b: np.ndarray) -> None:
    """E8M0 exponents whose halved scale lies between 2^-11 and 2^9."""
    b[:, 0] = rng.integers(117, 138, size=len(b))


def f16_scale_at(offset: int):  # noqa: ANN201
    """Random blocks' f16 scale at `offset`: |d| between about 2^-7 and 2^1, either sign."""
    def fix(rng: np.random.Generator, b: np.ndarray) -> None:
        h = (0x2000 + rng.integers(0, 0x2400, size=len(b))) | (rng.integers(0, 2, size=len(b)) << 15)
        b[:, offset] = h & 0xFF
        b[:, offset + 1] = h >> 8
    return fix


def iq1_m_scale(rng: np.random.Generator, b: np.ndarray) -> None:
    """IQ1_M's f16 d, spread over the top nibbles of its four scale words (bytes 49, 51, 53,
    55), sane as f16_scale_at's."""
    h = (0x2000 + rng.integers(0, 0x2400, size=len(b))) | (rng.integers(0, 2, size=len(b)) << 15)
    for k in range(4):
        b[:, 49 + 2 * k] = (b[:, 49 + 2 * k] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4)


# name, ggml type id, vec_dot function, activation type, block elements, block bytes, how
# random blocks get sane scales
TYPES = [
    ("mxfp4", 39, "ggml_vec_dot_mxfp4_q8_0", "q8_0", 32, 17, mxfp4_scales),
    ("tq1_0", 34, "ggml_vec_dot_tq1_0_q8_K", "q8_K", 256, 54, f16_scale_at(52)),
    ("tq2_0", 35, "ggml_vec_dot_tq2_0_q8_K", "q8_K", 256, 66, f16_scale_at(64)),
    ("iq2_xxs", 16, "ggml_vec_dot_iq2_xxs_q8_K", "q8_K", 256, 66, f16_scale_at(0)),
    ("iq2_xs", 17, "ggml_vec_dot_iq2_xs_q8_K", "q8_K", 256, 74, f16_scale_at(0)),
    ("iq2_s", 22, "ggml_vec_dot_iq2_s_q8_K", "q8_K", 256, 82, f16_scale_at(0)),
    ("iq3_xxs", 18, "ggml_vec_dot_iq3_xxs_q8_K", "q8_K", 256, 98, f16_scale_at(0)),
    ("iq3_s", 21, "ggml_vec_dot_iq3_s_q8_K", "q8_K", 256, 110, f16_scale_at(0)),
    ("iq1_s", 19, "ggml_vec_dot_iq1_s_q8_K", "q8_K", 256, 50, f16_scale_at(0)),
    ("iq1_m", 29, "ggml_vec_dot_iq1_m_q8_K", "q8_K", 256, 56, iq1_m_scale),
]
#: the types llama.cpp multiplies with its tiled product from 8 tokens
TILED = ["iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"]


def random_rows(rng: np.random.Generator, count: int, blocks: int, size: int, scales) -> list[bytes]:  # noqa: ANN001
    rows = []
    for _ in range(count):
        b = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
        scales(rng, b)
        rows.append(b.tobytes())
    return rows


def mxfp4_interleaved(rows: list[bytes], nb: int) -> bytes:
    """Eight MXFP4 rows as repack.cpp's block_mxfp4x8 (make_block_mxfp4x8, interleave 8): per
    block index, the eight exponents, then 16 chunks of 8 bytes, chunk i from row i % 8 at
    byte 8 * (i // 8) of its quants."""
    out = bytearray()
    for b in range(nb):
        blocks = [r[17 * b:17 * (b + 1)] for r in rows]
        out += bytes(blk[0] for blk in blocks)
        for i in range(16):
            qs = blocks[i % 8][1:]
            out += qs[8 * (i // 8):8 * (i // 8) + 8]
    return bytes(out)


def gemv_mxfp4(n: int, rows: list[bytes], xq: bytes) -> list[float]:
    """ggml_gemv_mxfp4_8x8_q8_0 of eight rows with one activation row."""
    s = (ctypes.c_float * 8)()
    packed = mxfp4_interleaved(rows, n // 32)
    G.CPU.ggml_gemv_mxfp4_8x8_q8_0(ctypes.c_int(n), s, ctypes.c_size_t(8), ctypes.c_char_p(packed),
                                   ctypes.c_char_p(xq), ctypes.c_int(1), ctypes.c_int(8))
    return list(s)


def repacked_section(n: int, rows: list[bytes]) -> bytes:
    assert len(rows) % 8 == 0
    acts = [G.quantize("q8_0", G.activation(n, s)) for s in G.SEEDS]
    per_act = [sum((gemv_mxfp4(n, rows[g:g + 8], xq) for g in range(0, len(rows), 8)), []) for xq in acts]
    results = [per_act[a][r] for r in range(len(rows)) for a in range(len(acts))]
    head = struct.pack("<IIII", 39, n, len(rows), len(acts)) + struct.pack(f"<{len(G.SEEDS)}I", *G.SEEDS)
    return head + b"".join(rows) + b"".join(acts) + struct.pack(f"<{len(results)}f", *results)


def dequant_section(ty: tuple, rows: list[bytes], n: int) -> bytes:
    """Random rows and their values by gguf.quants.dequantize (b"FDQX" sections: u32 type id,
    u32 n, u32 row count, the rows, then the f32 values)."""
    _, tid, _, _, _, _, _ = ty
    data = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), -1)
    values = G.gguf.quants.dequantize(data, G.gguf.GGMLQuantizationType(tid)).astype("<f4")
    return struct.pack("<III", tid, n, len(rows)) + data.tobytes() + values.tobytes()


def main() -> None:
    rng = np.random.default_rng(20261125)
    sections = G.dot_sections(TYPES, lambda ty, count, nb: random_rows(rng, count, nb, ty[5], ty[6]))
    OUT.write_bytes(b"FVDX" + struct.pack("<I", len(sections)) + b"".join(sections))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(sections)} sections)")

    dequant = [dequant_section(ty, random_rows(rng, 4, 512 // ty[4], ty[5], ty[6]), 512) for ty in TYPES]
    OUT_DEQUANT.write_bytes(b"FDQX" + struct.pack("<I", len(dequant)) + b"".join(dequant))
    print(f"wrote {OUT_DEQUANT} ({OUT_DEQUANT.stat().st_size} bytes)")

    tiled = []
    for ty in (t for t in TYPES if t[0] in TILED):
        rows = G.model_rows(ty[0], "blk.1.ffn_down.weight", [3, 50, 100, 200, 255], 2 * ty[5])
        tiled.append(G.tiled_section(ty, 512, rows + random_rows(rng, 4, 2, ty[5], ty[6])))
    OUT_TILED.write_bytes(b"FTLX" + struct.pack("<I", len(tiled)) + b"".join(tiled))
    print(f"wrote {OUT_TILED} ({OUT_TILED.stat().st_size} bytes, {len(tiled)} sections)")

    model = G.model_rows("mxfp4", "blk.1.ffn_down.weight", list(range(16, 24)), 16 * 17)
    repacked = [repacked_section(512, model + random_rows(rng, 8, 16, 17, mxfp4_scales))]
    OUT_REPACKED.write_bytes(b"FRPX" + struct.pack("<I", len(repacked)) + b"".join(repacked))
    print(f"wrote {OUT_REPACKED} ({OUT_REPACKED.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
