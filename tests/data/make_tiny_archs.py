#!/usr/bin/env python3
"""Writes the tiny random-weight models of every architecture beyond the tiny llama, and the
scenario each is recorded on (tests/data/models/tiny-ARCH-TYPE.gguf and
tests/data/scenarios/arch-ARCH-TYPE.json, without expected values: benches/record_archs.py
adds llama.cpp's).

The models use llama.cpp's tensor names and metadata keys, the 512-token SPM vocabulary of
tests/data/models/tiny-llama-f32.gguf, and weights drawn with scales like the tiny llama's
(embeddings of std 1, matrices of std 0.06-0.08, norms around 1), so that logits spread over
several units. TYPE is f32 (every tensor F32) or q8_0 (matrices in Q8_0, vectors F32).

  python tests/data/make_tiny_archs.py            # writes them all (deterministic)
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

DATA = Path(__file__).resolve().parent
VOCAB_SOURCE = DATA / "models" / "tiny-llama-f32.gguf"
N_VOCAB, N_EMBD, N_HEAD, N_HEAD_KV, N_LAYER, N_FF, N_CTX = 512, 256, 4, 2, 2, 512, 256
TYPES = ("f32", "q8_0")


@dataclass(frozen=True)
class Dims:
    """A model's sizes (the tiny models' by default; benches/make_moe_model.py scales them up)."""

    n_embd: int = N_EMBD
    n_head: int = N_HEAD
    n_head_kv: int = N_HEAD_KV
    n_layer: int = N_LAYER
    n_ff: int = N_FF
    n_ctx: int = N_CTX


TINY = Dims()


@dataclass
class Spec:
    """One architecture's tiny model: its metadata beyond the common keys, its layer layout."""

    name: str
    arch: str
    metadata: dict = field(default_factory=dict)
    head_dim: int = N_EMBD // N_HEAD
    pre_norms: bool = True
    qk_norm: str = ""            # "", "head" or "whole"
    post_norms: bool = False
    fused: bool = False          # attn_qkv and a 2 n_ff ffn_up (Phi-3)
    qkv_bias: bool = False
    o_bias: bool = False
    sinks: bool = False
    expert_bias: bool = False
    ffn_norm: str = "ffn_norm.weight"
    experts: int = 0
    experts_used: int = 0
    n_ff_exp: int = 0
    tied: bool = False           # no output.weight
    global_tensors: dict = field(default_factory=dict)


def llama3_rope_freqs(head_dim: int, base: float) -> np.ndarray:
    """Llama 3.1's frequency factors (factor 8, low 1, high 4, original context 8192), as
    convert_hf_to_gguf.py computes them into rope_freqs."""
    factor, low, high, old_ctx = 8.0, 1.0, 4.0, 8192
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (base ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def specs() -> list[Spec]:
    rng = np.random.default_rng(7)
    long_rope = 1.0 + rng.random(32, dtype=np.float32) * 3.0
    short_rope = 1.0 + rng.random(32, dtype=np.float32) * 0.5
    return [
        Spec("llama3", "llama", {"rope.freq_base": 500000.0},
             global_tensors={"rope_freqs.weight": llama3_rope_freqs(64, 500000.0)}),
        Spec("mixtral", "llama", {"rope.scaling.type": "linear", "rope.scaling.factor": 2.0},
             experts=4, experts_used=2),
        Spec("qwen3", "qwen3", {"attention.key_length": 128, "attention.value_length": 128, "rope.freq_base": 1000000.0},
             head_dim=128, qk_norm="head"),
        Spec("qwen3moe", "qwen3moe", {"attention.key_length": 128, "attention.value_length": 128,
                                      "expert_feed_forward_length": 128},
             head_dim=128, qk_norm="head", experts=8, experts_used=2, n_ff_exp=128),
        Spec("gemma2", "gemma2", {"attention.sliding_window": 32, "attn_logit_softcapping": 5.0,
                                  "final_logit_softcapping": 3.0, "attention.key_length": 64,
                                  "attention.value_length": 64}, post_norms=True, tied=True),
        Spec("phi3", "phi3", {"rope.scaling.original_context_length": 64, "rope.scaling.attn_factor": 1.1902381},
             fused=True, global_tensors={"rope_factors_long.weight": long_rope, "rope_factors_short.weight": short_rope}),
        Spec("granite", "granite", {"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.015625,
                                    "logit_scale": 8.0}),
        Spec("olmo2", "olmo2", {}, pre_norms=False, qk_norm="whole", post_norms=True),
        Spec("gpt-oss", "gpt-oss", {"attention.sliding_window": 16, "expert_feed_forward_length": 128,
                                    "rope.freq_base": 150000.0, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                    "rope.scaling.original_context_length": 64},
             qkv_bias=True, o_bias=True, sinks=True, expert_bias=True, ffn_norm="post_attention_norm.weight",
             experts=4, experts_used=2, n_ff_exp=128),
    ]


class Weights:
    """Random tensors with the tiny llama's scales, written in a chosen type."""

    def __init__(self, writer: gguf.GGUFWriter, rng: np.random.Generator, qtype: str) -> None:
        self.w, self.rng, self.qtype = writer, rng, qtype

    def matrix(self, name: str, *shape: int, std: float = 0.07) -> None:
        data = (self.rng.standard_normal(shape) * std).astype(np.float32)
        if self.qtype == "f16":
            self.w.add_tensor(name, data.astype(np.float16))
        elif self.qtype == "q8_0":
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            self.w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            self.w.add_tensor(name, data)

    def norm(self, name: str, n: int) -> None:
        self.w.add_tensor(name, (1.0 + self.rng.standard_normal(n) * 0.1).astype(np.float32))

    def bias(self, name: str, n: int) -> None:
        self.w.add_tensor(name, (self.rng.standard_normal(n) * 0.1).astype(np.float32))

    def vector(self, name: str, values: np.ndarray) -> None:
        self.w.add_tensor(name, values.astype(np.float32))


def copy_vocab(w: gguf.GGUFWriter, replace: dict[int, tuple[str, int]] | None = None) -> None:
    """The tiny llama's vocabulary; ``replace`` maps token ids to the (text, token type) they
    get instead (make_tiny_vision.py's image markers)."""
    r = gguf.GGUFReader(VOCAB_SOURCE)
    f = r.fields
    tokens, types = f["tokenizer.ggml.tokens"].contents(), f["tokenizer.ggml.token_type"].contents()
    for token_id, (text, token_type) in (replace or {}).items():
        tokens[token_id], types[token_id] = text, token_type
    w.add_tokenizer_model(f["tokenizer.ggml.model"].contents())
    w.add_tokenizer_pre(f["tokenizer.ggml.pre"].contents())
    w.add_token_list(tokens)
    w.add_token_scores(f["tokenizer.ggml.scores"].contents())
    w.add_token_types(types)
    w.add_bos_token_id(f["tokenizer.ggml.bos_token_id"].contents())
    w.add_eos_token_id(f["tokenizer.ggml.eos_token_id"].contents())
    w.add_unk_token_id(f["tokenizer.ggml.unknown_token_id"].contents())
    w.add_add_bos_token(f["tokenizer.ggml.add_bos_token"].contents())
    w.add_add_eos_token(f["tokenizer.ggml.add_eos_token"].contents())


def add_metadata(w: gguf.GGUFWriter, s: Spec, dims: Dims) -> None:
    a = s.arch
    w.add_uint32(f"{a}.context_length", dims.n_ctx)
    w.add_uint32(f"{a}.embedding_length", dims.n_embd)
    w.add_uint32(f"{a}.block_count", dims.n_layer)
    w.add_uint32(f"{a}.feed_forward_length", dims.n_ff)
    w.add_uint32(f"{a}.attention.head_count", dims.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", dims.n_head_kv)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32(f"{a}.rope.dimension_count", s.head_dim)
    if s.experts:
        w.add_uint32(f"{a}.expert_count", s.experts)
        w.add_uint32(f"{a}.expert_used_count", s.experts_used)
    if "rope.freq_base" not in s.metadata:
        w.add_float32(f"{a}.rope.freq_base", 10000.0)
    for k, v in s.metadata.items():
        if isinstance(v, str):
            w.add_string(f"{a}.{k}", v)
        elif isinstance(v, list):
            w.add_array(f"{a}.{k}", v)
        elif isinstance(v, int):
            w.add_uint32(f"{a}.{k}", v)
        else:
            w.add_float32(f"{a}.{k}", v)


def add_layer(wt: Weights, s: Spec, il: int, dims: Dims) -> None:
    p = f"blk.{il}."
    N_EMBD, N_FF = dims.n_embd, dims.n_ff  # noqa: N806 - the sizes as the tiny models name them
    q_dim, kv_dim = dims.n_head * s.head_dim, dims.n_head_kv * s.head_dim
    if s.pre_norms:
        wt.norm(p + "attn_norm.weight", N_EMBD)
        wt.norm(p + s.ffn_norm, N_EMBD)
    if s.fused:
        wt.matrix(p + "attn_qkv.weight", q_dim + 2 * kv_dim, N_EMBD, std=0.06)
    else:
        wt.matrix(p + "attn_q.weight", q_dim, N_EMBD, std=0.06)
        wt.matrix(p + "attn_k.weight", kv_dim, N_EMBD, std=0.06)
        wt.matrix(p + "attn_v.weight", kv_dim, N_EMBD, std=0.08)
    wt.matrix(p + "attn_output.weight", N_EMBD, q_dim, std=0.05)
    if s.qkv_bias:
        wt.bias(p + "attn_q.bias", q_dim)
        wt.bias(p + "attn_k.bias", kv_dim)
        wt.bias(p + "attn_v.bias", kv_dim)
    if s.o_bias:
        wt.bias(p + "attn_output.bias", N_EMBD)
    if s.sinks:
        wt.vector(p + "attn_sinks.weight", wt.rng.standard_normal(dims.n_head) * 2.0)
    if s.qk_norm == "head":
        wt.norm(p + "attn_q_norm.weight", s.head_dim)
        wt.norm(p + "attn_k_norm.weight", s.head_dim)
    elif s.qk_norm == "whole":
        wt.norm(p + "attn_q_norm.weight", q_dim)
        wt.norm(p + "attn_k_norm.weight", kv_dim)
    if s.post_norms:
        wt.norm(p + "post_attention_norm.weight", N_EMBD)
        wt.norm(p + "post_ffw_norm.weight", N_EMBD)
    if s.experts:
        ff = s.n_ff_exp or N_FF
        wt.matrix(p + "ffn_gate_inp.weight", s.experts, N_EMBD, std=0.3)
        wt.matrix(p + "ffn_gate_exps.weight", s.experts, ff, N_EMBD, std=0.08)
        wt.matrix(p + "ffn_up_exps.weight", s.experts, ff, N_EMBD, std=0.08)
        wt.matrix(p + "ffn_down_exps.weight", s.experts, N_EMBD, ff, std=0.05)
        if s.expert_bias:
            wt.bias(p + "ffn_gate_inp.bias", s.experts)
            wt.vector(p + "ffn_gate_exps.bias", wt.rng.standard_normal((s.experts, ff)) * 0.1)
            wt.vector(p + "ffn_up_exps.bias", wt.rng.standard_normal((s.experts, ff)) * 0.1)
            wt.vector(p + "ffn_down_exps.bias", wt.rng.standard_normal((s.experts, N_EMBD)) * 0.1)
    elif s.fused:
        wt.matrix(p + "ffn_up.weight", 2 * N_FF, N_EMBD, std=0.08)
        wt.matrix(p + "ffn_down.weight", N_EMBD, N_FF, std=0.05)
    else:
        wt.matrix(p + "ffn_gate.weight", N_FF, N_EMBD, std=0.08)
        wt.matrix(p + "ffn_up.weight", N_FF, N_EMBD, std=0.08)
        wt.matrix(p + "ffn_down.weight", N_EMBD, N_FF, std=0.05)


def write_model(s: Spec, qtype: str, path: Path, dims: Dims = TINY,
                vocab: Callable[[gguf.GGUFWriter], None] = copy_vocab) -> None:
    """Writes the model; ``vocab`` writes its tokenizer keys (the tiny llama's by default)."""
    w = gguf.GGUFWriter(str(path), s.arch)
    # No architecture in the name: llama.cpp sets token attributes by name ("phi3" needs tokens
    # this vocabulary lacks).
    w.add_name(f"tiny random model {qtype}")
    add_metadata(w, s, dims)
    vocab(w)
    rng = np.random.default_rng(sum(map(ord, s.name)))
    wt = Weights(w, rng, qtype)
    wt.matrix("token_embd.weight", N_VOCAB, dims.n_embd, std=1.0)
    wt.norm("output_norm.weight", dims.n_embd)
    if not s.tied:
        wt.matrix("output.weight", N_VOCAB, dims.n_embd, std=0.08)
    for name, values in s.global_tensors.items():
        wt.vector(name, values)
    for il in range(dims.n_layer):
        add_layer(wt, s, il, dims)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def scenario(model_file: str) -> dict:
    """A prompt of 48 tokens in micro-batches of 32 (outputs at every 8th), four tokens one at
    a time, then four sequences in one batch (three new prompts beside sequence 0's next
    token) and one more step of all four together."""
    rng = np.random.default_rng(11)
    tok = lambda n: [int(t) for t in rng.integers(3, N_VOCAB, n)]  # noqa: E731
    steps = []
    prompt = [1] + tok(47)
    steps.append({"op": "decode", "tokens": prompt, "pos": list(range(48)), "seq_ids": [[0]] * 48,
                  "logits": [7, 15, 23, 31, 39, 47]})
    for p in range(48, 52):
        steps.append({"op": "decode", "tokens": tok(1), "pos": [p], "seq_ids": [[0]], "logits": [0]})
    lens = {1: 10, 2: 6, 3: 13}
    tokens, pos, seqs, logits = tok(1), [52], [[0]], [0]
    for s, n in lens.items():
        tokens += [1] + tok(n - 1)
        pos += list(range(n))
        seqs += [[s]] * n
        logits.append(len(tokens) - 1)
    steps.append({"op": "decode", "tokens": tokens, "pos": pos, "seq_ids": seqs, "logits": logits})
    nxt = {0: 53, **lens}
    steps.append({"op": "decode", "tokens": tok(4), "pos": [nxt[s] for s in range(4)],
                  "seq_ids": [[s] for s in range(4)], "logits": [0, 1, 2, 3]})
    return {"name": Path(model_file).stem.replace("tiny-", "arch-"), "model": model_file,
            "context": {"n_ctx": N_CTX, "n_batch": 64, "n_ubatch": 32, "n_seq_max": 4}, "steps": steps}


def write_scenario(scn: dict) -> None:
    """Writes a scenario, keeping the expected values recorded for the same steps."""
    out = DATA / "scenarios" / f"{scn['name']}.json"
    old = json.loads(out.read_text()) if out.exists() else {}
    if old.get("steps") == scn["steps"]:
        scn.update({k: v for k, v in old.items() if k.startswith("expected") or k == "recorded_with"})
    out.write_text(json.dumps(scn))
    print("wrote", out.name)


def main() -> None:
    for s in specs():
        for qtype in TYPES:
            model_file = f"tiny-{s.name}-{qtype}.gguf"
            write_model(s, qtype, DATA / "models" / model_file)
            write_scenario(scenario(model_file))


if __name__ == "__main__":
    main()
