#!/usr/bin/env python3
"""Records llama.cpp's libmtmd on the tiny Pixtral pairs (tests/data/make_tiny_vision_pixtral.py)
into tests/data/scenarios/vision-pixtral-f32.json (Pixtral 12B's projector on a llama) and
vision-mistral3-f32.json (Mistral Small 3.1's patch merger on a mistral3), with record_vision.py's
prompts, images, settings and format (see there). Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_vision_pixtral.py [--sensitivity]

``--sensitivity`` records nothing: it prints the embeddings' size and how far the two images'
last logits are apart.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_vision as rv  # noqa: E402

DATA = rv.DATA
#: scenario name -> (text model, projector)
PAIRS = {"vision-pixtral-f32": ("tiny-pixtral-f32.gguf", "tiny-mmproj-pixtral-f16.gguf"),
         "vision-mistral3-f32": ("tiny-mistral3v-f32.gguf", "tiny-mmproj-mistral3-f16.gguf")}


def record(name: str) -> dict:
    text_model, mmproj = PAIRS[name]
    return rv.record(DATA / "models" / text_model, DATA / "models" / mmproj)


def sensitivity(name: str) -> None:
    got = record(name)
    embd, evals = got["embeddings"], got["evals"]
    rms = {k: float(np.sqrt((v.astype(np.float64) ** 2).mean())) for k, v in embd.items()}
    print(name, "embeddings RMS:", rms, "rows:", {k: v.shape[0] for k, v in embd.items()})
    print("square vs wide: last logits max |diff|", float(np.abs(evals[0]["logits"] - evals[1]["logits"]).max()))


def main() -> None:
    for name, (text_model, mmproj) in PAIRS.items():
        if "--sensitivity" in sys.argv[1:]:
            sensitivity(name)
        else:
            rv.record_pair(name, text_model, mmproj)


if __name__ == "__main__":
    main()
