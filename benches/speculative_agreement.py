#!/usr/bin/env python3
"""How often speculative decoding's greedy text differs from plain greedy decoding's: the
verification batches of 8 tokens or more take the tiled products (as llama.cpp's do), whose
sums round differently from one-token decodes, so a near-tie can go the other way. For each
prompt (the first 400 characters of each of tests/data/texts/ and a few chat prompts), 128
greedy tokens plain, with prompt lookup (drafts of up to 16) and with the target as its own
draft model (drafts of up to 12); prints the prompts whose texts differ and where.

  python benches/speculative_agreement.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import ferrollama as fl
from ferrollama.models import fetch

REPO = Path(__file__).resolve().parent.parent
N_TOKENS = 128


def prompts() -> list[str]:
    texts = [p.read_text()[:400] for p in sorted((REPO / "tests" / "data" / "texts").glob("*"))]
    return texts + ["def quicksort(items):\n", "Write a haiku about the sea.\n\n", "The three laws of motion are"]


def run(path: str, prompt: str, drafter) -> tuple[list[int], fl.Llama]:  # noqa: ANN001
    llm = fl.Llama(path, n_ctx=1024, draft_model=drafter)
    tokens = llm.tokenize(prompt, add_bos=True, special=False)
    out = []
    for t in llm.generate(tokens, temp=0.0):
        if llm.model.is_eog(t) or len(out) == N_TOKENS:
            break
        out.append(t)
    return out, llm


def gap_at(path: str, prompt: str, plain: list[int], k: int) -> tuple[float, float]:
    """Plain decoding's logits at the first differing token k: the gap between its top two
    logits, and the rank-2 logit's distance below the top in log-probability."""
    llm = fl.Llama(path, n_ctx=1024)
    tokens = llm.tokenize(prompt, add_bos=True, special=False) + plain[:k]
    llm.eval(tokens)
    logits = llm.ctx.logits(-1).astype(np.float64)
    top2 = np.sort(logits)[-2:]
    return float(top2[1] - top2[0]), float(np.log(np.exp(logits - logits.max()).sum()))


def main() -> int:
    path = str(fetch("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    differ = 0
    rows = prompts()
    for i, prompt in enumerate(rows):
        plain, _ = run(path, prompt, None)
        for name, drafter in (("lookup16", fl.PromptLookupDecoding(max_ngram_size=3, num_pred_tokens=16)),
                              ("self-draft12", fl.DraftModel(path, draft_max=12, draft_p_min=0.0, n_ctx=1024))):
            got, llm = run(path, prompt, drafter)
            same = got == plain
            first = next((k for k, (a, b) in enumerate(zip(got, plain)) if a != b), None)
            differ += not same
            where = "same"
            if not same:
                gap, _ = gap_at(path, prompt, plain, first)
                where = f"DIFFERS at token {first}: plain decoding's top two logits there are {gap:.4f} apart"
            print(f"prompt {i} {name}: {where} (accepted {llm.speculative_stats.n_accepted}/{llm.speculative_stats.n_drafted})")
    print(f"{differ} of {2 * len(rows)} texts differ from plain greedy decoding")
    return 0


if __name__ == "__main__":
    sys.exit(main())
