#!/usr/bin/env python3
"""How fast an image goes through a LLaVA 1.5-sized projector: ferrollama's encoder against
llama.cpp's libmtmd (mtmd_encode_chunk), alternating, in one run. The projector is random, with
CLIP ViT-L/14-336's sizes as LLaVA 1.5's file has them (23 blocks of width 1024, 16 heads, FFN
4096, 577 positions with the class embedding; llava runs 22) and make_tiny_vision_llava's head
(mm.0 to 128, mm.2 to the tiny llama's 256, a small part of the work), written once to --dir.
Both engines get 2 threads; the image is tests/data/images/wide-100x37.png (padded to 336x336).

  PYTHONPATH=python:.venv/lib/python3.11/site-packages .bench-venv/bin/python benches/vision_llava_speed.py [--reps 5]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "data"))
import benchlib  # noqa: E402
import make_tiny_vision_llava as tl  # noqa: E402
import record_vision as rv  # noqa: E402

M = rv.M
CLIP_L = replace(tl.VISION, image_size=336, patch_size=14, n_embd=1024, n_head=16, n_layer=23, n_ff=4096)
IMAGE = "wide"


class _WidthScaled(tl.mk.Weights):
    """The tiny writer's matrices with their deviations scaled by 1/sqrt(inputs / 64): the tiny
    file's scales at width 1024 would grow the activations past f16's range (llama.cpp rounds
    them to f16), which says nothing of the speed and spoils the comparison of the outputs."""

    def matrix(self, name: str, *shape: int, std: float = 0.07) -> None:
        super().matrix(name, *shape, std=std * float(np.sqrt(64 / shape[-1])))


def write_projector(path: Path) -> None:
    # make_tiny_vision_llava's writer, at CLIP-L's sizes and scales
    tl.VISION, tl.mk.Weights = CLIP_L, _WidthScaled
    tl.write_mmproj(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the projector file is written (once)")
    args = ap.parse_args()
    mmproj = Path(args.dir) / "bench-mmproj-llava-clip-l-f16.gguf"
    if not mmproj.exists():
        write_projector(mmproj)

    import ferrollama as fl
    from ferrollama.generation.multimodal import Projector
    from ferrollama.generation.media import load_image, preprocess_image

    text_model = rv.DATA / "models" / tl.TEXT_MODEL
    ours = Projector(fl.Model(str(text_model)), mmproj, n_threads=rv.recorder.THREADS)
    pixels = preprocess_image("mlp", load_image(rv.DATA / rv.IMAGES[IMAGE]), ours.vision).entries[0]
    compare_encodes(text_model, mmproj, ours, pixels, rv.DATA / rv.IMAGES[IMAGE], args.reps, "one 336x336 image")


def compare_encodes(text_model: Path, mmproj: Path, ours, pixels: np.ndarray, image: Path, reps: int,  # noqa: ANN001
                    what: str, chunk_index: int = 0) -> None:
    """Encodes the image chunk `chunk_index` of the image file with libmtmd and `ours` (a
    Projector; `pixels` its preprocessed input for that chunk) alternately, `reps` times each
    after a warm-up, and prints the times and their ratio."""
    ms = {"llama.cpp": benchlib.Samples(), "ferrollama": benchlib.Samples()}
    with rv.recorder.Model(text_model, extra_bufts=False) as model, \
            rv.Mtmd(mmproj, model.model, {"image": image}) as mtmd:
        chunks = mtmd.tokenize(f"{rv.MARKER}", ["image"])
        try:
            chunk = rv.image_chunks(chunks)[chunk_index]
            want = mtmd.embeddings(chunk)  # warm-up of both
            got = ours.core.encode_pixels(pixels)
            print(f"max |ferrollama - llama.cpp| = {np.abs(got - want).max():.3g} (embeddings RMS "
                  f"{np.sqrt((want.astype(np.float64) ** 2).mean()):.3g})")
            for _ in range(reps):
                t0 = time.perf_counter()
                M.mtmd_encode_chunk(mtmd.ctx, chunk)
                t1 = time.perf_counter()
                ours.core.encode_pixels(pixels)
                t2 = time.perf_counter()
                ms["llama.cpp"].values.append((t1 - t0) * 1e3)
                ms["ferrollama"].values.append((t2 - t1) * 1e3)
        finally:
            M.mtmd_input_chunks_free(chunks)
    ratio, sd = benchlib.paired_ratio(ms["ferrollama"], ms["llama.cpp"])
    info = benchlib.machine_info()
    print(f"CPU: {info.get('cpu')}, {rv.recorder.THREADS} threads, {reps} alternating reps, {what}")
    print(benchlib.markdown_table(["engine", "encode ms (median ± sd)"], [[k, v.cell()] for k, v in ms.items()]))
    print(f"ferrollama / llama.cpp time: {ratio:.2f} ± {sd:.2f}")


if __name__ == "__main__":
    main()
