#!/usr/bin/env python3
"""What batch-invariant logits cost (issue 40): pp512 and tg of the real models with
``batch_invariant=True`` against the default (llama.cpp's arithmetic), alternating in one run,
and at a context depth. The ratio on/off is what the two engines' ratio against llama.cpp moves by.

    PYTHONPATH=python .venv/bin/python benches/batch_invariance_cost.py [--reps 3] [--depth 0 4096]
"""
from __future__ import annotations

import argparse
import statistics
import time

import ferrollama as fl
from ferrollama.models import default_model_path


def timed_run(model: fl.Model, invariant: bool, depth: int, n_prompt: int, n_gen: int, threads: int) -> tuple[float, float]:
    """(prompt tokens/s, generated tokens/s) of one run after `depth` tokens of context."""
    ctx = fl.Context(model, n_ctx=depth + n_prompt + n_gen + 16, n_batch=512, n_ubatch=512, n_threads=threads,
                     batch_invariant=invariant)
    vocab = model.n_vocab
    filler = [(17 + 31 * i) % (vocab - 200) + 100 for i in range(depth + n_prompt)]
    for start in range(0, depth, 512):
        ctx.decode(fl.Batch.from_tokens(filler[start:min(start + 512, depth)], pos0=start, seq_id=0, logits="none"))
    t0 = time.perf_counter()
    ctx.decode(fl.Batch.from_tokens(filler[depth:depth + n_prompt], pos0=depth, seq_id=0, logits="last"))
    t1 = time.perf_counter()
    tok = 100
    for i in range(n_gen):
        ctx.decode(fl.Batch.from_tokens([tok], pos0=depth + n_prompt + i, seq_id=0, logits="last"))
        tok = int(ctx.logits(-1).argmax())
    t2 = time.perf_counter()
    return n_prompt / (t1 - t0), n_gen / (t2 - t1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--depth", type=int, nargs="+", default=[0])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model = fl.Model(str(args.model or default_model_path()))
    print(f"{args.model or default_model_path()}: {model.arch}, {args.threads} threads")
    print("| depth | pp, default t/s | pp, invariant t/s | ratio | tg, default t/s | tg, invariant t/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for depth in args.depth:
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.reps):
            for invariant in (False, True):
                runs[invariant].append(timed_run(model, invariant, depth, args.prompt, args.gen, args.threads))
        med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in runs.items()}
        (pp0, tg0), (pp1, tg1) = med[False], med[True]
        print(f"| {depth} | {pp0:.1f} | {pp1:.1f} | {pp1 / pp0:.3f} | {tg0:.1f} | {tg1:.1f} | {tg1 / tg0:.3f} |", flush=True)


if __name__ == "__main__":
    main()
