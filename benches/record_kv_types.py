#!/usr/bin/env python3
"""Records llama.cpp's logits with each quantized or bf16 KV cache type (llama.cpp's `-ctk`/`-ctv`
types beyond f32 and f16: bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1; K and V of the same type)
into tests/data/scenarios/kv-types.json, the steps of arch-llama3-f32 (the tiny Llama 3, f32
weights so that the cache's rounding is what differs; a 48-token prompt in micro-batches of 32,
single tokens, four sequences in one batch), and kv-types-shift.json, the steps of context-shift
(the tiny Llama: cells removed and the rest shifted, so that the quantized keys are re-rotated
in place), flash attention on (llama.cpp requires it for a
quantized V cache; the engine attends over any V type but f32/f16 with the same online softmax),
one record per type under `expected_kv_TYPE`.

  /path/to/bench-venv/bin/python benches/record_kv_types.py [--no-extra-bufts]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches"))
import recorder  # noqa: E402

#: llama.cpp's ggml type ids of the cache types
TYPE_IDS = {"bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}
SCENARIOS = ROOT / "tests" / "data" / "scenarios"


#: the scenarios written: the scenario each takes its model and steps from, and its types (a
#: K-shift of a bf16 cache aborts llama.cpp 0.3.36: ggml's CPU RoPE takes F32 and F16 only)
SOURCES = {"kv-types": ("arch-llama3-f32", tuple(TYPE_IDS)),
           "kv-types-shift": ("context-shift", tuple(t for t in TYPE_IDS if t != "bf16"))}


def main(args: list[str]) -> None:
    for name, (source, types) in SOURCES.items():
        record(name, source, types, extra_bufts="--no-extra-bufts" not in args)


def record(name: str, source: str, types: tuple[str, ...], extra_bufts: bool) -> None:
    base = json.loads((SCENARIOS / f"{source}.json").read_text())
    scn = {"name": name, "model": base["model"], "context": base["context"], "steps": base["steps"]}
    scn["context"]["flash_attn"] = True
    keys = {f"expected_kv_{t}": TYPE_IDS[t] for t in types}
    scn.update(recorder.record(ROOT / "tests" / "data" / "models" / scn["model"], scn["context"], scn["steps"],
                               cache_types=keys, extra_bufts=extra_bufts))
    scn["recorded_with"] = recorder.RECORDED_WITH.replace("flash attention off", "flash attention on")
    out = SCENARIOS / f"{name}.json"
    out.write_text(json.dumps(scn))
    print("recorded", out.name, {k: len(v) for k, v in scn.items() if k.startswith("expected")})


if __name__ == "__main__":
    main(sys.argv[1:])
