#!/usr/bin/env python3
"""Writes the random-weight `gemma4` model of the Gemma 4 speed benchmark (benches/compare_hybrid.py
runs it): Gemma 4 E2B's per-layer shapes, fewer layers, in Q4_K_M.

The tensors are written by tests/data/make_tiny_gemma4.py's writers (add_metadata, add_attention,
add_ffn, add_per_layer_embeddings: the names, layouts and metadata keys of llama.cpp's gemma4
loader, as convert_hf_to_gguf.py writes a checkpoint: sliding and full layers with their own head
sizes, proportional RoPE on the full layers through rope_freqs, a shared-KV tail, per-layer
embeddings, a layer output scale, soft-capped logits), here with the real sizes (the tiny
module's size constants are set before the writers run), F16 matrices whose standard deviations
are the tiny models' scaled by sqrt(256 / row length) (benches/make_mla_bench_model.py's
F16Weights) and a synthetic vocabulary of the real size (benches/make_hybrid_bench_models.py's);
then `ferrollama quantize IN OUT Q4_K_M` (llama-quantize's per-tensor choices: the tied
token_embd and per_layer_token_embd in Q6_K, per_layer_model_proj left F16) turns the F16 file
into the benchmark's file and the F16 file is deleted.

Shapes, google/gemma-4-E2B's text_config (config.json): hidden 1536, 35 layers, 8 heads, 1 KV
head on every layer (num_global_key_value_heads null, attention_k_eq_v false: V projected on the
full layers too), head_dim 256 on the sliding layers, global_head_dim 512 on the full ones,
layer_types four sliding then one full (full at 4, 9, ..., 34), sliding_window 512, RoPE base
10000 on the sliding layers (whole heads) and 1e6 "proportional" with partial_rotary_factor 0.25
on the full ones, intermediate_size 6144 with use_double_wide_mlp (12288 in the KV-shared
layers), num_kv_shared_layers 20 (layers 15-34 attend over the K/V of the last non-shared layer
of their kind), hidden_size_per_layer_input 256, vocab 262144 (vocab_size_per_layer_input
the same), tied embeddings, final_logit_softcapping 30, rms_norm_eps 1e-6, max_position_embeddings
131072.

Not E2B's: the layer count. --layers (a multiple of 5, default 10 against 35) keeps the pattern
(four sliding, one full), and the layers with K/V of their own are the real model's share (15 of
35) of them rounded to whole periods, at least one, so that they end with a full layer as E2B's
do (llama.cpp's shared sliding layers read the last but one of them, the shared full layers the
last); the rest share (default: layers 5..9 over the K/V of layers 3 and 4; 35: E2B's 15..34). So per token the tied output matrix (262144 x 1536)
is a larger share of the work than in the real model, and the K/V memory per token is that of
the layers kept: the real model keeps K/V in 3 full layers (4, 9, 14: 2 x 512 F16 values each =
6 KiB per token) and 12 sliding ones (1 KiB per token each, in a 512-token window); the default
10-layer model in 1 full layer (2 KiB per token) and 4 sliding ones. The per-layer token table is
vocab x layers x 256 (671M values at 10 layers, 2.35G at 35).

  python benches/make_gemma4_bench_model.py [--out-dir DIR] [--layers 10] [--keep-f16] [--force]

Writes DIR/bench-gemma4-e2b-Nl-q4_k_m.gguf (DIR: ~/.cache/ferrollama/bench). Needs gguf and
numpy, and a ferrollama that `python -m ferrollama.cli quantize` runs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "data"))
sys.path.insert(0, str(REPO / "benches"))
import make_tiny_gemma4 as tg  # noqa: E402 - the tensor and metadata writers
from make_hybrid_bench_models import synthetic_vocab, write_q4_k_m  # noqa: E402
from make_mla_bench_model import F16Weights  # noqa: E402

DEFAULT_OUT = Path.home() / ".cache" / "ferrollama" / "bench"

N_EMBD, N_HEAD, N_HEAD_KV, HD_FULL, HD_SWA = 1536, 8, 1, 512, 256
N_FF, N_PL, N_VOCAB, N_CTX, N_SWA, SOFTCAP = 6144, 256, 262144, 131072, 512, 30.0
E2B_LAYERS, E2B_SHARED, PERIOD = 35, 20, 5      # PERIOD: four sliding layers, then a full one


def set_real_sizes() -> None:
    """make_tiny_gemma4's writers read these module constants at call time."""
    tg.N_EMBD, tg.N_HEAD, tg.N_HEAD_KV, tg.HD_FULL, tg.HD_SWA = N_EMBD, N_HEAD, N_HEAD_KV, HD_FULL, HD_SWA
    tg.N_VOCAB, tg.N_CTX, tg.N_SWA, tg.SOFTCAP = N_VOCAB, N_CTX, N_SWA, SOFTCAP


def e2b_spec(n_layer: int) -> tg.Spec:
    if n_layer < PERIOD or n_layer % PERIOD:
        raise SystemExit(f"--layers must be a positive multiple of {PERIOD} (four sliding layers, one full)")
    # the layers with K/V of their own end with a full layer, as E2B's 15 do: the shared sliding
    # layers read the last but one of them, the shared full layers the last
    n_kv = PERIOD * max(1, round(n_layer * (E2B_LAYERS - E2B_SHARED) / E2B_LAYERS / PERIOD))
    n_shared = n_layer - n_kv
    swa = [(il + 1) % PERIOD != 0 for il in range(n_layer)]
    n_ff = [2 * N_FF if il >= n_layer - n_shared else N_FF for il in range(n_layer)]   # use_double_wide_mlp
    return tg.Spec(f"gemma4-e2b-{n_layer}l", swa=swa, n_ff=n_ff, n_shared_kv=n_shared, n_pl=N_PL,
                   n_head_kv_full=N_HEAD_KV)


def write_f16(spec: tg.Spec, path: Path) -> None:
    set_real_sizes()
    w = gguf.GGUFWriter(str(path), "gemma4")
    # No architecture in the name: llama.cpp sets token attributes by name.
    w.add_name("synthetic bench model")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tg.add_metadata(w, spec)
    wt = F16Weights(w, np.random.default_rng(37))
    wt.matrix("token_embd.weight", N_VOCAB, N_EMBD, std=0.25)    # tied output, as E2B
    wt.norm("output_norm.weight", N_EMBD)
    wt.vector("rope_freqs.weight", tg.proportional_rope_freqs(HD_FULL, 0.25))
    tg.add_per_layer_embeddings(wt, spec)
    for il in range(len(spec.swa)):
        tg.add_attention(wt, spec, il)
        tg.add_ffn(wt, spec, il)
        wt.vector(f"blk.{il}.layer_output_scale.weight", np.array([wt.rng.uniform(0.6, 1.4)]))
    synthetic_vocab(w, N_VOCAB)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(DEFAULT_OUT))
    ap.add_argument("--layers", type=int, default=10, help=f"a multiple of {PERIOD} (E2B: {E2B_LAYERS})")
    ap.add_argument("--keep-f16", action="store_true", help="keep the F16 file beside the Q4_K_M one")
    ap.add_argument("--force", action="store_true", help="rewrite the model if it exists")
    args = ap.parse_args()
    spec = e2b_spec(args.layers)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dst = out / f"bench-gemma4-e2b-{args.layers}l-q4_k_m.gguf"
    if dst.exists() and not args.force:
        print("exists", dst)
        return
    write_q4_k_m(lambda f16: write_f16(spec, f16), out / f"bench-gemma4-e2b-{args.layers}l-f16.gguf", dst, args.keep_f16)


if __name__ == "__main__":
    main()
