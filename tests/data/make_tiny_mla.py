#!/usr/bin/env python3
"""Writes tiny random-weight models of llama.cpp's `deepseek2` architecture (multi-head latent
attention) and their scenarios (tests/data/models/tiny-NAME-TYPE.gguf and
tests/data/scenarios/arch-NAME-TYPE.json, TYPE f32 or q8_0, and mla-shift-NAME-f32.json, the
latent cache's K-shift and state round trips; without expected values: benches/record_mla.py
adds llama.cpp's):

- deepseek2: DeepSeek-V3's layout: Q through its own compression (attn_q_a, attn_q_a_norm,
  attn_q_b), the split attn_k_b / attn_v_b of newer files (a latent cache, the absorbed
  products), YaRN with a log multiplier, one dense block then two of experts with a shared
  expert, sigmoid routing with the selection bias exp_probs_b, expert groups, renormalized
  and scaled weights.
- deepseek2-lite: DeepSeek-V2-Lite's layout: Q projected directly (attn_q, q_lora_rank 0), the
  joint attn_kv_b of older files (llama.cpp's non-MLA path: each head's key and value
  decompressed and cached), softmax routing (no expert_gating_func: llama.cpp's default), one
  dense block then one of experts.

Sizes: n_embd 256, 4 heads, kv_lora_rank 64, 64 rotated values per head (so that the cached
keys, 128 values, and values, 64, have the sizes the exact attention kernel takes); metadata as
convert_hf_to_gguf.py writes it (key_length/value_length are the cache's sizes in a split file,
head_count_kv 1, and the *_mla keys the heads'). q8_0: the matrices in Q8_0 (every row a
multiple of 32 long), routers, norms and biases F32.

  python tests/data/make_tiny_mla.py            # writes them all (deterministic)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_archs import N_VOCAB, TYPES, Weights, copy_vocab, scenario, write_scenario  # noqa: E402

DATA = Path(__file__).resolve().parent
ARCH = "deepseek2"
N_EMBD, N_HEAD, N_FF, N_CTX = 256, 4, 512, 256
KV_LORA, N_ROT = 64, 64


@dataclass(frozen=True)
class MlaSpec:
    name: str
    n_layer: int
    q_lora: int           # 0: attn_q
    split: bool           # attn_k_b / attn_v_b (else attn_kv_b)
    nope: int             # each query head's no-RoPE part
    head_v: int           # each head's value
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_shared: int
    gating: int | None    # 1 softmax, 2 sigmoid, None: absent
    probs_bias: bool
    groups: tuple[int, int] | None
    weights_norm: bool
    weights_scale: float
    yarn: bool


SPECS = [
    MlaSpec("deepseek2", n_layer=3, q_lora=64, split=True, nope=32, head_v=64, n_expert=8, n_expert_used=2,
            n_ff_exp=64, n_shared=1, gating=2, probs_bias=True, groups=(4, 2), weights_norm=True, weights_scale=2.5,
            yarn=True),
    MlaSpec("deepseek2-lite", n_layer=2, q_lora=0, split=False, nope=64, head_v=64, n_expert=4, n_expert_used=2,
            n_ff_exp=128, n_shared=2, gating=None, probs_bias=False, groups=None, weights_norm=False,
            weights_scale=1.0, yarn=False),
]


def add_metadata(w: gguf.GGUFWriter, s: MlaSpec) -> None:
    u32 = lambda k, v: w.add_uint32(f"{ARCH}.{k}", v)  # noqa: E731
    f32 = lambda k, v: w.add_float32(f"{ARCH}.{k}", v)  # noqa: E731
    u32("context_length", N_CTX)
    u32("embedding_length", N_EMBD)
    u32("block_count", s.n_layer)
    u32("feed_forward_length", N_FF)
    u32("attention.head_count", N_HEAD)
    f32("attention.layer_norm_rms_epsilon", 1e-6)
    f32("rope.freq_base", 10000.0)
    u32("rope.dimension_count", N_ROT)
    u32("attention.q_lora_rank", s.q_lora)
    u32("attention.kv_lora_rank", KV_LORA)
    if s.split:
        # the cache's sizes: one KV head of the latent and the rotated part, valued by the latent
        u32("attention.head_count_kv", 1)
        u32("attention.key_length", KV_LORA + N_ROT)
        u32("attention.value_length", KV_LORA)
        u32("attention.key_length_mla", s.nope + N_ROT)
        u32("attention.value_length_mla", s.head_v)
    else:
        u32("attention.head_count_kv", N_HEAD)
        u32("attention.key_length", s.nope + N_ROT)
        u32("attention.value_length", s.head_v)
    u32("leading_dense_block_count", 1)
    u32("expert_count", s.n_expert)
    u32("expert_used_count", s.n_expert_used)
    u32("expert_feed_forward_length", s.n_ff_exp)
    u32("expert_shared_count", s.n_shared)
    f32("expert_weights_scale", s.weights_scale)
    w.add_bool(f"{ARCH}.expert_weights_norm", s.weights_norm)
    if s.gating is not None:
        u32("expert_gating_func", s.gating)
    if s.groups:
        u32("expert_group_count", s.groups[0])
        u32("expert_group_used_count", s.groups[1])
    if s.yarn:
        w.add_string(f"{ARCH}.rope.scaling.type", "yarn")
        f32("rope.scaling.factor", 4.0)
        u32("rope.scaling.original_context_length", 32)
        # 0.1 * mscale_all_dim, as convert_hf_to_gguf.py writes it
        f32("rope.scaling.yarn_log_multiplier", 0.1 * 0.707)


def add_attention(wt: Weights, s: MlaSpec, p: str) -> None:
    dqk = s.nope + N_ROT
    if s.q_lora:
        wt.matrix(p + "attn_q_a.weight", s.q_lora, N_EMBD, std=0.07)
        wt.norm(p + "attn_q_a_norm.weight", s.q_lora)
        wt.matrix(p + "attn_q_b.weight", N_HEAD * dqk, s.q_lora, std=0.15)
    else:
        wt.matrix(p + "attn_q.weight", N_HEAD * dqk, N_EMBD, std=0.07)
    wt.matrix(p + "attn_kv_a_mqa.weight", KV_LORA + N_ROT, N_EMBD, std=0.07)
    wt.norm(p + "attn_kv_a_norm.weight", KV_LORA)
    if s.split:
        wt.matrix(p + "attn_k_b.weight", N_HEAD, KV_LORA, s.nope, std=0.2)
        wt.matrix(p + "attn_v_b.weight", N_HEAD, s.head_v, KV_LORA, std=0.15)
    else:
        wt.matrix(p + "attn_kv_b.weight", N_HEAD * (s.nope + s.head_v), KV_LORA, std=0.15)
    wt.matrix(p + "attn_output.weight", N_EMBD, N_HEAD * s.head_v, std=0.06)


def add_ffn(wt: Weights, s: MlaSpec, p: str, dense: bool) -> None:
    if dense:
        wt.matrix(p + "ffn_gate.weight", N_FF, N_EMBD, std=0.08)
        wt.matrix(p + "ffn_up.weight", N_FF, N_EMBD, std=0.08)
        wt.matrix(p + "ffn_down.weight", N_EMBD, N_FF, std=0.05)
        return
    ff, ne, ff_sh = s.n_ff_exp, s.n_expert, s.n_ff_exp * s.n_shared
    wt.vector(p + "ffn_gate_inp.weight", wt.rng.standard_normal((ne, N_EMBD)) * 0.1)
    if s.probs_bias:
        wt.vector(p + "exp_probs_b.bias", wt.rng.standard_normal(ne) * 0.1)
    wt.matrix(p + "ffn_gate_exps.weight", ne, ff, N_EMBD, std=0.1)
    wt.matrix(p + "ffn_up_exps.weight", ne, ff, N_EMBD, std=0.1)
    wt.matrix(p + "ffn_down_exps.weight", ne, N_EMBD, ff, std=0.08)
    wt.matrix(p + "ffn_gate_shexp.weight", ff_sh, N_EMBD, std=0.1)
    wt.matrix(p + "ffn_up_shexp.weight", ff_sh, N_EMBD, std=0.1)
    wt.matrix(p + "ffn_down_shexp.weight", N_EMBD, ff_sh, std=0.08)


def write_model(s: MlaSpec, qtype: str, path: Path) -> None:
    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_name(f"tiny random model {qtype}")
    add_metadata(w, s)
    copy_vocab(w)
    wt = Weights(w, np.random.default_rng(sum(map(ord, s.name))), qtype)
    wt.matrix("token_embd.weight", N_VOCAB, N_EMBD, std=1.0)
    wt.norm("output_norm.weight", N_EMBD)
    wt.matrix("output.weight", N_VOCAB, N_EMBD, std=0.08)
    for il in range(s.n_layer):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", N_EMBD)
        wt.norm(p + "ffn_norm.weight", N_EMBD)
        add_attention(wt, s, p)
        add_ffn(wt, s, p, dense=il == 0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def shift_scenario(model_file: str) -> dict:
    """The latent cache's sequence operations: a 40-token prompt, 8 cells removed from its
    middle and the rest shifted back over them (the K-shift rotates each key's RoPE part
    only), three more tokens, the whole state saved, cleared and restored, one token, then
    sequence 0's state saved and restored as sequence 1, two tokens."""
    rng = np.random.default_rng(5)
    tok = lambda n: [int(t) for t in rng.integers(3, N_VOCAB, n)]  # noqa: E731
    steps = [
        {"op": "decode", "tokens": [1] + tok(39), "pos": list(range(40)), "seq_ids": [[0]] * 40, "logits": [39]},
        {"op": "seq_rm", "seq_id": 0, "p0": 4, "p1": 12},
        {"op": "seq_add", "seq_id": 0, "p0": 12, "p1": -1, "delta": -8, "check_pos": [0]},
        {"op": "decode", "tokens": tok(3), "pos": [32, 33, 34], "seq_ids": [[0]] * 3, "logits": [0, 1, 2]},
        {"op": "state_save", "slot": "a"},
        {"op": "clear"},
        {"op": "state_load", "slot": "a"},
        {"op": "decode", "tokens": tok(1), "pos": [35], "seq_ids": [[0]], "logits": [0]},
        {"op": "seq_state_save", "seq_id": 0, "slot": "b"},
        {"op": "clear"},
        {"op": "seq_state_load", "seq_id": 1, "slot": "b"},
        {"op": "decode", "tokens": tok(2), "pos": [36, 37], "seq_ids": [[1]] * 2, "logits": [0, 1]},
    ]
    return {"name": Path(model_file).stem.replace("tiny-", "mla-shift-"), "model": model_file,
            "context": {"n_ctx": N_CTX, "n_batch": 64, "n_ubatch": 32, "n_seq_max": 2}, "steps": steps}


def main() -> None:
    for s in SPECS:
        for qtype in TYPES:
            model_file = f"tiny-{s.name}-{qtype}.gguf"
            write_model(s, qtype, DATA / "models" / model_file)
            print("wrote", model_file)
            write_scenario(scenario(model_file))
            if qtype == "f32":
                write_scenario(shift_scenario(model_file))


if __name__ == "__main__":
    main()
