#!/usr/bin/env python3
"""Writes a tiny random SmolVLM pair (benches/record_vision_idefics3.py records llama.cpp's libmtmd
on it into tests/data/scenarios/vision-idefics3-f32.json):

- tests/data/models/tiny-smolvlm-f32.gguf: a tiny llama (SmolVLM's text model is a llama;
  make_tiny_archs.py's layout, a context of 512 for prompts with two tiled images) with the
  tiny llama's vocabulary, where twelve merges no English prompt uses become Idefics3's image
  tokens: "<fake_token_around_image>", "<global-img>" and "<row_R_col_C>" for a grid up to 3x3
  as CONTROL tokens (special tokens parsed from mtmd's slice template text), and "\\n\\n" as a
  NORMAL token (mtmd looks it up by its piece, lookup_token, as it does "\\n": the byte token);
  SmolVLM's chat template.
- tests/data/models/tiny-mmproj-idefics3-f16.gguf: a `clip` file of projector type idefics3:
  make_tiny_vision.py's SigLIP on 32x32 tiles in 4x4 patches (64 patches), the preprocessor's
  longest edge 96 (clip.vision.preproc_image_size), pixel-shuffled 2x2
  (clip.vision.projector.scale_factor) into 16 rows of 256 per tile, projected by
  mm.model.fc (F16, no bias) to the text model's 256. An image is resized to 96 on its longest
  side, then up to whole 32-pixel tiles: square-64.png gives 3x3 tiles and wide-100x37.png 3x2,
  each plus the 32x32 overview (160 and 112 image tokens).

  python tests/data/make_tiny_vision_idefics3.py            # writes them (deterministic)
"""
from __future__ import annotations

import sys
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_archs as mk  # noqa: E402
import make_tiny_vision as mv  # noqa: E402

DATA = mk.DATA
TEXT_MODEL = "tiny-smolvlm-f32.gguf"
MMPROJ = "tiny-mmproj-idefics3-f16.gguf"
LONGEST_EDGE = 96
VISION = mv.VisionDims(image_size=32, patch_size=4)

#: Idefics3's image tokens in place of merges of the tiny llama's vocabulary that English
#: prompts do not use (Cyrillic, runs of spaces, "\\", "##", "Comment")
_CONTROL = gguf.TokenType.CONTROL
IMAGE_TOKENS = {
    464: ("<fake_token_around_image>", _CONTROL), 469: ("<global-img>", _CONTROL), 477: ("\n\n", gguf.TokenType.NORMAL),
    **{tid: (f"<row_{r}_col_{c}>", _CONTROL)
       for tid, (r, c) in zip((490, 494, 507, 308, 418, 462, 320, 444, 461), ((r, c) for r in (1, 2, 3) for c in (1, 2, 3)))},
}

SMOLVLM = mk.Spec("smolvlm", "llama")

#: SmolVLM's chat template (its chat_template.json): "User:" turns whose content parts are text
#: or images, each turn closed by <end_of_utterance>
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def smolvlm_vocab(w: gguf.GGUFWriter) -> None:
    mk.copy_vocab(w, IMAGE_TOKENS)
    w.add_chat_template(CHAT_TEMPLATE)


def add_idefics3_metadata(w: gguf.GGUFWriter, v: mv.VisionDims) -> None:
    """make_tiny_vision's SigLIP keys, and the preprocessor's longest edge as conversion/smolvlm.py
    writes it."""
    mv.add_clip_metadata(w, v, "idefics3")
    w.add_uint32("clip.vision.preproc_image_size", LONGEST_EDGE)


def add_idefics3_weights(wt: mk.Weights, v: mv.VisionDims) -> None:
    """SigLIP's tensors and the connector's projection: (n_embd_text, n_merge² n_embd_v), its
    outputs of an RMS near 2 as make_tiny_vision's."""
    mv.add_vit_weights(wt, v)
    wt.matrix("mm.model.fc.weight", v.n_embd_out, v.n_embd * v.merge * v.merge, std=0.12)


def write_mmproj(path: Path, zero_blocks: bool = False) -> None:
    mv.write_mmproj(path, VISION, zero_blocks, metadata=add_idefics3_metadata, weights=add_idefics3_weights)


def main() -> None:
    mk.write_model(SMOLVLM, "f32", DATA / "models" / TEXT_MODEL, dims=mk.Dims(n_ctx=512), vocab=smolvlm_vocab)
    write_mmproj(DATA / "models" / MMPROJ)
    print("wrote", TEXT_MODEL, MMPROJ)


if __name__ == "__main__":
    main()
