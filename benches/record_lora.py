#!/usr/bin/env python3
"""Records llama.cpp's logits with LoRA adapters set (tests/data/scenarios/lora-*.json, written
with the adapters by tests/data/make_tiny_loras.py): each scenario names its model and a list
of (adapter file, scale), which go to llama_adapter_lora_init and llama_set_adapters_lora
before its steps run. `expected` with an F32 KV cache, `expected_kv_f16` with F16, flash
attention off, 2 threads: benches/recorder.py, as benches/record_archs.py records the architectures.

  /path/to/bench-venv/bin/python benches/record_lora.py [NAME ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recorder  # noqa: E402


def main(names: list[str]) -> None:
    recorder.update_scenarios(("lora-*.json",), names)


if __name__ == "__main__":
    main(sys.argv[1:])
