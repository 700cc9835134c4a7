#!/usr/bin/env python3
"""Records llama-quantize's per-tensor type choices for every preset (tests/data/fixtures/quantize_presets.json),
which tests/test_quant_plan.py compares with ferrollama's (python/ferrollama/cli/quant_plan.py).

The models: the two real models (Qwen2.5-Coder-0.5B-Instruct and gemma-3-270m, in
~/.cache/ferrollama as Q4_K_M) as F16 models, and tiny models whose shapes reach the rules the real
ones do not (experts: tiny-qwen3moe has 8, the n_expert == 8 rules; tiny-gpt-oss's 3-D experts for
MXFP4_MOE; tiny-phi3's fused attn_qkv; tiny-llama's grouped-query ratio of 2). The choice depends
only on names, shapes and hyper-parameters, so an F16 model of a real one is its metadata and
tensor shapes with zero weights (1-D tensors F32): what llama-quantize would see after
convert_hf_to_gguf --outtype f16.

llama_model_quantize (llama-cpp-python 0.3.36) runs with dry_run, which decides every type
without quantizing and logs "[ i/ n] name - [shape], type = F16, size = .. MiB -> .. MiB (TYPE)";
the log is read through llama_log_set. Each preset is recorded without and with an importance
matrix (a non-null, empty llama_model_imatrix_data list: the rules only ask whether there is one).

  /path/to/bench-venv/bin/python benches/record_presets.py
"""
from __future__ import annotations

import ctypes
import json
import re
import tempfile
from pathlib import Path

import gguf
import llama_cpp as L
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
CACHE = Path.home() / ".cache" / "ferrollama"
REAL = {"qwen2.5-coder-0.5b": CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "gemma-3-270m": CACHE / "gemma-3-270m-q4_k_m.gguf"}
TINY = {name: DATA / "models" / f"{name}-f32.gguf" for name in ("tiny-llama", "tiny-qwen3moe", "tiny-gpt-oss", "tiny-phi3")}
#: llama-quantize's presets and their llama_ftype (llama.h)
PRESETS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q8_0": 7, "Q2_K": 10, "Q2_K_S": 21, "Q3_K_S": 11, "Q3_K_M": 12,
           "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "IQ2_XXS": 19, "IQ2_XS": 20,
           "IQ2_S": 28, "IQ2_M": 29, "IQ3_XXS": 23, "IQ3_XS": 22, "IQ3_S": 26, "IQ3_M": 27, "IQ1_S": 24, "IQ1_M": 31,
           "IQ4_NL": 25, "IQ4_XS": 30, "TQ1_0": 36, "TQ2_0": 37, "MXFP4_MOE": 38, "F16": 1, "BF16": 32}
LINE = re.compile(r"\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s+(\S+), size =[^\n(]*(?:\((\S+)\))?")

_log: list[str] = []


@L.llama_log_callback
def _collect(level, text, user_data):
    _log.append(text.decode("utf-8", "replace"))


def f16_skeleton(src: Path, out: Path) -> None:
    """The model's metadata and tensor shapes, weights zero: F16 for matrices, F32 for vectors."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type", "general.alignment"):
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        writer.add_key_value(name, f.contents(), vtype, sub_type=sub)
    writer.add_file_type(1)
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        dtype = np.float16 if len(shape) >= 2 else np.float32
        writer.add_tensor(t.name, np.zeros(shape, dtype=dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def dry_run(model: Path, ftype: int, with_imatrix: bool) -> dict[str, str]:
    params = L.llama_model_quantize_default_params()
    params.nthread = 1
    params.ftype = ftype
    params.dry_run = True
    empty = (L.llama_model_imatrix_data * 1)()
    if with_imatrix:
        params.imatrix = ctypes.cast(empty, ctypes.POINTER(L.llama_model_imatrix_data))
    _log.clear()
    with tempfile.TemporaryDirectory() as tmp:
        rc = L.llama_model_quantize(str(model).encode(), str(Path(tmp) / "out.gguf").encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize (dry run) failed for {model.name}, ftype {ftype}")
    types = {}
    for name, cur, new in LINE.findall("".join(_log)):
        types[name] = (new or cur).upper()  # ggml_type_name ("q4_K") in gguf's spelling
    return types


def by_type(types: dict[str, str]) -> dict[str, list[str]]:
    """{type: [tensor names]}: the record's compact form."""
    out: dict[str, list[str]] = {}
    for name, t in sorted(types.items()):
        out.setdefault(t, []).append(name)
    return out


def record_model(path: Path) -> dict:
    plans = {}
    for preset, ftype in PRESETS.items():
        plain, imat = dry_run(path, ftype, False), dry_run(path, ftype, True)
        plans[preset] = {"plain": by_type(plain)} if plain == imat else {"plain": by_type(plain), "imatrix": by_type(imat)}
    return plans


def main() -> None:
    L.llama_log_set(_collect, None)
    record = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in REAL.items():
            skeleton = Path(tmp) / f"{name}-f16.gguf"
            f16_skeleton(src, skeleton)
            record[name] = {"source": src.name, "tensor_types": "F16 matrices, F32 vectors", "plans": record_model(skeleton)}
            skeleton.unlink()
            print(name, "done")
    for name, path in TINY.items():
        record[name] = {"source": path.name, "tensor_types": "as in the file", "plans": record_model(path)}
        print(name, "done")
    out = DATA / "fixtures" / "quantize_presets.json"
    out.write_text(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")
    print(out, out.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
