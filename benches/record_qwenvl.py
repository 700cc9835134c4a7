#!/usr/bin/env python3
"""Records llama.cpp's logits on the M-RoPE scenarios of the tiny Qwen-VL text models
(tests/data/scenarios/mrope-*.json, written with their models by tests/data/make_tiny_qwenvl.py):
batches of embedding rows (stand-ins for an image's, DeepStack-wide for qwen3vl/qwen3vlmoe) at
mtmd's 2-D M-RoPE positions, given to llama_decode as llama.cpp's batches of embeddings carry
them (llama_batch_init(n, n_embd_inp, ...) with 4 * n positions, section by section), text
tokens around them, and a sequence's state saved and restored in the middle of an image.
`expected` with an F32 KV cache, `expected_kv_f16` with F16, through benches/recorder.py
(flash attention off, 2 threads). The text-only scenarios of the same models (arch-qwen*vl*)
are recorded by benches/record_archs.py. Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_qwenvl.py [NAME ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recorder  # noqa: E402


def main(names: list[str]) -> None:
    recorder.update_scenarios(("mrope-*.json",), names)


if __name__ == "__main__":
    main(sys.argv[1:])
