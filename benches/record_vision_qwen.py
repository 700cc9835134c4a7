#!/usr/bin/env python3
"""Records llama.cpp's libmtmd on the tiny Qwen VL projectors (tests/data/make_tiny_vision_qwen.py)
and their text models (tests/data/make_tiny_qwenvl.py) into tests/data/scenarios/vision-qwen2vl-f32.json,
vision-qwen2.5vl-f32.json and vision-qwen3vl-f32.json, with record_vision.py's prompts, settings and
format (see there) on a square image smart resize keeps and one it resizes. Run it with the
benchmark venv:

  /path/to/bench-venv/bin/python benches/record_vision_qwen.py [--sensitivity]

The logits after an image (`evals`) need the text model's M-RoPE positions; the embeddings
(`expected_embeddings`: mtmd_encode_chunk's rows) and the chunks do not.

``--sensitivity`` records nothing: it prints how far the two images' embeddings are apart and
their RMS, per projector.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_vision as rv  # noqa: E402

DATA = rv.DATA
IMAGES = {"square": "images/square-224.png", "wide": "images/wide-300x170.png"}
#: (scenario, text model, projector), as make_tiny_vision_qwen.py pairs them
PROJECTORS = [("vision-qwen2vl-f32", "tiny-qwen2vl-f32.gguf", "tiny-mmproj-qwen2vl-f16.gguf"),
              ("vision-qwen2.5vl-f32", "tiny-qwen2vl-f32.gguf", "tiny-mmproj-qwen2.5vl-f16.gguf"),
              ("vision-qwen3vl-f32", "tiny-qwen3vl-f32.gguf", "tiny-mmproj-qwen3vl-f16.gguf")]


def record(text_model: str, mmproj: str) -> dict:
    return rv.record(DATA / "models" / text_model, DATA / "models" / mmproj, images=IMAGES)


def sensitivity() -> None:
    for name, text_model, mmproj in PROJECTORS:
        embd = record(text_model, mmproj)["embeddings"]
        rms = {k: round(float(np.sqrt((e.astype(np.float64) ** 2).mean())), 4) for k, e in embd.items()}
        print(name, {k: e.shape for k, e in embd.items()}, "RMS", rms)


def main() -> None:
    if "--sensitivity" in sys.argv[1:]:
        sensitivity()
        return
    for name, text_model, mmproj in PROJECTORS:
        rv.record_pair(name, text_model, mmproj, images=IMAGES)


if __name__ == "__main__":
    main()
