#!/usr/bin/env python3
"""Records llama.cpp's logits on the scenarios of tests/data/make_tiny_mla.py (the deepseek2
tiny models: arch-deepseek2*.json and mla-shift-*.json) through benches/recorder.py, with
llama.cpp's weights outside its extra CPU buffer types (this machine's AMX traps on Q8_0 in
them; see recorder.py). Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_mla.py [NAME ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recorder  # noqa: E402


def main(names: list[str]) -> None:
    recorder.update_scenarios(("arch-deepseek2*.json", "mla-*.json"), names, extra_bufts=False)


if __name__ == "__main__":
    main(sys.argv[1:])
