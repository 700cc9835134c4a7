#!/usr/bin/env python3
"""Records llama.cpp's logits on the tiny-architecture scenarios (tests/data/scenarios/arch-*.json,
written with their models by tests/data/make_tiny_archs.py, and params-*.json, which
tests/data/make_param_scenarios.py writes with context RoPE parameters and kv_overrides): `expected` with an F32 KV cache,
`expected_kv_f16` with F16, flash attention off (the path the engine follows for these cache
types), 2 threads, one unified cell array.

Everything goes through llama-cpp-python 0.3.36's low-level API (llama_decode on a
llama_batch), as benches/record_fixtures.py does. Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_archs.py [NAME ...]
"""
from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import llama_cpp as L
import numpy as np

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
CACHE_TYPES = {"expected": 0, "expected_kv_f16": 1}  # GGML_TYPE_F32, GGML_TYPE_F16


ROPE_SCALING = {"none": 0, "linear": 1, "yarn": 2, "longrope": 3}


def kv_override_array(overrides: dict):
    """llama_model_kv_override entries (and the zeroed sentinel) for a dict of overrides."""
    arr = (L.llama_model_kv_override * (len(overrides) + 1))()
    for i, (key, value) in enumerate(overrides.items()):
        arr[i].key = key.encode()
        if isinstance(value, bool):
            arr[i].tag, arr[i].value.val_bool = L.LLAMA_KV_OVERRIDE_TYPE_BOOL, value
        elif isinstance(value, int):
            arr[i].tag, arr[i].value.val_i64 = L.LLAMA_KV_OVERRIDE_TYPE_INT, value
        elif isinstance(value, float):
            arr[i].tag, arr[i].value.val_f64 = L.LLAMA_KV_OVERRIDE_TYPE_FLOAT, value
        else:
            arr[i].tag, arr[i].value.val_str = L.LLAMA_KV_OVERRIDE_TYPE_STR, value.encode()
    arr[len(overrides)].key = b""
    return arr


def load_model(path: Path, kv_overrides: dict | None = None):
    params = L.llama_model_default_params()
    params.n_gpu_layers = 0
    keep = None
    if kv_overrides:
        keep = kv_override_array(kv_overrides)
        params.kv_overrides = keep
    model = L.llama_model_load_from_file(str(path).encode(), params)
    del keep
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    return model


def new_context(model, ctx_params: dict, cache_type: int):
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch = ctx_params["n_ctx"], ctx_params["n_batch"], ctx_params["n_ubatch"]
    p.n_seq_max = ctx_params.get("n_seq_max", 1)
    p.n_threads = p.n_threads_batch = 2
    p.type_k = p.type_v = cache_type
    p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    p.kv_unified = ctx_params.get("kv_unified", True)
    p.swa_full = ctx_params.get("swa_full", False)
    p.no_perf = True
    for key, value in ctx_params.get("rope", {}).items():
        setattr(p, key, ROPE_SCALING[value] if key == "rope_scaling_type" else value)
    ctx = L.llama_init_from_model(model, p)
    if not ctx:
        raise RuntimeError("llama.cpp could not create the context")
    return ctx


def decode(ctx, step: dict, n_seq_max: int, n_vocab: int, si: int) -> list[dict]:
    n = len(step["tokens"])
    batch = L.llama_batch_init(n, 0, n_seq_max)
    want = set(step["logits"])
    try:
        for i, (t, p, seqs) in enumerate(zip(step["tokens"], step["pos"], step["seq_ids"])):
            batch.token[i] = t
            batch.pos[i] = p
            batch.n_seq_id[i] = len(seqs)
            for j, s in enumerate(seqs):
                batch.seq_id[i][j] = s
            batch.logits[i] = i in want
        batch.n_tokens = n
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            return [{"step": si, "decode_rc": int(rc)}]
        out = []
        for i in step["logits"]:
            ptr = L.llama_get_logits_ith(ctx, i)
            logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
            out.append({"step": si, "batch_index": i, "logits": [round(float(x), 6) for x in logits]})
        return out
    finally:
        L.llama_batch_free(batch)


def record(scn: dict, cache_type: int) -> list[dict]:
    model = load_model(DATA / "models" / scn["model"], scn.get("kv_overrides"))
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    ctx = new_context(model, scn["context"], cache_type)
    mem = L.llama_get_memory(ctx)
    n_seq = scn["context"].get("n_seq_max", 1)
    got: list[dict] = []
    try:
        for si, st in enumerate(scn["steps"]):
            op = st["op"]
            if op == "decode":
                got += decode(ctx, st, n_seq, n_vocab, si)
            elif op == "seq_rm":
                got.append({"step": si, "returns": bool(L.llama_memory_seq_rm(mem, st["seq_id"], st["p0"], st["p1"]))})
            elif op == "seq_cp":
                L.llama_memory_seq_cp(mem, st["src"], st["dst"], st["p0"], st["p1"])
            elif op == "clear":
                L.llama_memory_clear(mem, False)
            else:
                raise ValueError(f"unknown op {op}")
    finally:
        L.llama_free(ctx)
        L.llama_model_free(model)
    return got


@L.llama_log_callback
def _quiet(level, text, user_data):  # noqa: ANN001 - llama.cpp logs every load
    pass


def main(names: list[str]) -> None:
    record_scenarios(("arch-*.json", "params-*.json"), record, names)


def record_scenarios(patterns: tuple[str, ...], record_one, names: list[str]) -> None:
    """Records `expected` (F32 cache) and `expected_kv_f16` of the scenario files matching the
    patterns (only those named, when names are given) with record_one(scenario, cache type)."""
    L.llama_backend_init()
    L.llama_log_set(_quiet, None)
    for path in [p for pattern in patterns for p in sorted((DATA / "scenarios").glob(pattern))]:
        if names and path.stem not in names:
            continue
        scn = json.loads(path.read_text())
        for key, cache_type in CACHE_TYPES.items():
            scn[key] = record_one(scn, cache_type)
        scn["recorded_with"] = f"llama-cpp-python {L.__version__} (llama.cpp vendored), CPU, flash attention off, 2 threads"
        path.write_text(json.dumps(scn))
        print("recorded", path.name, len(scn["expected"]), "outputs")


if __name__ == "__main__":
    main(sys.argv[1:])
