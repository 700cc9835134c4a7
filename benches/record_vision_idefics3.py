#!/usr/bin/env python3
"""Records llama.cpp's libmtmd on the tiny SmolVLM pair (tests/data/make_tiny_vision_idefics3.py)
into tests/data/scenarios/vision-idefics3-f32.json, as benches/record_vision.py records the Gemma 3
pair (the same settings and scenario keys): each image tiled into 32x32 slices plus an overview,
mtmd's chunks for the slice template (text between the image chunks), the logits after
mtmd_helper_eval_chunks with F32 and F16 KV caches. `expected_embeddings` holds each image's
chunks' embeddings one after the other in the prompt's order (slices row by row, then the
overview). Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_vision_idefics3.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_vision as rv  # noqa: E402

NAME = "vision-idefics3-f32"
TEXT_MODEL, MMPROJ = "tiny-smolvlm-f32.gguf", "tiny-mmproj-idefics3-f16.gguf"
IMAGES = rv.IMAGES
#: two tiled images take 272 positions: a context beyond the Gemma 3 pair's
CONTEXT = {**rv.CONTEXT, "n_ctx": 512}
#: text on both sides of an image, an image first (BOS a chunk of its own), two images in one prompt
PROMPTS = rv.PROMPTS_IMAGE_FIRST


def main() -> None:
    rv.record_pair(NAME, TEXT_MODEL, MMPROJ, IMAGES, PROMPTS, CONTEXT)


if __name__ == "__main__":
    main()
