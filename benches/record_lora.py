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
import sys
from pathlib import Path

import llama_cpp as L

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_archs import DATA, decode, load_model, new_context, record_scenarios  # noqa: E402


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
    record_scenarios(("lora-*.json",), record, names)


if __name__ == "__main__":
    main(sys.argv[1:])
