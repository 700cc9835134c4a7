#!/usr/bin/env python3
"""Writes a tiny random Gemma 3 with its vision projector, the images it is recorded on, and the
text model's ordinary scenarios (benches/record_vision.py records llama.cpp's libmtmd on them into
tests/data/scenarios/vision-gemma3-f32.json; `benches/record_archs.py --no-extra-bufts` adds the
expected values of arch-gemma3-{f32,q8_0}.json):

- tests/data/models/tiny-gemma3-{f32,q8_0}.gguf (the projector goes with the F32 one):
  make_tiny_archs.py's layer layout as llama.cpp's gemma3 loader reads it (per-head Q/K norms,
  norms after attention and after the FFN, tied output), 2 layers: the first sliding (window 32,
  RoPE base 10000, llama.cpp's default), the second global (base 1e6, linear RoPE scaling 8 as
  Gemma 3 4B has). The tiny llama's vocabulary without the space prefix (as Gemma's), where two
  Cyrillic merges no English prompt uses become Gemma's image markers, CONTROL tokens, so that
  mtmd's "<start_of_image>" / "<end_of_image>" (parsed as special text, tools/mtmd/mtmd.cpp
  add_media) are one token each as in Gemma 3.
- tests/data/models/tiny-mmproj-gemma3-f16.gguf: a `clip` file of projector type gemma3 (SigLIP):
  64x64 images in 8x8 patches (64 patches), width 64, 4 heads, 2 blocks, FFN 128 (GELU), average
  pooled 2x2 (clip.vision.projector.scale_factor, which llama.cpp reads for gemma3 instead of its
  default 4) into 16 image tokens, RMS-normed and projected to the text model's 256. Tensor types
  as convert_hf_to_gguf.py writes an f16 mmproj (conversion/gemma.py Gemma3VisionModel): the
  embeddings (patch kernel and bias, position embeddings) F32, the other matrices F16, vectors F32.
  (llama.cpp's patch convolution rounds an F32 kernel to F16 all the same: ggml_conv_2d's im2col
  is F16.) The weights are scaled so that the image matters: llama.cpp's embeddings of the two
  images differ by up to 47 (rows of RMS 8), identity blocks (attn_out and ffn_down zeroed) change
  them by an RMS of 8, and the last logits after the image differ by up to 4 between the images.
- tests/data/images/square-64.png (the projector's size: no resize) and wide-100x37.png (resized
  and letterboxed by mtmd): gradients, shapes and a little noise.

  python tests/data/make_tiny_vision.py            # writes them all (deterministic)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_archs as mk  # noqa: E402

DATA = mk.DATA
MMPROJ = "tiny-mmproj-gemma3-f16.gguf"
IMAGES = {"square": "square-64.png", "wide": "wide-100x37.png"}

#: Gemma 3's image markers, in place of the Cyrillic merges "ра" and "ни" of the tiny llama's vocabulary
IMAGE_MARKERS = {494: ("<start_of_image>", gguf.TokenType.CONTROL), 507: ("<end_of_image>", gguf.TokenType.CONTROL)}

GEMMA3 = mk.Spec("gemma3", "gemma3", {"attention.sliding_window": 32, "attention.sliding_window_pattern": 2,
                                      "attention.key_length": 64, "attention.value_length": 64,
                                      "rope.freq_base": 1000000.0, "rope.scaling.type": "linear",
                                      "rope.scaling.factor": 8.0},
                 qk_norm="head", post_norms=True, tied=True)


@dataclass(frozen=True)
class VisionDims:
    """The projector's sizes. n_ff must differ from n_embd: llama.cpp swaps a gemma3 file's
    ffn_up and ffn_down when ffn_down has n_embd columns (clip.cpp's fix for old conversions)."""

    image_size: int = 64
    patch_size: int = 8
    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 2
    n_ff: int = 128
    merge: int = 2  # pooling kernel per side: 8x8 patches -> 4x4 image tokens
    #: the text model's width
    n_embd_out: int = mk.N_EMBD

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


VISION = VisionDims()


def gemma_vocab(w: gguf.GGUFWriter) -> None:
    mk.copy_vocab(w, IMAGE_MARKERS)
    w.add_add_space_prefix(False)


def add_clip_metadata(w: gguf.GGUFWriter, v: VisionDims, projector: str = "gemma3") -> None:
    """The keys llama.cpp's clip loader reads for a SigLIP projector (tools/mtmd/clip-impl.h),
    as convert_hf_to_gguf.py writes them for gemma3 (idefics3 writes the same ones, and more)."""
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name(f"tiny random {projector} projector")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_string("clip.projector_type", projector)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)  # without it clip.cpp takes GELU-quick
    w.add_uint32("clip.vision.image_size", v.image_size)
    w.add_uint32("clip.vision.patch_size", v.patch_size)
    w.add_uint32("clip.vision.embedding_length", v.n_embd)
    w.add_uint32("clip.vision.feed_forward_length", v.n_ff)
    w.add_uint32("clip.vision.block_count", v.n_layer)
    w.add_uint32("clip.vision.attention.head_count", v.n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projection_dim", v.n_embd_out)
    w.add_uint32("clip.vision.projector.scale_factor", v.merge)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])


def add_vision_weights(wt: mk.Weights, v: VisionDims) -> None:
    """SigLIP's tensors and Gemma 3's projection."""
    add_vit_weights(wt, v)
    # (n_embd_v, n_embd_text) as Gemma 3's mm_input_projection_weight; the image tokens come out
    # with an RMS near 2, as real image embeddings are of the order of the text's scaled token
    # embeddings' (llama.cpp's own f16 roundings move them by ~1e-3 of their size: at an RMS of
    # 8 that alone was 0.009 between llama.cpp and an exact float64 implementation)
    wt.matrix("mm.input_projection.weight", v.n_embd, v.n_embd_out, std=0.25)
    wt.norm("mm.soft_emb_norm.weight", v.n_embd)


def add_vit_weights(wt: mk.Weights, v: VisionDims) -> None:
    """SigLIP's tensors, scaled so that each block changes the residual stream about as much as
    it holds (the image tokens depend on the blocks, not only on the patches)."""
    rng = wt.rng
    wt.vector("v.patch_embd.weight", rng.standard_normal((v.n_embd, 3, v.patch_size, v.patch_size)) * 0.1)
    wt.bias("v.patch_embd.bias", v.n_embd)
    wt.vector("v.position_embd.weight", rng.standard_normal((v.n_patches, v.n_embd)) * 0.2)
    for il in range(v.n_layer):
        p = f"v.blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            wt.matrix(p + name + ".weight", v.n_embd, v.n_embd, std=0.15)
            wt.bias(p + name + ".bias", v.n_embd)
        for name in ("ln1", "ln2"):
            wt.norm(p + name + ".weight", v.n_embd)
            wt.bias(p + name + ".bias", v.n_embd)
        wt.matrix(p + "ffn_up.weight", v.n_ff, v.n_embd, std=0.15)
        wt.bias(p + "ffn_up.bias", v.n_ff)
        wt.matrix(p + "ffn_down.weight", v.n_embd, v.n_ff, std=0.12)
        wt.bias(p + "ffn_down.bias", v.n_embd)
    wt.norm("v.post_ln.weight", v.n_embd)
    wt.bias("v.post_ln.bias", v.n_embd)


def write_mmproj(path: Path, v: VisionDims = VISION, zero_blocks: bool = False,
                 metadata: Callable[[gguf.GGUFWriter, VisionDims], None] = add_clip_metadata,
                 weights: Callable[[mk.Weights, VisionDims], None] = add_vision_weights) -> None:
    """The projector (Gemma 3's unless ``metadata`` and ``weights`` write another's);
    ``zero_blocks`` zeroes the blocks' output projections (attn_out, ffn_down), which makes every
    block the identity (a sensitivity check, not a test file)."""
    w = gguf.GGUFWriter(str(path), "clip")
    metadata(w, v)
    weights(mk.Weights(w, np.random.default_rng(38), "f16"), v)
    if zero_blocks:
        for name, info in w.tensors[0].items():
            if ".attn_out." in name or ".ffn_down." in name:
                info.tensor[...] = 0
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def draw_image(width: int, height: int, seed: int) -> Image.Image:
    """Diagonal colour gradients, a disc, a bar and a little noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = rng.random(3) * 2 * np.pi
    rgb = np.stack([0.5 + 0.45 * np.sin(2 * np.pi * (x / width * (c + 1) + y / height * (2 - c)) / 2 + phase[c])
                    for c in range(3)], axis=-1)
    rgb += rng.normal(0.0, 0.03, rgb.shape)
    img = Image.fromarray((np.clip(rgb, 0, 1) * 255).round().astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    colour = lambda: tuple(int(c) for c in rng.integers(0, 256, 3))  # noqa: E731
    cx, cy, r = width * rng.uniform(0.3, 0.7), height * rng.uniform(0.3, 0.7), min(width, height) * 0.25
    draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour())
    draw.rectangle((width * 0.1, height * 0.75, width * 0.6, height * 0.85), fill=colour())
    return img


def write_images() -> None:
    out = DATA / "images"
    out.mkdir(exist_ok=True)
    draw_image(VISION.image_size, VISION.image_size, 1).save(out / IMAGES["square"], optimize=True)
    draw_image(100, 37, 2).save(out / IMAGES["wide"], optimize=True)


def main() -> None:
    for qtype in mk.TYPES:
        model_file = f"tiny-gemma3-{qtype}.gguf"
        mk.write_model(GEMMA3, qtype, DATA / "models" / model_file, vocab=gemma_vocab)
        mk.write_scenario(mk.scenario(model_file))
    write_mmproj(DATA / "models" / MMPROJ)
    write_images()
    print("wrote", MMPROJ, *IMAGES.values())


if __name__ == "__main__":
    main()
