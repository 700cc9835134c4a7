#!/usr/bin/env python3
"""Writes the tiny random-weight models of the long tail of 2025-26 architectures
(tests/data/models/tiny-NAME-{f32,q8_0}.gguf) and their scenarios
(tests/data/scenarios/arch-NAME-{f32,q8_0}.json, without expected values: benches/recorder.py's
update_scenarios(("arch-*.json",), NAMES, extra_bufts=False) adds llama.cpp's, without its AMX
buffers, which trap on this CPU). It extends make_tiny_archs.py (its Spec, weights, vocabulary, metadata
and scenario) with the layer layouts those families add.

Each model shows every distinctive feature of its family so that it changes the logits: SmolLM3
has 4 layers, the fourth without RoPE (llama.cpp's fixed period of 4); Mistral 3 rotates by YaRN
from an original context of 16 positions with betas of its own (0.5 and 0.125: correction dims
2..6 instead of the defaults' 0..2), 16 positions being also the step of its attention
temperature (Q x 1, 1.35, 1.55 over the 48-token prompt); Qwen2-MoE has Q/K/V biases,
4 experts (2 per token, weights not renormalized) and a shared expert whose sigmoid gate (of std
~1.1 over the tokens) lets part of it through; OLMoE normalizes Q and K over whole projections
(as many KV heads as heads, as llama.cpp's n_embd-long norms need) before 4 experts of
feed_forward_length rows; EXAONE 4 has the 64 layers llama.cpp needs to give it sliding windows
(3 of every 4 layers, window 8, rotated; the global ones without RoPE), post-norms and per-head
Q/K norms, at n_embd 32 so that its file stays small (its rope.freq_base_swa, which only
llama.cpp's K-shift reads, differs from the base); Seed-OSS has heads of key_length 32 with 6 heads
(Q of 192 values for n_embd 128), Q/K/V biases and its FFN norm named post_attention_norm; ERNIE
4.5 is the llama block; ERNIE 4.5 MoE a dense first layer (leading_dense_block_count 1), then
experts with a selection bias (exp_probs_b) and a shared expert; Cohere 2 has 4 parallel layers
(3 sliding with window 8, the 4th global without RoPE; rope.freq_base_swa, which only llama.cpp's
K-shift reads, differs from the base), LayerNorms without bias, the output tied
to the embedding and logits times 0.25; StarCoder 2 LayerNorms with biases (the output norm's
too), biases on every projection and a GELU FFN without gate.

The F32 models of the families with layers without RoPE also get a context-shift scenario
(tests/data/scenarios/kshift-NAME.json): llama.cpp's K-shift rotates those layers' keys too, and
the sliding layers by rope.freq_base_swa, which EXAONE 4's and Cohere 2's graphs do not use.

  python tests/data/make_tiny_tail.py [NAME ...]     # writes them (all by default; deterministic)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_archs as mk  # noqa: E402

DATA = mk.DATA
# Narrower than make_tiny_archs's models (n_embd 128, heads of 32), so that the families that need
# 4 layers or more to show every layer kind stay a few MB in F32.
SMALL = mk.Dims(n_embd=128, n_head=4, n_head_kv=2, n_ff=256)
HEAD_DIM = 32


def spec(name: str, arch: str, metadata: dict, **kw) -> mk.Spec:
    return mk.Spec(name, arch, metadata, head_dim=HEAD_DIM, **kw)


@dataclass
class Family:
    """A tiny model: make_tiny_archs's Spec, its sizes, and (where the family lays its layers
    out otherwise) its own layer writer."""

    spec: mk.Spec
    dims: mk.Dims = SMALL
    layer: Callable[[mk.Weights, mk.Spec, int, mk.Dims], None] = mk.add_layer


def shared_expert_layer(wt: mk.Weights, s: mk.Spec, il: int, dims: mk.Dims) -> None:
    """make_tiny_archs's layer with experts, plus a shared expert behind a sigmoid gate
    (Qwen2-MoE's ffn_*_shexp and ffn_gate_inp_shexp)."""
    mk.add_layer(wt, s, il, dims)
    p, ff = f"blk.{il}.", s.metadata["expert_shared_feed_forward_length"]
    wt.matrix(p + "ffn_gate_shexp.weight", ff, dims.n_embd, std=0.08)
    wt.matrix(p + "ffn_up_shexp.weight", ff, dims.n_embd, std=0.08)
    wt.matrix(p + "ffn_down_shexp.weight", dims.n_embd, ff, std=0.05)
    wt.vector(p + "ffn_gate_inp_shexp.weight", wt.rng.standard_normal(dims.n_embd) * 0.1)


def ernie_moe_layer(wt: mk.Weights, s: mk.Spec, il: int, dims: mk.Dims) -> None:
    """ERNIE 4.5 MoE: dense leading layers, then experts with a selection bias (exp_probs_b) and
    a shared expert."""
    if il < s.metadata["leading_dense_block_count"]:
        mk.add_layer(wt, replace(s, experts=0), il, dims)
        return
    mk.add_layer(wt, s, il, dims)
    p, ff = f"blk.{il}.", s.metadata["expert_shared_feed_forward_length"]
    wt.vector(p + "exp_probs_b.bias", wt.rng.standard_normal(s.experts) * 0.2)
    wt.matrix(p + "ffn_gate_shexp.weight", ff, dims.n_embd, std=0.08)
    wt.matrix(p + "ffn_up_shexp.weight", ff, dims.n_embd, std=0.08)
    wt.matrix(p + "ffn_down_shexp.weight", dims.n_embd, ff, std=0.05)


def attention_weights(wt: mk.Weights, s: mk.Spec, p: str, dims: mk.Dims, o_bias: bool) -> None:
    q_dim, kv_dim = dims.n_head * s.head_dim, dims.n_head_kv * s.head_dim
    wt.matrix(p + "attn_q.weight", q_dim, dims.n_embd, std=0.06)
    wt.matrix(p + "attn_k.weight", kv_dim, dims.n_embd, std=0.06)
    wt.matrix(p + "attn_v.weight", kv_dim, dims.n_embd, std=0.08)
    wt.matrix(p + "attn_output.weight", dims.n_embd, q_dim, std=0.05)
    if s.qkv_bias:
        wt.bias(p + "attn_q.bias", q_dim)
        wt.bias(p + "attn_k.bias", kv_dim)
        wt.bias(p + "attn_v.bias", kv_dim)
    if o_bias:
        wt.bias(p + "attn_output.bias", dims.n_embd)


def cohere2_layer(wt: mk.Weights, s: mk.Spec, il: int, dims: mk.Dims) -> None:
    """Cohere 2: one LayerNorm (weight only) before attention and FFN side by side."""
    p = f"blk.{il}."
    wt.norm(p + "attn_norm.weight", dims.n_embd)
    attention_weights(wt, s, p, dims, o_bias=False)
    wt.matrix(p + "ffn_gate.weight", dims.n_ff, dims.n_embd, std=0.08)
    wt.matrix(p + "ffn_up.weight", dims.n_ff, dims.n_embd, std=0.08)
    wt.matrix(p + "ffn_down.weight", dims.n_embd, dims.n_ff, std=0.05)


def starcoder2_layer(wt: mk.Weights, s: mk.Spec, il: int, dims: mk.Dims) -> None:
    """StarCoder 2: LayerNorms with biases, biases on every projection, a GELU FFN without gate."""
    p = f"blk.{il}."
    wt.norm(p + "attn_norm.weight", dims.n_embd)
    wt.bias(p + "attn_norm.bias", dims.n_embd)
    attention_weights(wt, s, p, dims, o_bias=True)
    wt.norm(p + "ffn_norm.weight", dims.n_embd)
    wt.bias(p + "ffn_norm.bias", dims.n_embd)
    wt.matrix(p + "ffn_up.weight", dims.n_ff, dims.n_embd, std=0.08)
    wt.bias(p + "ffn_up.bias", dims.n_ff)
    wt.matrix(p + "ffn_down.weight", dims.n_embd, dims.n_ff, std=0.05)
    wt.bias(p + "ffn_down.bias", dims.n_embd)


def families() -> list[Family]:
    return [
        Family(spec("smollm3", "smollm3", {"rope.freq_base": 5000.0}), replace(SMALL, n_layer=4)),
        Family(spec("mistral3", "mistral3", {
            "rope.freq_base": 10000.0, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
            "rope.scaling.original_context_length": 16, "rope.scaling.yarn_beta_fast": 0.5,
            "rope.scaling.yarn_beta_slow": 0.125, "rope.scaling.yarn_log_multiplier": 1.0,
            "attention.temperature_scale": 0.5})),
        Family(spec("qwen2moe", "qwen2moe", {"expert_feed_forward_length": 64, "expert_shared_feed_forward_length": 128,
                                             "rope.freq_base": 1000000.0},
                    qkv_bias=True, experts=4, experts_used=2, n_ff_exp=64), layer=shared_expert_layer),
        Family(spec("olmoe", "olmoe", {}, qk_norm="whole", experts=4, experts_used=2),
               replace(SMALL, n_head_kv=4, n_ff=128)),
        Family(mk.Spec("exaone4", "exaone4", {"attention.sliding_window": 8, "rope.freq_base": 1000000.0,
                                              "rope.freq_base_swa": 10000.0},
                       head_dim=16, pre_norms=False, qk_norm="head", post_norms=True),
               mk.Dims(n_embd=32, n_head=2, n_head_kv=1, n_layer=64, n_ff=32)),
        Family(spec("seed_oss", "seed_oss", {"attention.key_length": HEAD_DIM, "attention.value_length": HEAD_DIM},
                    qkv_bias=True, ffn_norm="post_attention_norm.weight"), replace(SMALL, n_head=6)),
        Family(spec("ernie4_5", "ernie4_5", {"rope.freq_base": 500000.0})),
        Family(spec("ernie4_5-moe", "ernie4_5-moe", {
            "expert_feed_forward_length": 64, "expert_shared_feed_forward_length": 64,
            "interleave_moe_layer_step": 1, "leading_dense_block_count": 1}, experts=4, experts_used=2, n_ff_exp=64),
               layer=ernie_moe_layer),
        Family(spec("cohere2", "cohere2", {"attention.sliding_window": 8, "attention.layer_norm_epsilon": 1e-5,
                                           "logit_scale": 0.25, "rope.freq_base": 50000.0,
                                           "rope.freq_base_swa": 10000.0}, tied=True),
               replace(SMALL, n_layer=4), layer=cohere2_layer),
        Family(spec("starcoder2", "starcoder2", {"attention.layer_norm_epsilon": 1e-5, "rope.freq_base": 100000.0},
                    qkv_bias=True, global_tensors={"output_norm.bias": np.random.default_rng(2).standard_normal(128) * 0.1}),
               layer=starcoder2_layer),
    ]


#: the families whose K-shift reaches layers without RoPE (and sliding layers of a base of their
#: own that the graph does not use): a context shift of their F32 model (kshift-NAME.json)
KSHIFT = ("smollm3", "exaone4", "cohere2")


def kshift_scenario(model_file: str, name: str) -> dict:
    """A context shift as tests/data/scenarios/gemma3-context-shift.json makes it: three
    micro-batches of 32 tokens, positions 4..49 dropped and 50..95 moved back by 46 (the K-shift),
    two more micro-batches, a second shift (59..113 by -55), and 40 more tokens."""
    rng = np.random.default_rng(13)
    tok = lambda n: [int(t) for t in rng.integers(3, mk.N_VOCAB, n)]  # noqa: E731

    def decode(p0: int, n: int) -> dict:
        tokens = ([1] + tok(n - 1)) if p0 == 0 else tok(n)
        return {"op": "decode", "tokens": tokens, "pos": list(range(p0, p0 + n)), "seq_ids": [[0]] * n,
                "logits": [n - 1]}

    def shift(keep: int, p0: int, p1: int) -> list[dict]:
        return [{"op": "seq_rm", "seq_id": 0, "p0": keep, "p1": p0},
                {"op": "seq_add", "seq_id": 0, "p0": p0, "p1": p1, "delta": keep - p0, "check_pos": [0]}]

    steps = [decode(0, 32), decode(32, 32), decode(64, 32), *shift(4, 50, 96), decode(50, 32), decode(82, 32),
             *shift(4, 59, 114), decode(59, 32), decode(91, 8)]
    return {"name": name, "model": model_file, "context": {"n_ctx": 128, "n_batch": 32, "n_ubatch": 32},
            "steps": steps}


def write_model(f: Family, qtype: str, path: Path) -> None:
    s, dims = f.spec, f.dims
    w = gguf.GGUFWriter(str(path), s.arch)
    w.add_name(f"tiny random model {qtype}")
    mk.add_metadata(w, s, dims)
    mk.copy_vocab(w)
    rng = np.random.default_rng(sum(map(ord, s.name)))
    wt = mk.Weights(w, rng, qtype)
    wt.matrix("token_embd.weight", mk.N_VOCAB, dims.n_embd, std=1.0)
    wt.norm("output_norm.weight", dims.n_embd)
    if not s.tied:
        wt.matrix("output.weight", mk.N_VOCAB, dims.n_embd, std=0.08)
    for name, values in s.global_tensors.items():
        wt.vector(name, values)
    for il in range(dims.n_layer):
        f.layer(wt, s, il, dims)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(names: list[str]) -> None:
    for f in families():
        if names and f.spec.name not in names:
            continue
        for qtype in mk.TYPES:
            model_file = f"tiny-{f.spec.name}-{qtype}.gguf"
            write_model(f, qtype, DATA / "models" / model_file)
            print("wrote", model_file)
            mk.write_scenario(mk.scenario(model_file))
        if f.spec.name in KSHIFT:
            mk.write_scenario(kshift_scenario(f"tiny-{f.spec.name}-f32.gguf", f"kshift-{f.spec.name}"))


if __name__ == "__main__":
    main(sys.argv[1:])
