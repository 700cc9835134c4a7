#!/usr/bin/env python3
"""Writes a tiny random LLaVA 1.5 projector for the tiny llama (tests/data/models/tiny-llama-f32.gguf):
benches/record_vision_llava.py records llama.cpp's libmtmd on the pair and make_tiny_vision.py's
two images into tests/data/scenarios/vision-llava-f32.json.

- tests/data/models/tiny-mmproj-llava-f16.gguf: a `clip` file of projector type mlp (CLIP, as
  llava's legacy converter writes it): make_tiny_vision.py's encoder (64x64 images in 8x8
  patches, width 64, 4 heads, FFN 128, F16 matrices, F32 embeddings and vectors) with 3 blocks,
  of which llama.cpp runs the first 2 (llava takes the second-to-last layer: no
  clip.vision.feature_layer), GELU-quick (clip.use_gelu false), CLIP's class embedding (a 65th
  position) and pre-LayerNorm, no post-LayerNorm, the FFN's tensors under the old swapped names
  (fc1 as ffn_down: clip.cpp swaps them back), and the MLP mm.0 (64 -> 128), GELU, mm.2
  (128 -> the text model's 256). clip.vision.projection_dim says 32, as a real file's says
  CLIP's own projection width: the output width is mm.2's.
- tests/data/models/tiny-mmproj-llava16-f16.gguf (benches/record_vision_llava.py --llava16 records
  it into vision-llava16-f32.json): the same encoder and weights with LLaVA 1.6's keys as the
  legacy converter writes them: image_grid_pinpoints (64x128, 128x64, 128x128: anyres tiles of
  64x64 and an overview), mm_patch_merge_type spatial_unpad,
  image_crop_resolution, image_aspect_ratio, and model.image_newline (libmtmd uses none of the
  last four).
- tests/data/models/tiny-mmproj-yi-f16.gguf (--yi: vision-llava-yi-f32.json): Yi-VL's head
  (clip.cpp's mlp_norm, for a file with mm.3): mm.0, LayerNorm mm.1, GELU, mm.3, LayerNorm mm.4,
  no mm.2.

  python tests/data/make_tiny_vision_llava.py      # deterministic
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_archs as mk  # noqa: E402
import make_tiny_vision as tv  # noqa: E402

MMPROJ = "tiny-mmproj-llava-f16.gguf"
MMPROJ_16 = "tiny-mmproj-llava16-f16.gguf"
MMPROJ_YI = "tiny-mmproj-yi-f16.gguf"
TEXT_MODEL = "tiny-llama-f32.gguf"
VISION = replace(tv.VISION, n_layer=3)
PINPOINTS = [64, 128, 128, 64, 128, 128]
N_MLP = 128


def add_llava_metadata(w: gguf.GGUFWriter, v: tv.VisionDims) -> None:
    """make_tiny_vision's keys with llava's in place of Gemma 3's."""
    tv.add_clip_metadata(w, v)
    keys = w.kv_data[0]
    del keys["clip.vision.projector.scale_factor"]  # gemma3's pooling
    for key in ("clip.projector_type", "clip.use_gelu", "clip.vision.projection_dim", "general.name"):
        del keys[key]
    w.add_name("tiny random llava projector")
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.use_gelu", False)
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.has_llava_projector", True)
    w.add_uint32("clip.vision.projection_dim", 32)


def add_llava16_metadata(w: gguf.GGUFWriter) -> None:
    w.add_array("clip.vision.image_grid_pinpoints", PINPOINTS)
    w.add_string("clip.vision.mm_patch_merge_type", "spatial_unpad")
    w.add_uint32("clip.vision.image_crop_resolution", VISION.image_size)
    w.add_string("clip.vision.image_aspect_ratio", "anyres")


def add_llava_weights(wt: mk.Weights, v: tv.VisionDims) -> None:
    """make_tiny_vision's encoder without SigLIP's post-LN and Gemma 3's head, with CLIP's class
    embedding, pre-LN and one more position, the FFN under its old names, and the MLP."""
    tv.add_vision_weights(wt, v)
    tensors = wt.w.tensors[0]
    for name in ("v.post_ln.weight", "v.post_ln.bias", "mm.input_projection.weight", "mm.soft_emb_norm.weight",
                 "v.position_embd.weight"):
        del tensors[name]
    for il in range(v.n_layer):
        p = f"v.blk.{il}."
        for kind in ("weight", "bias"):
            up, down = tensors.pop(f"{p}ffn_up.{kind}"), tensors.pop(f"{p}ffn_down.{kind}")
            tensors[f"{p}ffn_down.{kind}"], tensors[f"{p}ffn_up.{kind}"] = up, down
    rng = wt.rng
    wt.vector("v.position_embd.weight", rng.standard_normal((v.n_patches + 1, v.n_embd)) * 0.2)
    wt.vector("v.class_embd", rng.standard_normal(v.n_embd) * 0.5)
    wt.norm("v.pre_ln.weight", v.n_embd)
    wt.bias("v.pre_ln.bias", v.n_embd)
    wt.matrix("mm.0.weight", N_MLP, v.n_embd, std=0.2)
    wt.bias("mm.0.bias", N_MLP)
    # image tokens of RMS ~1.6, of the order of a real LLaVA's: llama.cpp's f16 roundings (the
    # products' activations, GELU's tables, K/V) move its embeddings by ~1e-3 of their size,
    # 0.008 at an RMS of 4, where this engine's mirror of them was measured
    wt.matrix("mm.2.weight", v.n_embd_out, N_MLP, std=0.06)
    wt.bias("mm.2.bias", v.n_embd_out)


def yi_head(wt: mk.Weights) -> None:
    """mm.2 replaced by Yi-VL's normed layers."""
    for name in ("mm.2.weight", "mm.2.bias"):
        del wt.w.tensors[0][name]
    wt.norm("mm.1.weight", N_MLP)
    wt.bias("mm.1.bias", N_MLP)
    wt.matrix("mm.3.weight", VISION.n_embd_out, N_MLP, std=0.1)
    wt.bias("mm.3.bias", VISION.n_embd_out)
    wt.norm("mm.4.weight", VISION.n_embd_out)
    wt.bias("mm.4.bias", VISION.n_embd_out)


def write_mmproj(path: Path, llava16: bool = False, yi: bool = False) -> None:
    w = gguf.GGUFWriter(str(path), "clip")
    add_llava_metadata(w, VISION)
    wt = mk.Weights(w, np.random.default_rng(1538), "f16")
    add_llava_weights(wt, VISION)
    if llava16:
        add_llava16_metadata(w)
        wt.bias("model.image_newline", VISION.n_embd_out)
    if yi:
        yi_head(wt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    write_mmproj(mk.DATA / "models" / MMPROJ)
    write_mmproj(mk.DATA / "models" / MMPROJ_16, llava16=True)
    write_mmproj(mk.DATA / "models" / MMPROJ_YI, yi=True)
    print("wrote", MMPROJ, MMPROJ_16, MMPROJ_YI)


if __name__ == "__main__":
    main()
