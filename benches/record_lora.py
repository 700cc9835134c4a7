#!/usr/bin/env python3
"""Records llama.cpp's logits with LoRA adapters set (tests/data/scenarios/lora-*.json, written
with the adapters by tests/data/make_tiny_loras.py): each scenario names its model and a list
of (adapter file, scale), which go to llama_adapter_lora_init and llama_set_adapters_lora
before its steps run. `expected` with an F32 KV cache, `expected_kv_f16` with F16, flash
attention off, 2 threads, as benches/record_archs.py records the architectures.

  /path/to/bench-venv/bin/python benches/record_lora.py [NAME ...]
"""
from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import llama_cpp as L

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_archs import CACHE_TYPES, DATA, _quiet, decode, load_model, new_context  # noqa: E402


def record(scn: dict, cache_type: int) -> list[dict]:
    model = load_model(DATA / "models" / scn["model"])
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    adapters = []
    for f, _ in scn["lora"]:
        a = L.llama_adapter_lora_init(model, str(DATA / "lora" / f).encode())
        if not a:
            raise RuntimeError(f"llama.cpp could not load the adapter {f}")
        adapters.append(a)
    ctx = new_context(model, scn["context"], cache_type)
    n_seq = scn["context"].get("n_seq_max", 1)
    got: list[dict] = []
    try:
        arr = (L.llama_adapter_lora_p_ctypes * len(adapters))(*adapters)
        scales = (ctypes.c_float * len(adapters))(*[s for _, s in scn["lora"]])
        if L.llama_set_adapters_lora(ctx, arr, len(adapters), scales) != 0:
            raise RuntimeError("llama_set_adapters_lora failed")
        for si, st in enumerate(scn["steps"]):
            if st["op"] != "decode":
                raise ValueError(f"unexpected op {st['op']}")
            got += decode(ctx, st, n_seq, n_vocab, si)
    finally:
        L.llama_free(ctx)
        for a in adapters:
            L.llama_adapter_lora_free(a)
        L.llama_model_free(model)
    return got


def main(names: list[str]) -> None:
    L.llama_backend_init()
    L.llama_log_set(_quiet, None)
    for path in sorted((DATA / "scenarios").glob("lora-*.json")):
        if names and path.stem not in names:
            continue
        scn = json.loads(path.read_text())
        for key, cache_type in CACHE_TYPES.items():
            scn[key] = record(scn, cache_type)
        scn["recorded_with"] = f"llama-cpp-python {L.__version__} (llama.cpp vendored), CPU, flash attention off, 2 threads"
        path.write_text(json.dumps(scn))
        print("recorded", path.name, len(scn["expected"]), "outputs")


if __name__ == "__main__":
    main(sys.argv[1:])
