#!/usr/bin/env python3
"""Records llama.cpp's libmtmd on the tiny MiniCPM-V 2.6 pair (tests/data/make_tiny_vision_minicpmv.py)
into tests/data/scenarios/vision-minicpmv-f32.json, as benches/record_vision.py records the Gemma 3
pair (the same settings and scenario keys): square-64.png stretched to the projector's 64x64 (its
overview alone, between <image> and </image>), wide-100x37.png sliced 2x1 and pre-large.png 4x2
(llava-uhd without pinpoints: the overview first, then each slice between <slice> and </slice>,
rows ended by "\\n"), every overview and slice 64 rows (the resampler's queries); the logits after
mtmd_helper_eval_chunks with F32 and F16 KV caches. `expected_embeddings` holds each image's
chunks' embeddings one after the other in the prompt's order. Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_vision_minicpmv.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_vision as rv  # noqa: E402

NAME = "vision-minicpmv-f32"
TEXT_MODEL, MMPROJ = "tiny-minicpmv-f32.gguf", "tiny-mmproj-minicpmv-f16.gguf"
IMAGES = {**rv.IMAGES, "large": "images/pre-large.png"}
#: the sliced large image takes 9 x 64 positions and a few tokens
CONTEXT = {**rv.CONTEXT, "n_ctx": 1024}
#: text on both sides of an image, an image first (BOS a chunk of its own), two images in one
#: prompt (one sliced), the image sliced in two rows
PROMPTS = [*rv.PROMPTS_IMAGE_FIRST, rv.LARGE_IMAGE_PROMPT]


def main() -> None:
    rv.record_pair(NAME, TEXT_MODEL, MMPROJ, IMAGES, PROMPTS, CONTEXT)


if __name__ == "__main__":
    main()
