#!/usr/bin/env python3
"""Writes a tiny random Gemma 4 with its vision projector (projector type gemma4v) and a square
image that needs no resizing: benches/record_vision_gemma4.py records llama.cpp's libmtmd on the
pair, that image and make_tiny_vision.py's wide one into tests/data/scenarios/vision-gemma4-f32.json.

- tests/data/models/tiny-gemma4-vision-f32.gguf: make_tiny_gemma4.py's gemma4 (four layers, sliding
  and full, shared KV, per-layer embeddings, width 256: neither E2B's 1536 nor E4B's 2560, so
  that mtmd decodes its images non-causally), with make_tiny_vision.py's two Cyrillic merges
  turned into Gemma 4's image markers "<|image>" and "<image|>", CONTROL tokens (mtmd's add_media
  parses them as special text: one token each, as in Gemma 4), and a short chat template in Gemma
  4's turn format (a real Gemma 4 file carries its own; the tiny vocabulary spells the turn
  markers out) that writes a message's text parts in order, where the media markers stand.
- tests/data/models/tiny-mmproj-gemma4v-f16.gguf: a `clip` file of projector type gemma4v as
  conversion/gemma.py (Gemma4VisionAudioModel, vision only) writes it: 8x8 patches, width 64,
  4 heads of 16, 2 blocks, a gated FFN of 128 (GELU-quick: the converter writes no
  clip.use_gelu), pooled 3x3 (clip.cpp's default, no scale_factor key), image_size 224 (a
  placeholder, as the converter writes), mean 0 and std 1 (the graph maps pixels to [-1, 1]).
  Tensors: the patch kernel F16 (bias-free), the x and y position tables F32 (48 rows each),
  per block RMS norms ln1/ln2, per-head Q/K norms, post-attention and post-FFN norms, Q/K/V/out
  and gate/up/down F16 without biases, a one-value out_scale; v.std_bias / v.std_scale; the
  projection to the text model's 256. Gemma4ClippableLinear's scalars on some matrices (block
  0's attn_q input, block 1's ffn_down output, the projection's input) with bounds that clip
  part of the values, so that a clamp left out shows in the embeddings.
- tests/data/images/square-216.png: 216x216 pixels, whole 24-pixel blocks within 70..1120 tokens
  (81 image tokens, no resize); make_tiny_vision.py's wide-100x37.png is resized to 336x144 (84).

  python tests/data/make_tiny_vision_gemma4.py     # deterministic
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_archs as mk  # noqa: E402
import make_tiny_gemma4 as g4  # noqa: E402
import make_tiny_vision as tv  # noqa: E402

TEXT_MODEL = "tiny-gemma4-vision-f32.gguf"
MMPROJ = "tiny-mmproj-gemma4v-f16.gguf"
SQUARE = "square-216.png"
#: Gemma 4's image markers in place of make_tiny_vision.py's Gemma 3 ones (the same token ids)
IMAGE_MARKERS = {494: ("<|image>", gguf.TokenType.CONTROL), 507: ("<image|>", gguf.TokenType.CONTROL)}
VISION = replace(tv.VISION, image_size=224, merge=3)
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|turn>' + ('model' if message.role == 'assistant' else message.role) + '\\n' -}}"
    "{%- if message.content is string -%}{{- message.content | trim -}}"
    "{%- else -%}{%- for part in message.content -%}{{- part.text | trim if part.type == 'text' -}}{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<turn|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- endif -%}"
)
POS_SIZE = 48
#: (matrix prefix, scalar, value): Gemma4ClippableLinear's bounds that clip some of the values
CLAMPS = [("v.blk.0.attn_q", "input_min", -1.5), ("v.blk.0.attn_q", "input_max", 1.5),
          ("v.blk.1.ffn_down", "output_max", 0.4), ("v.blk.1.ffn_down", "output_min", -0.4),
          ("mm.input_projection", "input_max", 2.0)]


def add_clip_metadata(w: gguf.GGUFWriter, v: tv.VisionDims) -> None:
    """make_tiny_vision's keys, as Gemma4VisionAudioModel writes them for gemma4v."""
    tv.add_clip_metadata(w, v, projector="gemma4v")
    keys = w.kv_data[0]
    for key in ("clip.use_gelu", "clip.vision.projector.scale_factor", "clip.vision.image_mean", "clip.vision.image_std"):
        del keys[key]
    w.add_array("clip.vision.image_mean", [0.0, 0.0, 0.0])
    w.add_array("clip.vision.image_std", [1.0, 1.0, 1.0])


def add_vision_weights(wt: mk.Weights, v: tv.VisionDims) -> None:
    rng, d, hd = wt.rng, v.n_embd, v.n_embd // v.n_head
    kernel = rng.standard_normal((d, 3, v.patch_size, v.patch_size)) * 0.1
    wt.w.add_tensor("v.patch_embd.weight", kernel.astype(np.float16))  # the converter's F16 for an f16 file
    # (2, positions, n_embd): the x table, then the y table
    wt.vector("v.position_embd.weight", rng.standard_normal((2, POS_SIZE, d)) * 0.3)
    for il in range(v.n_layer):
        p = f"v.blk.{il}."
        for name in ("ln1", "ln2", "attn_post_norm", "ffn_post_norm"):
            wt.norm(p + name + ".weight", d)
        for name in ("attn_q_norm", "attn_k_norm"):
            wt.norm(p + name + ".weight", hd)
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            wt.matrix(p + name + ".weight", d, d, std=0.15)
        wt.matrix(p + "ffn_gate.weight", v.n_ff, d, std=0.15)
        wt.matrix(p + "ffn_up.weight", v.n_ff, d, std=0.15)
        wt.matrix(p + "ffn_down.weight", d, v.n_ff, std=0.12)
        wt.vector(p + "out_scale.weight", np.array([rng.uniform(0.6, 1.4)]))
    wt.vector("v.std_bias", rng.standard_normal(d) * 0.1)
    wt.vector("v.std_scale", rng.uniform(0.8, 1.2, d))
    # (n_embd_text, n_embd_v): ggml ne [n_embd_v, n_embd_text], multiplied as it is stored
    wt.matrix("mm.input_projection.weight", v.n_embd_out, d, std=0.25)
    for prefix, scalar, value in CLAMPS:
        wt.vector(f"{prefix}.{scalar}", np.array([value]))


def gemma4_vocab(w: gguf.GGUFWriter) -> None:
    mk.copy_vocab(w, IMAGE_MARKERS)
    w.add_chat_template(CHAT_TEMPLATE)


def write_square() -> None:
    tv.draw_image(216, 216, 3).save(tv.DATA / "images" / SQUARE, optimize=True)


def main() -> None:
    spec = next(s for s in g4.specs() if s.name == "gemma4")
    g4.write_model(spec, "f32", mk.DATA / "models" / TEXT_MODEL, vocab=gemma4_vocab)
    tv.write_mmproj(mk.DATA / "models" / MMPROJ, VISION, metadata=add_clip_metadata, weights=add_vision_weights)
    write_square()
    print("wrote", TEXT_MODEL, MMPROJ, SQUARE)


if __name__ == "__main__":
    main()
