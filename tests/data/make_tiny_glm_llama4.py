#!/usr/bin/env python3
"""Writes the tiny random-weight models of GLM-4.5 (`glm4moe`) and Llama 4 (`llama4`) and their
scenarios (tests/data/models/tiny-NAME-TYPE.gguf, tests/data/scenarios/arch-NAME-TYPE.json,
without expected values: benches/record_archs.py adds llama.cpp's). Built on make_tiny_archs.py
(its vocabulary, weight scales and scenario), with the layer layouts of these two families.

glm4moe: 2 trunk blocks (the first dense, `leading_dense_block_count` 1; the second a mixture
of 4 experts, 2 used, sigmoid routing with the selection bias `exp_probs_b`, weights normalized
and scaled by 2.5, and a shared expert) and 1 NextN (multi-token-prediction) block after them
(`nextn_predict_layers` 1: its extra tensors eh_proj, enorm, hnorm, shared_head_norm), which
llama.cpp loads and never runs. Q/K/V biases, per-head Q/K norms, heads of 64 values of which
RoPE rotates 32 (partial rotary).

llama4: 4 blocks: dense FFNs on blocks 0 and 2, experts (4, top-1 by the router's logit,
weighted by its sigmoid before the experts' products) with a shared expert on blocks 1 and 3
(`interleave_moe_layer_step` 2); chunked attention on blocks 0-2 and full attention without
RoPE on block 3 (llama.cpp's default pattern, 3 chunked : 1 full, the last of each 4 without
RoPE); Llama 3 RoPE frequency factors; L2 norms of Q and K on the RoPE blocks. llama.cpp fixes
Llama 4's chunk at 8192 positions (and the attention temperature's floor scale of the no-RoPE
blocks at 8192 too), whatever the file says: so the scenario's positions start at
100 * 8192 - 22, where the prompt crosses a chunk boundary in its first micro-batch and the
no-RoPE block's queries are scaled by a temperature of about 1.46 (log(100) * 0.1 + 1; at
positions below 8191 it is 1 and changes nothing).

  python tests/data/make_tiny_glm_llama4.py            # writes them all (deterministic)
"""
from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_archs import N_CTX, N_VOCAB, Weights, copy_vocab, llama3_rope_freqs, scenario, write_scenario  # noqa: E402

DATA = Path(__file__).resolve().parent
TYPES = ("f32", "q8_0")
N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM = 256, 4, 2, 64
Q_DIM, KV_DIM = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM

#: llama.cpp's fixed Llama 4 chunk (and temperature floor scale); the scenario's positions start
#: 22 before the boundary of the 100th chunk.
LLAMA4_CHUNK = 8192
LLAMA4_POS0 = 100 * LLAMA4_CHUNK - 22


def add_keys(w: gguf.GGUFWriter, arch: str, keys: dict) -> None:
    for k, v in keys.items():
        name = f"{arch}.{k}"
        if isinstance(v, bool):
            w.add_bool(name, v)
        elif isinstance(v, int):
            w.add_uint32(name, v)
        elif isinstance(v, str):
            w.add_string(name, v)
        else:
            w.add_float32(name, v)


def common_keys(n_layer: int, n_ff: int, n_rot: int) -> dict:
    return {"context_length": N_CTX, "embedding_length": N_EMBD, "block_count": n_layer, "feed_forward_length": n_ff,
            "attention.head_count": N_HEAD, "attention.head_count_kv": N_HEAD_KV,
            "attention.layer_norm_rms_epsilon": 1e-5, "rope.dimension_count": n_rot}


def attention(wt: Weights, p: str, bias: bool = False, qk_norm: bool = False) -> None:
    wt.norm(p + "attn_norm.weight", N_EMBD)
    wt.matrix(p + "attn_q.weight", Q_DIM, N_EMBD, std=0.06)
    wt.matrix(p + "attn_k.weight", KV_DIM, N_EMBD, std=0.06)
    wt.matrix(p + "attn_v.weight", KV_DIM, N_EMBD, std=0.08)
    wt.matrix(p + "attn_output.weight", N_EMBD, Q_DIM, std=0.05)
    if bias:
        wt.bias(p + "attn_q.bias", Q_DIM)
        wt.bias(p + "attn_k.bias", KV_DIM)
        wt.bias(p + "attn_v.bias", KV_DIM)
    if qk_norm:
        wt.norm(p + "attn_q_norm.weight", HEAD_DIM)
        wt.norm(p + "attn_k_norm.weight", HEAD_DIM)


def dense_ffn(wt: Weights, p: str, n_ff: int) -> None:
    wt.matrix(p + "ffn_gate.weight", n_ff, N_EMBD, std=0.08)
    wt.matrix(p + "ffn_up.weight", n_ff, N_EMBD, std=0.08)
    wt.matrix(p + "ffn_down.weight", N_EMBD, n_ff, std=0.05)


def moe_ffn(wt: Weights, p: str, n_expert: int, n_ff_exp: int, n_ff_shexp: int, probs_b: bool = False) -> None:
    # the router in F32, as convert_hf_to_gguf.py keeps it
    wt.vector(p + "ffn_gate_inp.weight", wt.rng.standard_normal((n_expert, N_EMBD)) * 0.3)
    if probs_b:
        # large enough to change which experts some tokens choose
        wt.vector(p + "exp_probs_b.bias", wt.rng.standard_normal(n_expert) * 0.3)
    wt.matrix(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, N_EMBD, std=0.08)
    wt.matrix(p + "ffn_up_exps.weight", n_expert, n_ff_exp, N_EMBD, std=0.08)
    wt.matrix(p + "ffn_down_exps.weight", n_expert, N_EMBD, n_ff_exp, std=0.08)
    wt.matrix(p + "ffn_gate_shexp.weight", n_ff_shexp, N_EMBD, std=0.08)
    wt.matrix(p + "ffn_up_shexp.weight", n_ff_shexp, N_EMBD, std=0.08)
    wt.matrix(p + "ffn_down_shexp.weight", N_EMBD, n_ff_shexp, std=0.05)


def embeddings(wt: Weights) -> None:
    wt.matrix("token_embd.weight", N_VOCAB, N_EMBD, std=1.0)
    wt.norm("output_norm.weight", N_EMBD)
    wt.matrix("output.weight", N_VOCAB, N_EMBD, std=0.08)


# --- glm4moe -------------------------------------------------------------------------------------

GLM_EXPERTS, GLM_FF_EXP = 4, 64


def m_glm4moe(w: gguf.GGUFWriter, wt: Weights) -> None:
    add_keys(w, "glm4moe", common_keys(3, 256, 32) | {
        "rope.freq_base": 1000000.0, "attention.key_length": HEAD_DIM, "attention.value_length": HEAD_DIM,
        "expert_count": GLM_EXPERTS, "expert_used_count": 2, "expert_feed_forward_length": GLM_FF_EXP,
        "expert_shared_count": 1, "leading_dense_block_count": 1, "expert_weights_scale": 2.5,
        "expert_weights_norm": True, "expert_gating_func": 2, "nextn_predict_layers": 1})
    embeddings(wt)
    for il in range(3):
        p = f"blk.{il}."
        attention(wt, p, bias=True, qk_norm=True)
        wt.norm(p + "post_attention_norm.weight", N_EMBD)
        if il == 0:
            dense_ffn(wt, p, 256)
        else:
            moe_ffn(wt, p, GLM_EXPERTS, GLM_FF_EXP, GLM_FF_EXP, probs_b=True)
    # the NextN block's own tensors (nextn.embed_tokens and shared_head_head are optional: left out)
    p = "blk.2.nextn."
    wt.matrix(p + "eh_proj.weight", N_EMBD, 2 * N_EMBD, std=0.06)
    wt.norm(p + "enorm.weight", N_EMBD)
    wt.norm(p + "hnorm.weight", N_EMBD)
    wt.norm(p + "shared_head_norm.weight", N_EMBD)


# --- llama4 --------------------------------------------------------------------------------------

LLAMA4_EXPERTS, LLAMA4_FF_EXP = 4, 64


def m_llama4(w: gguf.GGUFWriter, wt: Weights) -> None:
    add_keys(w, "llama4", common_keys(4, 256, HEAD_DIM) | {
        "rope.freq_base": 500000.0, "attention.sliding_window": LLAMA4_CHUNK, "expert_count": LLAMA4_EXPERTS,
        "expert_used_count": 1, "expert_feed_forward_length": LLAMA4_FF_EXP, "interleave_moe_layer_step": 2})
    embeddings(wt)
    wt.vector("rope_freqs.weight", llama3_rope_freqs(HEAD_DIM, 500000.0))
    for il in range(4):
        p = f"blk.{il}."
        attention(wt, p)
        wt.norm(p + "ffn_norm.weight", N_EMBD)
        if (il + 1) % 2 == 0:
            moe_ffn(wt, p, LLAMA4_EXPERTS, LLAMA4_FF_EXP, LLAMA4_FF_EXP)
        else:
            dense_ffn(wt, p, 256)


def llama4_scenario(model_file: str) -> dict:
    """make_tiny_archs' scenario with every position moved LLAMA4_POS0 on."""
    scn = scenario(model_file)
    for step in scn["steps"]:
        step["pos"] = [LLAMA4_POS0 + p for p in step["pos"]]
    return scn


MODELS = {"glm4moe": (m_glm4moe, scenario), "llama4": (m_llama4, llama4_scenario)}


def write_model(name: str, qtype: str, path: Path, drop: tuple[str, ...] = (), extra: dict | None = None) -> None:
    """The model `name` in `qtype`; for the tests, without the tensors named in `drop` and with
    the F32 tensors of `extra` added."""
    build, _ = MODELS[name]
    w = gguf.GGUFWriter(str(path), name)
    w.add_name(f"tiny random model {qtype}")
    copy_vocab(w)
    if drop:
        add = w.add_tensor
        w.add_tensor = lambda n, *a, **k: None if n in drop or n.startswith(drop) else add(n, *a, **k)
    wt = Weights(w, np.random.default_rng(sum(map(ord, name))), qtype)
    build(w, wt)
    for n, values in (extra or {}).items():
        wt.vector(n, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(names: list[str]) -> None:
    for name in names or MODELS:
        for qtype in TYPES:
            model_file = f"tiny-{name}-{qtype}.gguf"
            path = DATA / "models" / model_file
            write_model(name, qtype, path)
            write_scenario(MODELS[name][1](model_file))


if __name__ == "__main__":
    main(sys.argv[1:])
