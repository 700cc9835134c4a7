#!/usr/bin/env python3
"""Writes the random-weight `deepseek2` (multi-head latent attention) model of the MLA speed
benchmark (benches/compare_hybrid.py runs it): DeepSeek-V2-Lite's per-layer shapes, fewer layers,
in Q4_K_M.

The tensors are written by tests/data/make_tiny_mla.py's writers (add_attention, add_ffn,
add_metadata: the same names, layouts and metadata keys as the tiny deepseek2 test models, i.e.
as current convert_hf_to_gguf.py writes them: the split attn_k_b / attn_v_b, head_count_kv 1,
key_length / value_length the latent cache's 576 / 512, the *_mla keys the heads' 192 / 128),
here with the real sizes (the tiny module's size constants are set before the writers run), F16
matrices whose standard deviations are the tiny models' scaled by sqrt(256 / row length) (the
same activation gains at the real widths) and a synthetic vocabulary of the real size
(benches/make_hybrid_bench_models.py's); then `ferrollama quantize IN OUT Q4_K_M`
(llama-quantize's per-tensor choices) turns the F16 file into the benchmark's file and the F16
file is deleted.

Shapes, deepseek-ai/DeepSeek-V2-Lite's config.json: hidden 2048, 16 heads, q_lora_rank null
(Q projected directly by attn_q), kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128,
v_head_dim 128, first_k_dense_replace 1 (intermediate 10944), then MoE layers of 64 routed
experts of 1408 with 6 used and 2 shared experts (one shared FFN of 2816), scoring_func softmax,
norm_topk_prob false, routed_scaling_factor 1.0, rope_theta 10000 with YaRN (factor 40,
original_max_position_embeddings 4096, mscale_all_dim 0.707: yarn_log_multiplier 0.0707),
rms_norm_eps 1e-6, untied output, vocab 102400. Not V2-Lite's: the layer count (--layers, default
5 = 1 dense + 4 MoE, against 27, so that the file stays under 2 GB) and an explicit
attention.q_lora_rank = 0: convert_hf_to_gguf.py writes no key for a null q_lora_rank, and
llama.cpp (models/deepseek2.cpp) only skips it for the layer counts of the known lite models (26,
27), so it must be present at other layer counts; 0 means attn_q in both engines.

  python benches/make_mla_bench_model.py [--out-dir DIR] [--layers 5] [--keep-f16] [--force]

Writes DIR/bench-deepseek2-lite-Nl-q4_k_m.gguf (DIR: ~/.cache/ferrollama/bench). Needs gguf and
numpy, and a ferrollama that `python -m ferrollama.cli quantize` runs.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import gguf
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "data"))
sys.path.insert(0, str(REPO / "benches"))
import make_tiny_archs as mk  # noqa: E402
import make_tiny_mla as tm  # noqa: E402 - the tensor and metadata writers
from make_hybrid_bench_models import synthetic_vocab, write_q4_k_m  # noqa: E402

DEFAULT_OUT = Path.home() / ".cache" / "ferrollama" / "bench"

N_EMBD, N_HEAD, N_FF, N_CTX = 2048, 16, 10944, 163840
KV_LORA, N_ROT, N_VOCAB = 512, 64, 102400
TINY_WIDTH = tm.N_EMBD          # 256: the width the tiny models' standard deviations are for

LITE = tm.MlaSpec("deepseek2-lite-bench", n_layer=5, q_lora=0, split=True, nope=128, head_v=128, n_expert=64,
                  n_expert_used=6, n_ff_exp=1408, n_shared=2, gating=1, probs_bias=False, groups=None,
                  weights_norm=False, weights_scale=1.0, yarn=False)   # YaRN: V2-Lite's values, below


class F16Weights(mk.Weights):
    """The tiny models' Weights in F16 (norms, router and vectors F32), drawn in float32 (the
    expert tensors are 184M values each) a block of 2^24 values at a time (the same values as one
    draw: no float32 copy of a whole table, such as Gemma 4's per-layer one of 2.35G values),
    each matrix's std scaled to its row length."""

    BLOCK = 1 << 24

    def __init__(self, w: gguf.GGUFWriter, rng: np.random.Generator) -> None:
        super().__init__(w, rng, "f16")

    def matrix(self, name: str, *shape: int, std: float = 0.07) -> None:
        out = np.empty(shape, dtype=np.float16)
        flat = out.reshape(-1)
        scale = np.float32(std * math.sqrt(TINY_WIDTH / shape[-1]))
        for start in range(0, flat.size, self.BLOCK):
            block = self.rng.standard_normal(min(self.BLOCK, flat.size - start), dtype=np.float32)
            block *= scale
            flat[start:start + block.size] = block
        self.w.add_tensor(name, out)


def set_real_sizes() -> None:
    """make_tiny_mla's writers read these module constants at call time."""
    tm.N_EMBD, tm.N_HEAD, tm.N_FF, tm.N_CTX = N_EMBD, N_HEAD, N_FF, N_CTX
    tm.KV_LORA, tm.N_ROT = KV_LORA, N_ROT


def write_f16(spec: tm.MlaSpec, path: Path) -> None:
    set_real_sizes()
    w = gguf.GGUFWriter(str(path), tm.ARCH)
    # No architecture in the name: llama.cpp sets token attributes by name.
    w.add_name("synthetic mla bench model")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tm.add_metadata(w, spec)
    w.add_string(f"{tm.ARCH}.rope.scaling.type", "yarn")
    w.add_float32(f"{tm.ARCH}.rope.scaling.factor", 40.0)
    w.add_uint32(f"{tm.ARCH}.rope.scaling.original_context_length", 4096)
    w.add_float32(f"{tm.ARCH}.rope.scaling.yarn_log_multiplier", 0.1 * 0.707)
    wt = F16Weights(w, np.random.default_rng(37))
    wt.matrix("token_embd.weight", N_VOCAB, N_EMBD, std=0.4)   # std 0.4 * sqrt(256/2048) = 0.14
    wt.norm("output_norm.weight", N_EMBD)
    wt.matrix("output.weight", N_VOCAB, N_EMBD, std=0.08)
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", N_EMBD)
        wt.norm(p + "ffn_norm.weight", N_EMBD)
        tm.add_attention(wt, spec, p)
        tm.add_ffn(wt, spec, p, dense=il == 0)
    synthetic_vocab(w, N_VOCAB)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(DEFAULT_OUT))
    ap.add_argument("--layers", type=int, default=5, help="1 dense + LAYERS-1 MoE (V2-Lite: 27)")
    ap.add_argument("--keep-f16", action="store_true", help="keep the F16 file beside the Q4_K_M one")
    ap.add_argument("--force", action="store_true", help="rewrite the model if it exists")
    args = ap.parse_args()
    spec = tm.MlaSpec(**{**LITE.__dict__, "n_layer": args.layers})
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dst = out / f"bench-deepseek2-lite-{args.layers}l-q4_k_m.gguf"
    if dst.exists() and not args.force:
        print("exists", dst)
        return
    write_q4_k_m(lambda f16: write_f16(spec, f16), out / f"bench-deepseek2-lite-{args.layers}l-f16.gguf", dst, args.keep_f16)


if __name__ == "__main__":
    main()
