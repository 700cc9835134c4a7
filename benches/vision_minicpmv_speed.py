#!/usr/bin/env python3
"""How fast a slice goes through a MiniCPM-V 2.6-sized projector: ferrollama's encoder against
llama.cpp's libmtmd (mtmd_encode_chunk), alternating, in one run. The projector is random, with
SigLIP-400M's sizes as MiniCPM-V 2.6's file has them (27 blocks of width 1152, 16 heads, FFN
4304, 14x14 patches, image_size 448, the 70x70 position table) and make_tiny_vision_minicpmv's
resampler (64 queries, width 256 for the tiny qwen2: a small part of the work), written once to
--dir. Both engines get 2 threads; the image is tests/data/images/pre-large.png, sliced 2x2, whose
first slice (560x364: 40x26 patches, the positions bucketed) is encoded.

  PYTHONPATH=python:.venv/lib/python3.11/site-packages .bench-venv/bin/python benches/vision_minicpmv_speed.py [--reps 3]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "data"))
import make_tiny_vision_minicpmv as tm  # noqa: E402
import record_vision as rv  # noqa: E402
import vision_llava_speed as vls  # noqa: E402

SIGLIP_400M = replace(tm.VISION, image_size=448, patch_size=14, n_embd=1152, n_head=16, n_layer=27, n_ff=4304)
IMAGE = rv.DATA / "images" / "pre-large.png"


def write_projector(path: Path) -> None:
    # make_tiny_vision_minicpmv's writer at SigLIP-400M's sizes, with the llava bench's scales
    tm.VISION, tm.mk.Weights = SIGLIP_400M, vls._WidthScaled
    tm.write_mmproj(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the projector file is written (once)")
    args = ap.parse_args()
    mmproj = Path(args.dir) / "bench-mmproj-minicpmv-siglip-400m-f16.gguf"
    if not mmproj.exists():
        write_projector(mmproj)

    import ferrollama as fl
    from ferrollama.generation.media import load_image, preprocess_image
    from ferrollama.generation.multimodal import Projector

    text_model = rv.DATA / "models" / tm.TEXT_MODEL
    ours = Projector(fl.Model(str(text_model)), mmproj, n_threads=rv.recorder.THREADS)
    first_slice = preprocess_image("resampler", load_image(IMAGE), ours.vision).entries[0]
    # the chunks are the overview, then the slices: the first slice is chunk 1
    vls.compare_encodes(text_model, mmproj, ours, first_slice, IMAGE, args.reps,
                        f"the first {first_slice.shape[1]}x{first_slice.shape[0]} slice of a 1100x700 image", chunk_index=1)


if __name__ == "__main__":
    main()
