#!/usr/bin/env python3
"""How fast an image goes through a Qwen2.5-VL-7B-sized vision encoder: ferrollama's against
llama.cpp's libmtmd (mtmd_encode_chunk), alternating, in one run. The projector is random, with
Qwen2.5-VL-7B's vision sizes (32 blocks of width 1280, 16 heads, gated SiLU FFN 3420, 14-pixel
patches, windows of 112 pixels with blocks 7, 15, 23 and 31 attending to the whole image: n_wa_pattern
8) and make_tiny_vision_qwen's layout; its merger ends at the tiny qwen2vl text model's 256 instead
of 3584 (mtmd pairs a projector only with a text model of its width; mm.2 is under 1% of the
work). Written once to --dir. Both engines get 2 threads; the image is tests/data/images/square-224.png
resized to --size (smart resize keeps a multiple of 28).

  PYTHONPATH=python:.venv/lib/python3.11/site-packages .bench-venv/bin/python benches/vision_qwen_speed.py [--reps 3] [--size 448]
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
import make_tiny_vision_qwen as tq  # noqa: E402
import record_vision as rv  # noqa: E402

M = rv.M
QWEN25VL_7B = replace(tq.QWEN25VL, image_size=560, patch_size=14, n_embd=1280, n_head=16, n_layer=32, n_ff=3420, n_wa_pattern=8)


class _WidthScaled(tq.mk.Weights):
    """The tiny writer's matrices with their deviations scaled by 1/sqrt(inputs / 64), so that the
    activations stay within f16's range at width 1280 (as vision_llava_speed.py does)."""

    def matrix(self, name: str, *shape: int, std: float = 0.07) -> None:
        super().matrix(name, *shape, std=std * float(np.sqrt(64 / shape[-1])))


def write_projector(path: Path) -> None:
    tq.mk.Weights = _WidthScaled
    tq.tv.write_mmproj(path, QWEN25VL_7B, metadata=tq.add_qwen_metadata, weights=tq.add_qwen_weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size", type=int, default=448, help="the image's side in pixels (a multiple of 28)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the projector file is written (once)")
    args = ap.parse_args()
    mmproj = Path(args.dir) / "bench-mmproj-qwen2.5vl-7b-f16.gguf"
    if not mmproj.exists():
        write_projector(mmproj)

    from PIL import Image

    from ferrollama._core import Projector as CoreProjector
    from ferrollama.generation.media import load_image, preprocess_image
    from ferrollama.generation.multimodal import vision_params

    image = Path(args.dir) / f"bench-qwen-{args.size}.png"
    Image.open(rv.DATA / "images" / tq.IMAGES["square"]).resize((args.size, args.size), Image.BICUBIC).save(image)
    ours = CoreProjector(str(mmproj), n_threads=rv.recorder.THREADS)
    pixels = preprocess_image(ours.projector_type, load_image(image), vision_params(ours)).entries[0]
    ms = {"llama.cpp": benchlib.Samples(), "ferrollama": benchlib.Samples()}
    with rv.recorder.Model(rv.DATA / "models" / QWEN25VL_7B.text_model, extra_bufts=False) as model, \
            rv.Mtmd(mmproj, model.model, {"image": image}) as mtmd:
        chunks = mtmd.tokenize(f"{rv.MARKER}", ["image"])
        try:
            chunk = rv.image_chunks(chunks)[0]
            want = mtmd.embeddings(chunk)  # warm-up of both
            got = ours.encode_pixels(pixels)
            print(f"max |ferrollama - llama.cpp| = {np.abs(got - want).max():.3g} (embeddings RMS "
                  f"{np.sqrt((want.astype(np.float64) ** 2).mean()):.3g})")
            for _ in range(args.reps):
                t0 = time.perf_counter()
                M.mtmd_encode_chunk(mtmd.ctx, chunk)
                t1 = time.perf_counter()
                ours.encode_pixels(pixels)
                t2 = time.perf_counter()
                ms["llama.cpp"].values.append((t1 - t0) * 1e3)
                ms["ferrollama"].values.append((t2 - t1) * 1e3)
        finally:
            M.mtmd_input_chunks_free(chunks)
    ratio, sd = benchlib.paired_ratio(ms["ferrollama"], ms["llama.cpp"])
    info = benchlib.machine_info()
    print(f"CPU: {info.get('cpu')}, {rv.recorder.THREADS} threads, {args.reps} alternating reps, "
          f"one {pixels.shape[1]}x{pixels.shape[0]} image ({pixels.shape[0] * pixels.shape[1] // 196} patches)")
    print(benchlib.markdown_table(["engine", "encode ms (median ± sd)"], [[k, v.cell()] for k, v in ms.items()]))
    print(f"ferrollama / llama.cpp time: {ratio:.2f} ± {sd:.2f}")


if __name__ == "__main__":
    main()
