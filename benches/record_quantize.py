#!/usr/bin/env python3
"""Records what llama.cpp's quantizer writes for the tiny llama (tests/data/models/tiny-llama-f32.gguf),
with and without an importance matrix, for tests/test_cli_quantize_imatrix.py:
tests/data/quants/llama_quantize.json holds, per type, each tensor's type and the sha256 of its
bytes; and a few mixes (llama-quantize's per-tensor choices, not pure) of the tiny llama and the
tiny MoE (whose experts each take their own row of the imatrix), with each model's imatrix; and
llama-quantize's row-size fallbacks for Q1_0 and Q2_0 on tests/data/models/tiny-llama-oddrows-f32.gguf
(written here: tiny-llama's metadata and three small matrices of rows of 256, 96 and 48 values),
each tensor's type and bytes, or null where llama.cpp refuses (Q1_0 has no fallback type).

Everything goes through llama_model_quantize of llama-cpp-python 0.3.36 (llama.cpp's
llama-quantize minus its command line), with `pure` (every matrix in the type, llama.cpp's
row-size fallbacks aside) and 2 threads; the importance matrix is llama.cpp's own of the tiny llama
(tests/data/imatrix/tiny-llama-f32.imatrix.gguf, benches/record_imatrix.py), divided by its counts
as llama-quantize's load_imatrix does, passed as llama_model_quantize_params.imatrix.

  PYTHONPATH=.venv/lib/python3.11/site-packages:python /path/to/bench-venv/bin/python benches/record_quantize.py
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp as L
import numpy as np
from ferrollama.cli.inspect import read_header

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "data"))
from make_tiny_types import copy_fields  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
MODEL = DATA / "models" / "tiny-llama-f32.gguf"
IMATRIX = DATA / "imatrix" / "tiny-llama-f32.imatrix.gguf"
OUT = DATA / "quants" / "llama_quantize.json"
ODD_ROWS = DATA / "models" / "tiny-llama-oddrows-f32.gguf"
#: TYPE -> llama_ftype whose default tensor type it is (with pure, every matrix gets it)
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K": 12, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18,
          "IQ4_NL": 25, "IQ4_XS": 30, "Q1_0": 40, "Q2_0": 41}
#: the i-quants, by the preset whose default type each is (IQ2_M's is IQ2_S; IQ2_S's is IQ2_XS). With
#: pure, token_embd and output would get the type too, and llama.cpp's quantizer of IQ2_XXS, IQ2_XS and
#: IQ1_S aborts without importance weights (the imatrix has none for token_embd): both are Q8_0 here.
IQ_FTYPES = {"IQ2_XXS": 19, "IQ2_XS": 20, "IQ2_M": 29, "IQ3_XXS": 23, "IQ3_S": 26, "IQ1_S": 24, "IQ1_M": 31}
#: the i-quant presets llama-quantize writes without an imatrix (tensor_requires_imatrix is false for IQ3_S)
IQ_PLAIN = {"IQ3_S"}
Q8_0 = 8


def load_imatrix(path: Path) -> dict[str, np.ndarray]:
    """llama-quantize's load_imatrix: each matrix's sums divided by its counts (1 where a count is 0)."""
    tensors = {t.name: np.asarray(t.data, dtype=np.float32) for t in gguf.GGUFReader(path).tensors}
    out = {}
    for key, sums in tensors.items():
        if not key.endswith(".in_sum2"):
            continue
        name = key[: -len(".in_sum2")]
        counts = tensors[name + ".counts"].reshape(-1).astype(np.float32)
        rows = sums.reshape(len(counts), -1)
        out[name] = np.concatenate([r / c if c > 0 else np.ones_like(r) for r, c in zip(rows, counts)]).astype(np.float32)
    return out


def imatrix_param(imatrix: dict[str, np.ndarray]):
    """The NULL-terminated llama_model_imatrix_data array (and the buffers it points into)."""
    entries = (L.llama_model_imatrix_data * (len(imatrix) + 1))()
    keep = []
    for e, (name, values) in zip(entries, imatrix.items()):
        buf = np.ascontiguousarray(values, dtype=np.float32)
        keep += [name.encode(), buf]
        e.name = keep[-2]
        e.data = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        e.size = buf.size
    entries[len(imatrix)].name = None
    return entries, keep


#: mixes (not pure) with each model's own llama.cpp imatrix: (model, preset, llama_ftype)
MIXES = [("tiny-llama-f32", "Q4_K_M", 15), ("tiny-llama-f32", "Q2_K_S", 21), ("tiny-llama-f32", "Q3_K_M", 12),
         ("tiny-qwen3moe-f32", "Q4_K_M", 15), ("tiny-qwen3moe-f32", "Q5_K_S", 16),
         ("tiny-llama-f32", "IQ2_M", 29), ("tiny-llama-f32", "IQ3_M", 27), ("tiny-llama-f32", "IQ1_M", 31),
         ("tiny-llama-f32", "IQ3_XS", 22), ("tiny-qwen3moe-f32", "IQ2_XXS", 19),
         ("tiny-llama-f32", "Q1_0", 40),
         ("tiny-llama-f32", "Q2_0", 41)]
#: the row-size fallbacks recorded on ODD_ROWS (pure, no imatrix)
FALLBACKS = {"Q1_0": 40, "Q2_0": 41}


def write_odd_rows_model() -> None:
    """tiny-llama's metadata with matrices of 4 rows of 256 (a multiple of both blocks), 96 (of
    Q4_0's 32, not of 64 or 128) and 48 (of neither: F16) values, deterministic."""
    writer = gguf.GGUFWriter(str(ODD_ROWS), "llama")
    copy_fields(gguf.GGUFReader(MODEL), writer)
    writer.add_name("tiny-llama-oddrows")
    rng = np.random.default_rng(20261126)
    for name, cols in (("blk.0.attn_q.weight", 256), ("blk.0.ffn_down.weight", 96), ("blk.0.ffn_up.weight", 48)):
        writer.add_tensor(name, rng.standard_normal((4, cols)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class QuantizeFailed(RuntimeError):
    pass


def quantize(ftype: int, imatrix: dict[str, np.ndarray] | None, model: Path = MODEL, pure: bool = True,
             embd_and_output: int | None = None) -> dict[str, list[str]]:
    params = L.llama_model_quantize_default_params()
    params.nthread = 2
    params.ftype = ftype
    params.pure = pure
    if embd_and_output is not None:
        params.token_embedding_type = embd_and_output
        params.output_tensor_type = embd_and_output
    keep = None
    if imatrix is not None:
        entries, keep = imatrix_param(imatrix)
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(L.llama_model_imatrix_data))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.gguf"
        rc = L.llama_model_quantize(str(model).encode(), str(out).encode(), ctypes.byref(params))
        if rc != 0:
            raise QuantizeFailed(f"llama_model_quantize failed for ftype {ftype}")
        del keep
        return digests(out)


def digests(path: Path) -> dict[str, list[str]]:
    """{tensor name: [type, sha256 of its bytes]}, read with ferrollama's header reader (the gguf
    package does not know Q2_0)."""
    header = read_header(str(path))
    data = path.read_bytes()
    return {t.name: [t.type, hashlib.sha256(data[header.data_offset + t.offset:][:t.nbytes]).hexdigest()]
            for t in header.tensors}


def main() -> None:
    imatrix = load_imatrix(IMATRIX)
    record = {"model": MODEL.name, "imatrix": IMATRIX.name, "types": {}}
    for name, ftype in FTYPES.items():
        record["types"][name] = {"plain": quantize(ftype, None), "imatrix": quantize(ftype, imatrix)}
        print(name, "done")
    for name, ftype in IQ_FTYPES.items():
        record["types"][name] = {"imatrix": quantize(ftype, imatrix, embd_and_output=Q8_0), "embd_and_output": "Q8_0"}
        if name in IQ_PLAIN:
            record["types"][name]["plain"] = quantize(ftype, None, embd_and_output=Q8_0)
        print(name, "done")
    record["mixes"] = {}
    for model, preset, ftype in MIXES:
        path = DATA / "models" / f"{model}.gguf"
        own = load_imatrix(DATA / "imatrix" / f"{model}.imatrix.gguf")
        record["mixes"][f"{model} {preset}"] = quantize(ftype, own, path, pure=False)
        print(model, preset, "done")
    write_odd_rows_model()
    record["fallbacks"] = {}
    for name, ftype in FALLBACKS.items():
        try:
            record["fallbacks"][name] = quantize(ftype, None, ODD_ROWS)
        except QuantizeFailed:
            record["fallbacks"][name] = None
    OUT.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
