"""Writes the dequantization fixtures of the tensor crate's tests.

For every tiny model tests/data/models/tiny-llama-TYPE.gguf, a few rows of a few weight
tensors are dequantized with the `gguf` package (gguf.quants.dequantize, the Python
reference of ggml's dequantize_row_*) and written to tests/data/quants/TYPE.fix. The Rust
tests read the same rows from the model and must reproduce these floats bit for bit.

File format (little-endian): b"FQFX", u32 section count, then per section:
u32 name length, name (utf-8), u32 row count, u32 columns, u32 row indices, f32 values.

Run from the repository root: .venv/bin/python rust/tensor/tests/gen_fixtures.py
"""

import struct
from pathlib import Path

import numpy as np
import gguf
from gguf import quants

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "tests" / "data" / "models"
OUT = ROOT / "tests" / "data" / "quants"
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
         "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "mxfp4", "nvfp4", "tq1_0", "tq2_0", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"]
# (tensor, rows): a 256-column matrix, the 512-column ffn_down, and the embeddings.
PICKS = [("blk.0.attn_q.weight", [0, 1, 77]),
         ("blk.1.ffn_down.weight", [3, 255]),
         ("token_embd.weight", [0, 511])]


def section(reader: gguf.GGUFReader, name: str, rows: list[int]) -> bytes:
    t = next(t for t in reader.tensors if t.name == name)
    data = np.array(t.data)
    values = quants.dequantize(data, t.tensor_type).astype(np.float32)
    cols = int(t.shape[0])
    values = values.reshape(-1, cols)[rows]
    head = struct.pack("<I", len(name)) + name.encode() + struct.pack("<II", len(rows), cols)
    return head + struct.pack(f"<{len(rows)}I", *rows) + values.astype("<f4").tobytes()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for ty in TYPES:
        reader = gguf.GGUFReader(MODELS / f"tiny-llama-{ty}.gguf")
        body = b"".join(section(reader, name, rows) for name, rows in PICKS)
        (OUT / f"{ty}.fix").write_bytes(b"FQFX" + struct.pack("<I", len(PICKS)) + body)
        print(f"{ty}: {len(body) + 8} bytes")


if __name__ == "__main__":
    main()
