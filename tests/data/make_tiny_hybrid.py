#!/usr/bin/env python3
"""Writes tiny random-weight models of llama.cpp's recurrent and hybrid architectures
(tests/data/models/tiny-ARCH-TYPE.gguf, TYPE f32 or q8_0): mamba2, granitehybrid, lfm2, lfm2moe,
qwen3next, qwen35, qwen35moe, falcon-h1, nemotron_h and nemotron_h_moe. Their scenarios are
recorded by benches/record_hybrid.py (tests/data/scenarios/hybrid-ARCH-TYPE.json).

Each model has every layer kind of its family (recurrent and attention mixers, dense and MoE
feed-forwards), the tensors and metadata keys llama.cpp's loader reads, laid out as
convert_hf_to_gguf.py lays out a real checkpoint (numpy order: conv1d [channels, d_conv], A stored as
-exp(A_log), Mamba-2's A and D as [n_head, 1], its grouped norm as [n_group, d_inner / n_group],
Falcon-H1's pre-FFN norm named `blk.N.ffn_norm` without `.weight`, LFM2's output norm named
`token_embd_norm`, ...). Weights: matrices of std gain / sqrt(row length); the state-space
parameters in the ranges of real models (Mamba-2: A = -exp(A_log) in [-16, -1] as initialised,
dt log-uniform in [0.005, 0.5] through dt_bias = softplus^-1(dt), D in [0.5, 1.5]; gated delta net:
decays exp(-A softplus(a + dt_bias)) mostly in 0.5-0.99), scaled so that every part, the recurrent
state included, moves the logits by whole units (zeroing a mixer's output, the routed or shared
experts, D, or the state carried between tokens changes some logit by more than 2).

q8_0: the 2-D and 3-D weight matrices in Q8_0, except those convert_hf_to_gguf.py keeps in F32
(routers, conv1d kernels, norms, A, D, biases); every row length is a multiple of 32.

  python tests/data/make_tiny_hybrid.py            # writes them all (deterministic)
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_archs import copy_vocab  # noqa: E402 - the tiny models' shared vocabulary

DATA = Path(__file__).resolve().parent
N_VOCAB = 512
TYPES = ("f32", "q8_0")


class Weights:
    """Random tensors; `mat` draws std gain / sqrt(row length) and quantizes for q8_0."""

    def __init__(self, w: gguf.GGUFWriter, rng: np.random.Generator, qtype: str) -> None:
        self.w, self.rng, self.qtype = w, rng, qtype

    def mat(self, name: str, *shape: int, gain: float = 1.0) -> None:
        data = (self.rng.standard_normal(shape) * (gain / math.sqrt(shape[-1]))).astype(np.float32)
        if self.qtype == "q8_0":
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            self.w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            self.w.add_tensor(name, data)

    def f32(self, name: str, values) -> None:
        self.w.add_tensor(name, np.asarray(values, dtype=np.float32))

    def normal(self, name: str, *shape: int, std: float) -> None:
        self.f32(name, self.rng.standard_normal(shape) * std)

    def norm(self, name: str, *shape: int) -> None:
        self.f32(name, 1.0 + self.rng.standard_normal(shape) * 0.1)

    def uniform(self, lo: float, hi: float, n: int) -> np.ndarray:
        return self.rng.uniform(lo, hi, n)


def inv_softplus(y: np.ndarray) -> np.ndarray:
    return y + np.log(-np.expm1(-y))


# ---------------------------------------------------------------------------------------------
# building blocks (shapes in numpy order: the reverse of ggml's ne)

def embeddings(wt: Weights, n_embd: int, tied: bool, norm_name: str = "output_norm.weight") -> None:
    # untied: embeddings of std 1 like the other tiny models; tied: smaller, so that the logits
    # (output_norm(x) . token_embd) spread over a few units rather than sqrt(n_embd)
    wt.mat("token_embd.weight", N_VOCAB, n_embd, gain=math.sqrt(n_embd) * (0.4 if tied else 1.0))
    wt.norm(norm_name, n_embd)
    if not tied:
        wt.mat("output.weight", N_VOCAB, n_embd, gain=2.5)


def attention(wt: Weights, p: str, n_embd: int, n_head: int, n_head_kv: int, head_dim: int,
              q_gate: bool = False, qk_norm: bool = False, bias: bool = False) -> None:
    """attn_q/k/v/output; q_gate: Qwen3-Next's Q projection that yields [q, gate] per head."""
    wt.mat(p + "attn_q.weight", n_head * head_dim * (2 if q_gate else 1), n_embd)
    wt.mat(p + "attn_k.weight", n_head_kv * head_dim, n_embd)
    wt.mat(p + "attn_v.weight", n_head_kv * head_dim, n_embd, gain=1.3)
    wt.mat(p + "attn_output.weight", n_embd, n_head * head_dim, gain=0.8)
    if qk_norm:
        wt.norm(p + "attn_q_norm.weight", head_dim)
        wt.norm(p + "attn_k_norm.weight", head_dim)
    if bias:
        wt.normal(p + "attn_output.bias", n_embd, std=0.1)


def ffn(wt: Weights, p: str, n_embd: int, n_ff: int, gate: bool = True, suffix: str = "") -> None:
    if gate:
        wt.mat(f"{p}ffn_gate{suffix}.weight", n_ff, n_embd, gain=1.3)
    wt.mat(f"{p}ffn_up{suffix}.weight", n_ff, n_embd, gain=1.3)
    wt.mat(f"{p}ffn_down{suffix}.weight", n_embd, n_ff, gain=1.1)


def experts(wt: Weights, p: str, n_embd: int, n_expert: int, n_ff_exp: int, gate: bool = True) -> None:
    wt.normal(p + "ffn_gate_inp.weight", n_expert, n_embd, std=0.3)   # router: F32 as convert keeps it
    if gate:
        wt.mat(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd, gain=1.3)
    wt.mat(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd, gain=1.3)
    wt.mat(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp, gain=1.1)


def mamba2(wt: Weights, p: str, n_embd: int, d_inner: int, n_head: int, n_group: int, d_state: int,
           d_conv: int) -> None:
    """A Mamba-2 mixer: in_proj to [z, x, B, C, dt], causal conv over [x, B, C], the scan, the
    gated norm grouped by n_group, out_proj."""
    conv_dim = d_inner + 2 * n_group * d_state
    wt.mat(p + "ssm_in.weight", 2 * d_inner + 2 * n_group * d_state + n_head, n_embd, gain=1.5)
    wt.normal(p + "ssm_conv1d.weight", conv_dim, d_conv, std=0.5)
    wt.normal(p + "ssm_conv1d.bias", conv_dim, std=0.1)
    dt = np.exp(wt.uniform(math.log(5e-3), math.log(0.5), n_head))
    wt.f32(p + "ssm_dt.bias", inv_softplus(dt))
    wt.f32(p + "ssm_a", -wt.uniform(1.0, 16.0, n_head)[:, None])          # -exp(A_log), A_log = log U(1, 16)
    wt.f32(p + "ssm_d", wt.uniform(0.5, 1.5, n_head)[:, None])
    wt.norm(p + "ssm_norm.weight", n_group, d_inner // n_group)
    wt.mat(p + "ssm_out.weight", n_embd, d_inner, gain=0.8)


def gated_delta_net(wt: Weights, p: str, n_embd: int, n_k_heads: int, n_v_heads: int, head_dim: int,
                    d_conv: int, fused_ba: bool) -> None:
    """Qwen3-Next / Qwen3.5 linear attention: attn_qkv [q, k, v] (key heads n_k_heads, value heads
    n_v_heads), attn_gate z, beta and alpha projections (Qwen3-Next: one ssm_ba, per key head
    [beta x r, alpha x r]; Qwen3.5: ssm_beta and ssm_alpha), conv over [q, k, v], decay
    exp(ssm_a * softplus(alpha + ssm_dt.bias)), the gated RMS norm ssm_norm, ssm_out."""
    key_dim, value_dim = n_k_heads * head_dim, n_v_heads * head_dim
    wt.mat(p + "attn_qkv.weight", 2 * key_dim + value_dim, n_embd)
    wt.mat(p + "attn_gate.weight", value_dim, n_embd)
    if fused_ba:
        wt.mat(p + "ssm_ba.weight", 2 * n_v_heads, n_embd)
    else:
        wt.mat(p + "ssm_beta.weight", n_v_heads, n_embd)
        wt.mat(p + "ssm_alpha.weight", n_v_heads, n_embd)
    wt.normal(p + "ssm_conv1d.weight", 2 * key_dim + value_dim, d_conv, std=0.35)
    wt.f32(p + "ssm_dt.bias", wt.uniform(-3.0, 0.0, n_v_heads))
    wt.f32(p + "ssm_a", -np.exp(wt.uniform(math.log(0.05), math.log(1.0), n_v_heads)))
    wt.norm(p + "ssm_norm.weight", head_dim)
    wt.mat(p + "ssm_out.weight", n_embd, value_dim, gain=0.8)


def shortconv(wt: Weights, p: str, n_embd: int, l_cache: int) -> None:
    """LFM2's gated short convolution: in_proj to [B, C, x], conv of B*x over l_cache taps, C*conv."""
    wt.normal(p + "shortconv.conv.weight", n_embd, l_cache, std=0.5)
    wt.mat(p + "shortconv.in_proj.weight", 3 * n_embd, n_embd, gain=1.3)
    wt.mat(p + "shortconv.out_proj.weight", n_embd, n_embd, gain=1.0)


# ---------------------------------------------------------------------------------------------
# the architectures: each writes its metadata and tensors; its docstring names the layer kinds

E = 64                                   # n_embd of every model
SSM = dict(d_inner=128, n_head=4, n_group=2, d_state=32, d_conv=4)    # head_dim 32


def ssm_keys(w: gguf.GGUFWriter, d_inner: int, n_head: int, n_group: int, d_state: int, d_conv: int) -> None:
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_head)
    w.add_ssm_group_count(n_group)


def common(w: gguf.GGUFWriter, n_layer: int, n_ctx: int = 4096) -> None:
    w.add_context_length(n_ctx)
    w.add_embedding_length(E)
    w.add_block_count(n_layer)


def m_mamba2(w: gguf.GGUFWriter, wt: Weights) -> None:
    """Mamba-2 (mamba2-130m's layout, tied embeddings): two Mamba-2 layers, no FFN."""
    common(w, 2, 1 << 20)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    ssm_keys(w, **SSM)
    w.add_layer_norm_rms_eps(1e-5)
    embeddings(wt, E, tied=True)
    for il in range(2):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", E)
        mamba2(wt, p, E, **SSM)


def m_granitehybrid(w: gguf.GGUFWriter, wt: Weights) -> None:
    """Granite-4.0-H (tiny/small: MoE with a shared expert, no RoPE, the Granite multipliers):
    layers Mamba-2, attention, Mamba-2 (head_count_kv [0, 1, 0])."""
    kinds = ["M", "A", "M"]
    common(w, 3, 1 << 20)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_head_count_kv([1 if k == "A" else 0 for k in kinds])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_scaling_finetuned(False)                # Granite 4.0-H: no positional encoding
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_expert_shared_feed_forward_length(64)
    w.add_attention_scale(0.03125)
    w.add_embedding_scale(12.0)
    w.add_residual_scale(0.22)
    w.add_logit_scale(4.0)
    ssm_keys(w, **SSM)
    # token_embd small as in the real model (scaled up 12x on input)
    wt.mat("token_embd.weight", N_VOCAB, E, gain=math.sqrt(E) * 0.05)
    wt.norm("output_norm.weight", E)
    wt.mat("output.weight", N_VOCAB, E, gain=10.0)
    for il, k in enumerate(kinds):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", E)
        if k == "M":
            mamba2(wt, p, E, **SSM)
        else:
            attention(wt, p, E, 2, 1, 32)
        wt.norm(p + "ffn_norm.weight", E)
        experts(wt, p, E, 4, 32)
        ffn(wt, p, E, 64, suffix="_shexp")


def lfm2_attention(wt: Weights, p: str) -> None:
    attention(wt, p, E, 2, 1, 32, qk_norm=True)


def m_lfm2(w: gguf.GGUFWriter, wt: Weights) -> None:
    """LFM2 (350M's layout, tied embeddings, output norm `token_embd_norm`): layers short
    convolution, attention (QK norm, RoPE), short convolution; dense SwiGLU FFNs."""
    kinds = ["C", "A", "C"]
    common(w, 3, 128000)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv([1 if k == "A" else 0 for k in kinds])
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_shortconv_l_cache(3)
    embeddings(wt, E, tied=True, norm_name="token_embd_norm.weight")
    for il, k in enumerate(kinds):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", E)
        shortconv(wt, p, E, 3) if k == "C" else lfm2_attention(wt, p)
        wt.norm(p + "ffn_norm.weight", E)
        ffn(wt, p, E, 128)


def m_lfm2moe(w: gguf.GGUFWriter, wt: Weights) -> None:
    """LFM2-MoE (8B-A1B's layout): layer 0 short convolution + dense FFN (leading dense block),
    layer 1 attention + MoE, layer 2 short convolution + MoE; sigmoid routing with expert bias
    (exp_probs_b), weights normalized."""
    kinds = ["C", "A", "C"]
    common(w, 3, 128000)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv([1 if k == "A" else 0 for k in kinds])
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(32)
    w.add_leading_dense_block_count(1)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_shortconv_l_cache(3)
    embeddings(wt, E, tied=True, norm_name="token_embd_norm.weight")
    for il, k in enumerate(kinds):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", E)
        shortconv(wt, p, E, 3) if k == "C" else lfm2_attention(wt, p)
        wt.norm(p + "ffn_norm.weight", E)
        if il == 0:
            ffn(wt, p, E, 128)
        else:
            experts(wt, p, E, 4, 32)
            wt.normal(p + "exp_probs_b.bias", 4, std=0.5)


GDN = dict(n_k_heads=2, n_v_heads=4, head_dim=32, d_conv=4)   # value heads twice the key heads


def qwen_linear_keys(w: gguf.GGUFWriter) -> None:
    w.add_ssm_conv_kernel(GDN["d_conv"])
    w.add_ssm_state_size(GDN["head_dim"])
    w.add_ssm_group_count(GDN["n_k_heads"])
    w.add_ssm_time_step_rank(GDN["n_v_heads"])
    w.add_ssm_inner_size(GDN["head_dim"] * GDN["n_v_heads"])


def qwen_common(w: gguf.GGUFWriter, n_layer: int) -> None:
    common(w, n_layer, 262144)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(64)
    w.add_value_length(64)
    w.add_rope_dimension_count(16)                 # partial_rotary_factor 0.25 of head_dim 64
    w.add_layer_norm_rms_eps(1e-6)
    qwen_linear_keys(w)
    w.add_full_attention_interval(2)


def qwen_layer(wt: Weights, il: int, linear: bool, fused_ba: bool) -> str:
    p = f"blk.{il}."
    wt.norm(p + "attn_norm.weight", E)
    wt.norm(p + "post_attention_norm.weight", E)
    if linear:
        gated_delta_net(wt, p, E, fused_ba=fused_ba, **GDN)
    else:
        attention(wt, p, E, 2, 1, 64, q_gate=True, qk_norm=True)
    return p


def qwen_moe(wt: Weights, p: str) -> None:
    experts(wt, p, E, 4, 32)
    wt.normal(p + "ffn_gate_inp_shexp.weight", E, std=0.3)     # the shared expert's sigmoid gate
    ffn(wt, p, E, 64, suffix="_shexp")


def m_qwen3next(w: gguf.GGUFWriter, wt: Weights) -> None:
    """Qwen3-Next (80B-A3B's layout): gated delta net, then gated full attention
    (full_attention_interval 2); MoE with a gated shared expert in every layer."""
    qwen_common(w, 2)
    w.add_rope_freq_base(10000000.0)
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(32)
    w.add_expert_shared_feed_forward_length(64)
    embeddings(wt, E, tied=False)
    for il in range(2):
        qwen_moe(wt, qwen_layer(wt, il, linear=il == 0, fused_ba=True))


def m_qwen35(w: gguf.GGUFWriter, wt: Weights) -> None:
    """Qwen3.5 (dense, tied embeddings, interleaved M-RoPE sections [3, 3, 2, 0]): gated delta net,
    then gated full attention (recurrent_layers [true, false] and full_attention_interval 2, both
    written as convert_hf_to_gguf.py writes them); dense SwiGLU FFNs."""
    qwen_common(w, 2)
    w.add_rope_freq_base(10000000.0)
    w.add_feed_forward_length(128)
    w.add_rope_dimension_sections([3, 3, 2, 0])
    w.add_array(f"{w.arch}.attention.recurrent_layers", [True, False])
    embeddings(wt, E, tied=True)
    for il in range(2):
        ffn(wt, qwen_layer(wt, il, linear=il == 0, fused_ba=False), E, 128)


def m_qwen35moe(w: gguf.GGUFWriter, wt: Weights) -> None:
    """Qwen3.5-MoE (35B-A3B's layout): as qwen35 with MoE and a gated shared expert, untied."""
    qwen_common(w, 2)
    w.add_rope_freq_base(10000000.0)
    w.add_rope_dimension_sections([3, 3, 2, 0])
    w.add_array(f"{w.arch}.attention.recurrent_layers", [True, False])
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(32)
    w.add_expert_shared_feed_forward_length(64)
    embeddings(wt, E, tied=False)
    for il in range(2):
        qwen_moe(wt, qwen_layer(wt, il, linear=il == 0, fused_ba=False))


def m_falcon_h1(w: gguf.GGUFWriter, wt: Weights) -> None:
    """Falcon-H1 (0.5B's layout): every layer runs attention (NeoX RoPE, head_dim 64 with
    n_head * head_dim != n_embd) and a Mamba-2 mixer in parallel on the same normed input and
    adds both, then a SwiGLU FFN whose norm is `blk.N.ffn_norm` (no `.weight`)."""
    common(w, 2, 16384)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(64)
    w.add_value_length(64)
    w.add_rope_freq_base(100000000000.0)
    w.add_layer_norm_rms_eps(1e-5)
    ssm_keys(w, **SSM)
    embeddings(wt, E, tied=False)
    for il in range(2):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", E)
        attention(wt, p, E, 2, 1, 64)
        mamba2(wt, p, E, **SSM)
        wt.norm(p + "ffn_norm", E)
        ffn(wt, p, E, 128)


def m_nemotron_h(w: gguf.GGUFWriter, wt: Weights) -> None:
    """Nemotron-H (8B's layout, pattern "M*-"): a Mamba-2 layer, an attention layer (no RoPE),
    an MLP layer (squared ReLU, up/down only); each layer is one mixer/MLP with a residual.
    Layer kinds come from head_count_kv [0, 1, 0] and feed_forward_length [0, 0, 128]."""
    kinds = ["M", "A", "F"]
    common(w, 3, 8192)
    w.add_feed_forward_length([128 if k == "F" else 0 for k in kinds])
    w.add_head_count(2)
    w.add_head_count_kv([1 if k == "A" else 0 for k in kinds])
    w.add_key_length(32)
    w.add_value_length(32)
    w.add_layer_norm_eps(1e-5)                     # no rms key: llama.cpp falls back to this one
    ssm_keys(w, **SSM)
    embeddings(wt, E, tied=False)
    for il, k in enumerate(kinds):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", E)
        if k == "M":
            mamba2(wt, p, E, **SSM)
        elif k == "A":
            attention(wt, p, E, 2, 1, 32)
        else:
            ffn(wt, p, E, 128, gate=False)


def m_nemotron_h_moe(w: gguf.GGUFWriter, wt: Weights) -> None:
    """Nemotron-3-Nano (30B-A3B's layout, pattern "M*E"): a Mamba-2 layer, an attention layer, a
    MoE layer (squared-ReLU experts without gate, sigmoid routing with exp_probs_b, top-2 of 4
    normalized and scaled by 2.5, one shared expert)."""
    kinds = ["M", "A", "E"]
    common(w, 3, 262144)
    w.add_feed_forward_length([32 if k == "E" else 0 for k in kinds])
    w.add_head_count(2)
    w.add_head_count_kv([1 if k == "A" else 0 for k in kinds])
    w.add_key_length(32)
    w.add_value_length(32)
    w.add_layer_norm_eps(1e-5)
    ssm_keys(w, **SSM)
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(32)
    w.add_expert_shared_feed_forward_length(64)
    w.add_expert_shared_count(1)
    w.add_expert_weights_norm(True)
    w.add_expert_weights_scale(2.5)
    w.add_expert_group_count(1)
    w.add_expert_group_used_count(1)
    embeddings(wt, E, tied=False)
    for il, k in enumerate(kinds):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", E)
        if k == "M":
            mamba2(wt, p, E, **SSM)
        elif k == "A":
            attention(wt, p, E, 2, 1, 32)
        else:
            experts(wt, p, E, 4, 32, gate=False)
            wt.normal(p + "exp_probs_b.bias", 4, std=0.5)
            ffn(wt, p, E, 64, gate=False, suffix="_shexp")


MODELS = {
    "mamba2": ("mamba2", m_mamba2),
    "granitehybrid": ("granitehybrid", m_granitehybrid),
    "lfm2": ("lfm2", m_lfm2),
    "lfm2moe": ("lfm2moe", m_lfm2moe),
    "qwen3next": ("qwen3next", m_qwen3next),
    "qwen35": ("qwen35", m_qwen35),
    "qwen35moe": ("qwen35moe", m_qwen35moe),
    "falcon-h1": ("falcon-h1", m_falcon_h1),
    "nemotron_h": ("nemotron_h", m_nemotron_h),
    "nemotron_h_moe": ("nemotron_h_moe", m_nemotron_h_moe),
}


def write_model(name: str, qtype: str, path: Path, vocab: Callable[[gguf.GGUFWriter], None] = copy_vocab) -> None:
    """The model ``name`` in ``qtype``; ``vocab`` writes its vocabulary (make_tiny_vision_lfm2.py's
    adds LFM2-VL's image tokens)."""
    arch, build = MODELS[name]
    w = gguf.GGUFWriter(str(path), arch)
    # No architecture in the name: llama.cpp sets token attributes by name.
    w.add_name(f"tiny random model {qtype}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "f32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    rng = np.random.default_rng(sum(map(ord, name)) + 35)
    build(w, Weights(w, rng, qtype))
    vocab(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(names: list[str]) -> None:
    for name in names or MODELS:
        for qtype in TYPES:
            path = DATA / "models" / f"tiny-{name}-{qtype}.gguf"
            write_model(name, qtype, path)
            print("wrote", path.name, path.stat().st_size)


if __name__ == "__main__":
    main(sys.argv[1:])
