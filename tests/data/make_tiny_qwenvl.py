#!/usr/bin/env python3
"""Writes the tiny random text models of Qwen2-VL / Qwen2.5-VL (`qwen2vl`), Qwen3-VL (`qwen3vl`)
and Qwen3-VL-MoE (`qwen3vlmoe`), their ordinary scenarios and their scenarios of image-like
embeddings at M-RoPE positions (tests/data/models/tiny-NAME-TYPE.gguf,
tests/data/scenarios/arch-NAME-TYPE.json and mrope-NAME-TYPE.json, without expected values:
`benches/record_archs.py arch-NAME-TYPE` and `benches/record_qwenvl.py` add llama.cpp's).
Built on make_tiny_archs.py (its vocabulary, weight scales and scenario):

- qwen2vl: Qwen2's layer (Q/K/V biases, heads of 64), M-RoPE (`rope.dimension_sections`
  [8, 12, 12, 0]: time, height, width, none; Qwen2-VL's [16, 24, 24, 0] for heads of 128, halved).
- qwen3vl: Qwen3's layer (per-head Q/K norms, heads of 128), interleaved M-RoPE (Qwen3-VL's
  sections [24, 20, 20, 0]), 3 blocks of which the first 2 take DeepStack rows
  (`n_deepstack_layers` 2: an image row holds n_embd * 3 values, the main embedding then one
  addition after each of blocks 0 and 1).
- qwen3vlmoe: as qwen3vl with Qwen3-MoE's experts (8, 2 used, expert FFN 128), 2 blocks,
  `n_deepstack_layers` 1.

The vocabulary is the tiny llama's where two Cyrillic merges no English prompt uses become the
Qwen image markers <|vision_start|> and <|vision_end|>, CONTROL tokens, so that mtmd's markers
(tools/mtmd/mtmd.cpp add_media for the qwen2vl / qwen25vl / qwen3vl projectors) are one token each.

  python tests/data/make_tiny_qwenvl.py            # writes them all (deterministic)
"""
from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_archs as mk  # noqa: E402
from scenario_rows import image_positions  # noqa: E402

DATA = mk.DATA

#: Qwen's image markers, in place of the Cyrillic merges "ра" and "ни" of the tiny llama's vocabulary
IMAGE_MARKERS = {494: ("<|vision_start|>", gguf.TokenType.CONTROL), 507: ("<|vision_end|>", gguf.TokenType.CONTROL)}

QWEN3_HEADS = {"attention.key_length": 128, "attention.value_length": 128}

#: (spec, dims): the text models, with the number of blocks each has
MODELS = [
    (mk.Spec("qwen2vl", "qwen2vl", {"rope.freq_base": 1000000.0, "rope.dimension_sections": [8, 12, 12, 0]},
             qkv_bias=True), mk.TINY),
    (mk.Spec("qwen3vl", "qwen3vl", {**QWEN3_HEADS, "rope.freq_base": 5000000.0,
                                    "rope.dimension_sections": [24, 20, 20, 0], "n_deepstack_layers": 2},
             head_dim=128, qk_norm="head"), mk.Dims(n_layer=3)),
    (mk.Spec("qwen3vlmoe", "qwen3vlmoe", {**QWEN3_HEADS, "rope.freq_base": 5000000.0,
                                          "rope.dimension_sections": [24, 20, 20, 0], "n_deepstack_layers": 1,
                                          "expert_feed_forward_length": 128},
             head_dim=128, qk_norm="head", experts=8, experts_used=2, n_ff_exp=128), mk.TINY),
]


def qwen_vocab(w: gguf.GGUFWriter) -> None:
    mk.copy_vocab(w, IMAGE_MARKERS)


def n_deepstack(spec: mk.Spec) -> int:
    return spec.metadata.get("n_deepstack_layers", 0)


def mrope_scenario(model_file: str) -> dict:
    """Text, then an image (4 x 3 tokens at position 8, one batch over two micro-batches of 8),
    text after it from 8 + max(4, 3); a second image (2 x 5 at 18) whose second half is decoded
    first, the sequence saved, the cache cleared, the sequence restored under id 1 and the
    image's first half decoded there (its tokens must not see the restored later ones: their 2-D
    positions come back with the state), then text after it from 18 + 5."""
    rng = np.random.default_rng(38)
    tok = lambda n: [int(t) for t in rng.integers(3, mk.N_VOCAB, n)]  # noqa: E731
    vision_start, vision_end = (t for t in IMAGE_MARKERS)
    text = lambda tokens, p0, seq, logits: {"op": "decode", "tokens": tokens, "pos": list(range(p0, p0 + len(tokens))),  # noqa: E731
                                            "seq_ids": [[seq]] * len(tokens), "logits": logits}
    image = lambda seed, pos, seq, logits: {"op": "decode", "embd": {"seed": seed, "n": len(pos)}, "pos": pos,  # noqa: E731
                                            "seq_ids": [[seq]] * len(pos), "logits": logits}
    image_b = image_positions(18, 2, 5)
    steps = [
        text([1] + tok(6) + [vision_start], 0, 0, [7]),
        {**image(1, image_positions(8, 4, 3), 0, [0, 3, 7, 11]), "check_pos": [0]},
        text([vision_end] + tok(4) + [vision_start], 12, 0, [0, 5]),
        image(2, image_b[5:], 0, [0, 4]),
        {"op": "seq_state_save", "seq_id": 0, "slot": "b"},
        {"op": "clear"},
        {"op": "seq_state_load", "seq_id": 1, "slot": "b"},
        image(3, image_b[:5], 1, [0, 2, 4]),
        {**text([vision_end] + tok(3), 23, 1, [0, 3]), "check_pos": [0, 1]},
    ]
    return {"name": Path(model_file).stem.replace("tiny-", "mrope-"), "model": model_file,
            "context": {"n_ctx": mk.N_CTX, "n_batch": 64, "n_ubatch": 8, "n_seq_max": 2}, "steps": steps}


#: Qwen3.5's tiny models (make_tiny_hybrid.py writes them): interleaved M-RoPE too, whose images
#: come through the qwen3vl projector; the same scenario of embeddings at 2-D positions
QWEN35_MODELS = ("tiny-qwen35-f32.gguf", "tiny-qwen35moe-f32.gguf")


def main() -> None:
    for spec, dims in MODELS:
        for qtype in mk.TYPES:
            model_file = f"tiny-{spec.name}-{qtype}.gguf"
            mk.write_model(spec, qtype, DATA / "models" / model_file, dims=dims, vocab=qwen_vocab)
            mk.write_scenario(mk.scenario(model_file))
            mk.write_scenario(mrope_scenario(model_file))
    for model_file in QWEN35_MODELS:
        mk.write_scenario(mrope_scenario(model_file))


if __name__ == "__main__":
    main()
