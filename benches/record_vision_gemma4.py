#!/usr/bin/env python3
"""Records llama.cpp's libmtmd on the tiny Gemma 4 pair (tests/data/make_tiny_vision_gemma4.py)
into tests/data/scenarios/vision-gemma4-f32.json, as benches/record_vision.py records the Gemma 3
pair (the same settings and scenario keys): a 216x216 image taken as it is (81 image tokens) and
make_tiny_vision.py's 100x37 one resized to 336x144 (84), each between Gemma 4's markers; the
images decoded non-causally (the text model is neither E2B nor E4B); the logits after
mtmd_helper_eval_chunks with F32 and F16 KV caches. A non-causal image is one micro-batch: the
batch holds a whole image (128 tokens), and two images with their text need a context beyond
the tiny model's 256. Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_vision_gemma4.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_vision as rv  # noqa: E402

NAME = "vision-gemma4-f32"
TEXT_MODEL, MMPROJ = "tiny-gemma4-vision-f32.gguf", "tiny-mmproj-gemma4v-f16.gguf"
IMAGES = {"square": "images/square-216.png", "wide": rv.IMAGES["wide"]}
CONTEXT = {**rv.CONTEXT, "n_ctx": 512, "n_batch": 128, "n_ubatch": 128}
#: text on both sides of an image (past the sliding window of 16), an image first, two images in one prompt
PROMPTS = rv.PROMPTS_IMAGE_FIRST


def main() -> None:
    rv.record_pair(NAME, TEXT_MODEL, MMPROJ, IMAGES, PROMPTS, CONTEXT)


if __name__ == "__main__":
    main()
