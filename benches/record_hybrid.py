#!/usr/bin/env python3
"""Records llama.cpp on the tiny recurrent and hybrid models (tests/data/make_tiny_hybrid.py):
writes tests/data/scenarios/hybrid-ARCH-TYPE.json, one scenario per model whose parts (each
step's `part`, separated by `clear`) are

  prompt-split     40 tokens in one decode split into micro-batches of 16, then 5 single tokens
  multi-seq        three sequences' prompts in one batch, then one step of the three together
  seq-cp           seq_cp of a prompt, the two sequences diverging in one batch, seq_rm of the
                   copy and a fresh start of it from position 0, the original continuing
  seq-rm-partial   seq_rm of a recurrent sequence's tail (refused), of nothing past its end,
                   a decode continuing the unchanged state, seq_rm of the whole sequence, a fresh start
  state-save-load  llama_state_get_data / set_data around two decodes, then a different token
                   at the saved position; llama_state_seq_get_data of seq 0 set into seq 1, one
                   step of both

`expected` with an F32 KV cache, `expected_kv_f16` with F16 (the recurrent states are F32 in
both: llama.cpp's hybrid and recurrent memories take type_r = type_s = F32 whatever the context
asks), flash attention off, 2 threads, logits rounded to 5 decimals. The steps run through
benches/recorder.py; the state operations, which it does not know, are handled here.

This CPU advertises AMX-INT8 but executing its tile instructions traps (SIGILL in ggml's AMX
Q8_0 kernels), so the models are loaded without llama.cpp's extra CPU buffer types (no AMX, no
weight repacking): ggml's plain CPU kernels.

  /path/to/bench-venv/bin/python benches/record_hybrid.py [ARCH ...]
"""
from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recorder  # noqa: E402

L = recorder.L
ARCHS = ("mamba2", "granitehybrid", "lfm2", "lfm2moe", "qwen3next", "qwen35", "qwen35moe",
         "falcon-h1", "nemotron_h", "nemotron_h_moe")
CONTEXT = {"n_ctx": 128, "n_batch": 64, "n_ubatch": 16, "n_seq_max": 3}
DIGITS = 5

_model_default_params = L.llama_model_default_params


def _model_params_without_extra_bufts():  # noqa: ANN202
    params = _model_default_params()
    params.use_extra_bufts = False
    return params


L.llama_model_default_params = _model_params_without_extra_bufts   # recorder._Model loads with these


def steps() -> list[dict]:
    rng = np.random.default_rng(35)
    tok = lambda n: [int(t) for t in rng.integers(3, 512, n)]  # noqa: E731
    out: list[dict] = []

    def add(part: str, op: str, **kw) -> None:
        out.append({"op": op, **kw, "part": part})

    def dec(part: str, seq_tokens: list[tuple[int, list[int], int]], logits: list[int], **kw) -> None:
        """seq_tokens: (seq_id, tokens, first position), concatenated in one batch."""
        tokens, pos, seqs = [], [], []
        for s, ts, p0 in seq_tokens:
            tokens += ts
            pos += range(p0, p0 + len(ts))
            seqs += [[s]] * len(ts)
        add(part, "decode", tokens=tokens, pos=pos, seq_ids=seqs, logits=logits, **kw)

    part = "prompt-split"
    dec(part, [(0, [1] + tok(39), 0)], [15, 16, 39], check_pos=[0])
    for p in range(40, 45):
        dec(part, [(0, tok(1), p)], [0])
    add(part, "clear")

    part = "multi-seq"
    lens = (12, 7, 17)
    dec(part, [(s, [1] + tok(n - 1), 0) for s, n in enumerate(lens)], [11, 18, 35], check_pos=[0, 1, 2])
    dec(part, [(s, tok(1), n) for s, n in enumerate(lens)], [0, 1, 2], check_pos=[0, 1, 2])
    add(part, "clear")

    part = "seq-cp"
    dec(part, [(0, [1] + tok(9), 0)], [])
    add(part, "seq_cp", src=0, dst=1, p0=-1, p1=-1, check_pos=[0, 1])
    dec(part, [(1, tok(1), 10), (0, tok(1), 10)], [0, 1], check_pos=[0, 1])
    add(part, "seq_rm", seq_id=1, p0=-1, p1=-1, check_pos=[0, 1])
    dec(part, [(1, [1] + tok(2), 0)], [2], check_pos=[1])
    dec(part, [(0, tok(1), 11)], [0], check_pos=[0])
    add(part, "clear")

    part = "seq-rm-partial"
    dec(part, [(0, [1] + tok(9), 0)], [])
    add(part, "seq_rm", seq_id=0, p0=5, p1=-1, check_pos=[0])      # refused: the state is the tail's
    add(part, "seq_rm", seq_id=0, p0=10, p1=-1, check_pos=[0])     # nothing at or past 10: true
    dec(part, [(0, tok(1), 10)], [0])
    add(part, "seq_rm", seq_id=0, p0=0, p1=-1, check_pos=[0])      # the whole sequence: true
    dec(part, [(0, [1] + tok(3), 0)], [3], check_pos=[0])
    add(part, "clear")

    part = "state-save-load"
    dec(part, [(0, [1] + tok(11), 0)], [])
    add(part, "state_save", slot="a")
    dec(part, [(0, tok(2), 12)], [], check_pos=[0])
    add(part, "state_load", slot="a", check_pos=[0])
    dec(part, [(0, tok(1), 12)], [0])
    add(part, "seq_state_save", seq_id=0, slot="b")
    add(part, "seq_state_load", seq_id=1, slot="b", check_pos=[0, 1])
    t = tok(1)
    dec(part, [(1, t, 13), (0, t, 13)], [0, 1], check_pos=[0, 1])    # the two rows agree
    return out


class _Model(recorder._Model):
    """recorder's model with the state operations: runs the steps itself (the others through
    the same llama_* calls recorder makes), on one context per cache type."""

    def run(self, context: dict, steps: list[dict], cache_type: int, digits: int) -> list[dict]:
        ctx = self.context(context, cache_type)
        mem = L.llama_get_memory(ctx)
        slots: dict[str, bytes] = {}
        got: list[dict] = []
        try:
            for si, st in enumerate(steps):
                op = st["op"]
                if op == "decode":
                    got += self.decode(ctx, st, context["n_seq_max"], si, digits)
                elif op == "seq_rm":
                    got.append({"step": si, "returns": bool(L.llama_memory_seq_rm(mem, st["seq_id"], st["p0"], st["p1"]))})
                elif op == "seq_cp":
                    L.llama_memory_seq_cp(mem, st["src"], st["dst"], st["p0"], st["p1"])
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
                    if not L.llama_state_seq_set_data(ctx, (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob), len(blob), st["seq_id"]):
                        raise RuntimeError(f"step {si}: llama_state_seq_set_data failed")
                else:
                    raise ValueError(f"step {si}: unknown op {op!r}")
                for seq_id in st.get("check_pos", []):
                    got.append({"step": si, "seq_id": seq_id, "pos_min": int(L.llama_memory_seq_pos_min(mem, seq_id)),
                                "pos_max": int(L.llama_memory_seq_pos_max(mem, seq_id))})
        finally:
            L.llama_free(ctx)
        return got


def main(archs: list[str]) -> None:
    for arch in archs or ARCHS:
        for wtype in ("f32", "q8_0"):
            model = f"tiny-{arch}-{wtype}.gguf"
            scn = {"name": f"hybrid-{arch}-{wtype}", "model": model, "context": CONTEXT, "steps": steps()}
            with _Model(recorder.DATA / "models" / model, None, ()) as m:
                for key, cache_type in recorder.CACHE_TYPES.items():
                    scn[key] = m.run(CONTEXT, scn["steps"], cache_type, DIGITS)
            scn["recorded_with"] = recorder.RECORDED_WITH + ", no extra CPU buffer types (no AMX, no repacking)"
            path = recorder.DATA / "scenarios" / f"{scn['name']}.json"
            path.write_text(json.dumps(scn, separators=(",", ":")))
            print("recorded", path.name, len(scn["expected"]), "outputs", path.stat().st_size, "bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
