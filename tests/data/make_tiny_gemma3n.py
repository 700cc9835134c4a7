#!/usr/bin/env python3
"""Writes the tiny random-weight Gemma 3n models (tests/data/models/tiny-gemma3n-TYPE.gguf, TYPE
f32 or q8_0) and their scenarios (tests/data/scenarios/arch-gemma3n-TYPE.json, without expected
values: benches/record_archs.py adds llama.cpp's), with the tensor names and metadata keys of
llama.cpp's gemma3n loader, laid out as its converter writes a real checkpoint.

llama.cpp's graph fixes most of Gemma 3n's sizes whatever the file says: 4 AltUp streams, 256
per-layer embedding values, LAuReL rank 64, FFN gate sparsity in layers 0-9, K/V kept by the
first 20 layers only. So the model has 22 layers, the last two attending over layers 18 (the
sliding one) and 19 (the full one): the sliding pattern is the converter's per-layer array,
four sliding layers then a full one, except layer 21, made full so that both kinds of shared
layer are present. A width of 64, 4 heads of 32 (2 KV heads), FFNs of 128 rows, a window of 16
tokens (the scenario's prompt is 48). The metadata keys llama.cpp leaves unread are written
with the values it fixes, as the converter writes them for the real models.

Weights: embeddings of std 0.25, matrices of std 0.05-0.1, pre-norms around 1 (Q/K norms around
0.3, so that the unscaled attention scores stay within a few units); the AltUp coefficients of std
0.3 and the router of std 1 so that the streams mix visibly; the per-layer token table of std 0.5.
The norms after each block's output (attention, FFN, LAuReL, per-layer input) are around 0.15:
22 layers of random blocks at full strength are chaotic (with norms around 1, llama.cpp's own
logits of the q8_0 model move by up to 2.9 between an F32 and an F16 cache, against 0.07-0.2 for
the other tiny models); damped so, that spread is 0.11, and zeroing any part still moves llama.cpp's
logits of the f32 model (std 2.0) by max/mean: LAuReL 2.3/0.40, per-layer inputs 2.5/0.40, the AltUp
router 7.2/1.18, attention 2.4/0.38, the sparse layers' FFNs 2.1/0.35, the other FFNs 2.0/0.35,
the two shared-KV layers' attention 0.67/0.10.

  python tests/data/make_tiny_gemma3n.py            # writes them (deterministic)
"""
from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_archs import N_CTX, N_VOCAB, TYPES, Weights, copy_vocab, scenario, write_scenario  # noqa: E402
from make_tiny_gemma4 import small_norm  # noqa: E402

DATA = Path(__file__).resolve().parent
N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 4, 2, 32, 128
N_LAYER, N_LAYERS_WITH_KV, N_SPARSE = 22, 20, 10
N_ALTUP, N_PER_LAYER, LAUREL_RANK = 4, 256, 64
SWA = [il % 5 < 4 for il in range(N_LAYER)]
SWA[21] = False
SPARSITY_STD_MUL = 1.6448533535003662


def add_metadata(w: gguf.GGUFWriter) -> None:
    a = "gemma3n"
    w.add_uint32(f"{a}.context_length", N_CTX)
    w.add_uint32(f"{a}.embedding_length", N_EMBD)
    w.add_uint32(f"{a}.block_count", N_LAYER)
    w.add_uint32(f"{a}.feed_forward_length", N_FF)
    w.add_uint32(f"{a}.attention.head_count", N_HEAD)
    w.add_uint32(f"{a}.attention.head_count_kv", N_HEAD_KV)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{a}.attention.key_length", HEAD_DIM)
    w.add_uint32(f"{a}.attention.value_length", HEAD_DIM)
    w.add_float32(f"{a}.rope.freq_base", 1000000.0)
    w.add_float32(f"{a}.rope.freq_base_swa", 10000.0)
    w.add_uint32(f"{a}.attention.sliding_window", 16)
    w.add_array(f"{a}.attention.sliding_window_pattern", SWA)
    w.add_float32(f"{a}.final_logit_softcapping", 30.0)
    w.add_uint32(f"{a}.altup.active_idx", 0)
    w.add_uint32(f"{a}.altup.num_inputs", N_ALTUP)
    w.add_uint32(f"{a}.embedding_length_per_layer_input", N_PER_LAYER)
    w.add_uint32(f"{a}.attention.shared_kv_layers", N_LAYER - N_LAYERS_WITH_KV)
    w.add_array(f"{a}.activation_sparsity_scale",
                [SPARSITY_STD_MUL if il < N_SPARSE else float("-inf") for il in range(N_LAYER)])


def post_norm(wt: Weights, name: str) -> None:
    wt.vector(name, 0.15 * (1.0 + wt.rng.standard_normal(N_EMBD) * 0.1))


def add_layer(wt: Weights, il: int) -> None:
    p = f"blk.{il}."
    wt.norm(p + "attn_norm.weight", N_EMBD)
    wt.matrix(p + "attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD, std=0.1)
    wt.matrix(p + "attn_k.weight", N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.1)
    wt.matrix(p + "attn_v.weight", N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.1)
    small_norm(wt, p + "attn_q_norm.weight", HEAD_DIM)
    small_norm(wt, p + "attn_k_norm.weight", HEAD_DIM)
    wt.matrix(p + "attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM, std=0.08)
    post_norm(wt, p + "post_attention_norm.weight")
    wt.norm(p + "ffn_norm.weight", N_EMBD)
    wt.matrix(p + "ffn_gate.weight", N_FF, N_EMBD, std=0.1)
    wt.matrix(p + "ffn_up.weight", N_FF, N_EMBD, std=0.1)
    wt.matrix(p + "ffn_down.weight", N_EMBD, N_FF, std=0.08)
    post_norm(wt, p + "post_ffw_norm.weight")
    wt.matrix(p + "inp_gate.weight", N_PER_LAYER, N_EMBD, std=0.1)
    wt.matrix(p + "proj.weight", N_EMBD, N_PER_LAYER, std=0.06)
    post_norm(wt, p + "post_norm.weight")
    # rows of 4 values: F32 in every type, as the converter leaves them
    wt.vector(p + "altup_correct_coef.weight", wt.rng.standard_normal((N_ALTUP, N_ALTUP)) * 0.3)
    wt.vector(p + "altup_predict_coef.weight", wt.rng.standard_normal((N_ALTUP * N_ALTUP, N_ALTUP)) * 0.3)
    wt.norm(p + "altup_correct_scale.weight", N_EMBD)
    wt.matrix(p + "altup_router.weight", N_ALTUP, N_EMBD, std=1.0)
    wt.norm(p + "altup_router_norm.weight", N_EMBD)
    wt.matrix(p + "laurel_l.weight", LAUREL_RANK, N_EMBD, std=0.1)
    wt.matrix(p + "laurel_r.weight", N_EMBD, LAUREL_RANK, std=0.1)
    post_norm(wt, p + "laurel_post_norm.weight")


def write_model(qtype: str, path: Path) -> None:
    w = gguf.GGUFWriter(str(path), "gemma3n")
    w.add_name(f"tiny random model {qtype}")
    add_metadata(w)
    copy_vocab(w)
    wt = Weights(w, np.random.default_rng(3), qtype)
    wt.matrix("token_embd.weight", N_VOCAB, N_EMBD, std=0.25)
    wt.norm("output_norm.weight", N_EMBD)
    wt.matrix("altup_proj.weight", N_ALTUP - 1, N_EMBD, N_EMBD, std=0.1)
    wt.matrix("altup_unembd_proj.weight", N_ALTUP - 1, N_EMBD, N_EMBD, std=0.1)
    wt.matrix("per_layer_token_embd.weight", N_VOCAB, N_PER_LAYER * N_LAYER, std=0.5)
    wt.matrix("per_layer_model_proj.weight", N_PER_LAYER * N_LAYER, N_EMBD, std=0.1)
    wt.norm("per_layer_proj_norm.weight", N_PER_LAYER)
    for il in range(N_LAYER):
        add_layer(wt, il)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    for qtype in TYPES:
        model_file = f"tiny-gemma3n-{qtype}.gguf"
        write_model(qtype, DATA / "models" / model_file)
        write_scenario(scenario(model_file))


if __name__ == "__main__":
    main()
