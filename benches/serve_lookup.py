#!/usr/bin/env python3
"""The server's per-slot prompt lookup (``ferrollama serve --lookup N``) on the code-editing chat
of benches/speculative.py: the scheduler serving 1 and 4 such requests at once, with and without
lookup drafts, alternating rep by rep; generated tokens per second of wall time, the acceptance
rate, and whether the texts equal plain decoding's.

  python benches/serve_lookup.py [--reps 3] [--lookup 16] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as B  # noqa: E402
from speculative import MAX_TOKENS, MESSAGES, MODEL  # noqa: E402

import ferrollama as fl  # noqa: E402
from ferrollama.chat import ChatTemplate  # noqa: E402
from ferrollama.llama import SamplingParams  # noqa: E402
from ferrollama.server import Request, Scheduler  # noqa: E402


def run(model: fl.Model, prompt: list[int], n_clients: int, lookup: int) -> dict:
    drafter = fl.PromptLookupDecoding(max_ngram_size=2, num_pred_tokens=lookup) if lookup else None
    with Scheduler(model, n_ctx=2048 * n_clients, n_seq=n_clients, n_threads=2, drafter=drafter) as sched:
        t0 = time.perf_counter()
        jobs = sched.submit_many([Request(prompt, SamplingParams(temp=0), MAX_TOKENS) for _ in range(n_clients)])
        texts = [j.result()[0] for j in jobs]
        seconds = time.perf_counter() - t0
        st = sched.stats
    return {"texts": texts, "tokens": st.generated_tokens, "seconds": seconds,
            "tok_per_s": st.generated_tokens / seconds, "drafted": st.drafted_tokens, "accepted": st.accepted_tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lookup", type=int, default=16)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model = fl.Model(str(B.model_path(MODEL, None)))
    prompt = ChatTemplate.from_model(model).tokens(model, MESSAGES)
    results: dict[str, list[dict]] = {}
    for _ in range(args.reps):
        for n in (1, 4):
            for lookup in (0, args.lookup):
                results.setdefault(f"{n} client(s), {'lookup' if lookup else 'plain'}", []).append(
                    run(model, prompt, n, lookup))
    print(f"{'run':28s} {'tok/s (median)':>15s} {'vs plain':>9s} {'accepted/drafted':>17s} same text")
    for name, reps in results.items():
        plain = results[name.replace("lookup", "plain")]
        speed = statistics.median(r["tok_per_s"] for r in reps)
        ratio = statistics.median(r["tok_per_s"] / p["tok_per_s"] for r, p in zip(reps, plain))
        same = all(r["texts"] == p["texts"] for r, p in zip(reps, plain))
        acc = f"{reps[0]['accepted']}/{reps[0]['drafted']}" if reps[0]["drafted"] else "-"
        print(f"{name:28s} {speed:15.1f} {ratio:8.2f}x {acc:>17s} {same}")
    if args.json:
        Path(args.json).write_text(json.dumps({k: [{kk: vv for kk, vv in r.items() if kk != 'texts'} for r in v]
                                               for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
