#!/usr/bin/env python3
"""ferrollama vs llama.cpp: prompt processing, generation and batched generation speed.

Both engines run in this one process and ALTERNATE rep by rep (llama.cpp then
ferrollama on even reps, the other way round on odd ones) on the same random tokens,
so that the noise of a shared machine hits both alike; each rep's ratio is taken
between the two runs that ran back to back, and the table shows medians.

Tests (``--tests``, comma separated):

- ``ppN``  (pp512): llama-bench's prompt test. A fresh (cleared) cache each rep, N random
  tokens (the first one BOS when the vocab adds BOS) decoded in batches of
  n_batch = n_ubatch = min(N, 512), n_ctx = N, only the last token's logits. Reports N / time.
- ``tgN``  (tg128): llama-bench's generation test. A cleared cache, then N decodes of one
  token each (BOS first when the vocab adds it, then random tokens), n_ctx = N, logits
  of every token. Reports N / time.
- ``batchP`` (batch8): llama-batched-bench's S_TG. A context with n_seq_max = P; each rep
  clears the cache, decodes a prompt of --batch-pp tokens per sequence (one batch holding
  all P prompts, or with --batch-prompt shared one prompt copied with seq_cp), then times
  --batch-tg steps that decode P tokens, one per sequence, with logits. Reports
  P * steps / time (total generated tokens/s) for P sequences and, in the same context,
  for 1 sequence; the scaling P-seq / 1-seq is printed below the table.

Usage:
  python benches/compare.py [--models qwen2.5-coder-0.5b,gemma-3-270m] [--reps 5]
         [--threads 2] [--tests pp512,tg128,batch8] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as B  # noqa: E402

ENGINE_ORDER = ["llama.cpp", "ferrollama"]


# --------------------------------------------------------------------------- tests


@dataclass
class Row:
    """One line of the table: a test's samples per engine."""

    model: str
    test: str
    samples: dict  # engine name -> B.Samples


class PromptTest:
    def __init__(self, n: int) -> None:
        self.n = n
        self.name = f"pp{n}"
        self.n_batch = min(n, 512)

    def context_params(self, args) -> dict:  # noqa: ANN001
        return dict(n_ctx=self.n, n_batch=self.n_batch, n_ubatch=self.n_batch, n_seq_max=1)

    def row_names(self) -> list[str]:
        return [self.name]

    def prepare(self, ctx, model) -> dict:  # noqa: ANN001
        return {"batch": ctx.batch(self.n_batch, 1)}

    def run(self, ctx, model, state: dict, rng: np.random.Generator) -> list[float]:  # noqa: ANN001
        tokens = rng.integers(0, model.n_vocab, self.n).tolist()
        if model.add_bos:
            tokens[0] = model.bos
        batch = state["batch"]
        chunks = []
        for start in range(0, self.n, self.n_batch):
            part = tokens[start:start + self.n_batch]
            chunks.append((part, list(range(start, start + len(part)))))
        ctx.clear()
        elapsed = 0.0
        for part, pos in chunks:
            # filled outside the timed region: the decode is what is measured
            batch.fill(part, pos, [0] * len(part), [False] * (len(part) - 1) + [True])
            t0 = time.perf_counter()
            ctx.decode(batch)
            elapsed += time.perf_counter() - t0
        return [self.n / elapsed]


class GenTest:
    def __init__(self, n: int, depth: int = 0) -> None:
        self.n = n
        self.depth = depth
        self.name = f"tg{n}" + (f" @ d{depth}" if depth else "")

    def context_params(self, args) -> dict:  # noqa: ANN001
        n_ctx = self.n + self.depth
        n_batch = min(n_ctx, 2048)
        return dict(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(n_batch, 512), n_seq_max=1)

    def row_names(self) -> list[str]:
        return [self.name]

    def prepare(self, ctx, model) -> dict:  # noqa: ANN001
        state = {"batch": ctx.batch(1, 1)}
        if self.depth:
            # the context at depth is built once; each rep removes what the previous one
            # generated (llama-bench restores a saved sequence state: same cache contents).
            rng = np.random.default_rng(1234)
            tokens = rng.integers(0, model.n_vocab, self.depth).tolist()
            if model.add_bos:
                tokens[0] = model.bos
            n_batch = min(self.depth, 2048)
            big = ctx.batch(n_batch, 1)
            ctx.clear()
            for start in range(0, self.depth, n_batch):
                part = tokens[start:start + n_batch]
                big.fill(part, list(range(start, start + len(part))), [0] * len(part),
                         [False] * (len(part) - 1) + [True])
                ctx.decode(big)
            big.close()
        return state

    def run(self, ctx, model, state: dict, rng: np.random.Generator) -> list[float]:  # noqa: ANN001
        tokens = rng.integers(0, model.n_vocab, self.n).tolist()
        if model.add_bos and not self.depth:
            tokens[0] = model.bos
        batch = state["batch"]
        if self.depth:
            ctx.seq_rm(0, self.depth, -1)
        else:
            ctx.clear()
        fill, decode, pos0 = batch.fill_one, ctx.decode, self.depth
        t0 = time.perf_counter()
        for i, tok in enumerate(tokens):
            fill(tok, pos0 + i, 0, True)
            decode(batch)
        return [self.n / (time.perf_counter() - t0)]


class BatchTest:
    def __init__(self, n_seq: int, pp: int, tg: int, shared: bool) -> None:
        self.n_seq = n_seq
        self.pp = pp
        self.tg = tg
        self.shared = shared
        self.name = f"batch{n_seq}"

    def row_names(self) -> list[str]:
        kind = "shared" if self.shared else "per-seq"
        return [f"tg {self.n_seq}x{self.tg} after {kind} pp{self.pp} ({self.n_seq} seq)",
                f"tg 1x{self.tg} after pp{self.pp} (1 seq)"]

    def context_params(self, args) -> dict:  # noqa: ANN001
        need = self.pp + self.n_seq * self.tg if self.shared else self.n_seq * (self.pp + self.tg)
        n_ctx = max(256, -(-need // 256) * 256)
        return dict(n_ctx=n_ctx, n_batch=2048, n_ubatch=512, n_seq_max=self.n_seq)

    def prepare(self, ctx, model) -> dict:  # noqa: ANN001
        n_prompt_tokens = self.pp * (1 if self.shared else self.n_seq)
        return {"prompt": ctx.batch(max(n_prompt_tokens, self.pp), self.n_seq),
                "step": ctx.batch(self.n_seq, self.n_seq)}

    def _one(self, ctx, state: dict, n_seq: int) -> float:  # noqa: ANN001
        # batched-bench decodes token 0 everywhere; the computation does not depend on the ids.
        prompt, step = state["prompt"], state["step"]
        n_prompts = 1 if self.shared else n_seq
        toks = [0] * (self.pp * n_prompts)
        pos = [i for _ in range(n_prompts) for i in range(self.pp)]
        seq = [j for j in range(n_prompts) for _ in range(self.pp)]
        prompt.fill(toks, pos, seq, [False] * (len(toks) - 1) + [True])
        ctx.clear()
        ctx.decode(prompt)
        if self.shared:
            for j in range(1, n_seq):
                ctx.seq_cp(0, j)
        seqs = list(range(n_seq))
        zeros = [0] * n_seq
        outs = [True] * n_seq
        t0 = time.perf_counter()
        for i in range(self.tg):
            step.fill(zeros, [self.pp + i] * n_seq, seqs, outs)
            ctx.decode(step)
        return n_seq * self.tg / (time.perf_counter() - t0)

    def run(self, ctx, model, state: dict, rng: np.random.Generator) -> list[float]:  # noqa: ANN001
        return [self._one(ctx, state, self.n_seq), self._one(ctx, state, 1)]


def parse_tests(spec: str, args) -> list:  # noqa: ANN001
    tests = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        if m := re.fullmatch(r"pp(\d+)", item):
            tests.append(PromptTest(int(m[1])))
        elif m := re.fullmatch(r"tg(\d+)(?:@d(\d+))?", item):
            tests.append(GenTest(int(m[1]), int(m[2] or 0)))
        elif m := re.fullmatch(r"batch(\d+)", item):
            tests.append(BatchTest(int(m[1]), args.batch_pp, args.batch_tg, args.batch_prompt == "shared"))
        else:
            raise SystemExit(f"unknown test {item!r} (ppN, tgN, tgN@dD, batchN)")
    return tests


# --------------------------------------------------------------------------- runner


def run_test(test, models: dict, args, model_name: str, info: dict) -> list[Row]:  # noqa: ANN001
    """Warm-up once per engine, then args.reps alternating reps."""
    names = test.row_names()
    rows = [Row(model_name, n, {e: B.Samples() for e in models}) for n in names]
    ctxs, states = {}, {}
    for e, model in models.items():
        try:
            ctx = model.context(n_threads=args.threads, kv_unified=args.kv_unified, **test.context_params(args))
            ctxs[e] = ctx
            states[e] = test.prepare(ctx, model)
            test.run(ctx, model, states[e], np.random.default_rng(args.seed))  # warm-up, not counted
            info.setdefault("flash_attn", {})[f"{model_name}/{e}"] = ctx.flash_attn
        except Exception as exc:  # noqa: BLE001 - report the engine's failure in the table
            for r in rows:
                r.samples[e].error = f"{type(exc).__name__}: {exc}"
            ctxs.pop(e, None)
            print(f"  {e}: {test.name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    order = [e for e in ENGINE_ORDER if e in ctxs]
    if getattr(args, "wait_quiet", 0):
        B.wait_until_quiet(args.wait_quiet)
    foreign = B.ForeignLoad()
    for rep in range(args.reps):
        rep_order = order if rep % 2 == 0 else order[::-1]
        for e in rep_order:
            rng = np.random.default_rng(args.seed + 1 + rep)  # same tokens for both engines
            try:
                values = test.run(ctxs[e], models[e], states[e], rng)
            except Exception as exc:  # noqa: BLE001
                for r in rows:
                    r.samples[e].error = f"{type(exc).__name__}: {exc}"
                ctxs.pop(e)
                order.remove(e)
                continue
            for r, v in zip(rows, values):
                r.samples[e].values.append(v)
        if args.verbose:
            print(f"  {model_name} {test.name} rep {rep + 1}/{args.reps}: " + "; ".join(
                f"{e} " + ", ".join(f"{r.samples[e].values[-1]:.1f}" for r in rows if r.samples[e].values)
                for e in order), file=sys.stderr)
    info.setdefault("foreign_load_cores", {})[f"{model_name}/{test.name}"] = round(foreign.cores(), 3)
    if isinstance(test, GenTest) and not test.depth:
        for e, ctx in ctxs.items():
            info.setdefault("call_overhead_us", {})[f"{model_name}/{e}"] = measure_call_overhead(ctx, states[e])
    for e in list(ctxs):
        for s in states[e].values():
            s.close()
        ctxs[e].close()
    return rows


def measure_call_overhead(ctx, state: dict, n: int = 2000) -> dict:  # noqa: ANN001
    """What the Python layer costs per generated token: filling a 1-token batch and one
    native call that does no work (llama_n_ctx through ctypes, ctx.n_ctx through PyO3)."""
    batch = state["batch"]
    t0 = time.perf_counter()
    for i in range(n):
        batch.fill_one(1, i % 64, 0, True)
    fill = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        ctx.trivial_call()
    call = (time.perf_counter() - t0) / n
    return {"fill_1_token_batch": fill * 1e6, "native_call": call * 1e6}


def finite_or_none(x: float):  # noqa: ANN201 - JSON has no NaN
    return x if math.isfinite(x) else None


def fmt_ratio(num: B.Samples, den: B.Samples) -> str:
    med, sd = B.paired_ratio(num, den)
    return "n/a" if math.isnan(med) else f"{med:.2f} ± {sd:.2f}"


def report(rows: list[Row], engines: list[str], info: dict, args) -> str:  # noqa: ANN001
    header = ["model", "test"] + [f"{e} t/s" for e in engines]
    if set(engines) == set(ENGINE_ORDER):
        header.append("ferrollama / llama.cpp")
    body = []
    for r in rows:
        line = [r.model, r.test] + [r.samples[e].cell() for e in engines]
        if set(engines) == set(ENGINE_ORDER):
            line.append(fmt_ratio(r.samples["ferrollama"], r.samples["llama.cpp"]))
        body.append(line)
    out = [B.markdown_table(header, body), ""]
    out.append(f"median ± stdev over {args.reps} reps (warm-up not counted), {args.threads} threads, nice {info.get('nice', 0)}; "
               "ratio: median of the per-rep ratios of back-to-back runs.")
    scal = []
    for i, r in enumerate(rows):
        if r.test.endswith(" seq)") and not r.test.endswith("(1 seq)") and i + 1 < len(rows):
            one = rows[i + 1]
            for e in engines:
                med, _ = B.paired_ratio(r.samples[e], one.samples[e])
                if not math.isnan(med):
                    scal.append(f"{r.model} {e}: {med:.2f}x")
    if scal:
        out.append("batched scaling (P-seq t/s / 1-seq t/s): " + "; ".join(scal))
    if info.get("call_overhead_us"):
        parts = [f"{k}: fill {v['fill_1_token_batch']:.2f} µs + call {v['native_call']:.2f} µs"
                 for k, v in info["call_overhead_us"].items()]
        out.append("per-token Python overhead (tg): " + "; ".join(parts))
    if info.get("foreign_load_cores"):
        worst = max(info["foreign_load_cores"].values())
        out.append("CPU used by other processes during the reps (cores, per test): " + ", ".join(
            f"{k} {v:.2f}" for k, v in info["foreign_load_cores"].items())
            + ("" if worst < 0.2 else "  <- NOT a quiet machine: absolute numbers are unreliable"))
    if info.get("flash_attn"):
        out.append("llama.cpp flash attention (AUTO resolved to): " + ", ".join(
            f"{k.split('/')[0]} {v}" for k, v in info["flash_attn"].items() if k.endswith("llama.cpp")))
    return "\n".join(out)


def main(argv=None) -> int:  # noqa: ANN001
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(B.MODELS), help="comma separated: " + ", ".join(B.MODELS))
    ap.add_argument("--model-dir", default=None, help="directory holding the GGUF files (else ferrollama.models.fetch)")
    ap.add_argument("--reps", type=int, default=5, help="counted reps per engine (default 5)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tests", default="pp512,tg128,batch8")
    ap.add_argument("--engines", default="llama.cpp,ferrollama")
    ap.add_argument("--batch-pp", type=int, default=128, help="prompt tokens per sequence for batchP")
    ap.add_argument("--batch-tg", type=int, default=128, help="decode steps for batchP")
    ap.add_argument("--batch-prompt", choices=["per-seq", "shared"], default="per-seq",
                    help="one prompt per sequence (batched-bench's default) or one shared prompt (-pps)")
    ap.add_argument("--kv-unified", action=argparse.BooleanOptionalAction, default=False,
                    help="one KV stream for all sequences (batched-bench's -kvu; default off, as there)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--prio", type=int, choices=[0, 1, 2, 3], default=0,
                    help="llama-bench's --prio: 0 normal, 1/2/3 nice -5/-10/-20 for this process and its threads")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                    help="before each test, wait up to SECONDS for other processes to go below 0.2 cores")
    ap.add_argument("--json", default=None, help="write every sample and the settings here")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)

    tests = parse_tests(args.tests, args)
    nice = B.set_priority(args.prio)
    engines, missing = B.open_engines([e.strip() for e in args.engines.split(",") if e.strip()])
    if not engines:
        raise SystemExit("no engine available: " + "; ".join(missing.values()))
    engine_names = [e.name for e in engines]
    models = B.resolve_models(args.models, args.model_dir)
    info = {"machine": B.machine_info(), "engines": {e.name: e.version for e in engines},
            "missing_engines": missing, "system_info": {e.name: e.system_info() for e in engines}, "nice": nice}

    rows: list[Row] = []
    for short, path in models:
        loaded = {}
        for e in engines:
            try:
                loaded[e.name] = e.load(path)
            except Exception as exc:  # noqa: BLE001
                print(f"{e.name}: cannot load {path.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        bos = {n: (m.add_bos, m.bos) for n, m in loaded.items()}
        if len(set(bos.values())) > 1:
            print(f"warning: the engines disagree on BOS for {short}: {bos}", file=sys.stderr)
        for test in tests:
            print(f"{short}: {test.name} ...", file=sys.stderr)
            rows += run_test(test, loaded, args, short, info)
        for m in loaded.values():
            m.close()
    info["machine"]["loadavg_end"] = os.getloadavg()

    text = report(rows, engine_names, info, args)
    print(text)
    if args.json:
        doc = {"settings": {k: v for k, v in vars(args).items() if k != "json"}, "info": info,
               "results": [{"model": r.model, "test": r.test,
                            "engines": {e: s.as_dict() for e, s in r.samples.items()},
                            "ratio_ferrollama_over_llama_cpp": finite_or_none(
                                B.paired_ratio(r.samples["ferrollama"], r.samples["llama.cpp"])[0])
                            if set(r.samples) >= set(ENGINE_ORDER) else None} for r in rows],
               "markdown": text}
        Path(args.json).write_text(json.dumps(doc, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
