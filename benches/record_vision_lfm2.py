#!/usr/bin/env python3
"""Records llama.cpp's libmtmd on the tiny LFM2-VL pair (tests/data/make_tiny_vision_lfm2.py) into
tests/data/scenarios/vision-lfm2-f32.json, as benches/record_vision.py records the Gemma 3 pair
(the same settings and scenario keys): square-64.png resized to the projector's learned 16x16
patch grid, wide-100x37.png to a grid its position embeddings are resized to, pre-large.png tiled
(3x2 tiles of 512x512 and a thumbnail, each its own chunk, LFM2's tokens between them); the logits
after mtmd_helper_eval_chunks on the recurrent text model with F32 and F16 KV caches.
`expected_embeddings` holds each image's chunks' embeddings one after the other in the prompt's
order (tiles row by row, then the thumbnail). Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_vision_lfm2.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_vision as rv  # noqa: E402

NAME = "vision-lfm2-f32"
TEXT_MODEL, MMPROJ = "tiny-lfm2vl-f32.gguf", "tiny-mmproj-lfm2-f16.gguf"
IMAGES = {**rv.IMAGES, "large": "images/pre-large.png"}
#: the tiled image takes 1776 positions (and its prompt 1810); the batch as the other pairs'
CONTEXT = {**rv.CONTEXT, "n_ctx": 2048}
#: text on both sides of an image, an image first (BOS a chunk of its own), two images in one
#: prompt, a tiled image
PROMPTS = [*rv.PROMPTS_IMAGE_FIRST, rv.LARGE_IMAGE_PROMPT]


def main() -> None:
    rv.record_pair(NAME, TEXT_MODEL, MMPROJ, IMAGES, PROMPTS, CONTEXT)


if __name__ == "__main__":
    main()
