#!/usr/bin/env python3
"""Writes tiny random Qwen VL projectors, paired with make_tiny_qwenvl.py's text models, and the
images they are recorded on (benches/record_vision_qwen.py records llama.cpp's libmtmd on them
into tests/data/scenarios/vision-qwen*.json):

- tests/data/models/tiny-mmproj-qwen2vl-f16.gguf (`qwen2vl_merger`, with tiny-qwen2vl-f32.gguf):
  Qwen2-VL's encoder as conversion/qwenvl.py writes it: the Conv3D's two frames as two patch
  kernels (v.patch_embd.weight, .weight.1; no bias), 14x14 patches, width 64, 4 heads of 16
  (2-D rotary positions), 2 blocks of LayerNorms with biases and a GELU-quick FFN of 128 (no
  clip.use_gelu), the merger's LayerNorm (v.post_ln) and MLP (mm.0 over 2x2 patches, GELU, mm.2)
  to the text model's 256.
- tests/data/models/tiny-mmproj-qwen2.5vl-f16.gguf (`qwen2.5vl_merger`, with tiny-qwen2vl-f32.gguf,
  which llama.cpp runs for Qwen2.5-VL too): RMSNorms without biases, a gated SiLU FFN
  (clip.use_silu), 4 blocks with window attention (clip.vision.n_wa_pattern 2: blocks 1 and 3
  attend to the whole image, 0 and 2 within windows of 112 pixels: 4x4 merged tokens).
- tests/data/models/tiny-mmproj-qwen3vl-f16.gguf (`qwen3vl_merger`, with tiny-qwen3vl-f32.gguf):
  16x16 patches with a bias, learned positions for 14x14 patches (resized to the image's grid
  otherwise), a fused QKV, LayerNorms and a GELU FFN (clip.use_gelu), 3 blocks, the first two
  deepstack blocks (clip.vision.is_deepstack_layers and v.deepstack.N.*: LayerNorm over a 2x2
  unit, fc1, GELU, fc2): rows of 256 * 3 as the text model's n_deepstack_layers 2 takes them.
- tests/data/images/square-224.png (224x224: whole 2x2 blocks of 14 and of 16 pixels, smart resize
  keeps it: 256 patches for Qwen2(.5)-VL, 196 for Qwen3-VL, its positions' own grid) and
  wide-300x170.png (smart-resized to 308x168 and 288x160: partial windows, interpolated positions).

Tensor types as an f16 mmproj: matrices and patch kernels F16, norms, biases and positions F32.
Every encoder has >= 64 patches, so that ggml takes its tiled flash attention.

  python tests/data/make_tiny_vision_qwen.py
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_archs as mk  # noqa: E402
import make_tiny_vision as tv  # noqa: E402

IMAGES = {"square": "square-224.png", "wide": "wide-300x170.png"}
#: the CLIP mean and deviation Qwen's image processors use
MEAN, STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


@dataclass(frozen=True)
class QwenDims(tv.VisionDims):
    """A Qwen VL projector: its type, the text model it goes with and its own keys."""

    projector: str = "qwen2vl_merger"
    text_model: str = "tiny-qwen2vl-f32.gguf"
    n_wa_pattern: int = 0
    deepstack: tuple[int, ...] = ()

    @property
    def mmproj(self) -> str:
        return f"tiny-mmproj-{self.projector.removesuffix('_merger')}-f16.gguf"


QWEN2VL = QwenDims(image_size=224, patch_size=14, n_layer=2)
QWEN25VL = QwenDims(image_size=224, patch_size=14, n_layer=4, projector="qwen2.5vl_merger", n_wa_pattern=2)
QWEN3VL = QwenDims(image_size=224, patch_size=16, n_layer=3, projector="qwen3vl_merger",
                   text_model="tiny-qwen3vl-f32.gguf", deepstack=(0, 1))
PROJECTORS = (QWEN2VL, QWEN25VL, QWEN3VL)


def add_qwen_metadata(w: gguf.GGUFWriter, v: QwenDims) -> None:
    """The keys conversion/qwenvl.py and qwen3vl.py write."""
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name(f"tiny random {v.projector} projector")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_string("clip.projector_type", v.projector)
    w.add_bool("clip.has_vision_encoder", True)
    if v.projector == "qwen2.5vl_merger":
        w.add_bool("clip.use_silu", True)
        w.add_uint32("clip.vision.n_wa_pattern", v.n_wa_pattern)
    if v.projector == "qwen3vl_merger":
        w.add_bool("clip.use_gelu", True)
        w.add_uint32("clip.vision.spatial_merge_size", 2)
        w.add_array("clip.vision.is_deepstack_layers", [il in v.deepstack for il in range(v.n_layer)])
    w.add_uint32("clip.vision.image_size", v.image_size)
    w.add_uint32("clip.vision.patch_size", v.patch_size)
    w.add_uint32("clip.vision.embedding_length", v.n_embd)
    w.add_uint32("clip.vision.feed_forward_length", v.n_ff)
    w.add_uint32("clip.vision.block_count", v.n_layer)
    w.add_uint32("clip.vision.attention.head_count", v.n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projection_dim", v.n_embd_out)
    w.add_array("clip.vision.image_mean", MEAN)
    w.add_array("clip.vision.image_std", STD)


def add_qwen_weights(wt: mk.Weights, v: QwenDims) -> None:
    rng, d = wt.rng, v.n_embd
    qwen3, rms = v.projector == "qwen3vl_merger", v.projector == "qwen2.5vl_merger"
    for suffix in ("", ".1"):
        kernel = rng.standard_normal((d, 3, v.patch_size, v.patch_size)) * 0.07
        wt.w.add_tensor("v.patch_embd.weight" + suffix, kernel.astype(np.float16))
    if qwen3:
        wt.bias("v.patch_embd.bias", d)
        wt.vector("v.position_embd.weight", rng.standard_normal((v.n_patches, d)) * 0.2)

    def norm(name: str, n: int) -> None:
        wt.norm(name + ".weight", n)
        if not rms:
            wt.bias(name + ".bias", n)

    def linear(name: str, rows: int, cols: int, std: float = 0.15) -> None:
        wt.matrix(name + ".weight", rows, cols, std=std)
        wt.bias(name + ".bias", rows)

    for il in range(v.n_layer):
        p = f"v.blk.{il}."
        norm(p + "ln1", d)
        norm(p + "ln2", d)
        if qwen3:
            linear(p + "attn_qkv", 3 * d, d)
        else:
            for name in ("attn_q", "attn_k", "attn_v"):
                linear(p + name, d, d)
        linear(p + "attn_out", d, d)
        linear(p + "ffn_up", v.n_ff, d)
        if rms:
            linear(p + "ffn_gate", v.n_ff, d)
        linear(p + "ffn_down", d, v.n_ff, std=0.12)
    norm("v.post_ln", d)
    linear("mm.0", 4 * d, 4 * d, std=0.08)
    linear("mm.2", v.n_embd_out, 4 * d, std=0.08)
    for il in v.deepstack:
        p = f"v.deepstack.{il}."
        norm(p + "norm", 4 * d)
        linear(p + "fc1", 4 * d, 4 * d, std=0.08)
        linear(p + "fc2", v.n_embd_out, 4 * d, std=0.08)


def write_images() -> None:
    out = mk.DATA / "images"
    tv.draw_image(224, 224, 3).save(out / IMAGES["square"], optimize=True)
    tv.draw_image(300, 170, 4).save(out / IMAGES["wide"], optimize=True)


def main() -> None:
    for v in PROJECTORS:
        tv.write_mmproj(mk.DATA / "models" / v.mmproj, v, metadata=add_qwen_metadata, weights=add_qwen_weights)
    write_images()
    print("wrote", *(v.mmproj for v in PROJECTORS), *IMAGES.values())


if __name__ == "__main__":
    main()
