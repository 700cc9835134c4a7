#!/usr/bin/env python3
"""What a LoRA adapter costs: generation (tgN) and prompt (ppN) speed on a real model with a
rank-R adapter on every attention and FFN matrix (Q, K, V, O, gate, up, down of every layer),
against the same engine without it, and against llama.cpp with the same adapter.

The adapter is written as convert_lora_to_gguf.py writes one (its default --outtype f32, or
--dtype f16), with random A and B (the speed does not depend on the values). Both engines run
in this process; each rep runs every (engine, adapter on/off) pair back to back, the order of
the engines alternating from rep to rep, so that a shared machine's noise hits them alike;
ratios are per-rep ratios of runs made back to back, medians over the reps.

  python benches/lora_speed.py [--model qwen2.5-coder-0.5b] [--rank 16] [--dtype f32]
                               [--reps 5] [--threads 2] [--tg 64] [--pp 256] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as B  # noqa: E402

MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def write_adapter(model_path: Path, out: Path, rank: int, alpha: float, dtype: str) -> int:
    """A rank-`rank` adapter on every attention and FFN matrix of the model; returns the pairs."""
    import gguf

    r = gguf.GGUFReader(model_path)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(out), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    rng = np.random.default_rng(0)
    np_dtype = {"f32": np.float32, "f16": np.float16}[dtype]
    n = 0
    for t in r.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in MATRICES and parts[3] == "weight":
            n_in, n_out = int(t.shape[0]), int(t.shape[1])
            w.add_tensor(t.name + ".lora_a", (rng.standard_normal((rank, n_in)) * 0.02).astype(np_dtype))
            w.add_tensor(t.name + ".lora_b", (rng.standard_normal((n_out, rank)) * 0.02).astype(np_dtype))
            n += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n


class Setup:
    """One engine's model and two contexts: one without the adapter, one with it set at 1.0
    (set once: llama.cpp re-reserves its graph after a change of adapters)."""

    def __init__(self, engine, model_path: Path, adapter_path: Path, n_ctx: int, n_batch: int, threads: int):
        self.engine = engine
        self.model = engine.load(model_path)
        self.ctxs = [self.model.context(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads) for _ in range(2)]
        self.batch = self.ctxs[0].batch(n_batch)
        lora_ctx = self.ctxs[1]
        if engine.name == "llama.cpp":
            L = engine.L
            self.adapter = L.llama_adapter_lora_init(self.model.ptr, str(adapter_path).encode())
            if not self.adapter:
                raise RuntimeError("llama.cpp could not load the adapter")
            arr = (L.llama_adapter_lora_p_ctypes * 1)(self.adapter)
            scales = (ctypes.c_float * 1)(1.0)
            L.llama_set_adapters_lora(lora_ctx.ptr, arr, 1, scales)
        else:
            self.adapter = engine.fl.LoraAdapter(self.model.m, str(adapter_path))
            lora_ctx.ctx.set_lora(self.adapter, 1.0)
        self.ctx = self.ctxs[0]

    def set_adapter(self, on: bool) -> None:
        self.ctx = self.ctxs[1 if on else 0]

    def tg(self, tokens: list[int]) -> float:
        """Tokens/s decoding `tokens` one at a time into a cleared cache."""
        self.ctx.clear()
        t0 = time.perf_counter()
        for pos, tok in enumerate(tokens):
            self.batch.fill_one(tok, pos)
            self.ctx.decode(self.batch)
        return len(tokens) / (time.perf_counter() - t0)

    def pp(self, tokens: list[int]) -> float:
        """Tokens/s decoding `tokens` as one batch (last logits only) into a cleared cache."""
        self.ctx.clear()
        n = len(tokens)
        self.batch.fill(tokens, list(range(n)), [0] * n, [i == n - 1 for i in range(n)])
        t0 = time.perf_counter()
        self.ctx.decode(self.batch)
        return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--pp", type=int, default=256)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    [(name, path)] = B.resolve_models(args.model, args.model_dir)
    tmp = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    adapter = tmp / f"lora-r{args.rank}-{args.dtype}.gguf"
    n_pairs = write_adapter(path, adapter, args.rank, args.alpha, args.dtype)
    print(f"{name}: rank-{args.rank} {args.dtype} adapter on {n_pairs} matrices ({adapter.stat().st_size / 2**20:.1f} MiB)")

    engines = []
    for cls in (B.LlamaCppEngine, B.FerrollamaEngine):
        try:
            engines.append(cls())
        except B.EngineUnavailable as e:
            print(f"({e}: measuring without it)")
    setups = {e.name: Setup(e, path, adapter, n_ctx=max(args.tg, args.pp), n_batch=args.pp, threads=args.threads)
              for e in engines}
    rng = np.random.default_rng(1)
    some = setups[engines[0].name].model
    tg_tokens = [some.bos] + [int(t) for t in rng.integers(100, some.n_vocab - 100, args.tg - 1)]
    pp_tokens = [some.bos] + [int(t) for t in rng.integers(100, some.n_vocab - 100, args.pp - 1)]

    keys = [(e, test, on) for e in setups for test in ("tg", "pp") for on in (False, True)]
    samples = {k: B.Samples() for k in keys}
    for rep in range(args.reps + 1):       # rep 0 warms up (page cache, repacking, first products)
        order = list(setups) if rep % 2 == 0 else list(reversed(setups))
        for test in ("tg", "pp"):
            for e in order:
                for on in (False, True):
                    s = setups[e]
                    s.set_adapter(on)
                    v = s.tg(tg_tokens) if test == "tg" else s.pp(pp_tokens)
                    if rep > 0:
                        samples[(e, test, on)].values.append(v)
        print(f"rep {rep}/{args.reps} done", file=sys.stderr)

    print(f"\n| engine | test | without adapter (t/s) | with adapter (t/s) | with / without |")
    print("|---|---|---|---|---|")
    for e in setups:
        for test, n in (("tg", args.tg), ("pp", args.pp)):
            off, on = samples[(e, test, False)], samples[(e, test, True)]
            r, sd = B.paired_ratio(on, off)
            print(f"| {e} | {test}{n} | {off.cell()} | {on.cell()} | {r:.3f} ± {sd:.3f} |")
    if len(setups) == 2:
        print("\n| test | ferrollama / llama.cpp without adapter | ferrollama / llama.cpp with adapter |")
        print("|---|---|---|")
        for test, n in (("tg", args.tg), ("pp", args.pp)):
            r_off = B.paired_ratio(samples[("ferrollama", test, False)], samples[("llama.cpp", test, False)])
            r_on = B.paired_ratio(samples[("ferrollama", test, True)], samples[("llama.cpp", test, True)])
            print(f"| {test}{n} | {r_off[0]:.3f} ± {r_off[1]:.3f} | {r_on[0]:.3f} ± {r_on[1]:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({f"{e}/{t}/{'lora' if on else 'plain'}": s.as_dict()
                                               for (e, t, on), s in samples.items()}, indent=1))


if __name__ == "__main__":
    main()
