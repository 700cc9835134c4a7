#!/usr/bin/env python3
"""Writes the random-weight recurrent and hybrid models of the hybrid speed benchmark
(benches/compare_hybrid.py): one model per family, of a real checkpoint's shapes, in Q4_K_M.

The tensors are written by tests/data/make_tiny_hybrid.py's writers (the same names, layouts and
value ranges as the tiny test models), here with the real sizes, F16 matrices and a synthetic
vocabulary of the real size; then `ferrollama quantize IN OUT Q4_K_M` (llama-quantize's per-tensor
choices) turns the F16 file into the benchmark's file and the F16 file is deleted.

Shapes (the checkpoints' config.json values as far as known; "assumed" marks what is not):

  mamba2-370m      state-spaces/mamba2-370m: d_model 1024, 48 Mamba-2 layers, d_state 128,
                   headdim 64 (32 heads), ngroups 1, expand 2 (d_inner 2048), d_conv 4, no FFN,
                   tied embeddings, vocab 50280 padded to 50288
  granite-4.0-h-350m  ibm-granite/granite-4.0-h-350m: hidden 768, 32 layers of which 4 attention
                   (12 heads, 4 KV heads, head_dim 64, no RoPE; positions 5, 13, 21, 29 assumed),
                   28 Mamba-2 (d_state 128, 48 heads of 32, ngroups 1, expand 2: d_inner 1536,
                   d_conv 4), dense shared MLP 2048 (SwiGLU) in every layer, no experts, tied
                   embeddings, vocab 100352; Granite multipliers (embedding 12, residual 0.246,
                   attention 1/64, logits 3: assumed, they cost nothing)
  qwen3.5-0.8b     Qwen/Qwen3.5-0.8B: hidden 1024, 24 layers, full attention every 4th (gated
                   attention: 8 heads, 2 KV heads, head_dim 256, partial RoPE 64 dims, M-RoPE
                   sections [11, 11, 10]), 18 gated delta-net layers (16 key heads and 16 value
                   heads of 128, conv 4), SwiGLU FFN 3584, tied embeddings, vocab 248320
  lfm2-350m        LiquidAI/LFM2-350M: hidden 1024, 16 layers, attention at 2, 5, 8, 10, 12, 14
                   (16 heads, 8 KV heads, head_dim 64, QK norm), 10 short convolutions
                   (L_cache 3), SwiGLU FFN 4608 (block_ff_dim 6656 auto-adjusted), tied
                   embeddings, vocab 65536

The vocabulary is the tiny models' 512-piece SPM vocabulary (tests/data/models/tiny-llama-f32.gguf:
<unk>, <s>, </s>, the 256 byte pieces, ...) extended with distinct synthetic pieces to the real
size, so both engines load it and the embedding and output matrices have their real sizes.

  python benches/make_hybrid_bench_models.py [--out-dir DIR] [--models mamba2-370m,...] [--keep-f16]

Writes DIR/bench-NAME-q4_k_m.gguf (DIR: ~/.cache/ferrollama/bench). Needs gguf and numpy, and a
ferrollama that `python -m ferrollama.cli quantize` runs (the development venv's).
"""
from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "data"))
import make_tiny_archs as mk  # noqa: E402 - the tiny models' vocabulary source
import make_tiny_hybrid as th  # noqa: E402 - the tensor writers

DEFAULT_OUT = Path.home() / ".cache" / "ferrollama" / "bench"


class F16Weights(th.Weights):
    """make_tiny_hybrid's Weights with the matrices in F16 (vectors, conv kernels, A, D stay F32,
    as convert_hf_to_gguf.py keeps them and llama-quantize leaves them)."""

    def __init__(self, w: gguf.GGUFWriter, rng: np.random.Generator) -> None:
        super().__init__(w, rng, "f16")

    def mat(self, name: str, *shape: int, gain: float = 1.0) -> None:
        data = self.rng.standard_normal(shape, dtype=np.float32)
        data *= gain / math.sqrt(shape[-1])
        self.w.add_tensor(name, data.astype(np.float16))


def synthetic_vocab(w: gguf.GGUFWriter, n_vocab: int) -> None:
    """The tiny SPM vocabulary (512 pieces) and n_vocab - 512 distinct synthetic pieces."""
    f = gguf.GGUFReader(mk.VOCAB_SOURCE).fields
    tokens = list(f["tokenizer.ggml.tokens"].contents())
    scores = list(f["tokenizer.ggml.scores"].contents())
    types = list(f["tokenizer.ggml.token_type"].contents())
    seen = set(tokens)
    low = min(scores)
    i = 0
    while len(tokens) < n_vocab:
        piece = f"\u2581x{i:x}"
        i += 1
        if piece in seen:
            continue
        seen.add(piece)
        tokens.append(piece)
        scores.append(low - 1.0 - len(tokens) * 1e-4)
        types.append(1)                       # normal
    w.add_tokenizer_model(f["tokenizer.ggml.model"].contents())
    w.add_tokenizer_pre(f["tokenizer.ggml.pre"].contents())
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(f["tokenizer.ggml.bos_token_id"].contents())
    w.add_eos_token_id(f["tokenizer.ggml.eos_token_id"].contents())
    w.add_unk_token_id(f["tokenizer.ggml.unknown_token_id"].contents())
    w.add_add_bos_token(f["tokenizer.ggml.add_bos_token"].contents())
    w.add_add_eos_token(f["tokenizer.ggml.add_eos_token"].contents())


def tied_embeddings(wt: th.Weights, n_vocab: int, n_embd: int, norm_name: str = "output_norm.weight",
                    gain: float = 0.4) -> None:
    # as make_tiny_hybrid.embeddings(tied=True), at the real vocabulary size
    wt.mat("token_embd.weight", n_vocab, n_embd, gain=math.sqrt(n_embd) * gain)
    wt.norm(norm_name, n_embd)


def common(w: gguf.GGUFWriter, n_embd: int, n_layer: int, n_ctx: int) -> None:
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)


# ---------------------------------------------------------------------------------------------
# the models: each returns its vocabulary size after writing metadata and tensors


def m_mamba2_370m(w: gguf.GGUFWriter, wt: th.Weights) -> int:
    n_embd, n_layer, n_vocab = 1024, 48, 50288
    ssm = dict(d_inner=2048, n_head=32, n_group=1, d_state=128, d_conv=4)
    common(w, n_embd, n_layer, 1 << 20)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    th.ssm_keys(w, **ssm)
    w.add_layer_norm_rms_eps(1e-5)
    tied_embeddings(wt, n_vocab, n_embd)
    for il in range(n_layer):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", n_embd)
        th.mamba2(wt, p, n_embd, **ssm)
    return n_vocab


GRANITE_ATTENTION = (5, 13, 21, 29)


def m_granite_h_350m(w: gguf.GGUFWriter, wt: th.Weights) -> int:
    n_embd, n_layer, n_vocab, n_ff = 768, 32, 100352, 2048
    n_head, n_head_kv, head_dim = 12, 4, 64
    ssm = dict(d_inner=1536, n_head=48, n_group=1, d_state=128, d_conv=4)
    common(w, n_embd, n_layer, 32768)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv([n_head_kv if il in GRANITE_ATTENTION else 0 for il in range(n_layer)])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_scaling_finetuned(False)             # Granite 4.0-H: no positional encoding
    w.add_attention_scale(1.0 / 64)
    w.add_embedding_scale(12.0)
    w.add_residual_scale(0.246)
    w.add_logit_scale(3.0)
    th.ssm_keys(w, **ssm)
    wt.mat("token_embd.weight", n_vocab, n_embd, gain=math.sqrt(n_embd) * 0.05)   # scaled 12x on input
    wt.norm("output_norm.weight", n_embd)
    for il in range(n_layer):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", n_embd)
        if il in GRANITE_ATTENTION:
            th.attention(wt, p, n_embd, n_head, n_head_kv, head_dim)
        else:
            th.mamba2(wt, p, n_embd, **ssm)
        wt.norm(p + "ffn_norm.weight", n_embd)
        th.ffn(wt, p, n_embd, n_ff)
    return n_vocab


def m_qwen35_08b(w: gguf.GGUFWriter, wt: th.Weights) -> int:
    n_embd, n_layer, n_vocab, n_ff, interval = 1024, 24, 248320, 3584, 4
    gdn = dict(n_k_heads=16, n_v_heads=16, head_dim=128, d_conv=4)
    recurrent = [(il + 1) % interval != 0 for il in range(n_layer)]
    common(w, n_embd, n_layer, 262144)
    w.add_head_count(8)
    w.add_head_count_kv(2)
    w.add_key_length(256)
    w.add_value_length(256)
    w.add_rope_dimension_count(64)                  # partial_rotary_factor 0.25
    w.add_rope_freq_base(10000000.0)
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(gdn["d_conv"])
    w.add_ssm_state_size(gdn["head_dim"])
    w.add_ssm_group_count(gdn["n_k_heads"])
    w.add_ssm_time_step_rank(gdn["n_v_heads"])
    w.add_ssm_inner_size(gdn["head_dim"] * gdn["n_v_heads"])
    w.add_full_attention_interval(interval)
    w.add_feed_forward_length(n_ff)
    w.add_array(f"{w.arch}.attention.recurrent_layers", recurrent)
    tied_embeddings(wt, n_vocab, n_embd)
    for il in range(n_layer):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", n_embd)
        wt.norm(p + "post_attention_norm.weight", n_embd)
        if recurrent[il]:
            th.gated_delta_net(wt, p, n_embd, fused_ba=False, **gdn)
        else:
            th.attention(wt, p, n_embd, 8, 2, 256, q_gate=True, qk_norm=True)
        th.ffn(wt, p, n_embd, n_ff)
    return n_vocab


LFM2_ATTENTION = (2, 5, 8, 10, 12, 14)


def m_lfm2_350m(w: gguf.GGUFWriter, wt: th.Weights) -> int:
    n_embd, n_layer, n_vocab, n_ff = 1024, 16, 65536, 4608
    common(w, n_embd, n_layer, 128000)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(16)
    w.add_head_count_kv([8 if il in LFM2_ATTENTION else 0 for il in range(n_layer)])
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_shortconv_l_cache(3)
    tied_embeddings(wt, n_vocab, n_embd, norm_name="token_embd_norm.weight")
    for il in range(n_layer):
        p = f"blk.{il}."
        wt.norm(p + "attn_norm.weight", n_embd)
        if il in LFM2_ATTENTION:
            th.attention(wt, p, n_embd, 16, 8, 64, qk_norm=True)
        else:
            th.shortconv(wt, p, n_embd, 3)
        wt.norm(p + "ffn_norm.weight", n_embd)
        th.ffn(wt, p, n_embd, n_ff)
    return n_vocab


#: name -> (GGUF architecture, writer)
MODELS = {
    "mamba2-370m": ("mamba2", m_mamba2_370m),
    "granite-4.0-h-350m": ("granitehybrid", m_granite_h_350m),
    "qwen3.5-0.8b": ("qwen35", m_qwen35_08b),
    "lfm2-350m": ("lfm2", m_lfm2_350m),
}


def file_name(name: str) -> str:
    return f"bench-{name}-q4_k_m.gguf"


def write_f16(name: str, path: Path) -> None:
    arch, build = MODELS[name]
    w = gguf.GGUFWriter(str(path), arch)
    # No architecture in the name: llama.cpp sets token attributes by name.
    w.add_name("synthetic hybrid bench model")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    rng = np.random.default_rng(sum(map(ord, name)) + 35)
    n_vocab = build(w, F16Weights(w, rng))
    synthetic_vocab(w, n_vocab)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(DEFAULT_OUT))
    ap.add_argument("--models", default=",".join(MODELS), help="comma separated: " + ", ".join(MODELS))
    ap.add_argument("--keep-f16", action="store_true", help="keep the F16 file beside the Q4_K_M one")
    ap.add_argument("--force", action="store_true", help="rewrite models that exist")
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")
        dst = out / file_name(name)
        if dst.exists() and not args.force:
            print("exists", dst)
            continue
        write_q4_k_m(lambda f16: write_f16(name, f16), out / f"bench-{name}-f16.gguf", dst, args.keep_f16)


def write_q4_k_m(write_f16_to, f16: Path, dst: Path, keep_f16: bool) -> None:
    """Writes the F16 model with `write_f16_to(f16)`, then `ferrollama quantize` makes dst of it
    in Q4_K_M; the F16 file is deleted unless keep_f16."""
    t0 = time.time()
    write_f16_to(f16)
    t1 = time.time()
    subprocess.run([sys.executable, "-m", "ferrollama.cli", "quantize", str(f16), str(dst), "Q4_K_M"],
                   check=True, stdout=subprocess.DEVNULL)
    if not keep_f16:
        f16.unlink()
    print(f"wrote {dst} ({dst.stat().st_size / 2**20:.1f} MiB; F16 {t1 - t0:.0f} s, "
          f"quantize {time.time() - t1:.0f} s)")


if __name__ == "__main__":
    main()
