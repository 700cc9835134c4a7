#!/usr/bin/env python3
"""How fast a tile goes through an LFM2-VL-450M-sized projector: ferrollama's encoder against
llama.cpp's libmtmd (mtmd_encode_chunk), alternating, in one run. The projector is random, with
SigLIP2-base's sizes as LFM2-VL-450M's file has them (12 blocks of width 768, 12 heads, FFN
3072, 16x16 patches, 16x16 learned positions) and make_tiny_vision_lfm2's head (unshuffle 2x2,
input norm, mm.1 to 128, mm.2 to the tiny LFM2's 64, a small part of the work), written once
to --dir. Both engines get 2 threads; the image is tests/data/images/pre-large.png, whose
first 512x512 tile is encoded (1024 patches, the positions resized from 16x16 to 32x32).

  PYTHONPATH=python:.venv/lib/python3.11/site-packages .bench-venv/bin/python benches/vision_lfm2_speed.py [--reps 3]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "data"))
import make_tiny_vision_lfm2 as tl  # noqa: E402
import record_vision as rv  # noqa: E402
import vision_llava_speed as vls  # noqa: E402

SIGLIP2_BASE = replace(tl.VISION, n_embd=768, n_head=12, n_layer=12, n_ff=3072)
IMAGE = rv.DATA / "images" / "pre-large.png"


def write_projector(path: Path) -> None:
    # make_tiny_vision_lfm2's writer at SigLIP2-base's sizes, with the llava bench's scales
    tl.VISION, tl.mk.Weights = SIGLIP2_BASE, vls._WidthScaled
    tl.write_mmproj(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the projector file is written (once)")
    args = ap.parse_args()
    mmproj = Path(args.dir) / "bench-mmproj-lfm2-siglip2-base-f16.gguf"
    if not mmproj.exists():
        write_projector(mmproj)

    import ferrollama as fl
    from ferrollama.generation.media import load_image, preprocess_image
    from ferrollama.generation.multimodal import Projector

    text_model = rv.DATA / "models" / tl.TEXT_MODEL
    ours = Projector(fl.Model(str(text_model)), mmproj, n_threads=rv.recorder.THREADS)
    tile = preprocess_image("lfm2", load_image(IMAGE), ours.vision).entries[0]
    vls.compare_encodes(text_model, mmproj, ours, tile, IMAGE, args.reps, "the first 512x512 tile of a 1100x700 image")


if __name__ == "__main__":
    main()
