#!/usr/bin/env python3
"""Writes tiny random-weight encoders, tests/data/models/tiny-bert-f32.gguf and
tiny-nomic-bert-f32.gguf, under llama.cpp's tensor names and keys, with a WPM vocabulary: the
first 4096 pieces of tests/data/vocab/ggml-vocab-bert-bge.gguf (specials, characters and the
most frequent words; the rest of a text becomes [UNK] or word pieces). benches/record_bert.py
records llama.cpp's pooled embeddings of them.

  python tests/data/make_tiny_bert.py
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

DATA = Path(__file__).resolve().parent
VOCAB = DATA / "vocab" / "ggml-vocab-bert-bge.gguf"
N_VOCAB, N_EMBD, N_HEAD, N_LAYER, N_FF, N_CTX = 4096, 128, 4, 2, 256, 128


def copy_vocab(w: gguf.GGUFWriter) -> None:
    f = gguf.GGUFReader(VOCAB).fields
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")
    w.add_token_list(f["tokenizer.ggml.tokens"].contents()[:N_VOCAB])
    w.add_token_types(f["tokenizer.ggml.token_type"].contents()[:N_VOCAB])
    w.add_uint32("tokenizer.ggml.token_type_count", 2)
    for key in ("unknown_token_id", "seperator_token_id", "padding_token_id", "cls_token_id", "mask_token_id"):
        w.add_uint32(f"tokenizer.ggml.{key}", f[f"tokenizer.ggml.{key}"].contents())


def write(arch: str, path: Path) -> None:
    rng = np.random.default_rng(sum(map(ord, arch)))
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny random encoder {arch}")
    a = arch
    for key, v in (("context_length", N_CTX), ("embedding_length", N_EMBD), ("block_count", N_LAYER),
                   ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD), ("pooling_type", 1)):
        w.add_uint32(f"{a}.{key}", v)
    w.add_float32(f"{a}.attention.layer_norm_epsilon", 1e-12)
    w.add_bool(f"{a}.attention.causal", False)
    if arch == "nomic-bert":
        w.add_float32(f"{a}.rope.freq_base", 1000.0)
    copy_vocab(w)
    mat = lambda name, rows, cols, std: w.add_tensor(name, (rng.standard_normal((rows, cols)) * std).astype(np.float32))  # noqa: E731
    vec = lambda name, n, mean, std: w.add_tensor(name, (mean + rng.standard_normal(n) * std).astype(np.float32))  # noqa: E731
    mat("token_embd.weight", N_VOCAB, N_EMBD, 1.0)
    mat("token_types.weight", 2, N_EMBD, 0.5)
    if arch == "bert":
        mat("position_embd.weight", N_CTX, N_EMBD, 0.5)
    vec("token_embd_norm.weight", N_EMBD, 1.0, 0.1)
    vec("token_embd_norm.bias", N_EMBD, 0.0, 0.1)
    for il in range(N_LAYER):
        p = f"blk.{il}."
        if arch == "nomic-bert":
            mat(p + "attn_qkv.weight", 3 * N_EMBD, N_EMBD, 0.1)
        else:
            for t in "qkv":
                mat(p + f"attn_{t}.weight", N_EMBD, N_EMBD, 0.1)
                vec(p + f"attn_{t}.bias", N_EMBD, 0.0, 0.1)
        mat(p + "attn_output.weight", N_EMBD, N_EMBD, 0.08)
        vec(p + "attn_output.bias", N_EMBD, 0.0, 0.1)
        vec(p + "attn_output_norm.weight", N_EMBD, 1.0, 0.1)
        vec(p + "attn_output_norm.bias", N_EMBD, 0.0, 0.1)
        mat(p + "ffn_up.weight", N_FF, N_EMBD, 0.1)
        if arch == "nomic-bert":
            mat(p + "ffn_gate.weight", N_FF, N_EMBD, 0.1)
        else:
            vec(p + "ffn_up.bias", N_FF, 0.0, 0.1)
            vec(p + "ffn_down.bias", N_EMBD, 0.0, 0.1)
        mat(p + "ffn_down.weight", N_EMBD, N_FF, 0.08)
        vec(p + "layer_output_norm.weight", N_EMBD, 1.0, 0.1)
        vec(p + "layer_output_norm.bias", N_EMBD, 0.0, 0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    for arch in ("bert", "nomic-bert"):
        path = DATA / "models" / f"tiny-{arch}-f32.gguf"
        write(arch, path)
        print("wrote", path.name)


if __name__ == "__main__":
    main()
