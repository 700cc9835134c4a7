#!/usr/bin/env python3
"""Writes a tiny random MiniCPM-V 2.6 pair (benches/record_vision_minicpmv.py records llama.cpp's
libmtmd on it into tests/data/scenarios/vision-minicpmv-f32.json):

- tests/data/models/tiny-minicpmv-f32.gguf: a tiny qwen2 (MiniCPM-V 2.6's text model: Q/K/V
  biases, RoPE base 1e6) of make_tiny_archs.py's sizes, with the tiny llama's vocabulary where
  four merges no English prompt uses become MiniCPM-V's image tokens "<image>", "</image>",
  "<slice>", "</slice>" (CONTROL: mtmd looks them up by their piece), and "\\n" its byte token.
- tests/data/models/tiny-mmproj-minicpmv-f16.gguf: a `clip` file of projector type resampler as
  the legacy converter (minicpmv-convert-image-encoder-to-gguf.py) writes it for MiniCPM-V 2.6:
  clip.minicpmv_version 3, clip.minicpmv_query_num 64, clip.vision.projection_dim 0,
  has_minicpmv_projector; make_tiny_vision.py's SigLIP (64x64 in 4x4 patches: 256 patches,
  width 64, 4 heads, 2 blocks, FFN 128, GELU, post-LayerNorm) with SigLIP-NaViT's 70x70 position
  table (clip.cpp buckets each slice's patch grid onto it); the resampler of width 256 (two heads
  of 128, the text model's width): 64 learned queries, kv (64 -> 256), LayerNorms ln_q, ln_kv,
  ln_post, attention q/k/v/out with biases, proj (256 x 256, F16 as the converter's 2-D
  weights). resampler.pos_embed_k, which clip.cpp requires and never uses (it computes the sin-cos
  positions in the graph), is a single row here (the converter's is a 70x70 table).
  mtmd stretches square-64.png (no larger than image_size) to 64x64 (its overview alone),
  slices wide-100x37.png into 2x1 slices of 76x56 plus a 100x36 overview, and pre-large.png
  (1100x700) into 4x2 slices of 56x72 plus an 80x52 overview; each slice and overview gives 64 rows.

  python tests/data/make_tiny_vision_minicpmv.py            # writes them (deterministic)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_archs as mk  # noqa: E402
import make_tiny_vision as mv  # noqa: E402

DATA = mk.DATA
TEXT_MODEL = "tiny-minicpmv-f32.gguf"
MMPROJ = "tiny-mmproj-minicpmv-f16.gguf"
N_QUERY = 64
POS_BUCKETS = 70  # SigLIP-NaViT's 980 / 14 patches per side

QWEN2 = mk.Spec("qwen2", "qwen2", {"rope.freq_base": 1000000.0}, qkv_bias=True)

_CONTROL = gguf.TokenType.CONTROL
#: MiniCPM-V's image tokens in place of merges of the tiny llama's vocabulary that English
#: prompts do not use (make_tiny_vision_idefics3.py's choice)
IMAGE_TOKENS = {464: ("<image>", _CONTROL), 469: ("</image>", _CONTROL), 477: ("<slice>", _CONTROL),
                490: ("</slice>", _CONTROL)}


@dataclass(frozen=True)
class MinicpmvDims(mv.VisionDims):
    """make_tiny_vision's SigLIP in 4x4 patches, its position table SigLIP-NaViT's 70x70."""

    patch_size: int = 4

    @property
    def n_patches(self) -> int:
        return POS_BUCKETS * POS_BUCKETS


VISION = MinicpmvDims()


def minicpmv_vocab(w: gguf.GGUFWriter) -> None:
    mk.copy_vocab(w, IMAGE_TOKENS)


def add_minicpmv_metadata(w: gguf.GGUFWriter, v: mv.VisionDims) -> None:
    """make_tiny_vision's SigLIP keys with the legacy MiniCPM-V converter's in place of Gemma 3's."""
    mv.add_clip_metadata(w, v)
    keys = w.kv_data[0]
    for key in ("clip.vision.projector.scale_factor", "clip.projector_type", "clip.vision.projection_dim", "general.name"):
        del keys[key]
    w.add_name("tiny random MiniCPM-V 2.6 projector")
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.has_minicpmv_projector", True)
    w.add_string("clip.projector_type", "resampler")
    w.add_int32("clip.minicpmv_version", 3)
    w.add_uint32("clip.vision.projection_dim", 0)
    w.add_uint32("clip.minicpmv_query_num", N_QUERY)


def add_minicpmv_weights(wt: mk.Weights, v: mv.VisionDims) -> None:
    """SigLIP's tensors and the resampler's, its outputs of an RMS near 2."""
    mv.add_vit_weights(wt, v)
    d = v.n_embd_out
    wt.vector("resampler.query", wt.rng.standard_normal((N_QUERY, d)) * 0.5)
    wt.matrix("resampler.kv.weight", d, v.n_embd, std=0.15)
    for which in ("q", "kv", "post"):
        wt.norm(f"resampler.ln_{which}.weight", d)
        wt.bias(f"resampler.ln_{which}.bias", d)
    for which in ("q", "k", "v", "out"):
        wt.matrix(f"resampler.attn.{which}.weight", d, d, std=0.08)
        wt.bias(f"resampler.attn.{which}.bias", d)
    wt.matrix("resampler.proj.weight", d, d, std=0.125)
    wt.vector("resampler.pos_embed_k", np.zeros((1, d)))


def write_mmproj(path: Path, zero_blocks: bool = False) -> None:
    mv.write_mmproj(path, VISION, zero_blocks, metadata=add_minicpmv_metadata, weights=add_minicpmv_weights)


def main() -> None:
    mk.write_model(QWEN2, "f32", DATA / "models" / TEXT_MODEL, vocab=minicpmv_vocab)
    write_mmproj(DATA / "models" / MMPROJ)
    print("wrote", TEXT_MODEL, MMPROJ)


if __name__ == "__main__":
    main()
