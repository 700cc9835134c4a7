"""llama.cpp's logits on scenario steps: the one recorder of the tiny models' scenario records.

tests/data/scenarios/*.json (the format: tests/data/REFERENCE.md, "scenarios") are recorded
through here by benches/record_archs.py (arch-*, params-*), benches/record_lora.py (lora-*) and
tests/data/make_tiny_types.py (forward-TYPE). Everything goes through llama-cpp-python 0.3.36's
low-level API (llama_decode on a llama_batch, llama_memory_* for the sequence operations), so
run it with the benchmark venv (benches/setup.sh).

    import recorder
    got = recorder.record(DATA / "models" / "tiny-llama-f32.gguf",
                          {"n_ctx": 64, "n_batch": 32, "n_ubatch": 32, "n_seq_max": 2},
                          [{"op": "decode", "tokens": [1, 2], "pos": [0, 1], "seq_ids": [[0], [0, 1]], "logits": [1]},
                           {"op": "seq_rm", "seq_id": 1, "p0": 0, "p1": -1}])
    got["expected"], got["expected_kv_f16"]   # the entries with an F32 KV cache, with an F16 one

:func:`record` (model path, context parameters, steps) -> ``{"expected": [...], "expected_kv_f16": [...]}``
    The steps run once per KV cache type of ``cache_types`` (default :data:`CACHE_TYPES`), each
    time on a fresh context of the model (loaded once). Keywords: ``kv_overrides`` (a dict of
    metadata overrides given to the model's load), ``loras`` ((adapter path, scale) pairs set on
    every context), ``digits`` (decimals the logits are rounded to: 6 in arch-/params-/lora-
    records, 5 in forward-TYPE and hybrid-), ``extra_bufts=False`` (llama.cpp's weights without
    its extra CPU buffer types: no AMX, no repacking; see below).
:func:`run`: the same for one cache type (a ggml type id), returning the entries; :class:`Model`
    the loaded model whose ``run(context, steps, cache_type, digits)`` both call.
:func:`update_scenarios` (file patterns, names): re-records scenario files in place, each with
    its own model, context, steps, ``kv_overrides`` and ``lora``, and stamps ``recorded_with``.

Settings: CPU, 2 threads, flash attention off (the path the engine follows for these cache
types), ``no_perf``. Context keys: ``n_ctx``, ``n_batch``, ``n_ubatch``; ``n_seq_max`` (default
1), ``kv_unified`` (default true: one cell array for all sequences), ``swa_full`` (default
false), ``rope`` (llama_context_params fields: ``rope_scaling_type`` by name, ``rope_freq_base``,
``rope_freq_scale``, ``yarn_*``). Steps (the ``op`` key): ``decode`` (``tokens``, ``pos``,
``seq_ids``, ``logits``: the batch indices whose logits are recorded; a batch of embeddings has
``embd`` instead of ``tokens``, the rows tests/data/scenario_rows.py's ``embedding_rows``
makes of it, and for a model with M-RoPE ``pos`` holds four positions per row, given to
llama.cpp section by section as its batches of embeddings carry them), ``seq_rm``, ``seq_cp``,
``seq_keep``, ``seq_add``, ``seq_div``, ``clear``, and the state's: ``state_save`` /
``state_load`` (the context's whole state, llama_state_get_data / set_data, kept under ``slot``),
``seq_state_save`` / ``seq_state_load`` (one sequence's, ``seq_id`` and ``slot``); any step may
carry ``check_pos`` (sequence ids whose smallest and largest positions are recorded after it).

Entries, in step order: ``{"step", "batch_index", "logits": [n_vocab floats]}`` per requested
row of a decode; ``{"step", "decode_rc"}`` for a decode llama.cpp refused (nothing else of that
step); ``{"step", "returns": bool}`` for seq_rm; ``{"step", "seq_id", "pos_min", "pos_max"}``
per ``check_pos`` id.

The scenarios of tests/data/REFERENCE.md's first families (incremental, seq-*, context-shift,
...) were recorded by another harness. Through this recorder on an AVX-512 build, seq_rm,
seq_cp, seq_keep, seq_add, clear and check_pos reproduce those records to their rounding, but
seq-div and self-extend (seq_div) differ by up to 1.4 after the division, and two rows of
multi-seq-batch's first decode by 5.6: look into that before re-recording them from here.
A record made on one CPU need not come out in the same bits on another (AVX2 and AVX-512 builds
of llama.cpp round differently); the stored records name the machine they came from. A
`-march=native` build on a CPU that advertises AMX puts Q8_0 weights in ggml's AMX buffers; on a
virtual machine that advertises AMX without enabling it, the first Q8_0 product dies of an
illegal instruction (``tileloadd``): record such models with ``extra_bufts=False``.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path
from typing import Iterable, Sequence

import llama_cpp as L
import numpy as np

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
#: the record keys and the KV cache types they are recorded with (GGML_TYPE_F32, GGML_TYPE_F16)
CACHE_TYPES = {"expected": 0, "expected_kv_f16": 1}
THREADS = 2
RECORDED_WITH = f"llama-cpp-python {L.__version__} (llama.cpp vendored), CPU, flash attention off, {THREADS} threads"
ROPE_SCALING = {"none": 0, "linear": 1, "yarn": 2, "longrope": 3}


@L.llama_log_callback
def _quiet(level, text, user_data):  # noqa: ANN001 - llama.cpp logs every load
    pass


L.llama_backend_init()
L.llama_log_set(_quiet, None)


def record(model_path: str | os.PathLike[str], context: dict, steps: Sequence[dict], *,
           cache_types: dict[str, int] | None = None, kv_overrides: dict | None = None,
           loras: Iterable[tuple[str | os.PathLike[str], float]] = (), digits: int = 6,
           extra_bufts: bool = True) -> dict[str, list[dict]]:
    """The entries of the steps with each KV cache type: ``{key: entries}`` for the keys of
    ``cache_types`` (default :data:`CACHE_TYPES`: "expected" F32, "expected_kv_f16" F16)."""
    with Model(model_path, kv_overrides, loras, extra_bufts) as model:
        return {key: model.run(context, steps, cache_type, digits)
                for key, cache_type in (cache_types or CACHE_TYPES).items()}


def run(model_path: str | os.PathLike[str], context: dict, steps: Sequence[dict], cache_type: int = 0, *,
        kv_overrides: dict | None = None, loras: Iterable[tuple[str | os.PathLike[str], float]] = (),
        digits: int = 6, extra_bufts: bool = True) -> list[dict]:
    """The entries of the steps with one KV cache type (a ggml type id: 0 F32, 1 F16)."""
    with Model(model_path, kv_overrides, loras, extra_bufts) as model:
        return model.run(context, steps, cache_type, digits)


def update_scenarios(patterns: Sequence[str], names: Sequence[str] = (), digits: int = 6,
                     extra_bufts: bool = True) -> None:
    """Re-records the scenario files of tests/data/scenarios matching the patterns (only those
    named, when names are given): each key of CACHE_TYPES from the file's model (models/),
    context, steps, ``kv_overrides`` and ``lora`` ([adapter file in lora/, scale] pairs), and
    ``recorded_with``; the file keeps its other keys and their order."""
    for path in [p for pattern in patterns for p in sorted((DATA / "scenarios").glob(pattern))]:
        if names and path.stem not in names:
            continue
        scn = json.loads(path.read_text())
        scn.update(record(DATA / "models" / scn["model"], scn["context"], scn["steps"],
                          kv_overrides=scn.get("kv_overrides"),
                          loras=[(DATA / "lora" / f, s) for f, s in scn.get("lora", [])], digits=digits,
                          extra_bufts=extra_bufts))
        scn["recorded_with"] = RECORDED_WITH
        path.write_text(json.dumps(scn))
        print("recorded", path.name, len(scn["expected"]), "outputs")


# --- llama.cpp's side ------------------------------------------------------------------------------

def _kv_override_array(overrides: dict):
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


class Model:
    """A model loaded in llama.cpp with its LoRA adapters; a fresh context per :meth:`run`."""

    def __init__(self, path: str | os.PathLike[str], kv_overrides: dict | None = None,
                 loras: Iterable[tuple[str | os.PathLike[str], float]] = (), extra_bufts: bool = True):
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0
        if not extra_bufts:
            params.use_extra_bufts = False
        overrides = _kv_override_array(kv_overrides) if kv_overrides else None
        if overrides is not None:
            params.kv_overrides = overrides
        self.model = L.llama_model_load_from_file(os.fspath(path).encode(), params)
        del overrides
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.n_embd, self.n_embd_inp = L.llama_model_n_embd(self.model), L.llama_model_n_embd_inp(self.model)
        self.adapters, self.scales = [], []
        for adapter_path, scale in loras:
            adapter = L.llama_adapter_lora_init(self.model, os.fspath(adapter_path).encode())
            if not adapter:
                self.close()
                raise RuntimeError(f"llama.cpp could not load the adapter {adapter_path}")
            self.adapters.append(adapter)
            self.scales.append(float(scale))

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        self.close()

    def close(self) -> None:
        for adapter in self.adapters:
            L.llama_adapter_lora_free(adapter)
        self.adapters = []
        if self.model:
            L.llama_model_free(self.model)
            self.model = None

    def context(self, c: dict, cache_type: int):  # noqa: ANN201
        p = L.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch = c["n_ctx"], c["n_batch"], c["n_ubatch"]
        p.n_seq_max = c.get("n_seq_max", 1)
        p.n_threads = p.n_threads_batch = THREADS
        p.type_k = p.type_v = cache_type
        # flash attention off unless the scenario asks (llama.cpp requires it for a quantized V cache)
        p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if c.get("flash_attn") else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        p.kv_unified = c.get("kv_unified", True)
        p.swa_full = c.get("swa_full", False)
        p.no_perf = True
        for key, value in c.get("rope", {}).items():
            setattr(p, key, ROPE_SCALING[value] if key == "rope_scaling_type" else value)
        ctx = L.llama_init_from_model(self.model, p)
        if not ctx:
            raise RuntimeError("llama.cpp could not create the context")
        if self.adapters:
            n = len(self.adapters)
            adapters = (L.llama_adapter_lora_p_ctypes * n)(*self.adapters)
            scales = (ctypes.c_float * n)(*self.scales)
            if L.llama_set_adapters_lora(ctx, adapters, n, scales) != 0:
                L.llama_free(ctx)
                raise RuntimeError("llama_set_adapters_lora failed")
        return ctx

    def run(self, context: dict, steps: Sequence[dict], cache_type: int, digits: int) -> list[dict]:
        ctx = self.context(context, cache_type)
        mem = L.llama_get_memory(ctx)
        n_seq = context.get("n_seq_max", 1)
        slots: dict[str, bytes] = {}
        got: list[dict] = []
        try:
            for si, st in enumerate(steps):
                op = st["op"]
                if op == "decode":
                    got += self.decode(ctx, st, n_seq, si, digits)
                elif op == "seq_rm":
                    got.append({"step": si, "returns": bool(L.llama_memory_seq_rm(mem, st["seq_id"], st["p0"], st["p1"]))})
                elif op == "seq_cp":
                    L.llama_memory_seq_cp(mem, st["src"], st["dst"], st["p0"], st["p1"])
                elif op == "seq_keep":
                    L.llama_memory_seq_keep(mem, st["seq_id"])
                elif op == "seq_add":
                    L.llama_memory_seq_add(mem, st["seq_id"], st["p0"], st["p1"], st["delta"])
                elif op == "seq_div":
                    L.llama_memory_seq_div(mem, st["seq_id"], st["p0"], st["p1"], st["d"])
                elif op == "clear":
                    L.llama_memory_clear(mem, False)
                elif op == "state_save":
                    buf = (ctypes.c_uint8 * L.llama_state_get_size(ctx))()
                    slots[st["slot"]] = bytes(buf[:L.llama_state_get_data(ctx, buf, len(buf))])
                elif op == "state_load":
                    blob = slots[st["slot"]]
                    if L.llama_state_set_data(ctx, (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob), len(blob)) != len(blob):
                        raise RuntimeError(f"step {si}: llama_state_set_data failed")
                elif op == "seq_state_save":
                    buf = (ctypes.c_uint8 * L.llama_state_seq_get_size(ctx, st["seq_id"]))()
                    slots[st["slot"]] = bytes(buf[:L.llama_state_seq_get_data(ctx, buf, len(buf), st["seq_id"])])
                elif op == "seq_state_load":
                    blob = slots[st["slot"]]
                    if not L.llama_state_seq_set_data(ctx, (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob), len(blob),
                                                      st["seq_id"]):
                        raise RuntimeError(f"step {si}: llama_state_seq_set_data failed")
                else:
                    raise ValueError(f"step {si}: unknown op {op!r}")
                for seq_id in st.get("check_pos", []):
                    got.append({"step": si, "seq_id": seq_id, "pos_min": int(L.llama_memory_seq_pos_min(mem, seq_id)),
                                "pos_max": int(L.llama_memory_seq_pos_max(mem, seq_id))})
        finally:
            L.llama_free(ctx)
        return got

    def decode(self, ctx, step: dict, n_seq_max: int, si: int, digits: int) -> list[dict]:  # noqa: ANN001
        n = len(step["seq_ids"])
        rows = self.embedding_rows(step["embd"]) if "embd" in step else None
        batch = L.llama_batch_init(n, 0 if rows is None else self.n_embd_inp, n_seq_max)
        # the address (a field read from ctypes shares the structure's memory)
        own_pos = ctypes.cast(batch.pos, ctypes.c_void_p).value
        want = set(step["logits"])
        try:
            if rows is None:
                for i, (t, p) in enumerate(zip(step["tokens"], step["pos"])):
                    batch.token[i], batch.pos[i] = t, p
            else:
                ctypes.memmove(batch.embd, rows.ctypes.data, rows.nbytes)
                batch.pos = self.embedding_positions(step["pos"])
            for i, seqs in enumerate(step["seq_ids"]):
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
                logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
                out.append({"step": si, "batch_index": i, "logits": [round(float(x), digits) for x in logits]})
            return out
        finally:
            batch.pos = ctypes.cast(own_pos, ctypes.POINTER(ctypes.c_int32))
            L.llama_batch_free(batch)

    def embedding_rows(self, spec: dict) -> np.ndarray:
        if str(DATA) not in sys.path:
            sys.path.insert(0, str(DATA))
        from scenario_rows import embedding_rows
        return np.ascontiguousarray(embedding_rows(spec, self.n_embd, self.n_embd_inp))

    def embedding_positions(self, pos: list) -> "ctypes.Array":
        """A batch of embeddings' positions as llama.cpp reads them (llama_batch_compat): one per
        row, or for M-RoPE, four per row given section by section (all the rows' first
        positions, then their second ...)."""
        columns = [pos] if isinstance(pos[0], int) else list(zip(*pos))
        flat = [p for column in columns for p in column]
        self._pos = (ctypes.c_int32 * len(flat))(*flat)  # kept alive until the next batch
        return ctypes.cast(self._pos, ctypes.POINTER(ctypes.c_int32))


#: the class's former name (benches/record_hybrid.py subclasses it)
_Model = Model
