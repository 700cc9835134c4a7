#!/usr/bin/env python3
"""Writes the tiny random-weight Gemma 4 models (tests/data/models/tiny-NAME-TYPE.gguf, TYPE f32
or q8_0) and their scenarios (tests/data/scenarios/arch-NAME-TYPE.json, without expected values:
benches/record_archs.py adds llama.cpp's), with the tensor names and metadata keys of
llama.cpp's gemma4 loader, laid out as its converter writes a real checkpoint.

- gemma4: four layers, sliding / full / sliding / full, the sliding ones with 64-wide heads
  rotated whole at base 10000, the full ones with 128-wide heads and "proportional" RoPE at
  base 1e6 (rope_freqs: the first quarter of the pairs rotated, the rest given factors of 1e30);
  the last two layers attend over the K/V of layers 0 and 1 (shared_kv_layers 2; layer 2 still
  carries K/V matrices, which llama.cpp loads and ignores, layer 3 none); per-layer embeddings
  of 32 values; FFNs of 256 rows, twice as wide in the shared layers (use_double_wide_mlp);
  a layer output scale per layer; a window of 16 tokens; logits soft-capped at 5.
- gemma4-moe: two layers (sliding, full), no per-layer embeddings nor shared KV, the full layer
  with one KV head (the sliding one two) and without V (V is K's projection); each layer a dense FFN of 256 rows beside 4 experts (2
  used) of 128 rows with fused gate/up matrices, the router's input scale and a second scale
  per expert.

Weights: embeddings of std 0.25 (tied output, so that logits spread over about +-10 before the
cap), matrices of std 0.05-0.08, norms around 1 (Q/K norms around 0.3, so that the unscaled
attention scores stay within a few units), the router of std 2 (clear expert choices).

  python tests/data/make_tiny_gemma4.py            # writes them (deterministic)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_archs import N_CTX, N_VOCAB, TYPES, Weights, copy_vocab, scenario, write_scenario  # noqa: E402

DATA = Path(__file__).resolve().parent
N_EMBD, N_HEAD, N_HEAD_KV = 256, 4, 2
HD_FULL, HD_SWA = 128, 64
N_SWA, SOFTCAP = 16, 5.0                    # the sliding window, the final logits' soft cap


@dataclass
class Spec:
    name: str
    swa: list[bool]
    n_ff: list[int]
    n_shared_kv: int = 0
    n_pl: int = 0
    experts: int = 0
    experts_used: int = 0
    n_ff_exp: int = 0
    no_v_on_full: bool = False
    n_head_kv_full: int = N_HEAD_KV              # the full layers' KV heads (num_global_key_value_heads)
    kv_matrices_in_shared: set = field(default_factory=set)   # shared layers that still carry K/V


def specs() -> list[Spec]:
    return [
        Spec("gemma4", swa=[True, False, True, False], n_ff=[256, 256, 512, 512], n_shared_kv=2, n_pl=32,
             kv_matrices_in_shared={2}),
        Spec("gemma4-moe", swa=[True, False], n_ff=[256, 256], experts=4, experts_used=2, n_ff_exp=128,
             no_v_on_full=True, n_head_kv_full=1),
    ]


def add_metadata(w: gguf.GGUFWriter, s: Spec) -> None:
    a = "gemma4"
    n_layer = len(s.swa)
    w.add_uint32(f"{a}.context_length", N_CTX)
    w.add_uint32(f"{a}.embedding_length", N_EMBD)
    w.add_uint32(f"{a}.block_count", n_layer)
    w.add_array(f"{a}.feed_forward_length", s.n_ff)
    w.add_uint32(f"{a}.attention.head_count", N_HEAD)
    if s.n_head_kv_full == N_HEAD_KV:
        w.add_uint32(f"{a}.attention.head_count_kv", N_HEAD_KV)
    else:
        w.add_array(f"{a}.attention.head_count_kv", [N_HEAD_KV if swa else s.n_head_kv_full for swa in s.swa])
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{a}.attention.key_length", HD_FULL)
    w.add_uint32(f"{a}.attention.value_length", HD_FULL)
    w.add_uint32(f"{a}.attention.key_length_swa", HD_SWA)
    w.add_uint32(f"{a}.attention.value_length_swa", HD_SWA)
    w.add_uint32(f"{a}.rope.dimension_count", HD_FULL)
    w.add_uint32(f"{a}.rope.dimension_count_swa", HD_SWA)
    w.add_float32(f"{a}.rope.freq_base", 1000000.0)
    w.add_float32(f"{a}.rope.freq_base_swa", 10000.0)
    w.add_uint32(f"{a}.attention.sliding_window", N_SWA)
    w.add_array(f"{a}.attention.sliding_window_pattern", s.swa)
    w.add_uint32(f"{a}.attention.shared_kv_layers", s.n_shared_kv)
    w.add_uint32(f"{a}.embedding_length_per_layer_input", s.n_pl)
    w.add_float32(f"{a}.final_logit_softcapping", SOFTCAP)
    if s.experts:
        w.add_uint32(f"{a}.expert_count", s.experts)
        w.add_uint32(f"{a}.expert_used_count", s.experts_used)
        w.add_uint32(f"{a}.expert_feed_forward_length", s.n_ff_exp)


def proportional_rope_freqs(head_dim: int, partial: float) -> np.ndarray:
    """The converter's rope_freqs of the full layers: factors 1 for the rotated fraction of the
    pairs, 1e30 (no rotation) for the rest."""
    n_rot = int(head_dim * partial / 2)
    return np.array([1.0] * n_rot + [1e30] * (head_dim // 2 - n_rot), dtype=np.float32)


def small_norm(wt: Weights, name: str, n: int) -> None:
    wt.vector(name, 0.3 + wt.rng.standard_normal(n) * 0.03)


def add_attention(wt: Weights, s: Spec, il: int) -> None:
    p = f"blk.{il}."
    hd = HD_SWA if s.swa[il] else HD_FULL
    n_kv = N_HEAD_KV if s.swa[il] else s.n_head_kv_full
    n_layer = len(s.swa)
    shared = il >= n_layer - s.n_shared_kv
    wt.norm(p + "attn_norm.weight", N_EMBD)
    wt.matrix(p + "attn_q.weight", N_HEAD * hd, N_EMBD, std=0.06)
    if not shared or il in s.kv_matrices_in_shared:
        wt.matrix(p + "attn_k.weight", n_kv * hd, N_EMBD, std=0.06)
        if not (s.no_v_on_full and not s.swa[il]):
            wt.matrix(p + "attn_v.weight", n_kv * hd, N_EMBD, std=0.08)
        small_norm(wt, p + "attn_k_norm.weight", hd)
    small_norm(wt, p + "attn_q_norm.weight", hd)
    wt.matrix(p + "attn_output.weight", N_EMBD, N_HEAD * hd, std=0.05)
    wt.norm(p + "post_attention_norm.weight", N_EMBD)


def add_ffn(wt: Weights, s: Spec, il: int) -> None:
    p = f"blk.{il}."
    ff = s.n_ff[il]
    wt.norm(p + "ffn_norm.weight", N_EMBD)
    wt.matrix(p + "ffn_gate.weight", ff, N_EMBD, std=0.08)
    wt.matrix(p + "ffn_up.weight", ff, N_EMBD, std=0.08)
    wt.matrix(p + "ffn_down.weight", N_EMBD, ff, std=0.05)
    wt.norm(p + "post_ffw_norm.weight", N_EMBD)
    if s.experts:
        ne, fe = s.experts, s.n_ff_exp
        wt.vector(p + "ffn_gate_inp.weight", wt.rng.standard_normal((ne, N_EMBD)) * 2.0)
        wt.vector(p + "ffn_gate_inp.scale", 1.0 + wt.rng.standard_normal(N_EMBD) * 0.2)
        wt.matrix(p + "ffn_gate_up_exps.weight", ne, 2 * fe, N_EMBD, std=0.08)
        wt.matrix(p + "ffn_down_exps.weight", ne, N_EMBD, fe, std=0.05)
        wt.vector(p + "ffn_down_exps.scale", wt.rng.uniform(0.5, 1.5, ne))
        wt.norm(p + "pre_ffw_norm_2.weight", N_EMBD)
        wt.norm(p + "post_ffw_norm_1.weight", N_EMBD)
        wt.norm(p + "post_ffw_norm_2.weight", N_EMBD)


def add_per_layer_embeddings(wt: Weights, s: Spec) -> None:
    n_layer = len(s.swa)
    wt.matrix("per_layer_token_embd.weight", N_VOCAB, s.n_pl * n_layer, std=0.5)
    wt.matrix("per_layer_model_proj.weight", s.n_pl * n_layer, N_EMBD, std=0.06)
    wt.norm("per_layer_proj_norm.weight", s.n_pl)
    for il in range(n_layer):
        p = f"blk.{il}."
        wt.matrix(p + "inp_gate.weight", s.n_pl, N_EMBD, std=0.08)
        wt.matrix(p + "proj.weight", N_EMBD, s.n_pl, std=0.1)
        wt.norm(p + "post_norm.weight", N_EMBD)


def write_model(s: Spec, qtype: str, path: Path, vocab: Callable[[gguf.GGUFWriter], None] = copy_vocab) -> None:
    """``vocab`` writes the tokenizer's keys (make_tiny_vision_gemma4.py's adds image markers)."""
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_name(f"tiny random model {qtype}")
    add_metadata(w, s)
    vocab(w)
    wt = Weights(w, np.random.default_rng(sum(map(ord, s.name))), qtype)
    wt.matrix("token_embd.weight", N_VOCAB, N_EMBD, std=0.25)
    wt.norm("output_norm.weight", N_EMBD)
    wt.vector("rope_freqs.weight", proportional_rope_freqs(HD_FULL, 0.25))
    if s.n_pl:
        add_per_layer_embeddings(wt, s)
    for il in range(len(s.swa)):
        add_attention(wt, s, il)
        add_ffn(wt, s, il)
        wt.vector(f"blk.{il}.layer_output_scale.weight", np.array([wt.rng.uniform(0.6, 1.4)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    for s in specs():
        for qtype in TYPES:
            model_file = f"tiny-{s.name}-{qtype}.gguf"
            write_model(s, qtype, DATA / "models" / model_file)
            write_scenario(scenario(model_file))


if __name__ == "__main__":
    main()
