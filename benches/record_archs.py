#!/usr/bin/env python3
"""Records llama.cpp's logits on the tiny-architecture scenarios (tests/data/scenarios/arch-*.json,
written with their models by tests/data/make_tiny_archs.py, and params-*.json, which
tests/data/make_param_scenarios.py writes with context RoPE parameters and kv_overrides): `expected` with an F32 KV cache,
`expected_kv_f16` with F16, flash attention off (the path the engine follows for these cache
types), 2 threads, one unified cell array.

The steps run through benches/recorder.py (llama-cpp-python 0.3.36's low-level API, llama_decode
on a llama_batch), the recorder of every tiny-model scenario. Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_archs.py [--no-extra-bufts] [NAME ...]

`--no-extra-bufts` loads the models without llama.cpp's extra CPU buffer types (no AMX, no
weight repacking: ggml's plain kernels), as on a CPU that advertises AMX but traps its tile
instructions; the scenarios of the 2025-26 families (make_tiny_glm_llama4.py, make_tiny_tail.py:
glm4moe, llama4, smollm3 ... starcoder2 and the kshift-* context shifts) were recorded so.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recorder  # noqa: E402


def main(args: list[str]) -> None:
    extra_bufts = "--no-extra-bufts" not in args
    names = [a for a in args if a != "--no-extra-bufts"]
    recorder.update_scenarios(("arch-*.json", "params-*.json", "kshift-*.json"), names, extra_bufts=extra_bufts)


if __name__ == "__main__":
    main(sys.argv[1:])
