#!/usr/bin/env python3
"""Writes LoRA adapters for the tiny models (tests/data/lora/*.gguf) as
convert_lora_to_gguf.py writes them: general.type = "adapter", adapter.type = "lora",
adapter.lora.alpha, and for each adapted matrix `<base name>.lora_a` (rank rows of the
input's width) and `.lora_b` (the output's rows of rank); the token embedding's A is stored
transposed (a row of rank values per token), experts' pairs are 3-D (one A and B per expert).
Also the scenarios llama.cpp's logits are recorded on with them
(tests/data/scenarios/lora-*.json, without expected values: benches/record_lora.py adds them).

  python tests/data/make_tiny_loras.py            # writes them all (deterministic)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

DATA = Path(__file__).resolve().parent
MODELS = DATA / "models"
LORA = DATA / "lora"

ATTN = ("attn_q", "attn_k", "attn_v", "attn_output")
FFN = ("ffn_gate", "ffn_up", "ffn_down")


@dataclass
class Adapter:
    """One adapter: the base model it is for, the matrices it adapts in every layer (and the
    global ones), its rank, alpha and storage type."""

    name: str
    base: str
    layer_tensors: tuple[str, ...]
    global_tensors: tuple[str, ...] = ()
    rank: int = 4
    alpha: float = 8.0
    dtype: type = np.float16
    #: tensors llama.cpp skips (norms), written to check that they are skipped as it does
    extra_norms: tuple[str, ...] = ()
    seed: int = 0
    arch: str | None = None        # another architecture than the base's (for error tests)
    metadata: dict = field(default_factory=dict)


def adapters() -> list[Adapter]:
    return [
        Adapter("lora-llama3-a", "tiny-llama3-f32.gguf", ATTN + FFN, seed=1),
        Adapter("lora-llama3-b", "tiny-llama3-f32.gguf", ("attn_q", "attn_v", "ffn_down"),
                ("token_embd.weight", "output.weight"), rank=8, alpha=0.0, dtype=np.float32,
                extra_norms=("blk.0.attn_norm.weight",), seed=2),
        Adapter("lora-mixtral", "tiny-mixtral-f32.gguf",
                ATTN + ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), seed=3),
        Adapter("lora-phi3", "tiny-phi3-f32.gguf", ("attn_qkv", "attn_output", "ffn_up", "ffn_down"), seed=4),
    ]


def base_shapes(base: str) -> tuple[str, dict[str, tuple[int, ...]]]:
    """The base model's architecture and each tensor's numpy shape (ggml's ne reversed)."""
    r = gguf.GGUFReader(MODELS / base)
    arch = r.fields["general.architecture"].contents()
    return arch, {t.name: tuple(int(x) for x in reversed(t.shape)) for t in r.tensors}


def pair(rng: np.random.Generator, name: str, shape: tuple[int, ...], rank: int) -> tuple[np.ndarray, np.ndarray]:
    """A and B (numpy shapes) for a base tensor of numpy shape `shape`, with values that move
    the logits visibly (B is not zero, unlike a freshly initialised LoRA)."""
    if name == "token_embd.weight":
        n_vocab, n_embd = shape
        return rng.standard_normal((n_vocab, rank)) * 0.5, rng.standard_normal((n_embd, rank)) * 0.1
    *experts, n_out, n_in = shape
    a = rng.standard_normal((*experts, rank, n_in)) * 0.07
    b = rng.standard_normal((*experts, n_out, rank)) * 0.05
    return a, b


def write_adapter(ad: Adapter, path: Path, shape_override: dict[str, tuple[int, ...]] | None = None) -> None:
    """Writes `ad`; `shape_override` replaces a base tensor's shape (for wrong-shape tests)."""
    arch, shapes = base_shapes(ad.base)
    shapes.update(shape_override or {})
    w = gguf.GGUFWriter(str(path), ad.arch or arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, ad.alpha)
    for k, v in ad.metadata.items():
        w.add_string(k, v)
    rng = np.random.default_rng(ad.seed)
    n_layer = 1 + max(int(n.split(".")[1]) for n in shapes if n.startswith("blk."))
    names = [f"blk.{il}.{t}.weight" for il in range(n_layer) for t in ad.layer_tensors] + list(ad.global_tensors)
    for name in names:
        a, b = pair(rng, name, shapes[name], ad.rank)
        w.add_tensor(name + ".lora_a", a.astype(ad.dtype))
        w.add_tensor(name + ".lora_b", b.astype(ad.dtype))
    for name in ad.extra_norms:
        w.add_tensor(name, np.ones(shapes[name], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def scenarios() -> list[tuple[str, str, list[tuple[str, float]]]]:
    """(scenario name, model file, [(adapter file, scale), ...])."""
    a, b = "lora-llama3-a.gguf", "lora-llama3-b.gguf"
    out = []
    for t in ("f32", "q8_0"):
        model = f"tiny-llama3-{t}.gguf"
        out += [(f"lora-llama3-{t}-a1", model, [(a, 1.0)]),
                (f"lora-llama3-{t}-a-half", model, [(a, 0.5)]),
                (f"lora-llama3-{t}-a-b", model, [(a, 1.0), (b, 0.75)])]
    out += [("lora-mixtral-f32", "tiny-mixtral-f32.gguf", [("lora-mixtral.gguf", 1.0)]),
            ("lora-phi3-f32", "tiny-phi3-f32.gguf", [("lora-phi3.gguf", 1.0)])]
    return out


def main() -> None:
    import make_tiny_archs as mk

    for ad in adapters():
        write_adapter(ad, LORA / f"{ad.name}.gguf")
        print("wrote", ad.name)
    for name, model, loras in scenarios():
        scn = mk.scenario(model)
        scn["name"] = name
        scn["lora"] = [[f, s] for f, s in loras]
        out = DATA / "scenarios" / f"{name}.json"
        old = json.loads(out.read_text()) if out.exists() else {}
        if old.get("steps") == scn["steps"] and old.get("lora") == scn["lora"]:
            scn.update({k: v for k, v in old.items() if k.startswith("expected") or k == "recorded_with"})
        out.write_text(json.dumps(scn))
        print("wrote", out.name)


if __name__ == "__main__":
    main()
