"""Drives ferrollama through a recorded llama.cpp scenario and compares the outputs.

A scenario (tests/data/scenarios/*.json, format in tests/data/REFERENCE.md) is a list of
steps (decode and sequence operations); `expected` holds llama.cpp's outputs recorded with
an F32 KV cache, `expected_kv_f16` with F16. Also used by benches/conformance_table.py.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import ferrollama as fl

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from scenario_rows import embedding_rows  # noqa: E402
SCENARIOS = DATA / "scenarios"
TINY_MODELS = DATA / "models"
FLOAT_TYPES = ("f32", "f16", "bf16")

#: README tolerances: tiny float models, tiny quantized models, real models (KLD, top-1).
TOL_TINY_FLOAT_MAX = 0.05
TOL_TINY_QUANT_MAX = 0.35
TOL_TINY_QUANT_MEAN = 0.05
TOL_REAL = {"qwen2": (0.005, 0.95), "gemma3": (0.02, 0.90)}


def load(name: str) -> dict:
    return json.loads((SCENARIOS / f"{name}.json").read_text())


def scenario_names(prefixes: tuple[str, ...]) -> list[str]:
    names = sorted(p.stem for p in SCENARIOS.glob("*.json"))
    return [n for n in names if n.startswith(prefixes)]


def run(scn: dict, model: fl.Model, cache_type: str, setup=None) -> list[dict]:
    """Replays the steps; returns outputs in the shape of `expected` (full logits arrays).
    `setup(ctx)`, when given, prepares the new context first (e.g. sets LoRA adapters)."""
    c = scn["context"]
    n_seq = c.get("n_seq_max", 1)
    ctx = fl.Context(model, n_ctx=c["n_ctx"], n_batch=c["n_batch"], n_ubatch=c["n_ubatch"], n_seq_max=n_seq,
                     type_k=cache_type, type_v=cache_type, kv_unified=c.get("kv_unified", True),
                     swa_full=c.get("swa_full", False), **c.get("rope", {}))
    if setup is not None:
        setup(ctx)
    kv = ctx.kv
    slots: dict[str, bytes] = {}
    got: list[dict] = []
    for si, st in enumerate(scn["steps"]):
        op = st["op"]
        if op == "decode":
            if "embd" in st:
                batch = embeddings_batch(st, model)
            else:
                n = len(st["tokens"])
                seqs = st.get("seq_ids") or [[0]] * n
                want = set(st["logits"])
                batch = fl.Batch(n_tokens_max=n, n_seq_max=n_seq)
                for i, (t, p, s) in enumerate(zip(st["tokens"], st["pos"], seqs)):
                    batch.add(t, p, s, i in want)
            try:
                ctx.decode(batch)
            except fl.DecodeError:
                got.append({"step": si, "decode_rc": 1})
            else:
                for i in st["logits"]:
                    got.append({"step": si, "batch_index": i, "logits": ctx.logits(i)})
        elif op == "seq_rm":
            got.append({"step": si, "returns": kv.seq_rm(st["seq_id"], st["p0"], st["p1"])})
        elif op == "seq_cp":
            kv.seq_cp(st["src"], st["dst"], st["p0"], st["p1"])
        elif op == "seq_keep":
            kv.seq_keep(st["seq_id"])
        elif op == "seq_add":
            kv.seq_add(st["seq_id"], st["p0"], st["p1"], st["delta"])
        elif op == "seq_div":
            kv.seq_div(st["seq_id"], st["p0"], st["p1"], st["d"])
        elif op == "clear":
            kv.clear()
        elif op == "state_save":
            slots[st["slot"]] = ctx.state_get()
        elif op == "state_load":
            ctx.state_set(slots[st["slot"]])
        elif op == "seq_state_save":
            slots[st["slot"]] = ctx.seq_state_get(st["seq_id"])
        elif op == "seq_state_load":
            ctx.seq_state_set(slots[st["slot"]], st["seq_id"])
        else:
            raise ValueError(f"unknown op {op}")
        for s in st.get("check_pos", []):
            got.append({"step": si, "seq_id": s, "pos_min": kv.seq_pos_min(s), "pos_max": kv.seq_pos_max(s)})
    return got


def embeddings_batch(st: dict, model: fl.Model) -> fl.Batch:
    """A step's batch of embedding rows (scenario_rows.embedding_rows) of one sequence, at its
    M-RoPE positions (four per row) or consecutive ones; logits of every row (the step reads
    those it records: each row's are the same whichever others are computed)."""
    seqs = {tuple(s) for s in st["seq_ids"]}
    if len(seqs) != 1 or len(next(iter(seqs))) != 1:
        raise ValueError(f"a batch of embeddings of one sequence, not {sorted(seqs)}")
    rows = embedding_rows(st["embd"], model.n_embd, model.n_embd_inp)
    seq_id = st["seq_ids"][0][0]
    if isinstance(st["pos"][0], list):
        return fl.Batch.from_embeddings(rows, seq_id=seq_id, logits="all", positions=np.array(st["pos"]))
    if st["pos"] != list(range(st["pos"][0], st["pos"][0] + len(rows))):
        raise ValueError("a batch of embeddings at consecutive positions, or four per row (M-RoPE)")
    return fl.Batch.from_embeddings(rows, st["pos"][0], seq_id, "all")


def _key(e: dict) -> tuple:
    if "batch_index" in e:
        return (e["step"], "logits", e["batch_index"])
    if "seq_id" in e:
        return (e["step"], "pos", e["seq_id"])
    if "returns" in e:
        return (e["step"], "returns")
    return (e["step"], "decode_rc")


def kld_top(ref_top: list, ref_lse: float, logits: np.ndarray) -> float:
    """KL(llama.cpp || engine) over the recorded top tokens plus one bucket for the rest."""
    ids = np.array([t for t, _ in ref_top])
    lp_ref = np.array([l for _, l in ref_top], dtype=np.float64) - ref_lse
    x = logits.astype(np.float64)
    m = x.max()
    lse = m + math.log(np.exp(x - m).sum())
    lp = x[ids] - lse
    p_ref = np.exp(lp_ref)
    kl = float((p_ref * (lp_ref - lp)).sum())
    rest_ref = max(1.0 - p_ref.sum(), 0.0)
    rest = max(1.0 - np.exp(lp).sum(), 1e-30)
    if rest_ref > 0:
        kl += rest_ref * math.log(rest_ref / rest)
    return kl


@dataclass
class Comparison:
    name: str
    cache_type: str
    n_logits: int = 0
    max_abs: float = 0.0
    mean_abs: float = 0.0
    mean_kld: float = 0.0
    top1: float = 1.0
    #: positions left out of top-1 because llama.cpp's own F32 and F16 records disagree there
    top1_ties: int = 0
    exact_failures: list = field(default_factory=list)

    def row(self) -> str:
        if self.mean_kld or self.top1 < 1.0 or self.n_logits and self.max_abs == 0.0 and self.mean_abs == 0.0:
            metric = f"KLD {self.mean_kld:.5f}, top-1 {self.top1 * 100:.1f}%"
            if self.top1_ties:
                metric += f" ({self.top1_ties} llama.cpp self-disagreement left out)"
        else:
            metric = f"max {self.max_abs:.4f}, mean {self.mean_abs:.5f}"
        return f"| {self.name} | {self.cache_type} | {self.n_logits} | {metric} |"


def llama_cpp_self_disagreements(scn: dict) -> set:
    """Outputs where llama.cpp's F32-cache and F16-cache records name different top tokens:
    there llama.cpp does not agree with itself, so no engine can agree or disagree with it."""
    f16 = {_key(e): e for e in scn.get("expected_kv_f16", []) if "top" in e}
    return {_key(e) for e in scn.get("expected", []) if "top" in e and _key(e) in f16
            and e["top"][0][0] != f16[_key(e)]["top"][0][0]}


def compare(name: str, scn: dict, got: list[dict], cache_type: str) -> Comparison:
    expected = scn["expected"] if cache_type == "f32" else scn[f"expected_kv_{cache_type}"]
    mine = {_key(e): e for e in got}
    cmp = Comparison(name, cache_type)
    ties = llama_cpp_self_disagreements(scn)
    sums, klds, tops = [], [], []
    for e in expected:
        k = _key(e)
        g = mine.get(k)
        if g is None:
            cmp.exact_failures.append(f"step {e['step']}: missing output {k} (got keys {sorted(mine)[:5]}...)")
            continue
        if "logits" in e:
            d = np.abs(np.asarray(e["logits"], dtype=np.float64) - g["logits"])
            cmp.max_abs = max(cmp.max_abs, float(d.max()))
            sums.append(float(d.mean()))
        elif "top" in e:
            klds.append(kld_top(e["top"], e["lse"], g["logits"]))
            if k in ties:
                cmp.top1_ties += 1
            else:
                tops.append(int(np.argmax(g["logits"])) == e["top"][0][0])
        else:
            for f in ("returns", "pos_min", "pos_max", "decode_rc"):
                if f in e and e[f] != g.get(f):
                    cmp.exact_failures.append(f"step {e['step']}: {f} expected {e[f]}, got {g.get(f)}")
    cmp.n_logits = len(sums) + len(klds)
    if sums:
        cmp.mean_abs = float(np.mean(sums))
    if klds:
        cmp.mean_kld = float(np.mean(klds))
        cmp.top1 = float(np.mean(tops)) if tops else 1.0
    return cmp


def check(cmp: Comparison, model_file: str, arch: str) -> list[str]:
    """The tolerance violations of a comparison (empty when it passes)."""
    bad = list(cmp.exact_failures)
    if model_file.startswith("tiny-"):
        wtype = model_file[:-len(".gguf")].rsplit("-", 1)[1]
        if wtype in FLOAT_TYPES:
            if cmp.max_abs > TOL_TINY_FLOAT_MAX:
                bad.append(f"max |dlogit| {cmp.max_abs:.4f} > {TOL_TINY_FLOAT_MAX}")
        else:
            if cmp.max_abs > TOL_TINY_QUANT_MAX:
                bad.append(f"max |dlogit| {cmp.max_abs:.4f} > {TOL_TINY_QUANT_MAX}")
            if cmp.mean_abs > TOL_TINY_QUANT_MEAN:
                bad.append(f"mean |dlogit| {cmp.mean_abs:.4f} > {TOL_TINY_QUANT_MEAN}")
    else:
        kld_max, top_min = TOL_REAL[arch]
        if cmp.mean_kld > kld_max:
            bad.append(f"mean KLD {cmp.mean_kld:.5f} > {kld_max}")
        if cmp.top1 < top_min:
            bad.append(f"top-1 agreement {cmp.top1:.3f} < {top_min}")
    return bad
