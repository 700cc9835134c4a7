#!/usr/bin/env python3
"""Writes a tiny random LFM2-VL pair (benches/record_vision_lfm2.py records llama.cpp's libmtmd on
it into tests/data/scenarios/vision-lfm2-f32.json):

- tests/data/models/tiny-lfm2vl-f32.gguf: make_tiny_hybrid.py's tiny LFM2 (short convolutions and
  attention: a recurrent model in ferrollama's terms), its weights as tiny-lfm2-f32.gguf's, with
  the tiny llama's vocabulary where nine merges no English prompt uses become LFM2-VL's image
  tokens, CONTROL tokens (mtmd parses "<|image_start|>" / "<|image_end|>" and the tiles'
  "<|img_row_R_col_C|>" as special text, and looks "<|img_thumbnail|>" up by its piece): rows and
  columns up to 2x3, the grid of tests/data/images/pre-large.png; a ChatML chat template.
- tests/data/models/tiny-mmproj-lfm2-f16.gguf: a `clip` file of projector type lfm2:
  make_tiny_vision.py's SigLIP in 16x16 patches with 16x16 learned positions (image_size 256,
  as LFM2-VL's SigLIP2 NaFlex), resized by clip.cpp to each image's patch grid; pixel-unshuffled
  2x2 (clip.vision.projector.scale_factor) into rows of 256, LayerNorm'd (mm.input_norm) and
  projected by mm.1 (256 -> 128), GELU, mm.2 (128 -> the text model's 64). mtmd resizes an image
  to 64..256 tokens (multiples of 32 pixels): square-64.png to 256x256 (the learned grid),
  wide-100x37.png to a grid the positions are resized to; pre-large.png (1100x700) is over twice
  the pixel limit and tiles: 3x2 tiles of 512x512 (256 tokens each) and a thumbnail.

  python tests/data/make_tiny_vision_lfm2.py            # writes them (deterministic)
"""
from __future__ import annotations

import sys
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_archs as mk  # noqa: E402
import make_tiny_hybrid as hy  # noqa: E402
import make_tiny_vision as mv  # noqa: E402

DATA = mk.DATA
TEXT_MODEL = "tiny-lfm2vl-f32.gguf"
MMPROJ = "tiny-mmproj-lfm2-f16.gguf"
VISION = mv.VisionDims(image_size=256, patch_size=16, n_embd_out=hy.E)
HIDDEN = 128

#: LFM2-VL's image tokens in place of merges of the tiny llama's vocabulary that English prompts
#: do not use (make_tiny_vision_idefics3.py's choice)
_CONTROL = gguf.TokenType.CONTROL
IMAGE_TOKENS = {
    464: ("<|image_start|>", _CONTROL), 469: ("<|image_end|>", _CONTROL), 477: ("<|img_thumbnail|>", _CONTROL),
    **{tid: (f"<|img_row_{r}_col_{c}|>", _CONTROL)
       for tid, (r, c) in zip((490, 494, 507, 308, 418, 462), ((r, c) for r in (1, 2) for c in (1, 2, 3)))},
}

#: ChatML, as LFM2-VL's template (its image parts written as the media marker by the handlers)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def lfm2vl_vocab(w: gguf.GGUFWriter) -> None:
    mk.copy_vocab(w, IMAGE_TOKENS)
    w.add_chat_template(CHAT_TEMPLATE)


def add_lfm2_metadata(w: gguf.GGUFWriter, v: mv.VisionDims) -> None:
    """make_tiny_vision's SigLIP keys under projector type lfm2 (the MLP's width is mm.2's rows)."""
    mv.add_clip_metadata(w, v, "lfm2")


def add_lfm2_weights(wt: mk.Weights, v: mv.VisionDims) -> None:
    """SigLIP's tensors and LFM2-VL's connector: a LayerNorm over the unshuffled rows, then
    mm.1, GELU, mm.2, their outputs of an RMS near 2 as make_tiny_vision's."""
    mv.add_vit_weights(wt, v)
    merged = v.n_embd * v.merge * v.merge
    wt.norm("mm.input_norm.weight", merged)
    wt.bias("mm.input_norm.bias", merged)
    wt.matrix("mm.1.weight", HIDDEN, merged, std=0.12)
    wt.bias("mm.1.bias", HIDDEN)
    wt.matrix("mm.2.weight", v.n_embd_out, HIDDEN, std=0.14)
    wt.bias("mm.2.bias", v.n_embd_out)


def write_mmproj(path: Path, zero_blocks: bool = False) -> None:
    mv.write_mmproj(path, VISION, zero_blocks, metadata=add_lfm2_metadata, weights=add_lfm2_weights)


def main() -> None:
    hy.write_model("lfm2", "f32", DATA / "models" / TEXT_MODEL, vocab=lfm2vl_vocab)
    write_mmproj(DATA / "models" / MMPROJ)
    print("wrote", TEXT_MODEL, MMPROJ)


if __name__ == "__main__":
    main()
