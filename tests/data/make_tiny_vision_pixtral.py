#!/usr/bin/env python3
"""Writes two tiny random Pixtral pairs (benches/record_vision_pixtral.py records llama.cpp's libmtmd
on them and make_tiny_vision.py's two images into tests/data/scenarios/vision-pixtral-f32.json and
vision-mistral3-f32.json):

- tests/data/models/tiny-pixtral-f32.gguf: a tiny llama (Pixtral 12B's text model is one;
  make_tiny_archs.py's layout) on the tiny llama's vocabulary, where three merges no English
  prompt uses become Mistral's image tokens "[IMG]", "[IMG_BREAK]" and "[IMG_END]", CONTROL
  tokens (mtmd parses "[IMG_END]" as special text after an image), and Mistral Small 3.2's chat
  template (llama.cpp's models/templates/Mistral-Small-3.2-24B-Instruct-2506.jinja: typed content
  parts, "[IMG]" for an image part).
- tests/data/models/tiny-mistral3v-f32.gguf: a tiny mistral3 (Ministral 3's text architecture,
  make_tiny_tail.py's YaRN and attention temperature) at the tiny llama's width, same vocabulary.
- tests/data/models/tiny-mmproj-pixtral-f16.gguf: a `clip` file of projector type pixtral as
  convert_hf_to_gguf.py writes Pixtral 12B's (conversion/llava.py): 8x8 patches of images of any
  size (64x64: 8x8 patches, 100x37 resized by mtmd to 104x40: 13x5), width 64, 4 heads of 16, 2
  blocks of RMS norms (pre-norm `v.pre_ln` too) and a gated SiLU FFN of 128 (clip.use_silu), no
  biases and no position embedding (the graph's 2-D RoPE), then mm.1 (64 -> 256, bias), GELU, mm.2
  (256 -> 256, bias) and `v.token_embd.img_break`, the text model's embedding row of "[IMG_BREAK]"
  (which the graph puts after each row of image tokens but the last: 64 + 7 and 65 + 4 tokens).
- tests/data/models/tiny-mmproj-mistral3-f16.gguf: the same encoder on 4x4 patches with Mistral
  Small 3.1's patch merger (clip.vision.spatial_merge_size 2, `mm.input_norm`,
  `mm.patch_merger` 256 -> 64), mm.1 and mm.2 without biases, and clip.rope.freq_base as a
  Mistral-format conversion (conversion/pixtral.py) writes it: 64x64 gives 16x16 patches merged
  into 8x8 tokens, 100x37 (resized to 104x40) 26x10 patches into 13x5 (64 + 7 and 65 + 4 tokens).
  Both encoders see at least 64 patches (llama.cpp's tiled flash attention, REFERENCE.md).
F16 matrices, F32 vectors, as an f16 mmproj conversion writes them.

  python tests/data/make_tiny_vision_pixtral.py      # deterministic
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_archs as mk  # noqa: E402
import make_tiny_tail as tail  # noqa: E402
import make_tiny_vision as tv  # noqa: E402

DATA = mk.DATA
_CONTROL = gguf.TokenType.CONTROL
#: Mistral's image tokens in place of Cyrillic merges of the tiny llama's vocabulary
IMAGE_TOKENS = {494: ("[IMG]", _CONTROL), 490: ("[IMG_BREAK]", _CONTROL), 507: ("[IMG_END]", _CONTROL)}
IMG_BREAK = 490

PIXTRAL_TEXT = mk.Spec("pixtral", "llama")
#: Mistral Small 3.2's chat template, as llama.cpp keeps it (vendor/llama.cpp/models/templates)
CHAT_TEMPLATE = (DATA / "templates" / "Mistral-Small-3.2-24B-Instruct-2506.jinja").read_text()
#: make_tiny_tail's mistral3 at the tiny llama's width (heads of 64)
MISTRAL3_TEXT = replace(next(f.spec for f in tail.families() if f.spec.name == "mistral3"), name="mistral3v",
                        head_dim=mk.N_EMBD // mk.N_HEAD)


@dataclass(frozen=True)
class Pair:
    text_model: str
    text_spec: mk.Spec
    mmproj: str
    vision: tv.VisionDims
    #: Mistral Small 3.1's patch merger (clip.vision.spatial_merge_size = vision.merge)
    merger: bool
    chat_template: str = ""


PIXTRAL = Pair("tiny-pixtral-f32.gguf", PIXTRAL_TEXT, "tiny-mmproj-pixtral-f16.gguf",
               tv.VisionDims(image_size=64, patch_size=8, merge=1), merger=False, chat_template=CHAT_TEMPLATE)
MISTRAL3 = Pair("tiny-mistral3v-f32.gguf", MISTRAL3_TEXT, "tiny-mmproj-mistral3-f16.gguf",
                tv.VisionDims(image_size=64, patch_size=4, merge=2), merger=True)
PAIRS = (PIXTRAL, MISTRAL3)


def mistral_vocab(chat_template: str):  # noqa: ANN201 - a make_tiny_archs vocabulary writer
    def write(w: gguf.GGUFWriter) -> None:
        mk.copy_vocab(w, IMAGE_TOKENS)
        if chat_template:
            w.add_chat_template(chat_template)
    return write


def add_pixtral_metadata(w: gguf.GGUFWriter, pair: Pair) -> None:
    """make_tiny_vision's keys with Pixtral's in place of Gemma 3's."""
    v = pair.vision
    tv.add_clip_metadata(w, v, "pixtral")
    keys = w.kv_data[0]
    for key in ("clip.vision.projector.scale_factor", "clip.use_gelu", "clip.vision.attention.layer_norm_epsilon"):
        del keys[key]
    w.add_bool("clip.use_silu", True)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    if pair.merger:
        w.add_uint32("clip.vision.spatial_merge_size", v.merge)
        w.add_float32("clip.rope.freq_base", 10000.0)


def add_pixtral_weights(wt: mk.Weights, pair: Pair, img_break: np.ndarray) -> None:
    """Pixtral's encoder (no biases, RMS norms, gated FFN), the merger if any, the MLP and the break."""
    v, rng = pair.vision, wt.rng
    wt.vector("v.patch_embd.weight", rng.standard_normal((v.n_embd, 3, v.patch_size, v.patch_size)) * 0.1)
    wt.norm("v.pre_ln.weight", v.n_embd)
    for il in range(v.n_layer):
        p = f"v.blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            wt.matrix(p + name + ".weight", v.n_embd, v.n_embd, std=0.15)
        for name in ("ln1", "ln2"):
            wt.norm(p + name + ".weight", v.n_embd)
        wt.matrix(p + "ffn_gate.weight", v.n_ff, v.n_embd, std=0.15)
        wt.matrix(p + "ffn_up.weight", v.n_ff, v.n_embd, std=0.15)
        wt.matrix(p + "ffn_down.weight", v.n_embd, v.n_ff, std=0.12)
    if pair.merger:
        wt.norm("mm.input_norm.weight", v.n_embd)
        wt.matrix("mm.patch_merger.weight", v.n_embd, v.n_embd * v.merge * v.merge, std=0.08)
    wt.matrix("mm.1.weight", v.n_embd_out, v.n_embd, std=0.15)
    # image tokens of RMS ~2 (the merger's RMS norm makes Mistral Small's smaller), as make_tiny_vision's
    wt.matrix("mm.2.weight", v.n_embd_out, v.n_embd_out, std=0.1 if pair.merger else 0.07)
    if not pair.merger:  # Pixtral 12B's adapter has biases, Mistral Small's none
        wt.bias("mm.1.bias", v.n_embd_out)
        wt.bias("mm.2.bias", v.n_embd_out)
    wt.vector("v.token_embd.img_break", img_break)


def token_embedding_row(model: Path, token: int) -> np.ndarray:
    t = next(t for t in gguf.GGUFReader(model).tensors if t.name == "token_embd.weight")
    return np.asarray(t.data[token], np.float32)


def write_mmproj(pair: Pair) -> None:
    w = gguf.GGUFWriter(str(DATA / "models" / pair.mmproj), "clip")
    add_pixtral_metadata(w, pair)
    img_break = token_embedding_row(DATA / "models" / pair.text_model, IMG_BREAK)
    add_pixtral_weights(mk.Weights(w, np.random.default_rng(3838), "f16"), pair, img_break)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    for pair in PAIRS:
        mk.write_model(pair.text_spec, "f32", DATA / "models" / pair.text_model, vocab=mistral_vocab(pair.chat_template))
        write_mmproj(pair)
        print("wrote", pair.text_model, pair.mmproj)


if __name__ == "__main__":
    main()
