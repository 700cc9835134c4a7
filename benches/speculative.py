#!/usr/bin/env python3
"""Speculative decoding on a code-editing chat: Qwen2.5-Coder-0.5B-Instruct repeats a 40-line
function with one name changed, 200 tokens, greedy. Plain decoding and prompt lookup, in
ferrollama and in llama-cpp-python (its LlamaPromptLookupDecoding), alternating rep by rep in
this one process. Generation speed is timed from the first streamed token to the last, so
the prompt (the same in every run) does not count; the acceptance rate and whether each text
equals plain greedy decoding's are printed.

With --draft-model PATH it also measures draft-model speculation; with --zero-acceptance it
measures the cost of drafting and verifying when nothing is accepted: a draft model that
shares the vocabulary but agrees with nothing (a 2-layer random model written by
tests/data/make_tiny_archs.py's writer with the target's vocabulary size), against plain
decoding.

  /path/to/bench-venv/bin/python benches/speculative.py [--reps 3] [--json out.json]
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

MODEL = "qwen2.5-coder-0.5b"
MAX_TOKENS = 200

FUNCTION = '''def summarize_orders(orders, min_total=0.0):
    """Totals, counts and averages of orders per customer."""
    summary = {}
    for order in orders:
        customer = order.get("customer")
        if customer is None:
            continue
        total = 0.0
        for item in order.get("items", []):
            price = float(item.get("price", 0))
            quantity = int(item.get("quantity", 1))
            if quantity <= 0:
                continue
            total += price * quantity
        if total < min_total:
            continue
        entry = summary.setdefault(customer, {"count": 0, "total": 0.0})
        entry["count"] += 1
        entry["total"] += total
    for customer, entry in summary.items():
        if entry["count"]:
            entry["average"] = entry["total"] / entry["count"]
        else:
            entry["average"] = 0.0
    ranked = sorted(summary.items(), key=lambda kv: kv[1]["total"], reverse=True)
    result = []
    for rank, (customer, entry) in enumerate(ranked, start=1):
        result.append({
            "rank": rank,
            "customer": customer,
            "orders": entry["count"],
            "total": round(entry["total"], 2),
            "average": round(entry["average"], 2),
        })
    return result
'''
MESSAGES = [
    {"role": "system", "content": "You are a coding assistant. Reply with the code only, in one Python code block."},
    {"role": "user", "content": "Rename the local variable `summary` to `per_customer` in this function and "
                                "return the whole function:\n\n```python\n" + FUNCTION + "```"},
]


def timed_stream(chunks) -> tuple[str, int, float]:  # noqa: ANN001
    """The text, the number of streamed content chunks, and the seconds from the first to the last."""
    parts, t_first, t_last = [], None, None
    for ch in chunks:
        delta = ch["choices"][0].get("delta", {}).get("content")
        if delta:
            parts.append(delta)
            t_last = time.perf_counter()
            t_first = t_first or t_last
    return "".join(parts), len(parts), (t_last - t_first) if t_first else 0.0


def run_ferrollama(path: Path, drafter) -> dict:  # noqa: ANN001
    import ferrollama as fl
    llm = fl.Llama(str(path), n_ctx=2048, n_threads=2, draft_model=drafter)
    text, n, secs = timed_stream(llm.create_chat_completion(MESSAGES, max_tokens=MAX_TOKENS, temperature=0.0, stream=True))
    s = llm.speculative_stats
    return {"text": text, "tokens": n, "seconds": secs, "drafted": s.n_drafted, "accepted": s.n_accepted}


def run_llama_cpp(path: Path, lookup: bool) -> dict:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    # logits_all: llama-cpp-python's speculative path writes every verified row into its score
    # array, which without it holds n_batch rows only (a broadcast error mid-generation).
    llm = llama_cpp.Llama(str(path), n_ctx=2048, n_threads=2, n_threads_batch=2, verbose=False, logits_all=lookup,
                          draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10) if lookup else None)
    text, n, secs = timed_stream(llm.create_chat_completion(MESSAGES, max_tokens=MAX_TOKENS, temperature=0.0, stream=True))
    return {"text": text, "tokens": n, "seconds": secs}


def zero_acceptance_draft(target: Path, out_dir: Path) -> Path:
    """A 2-layer random draft model with the target's vocabulary (its tokenizer copied)."""
    import gguf
    import numpy as np
    path = out_dir / "random-draft-2l.gguf"
    if path.exists():
        return path
    r = gguf.GGUFReader(str(target))
    n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(str(path), "qwen2")
    for key in ("context_length", "embedding_length", "block_count", "feed_forward_length",
                "attention.head_count", "attention.head_count_kv"):
        w.add_uint32(f"qwen2.{key}", {"context_length": 4096, "embedding_length": 256, "block_count": 2,
                                      "feed_forward_length": 512, "attention.head_count": 4,
                                      "attention.head_count_kv": 2}[key])
    w.add_float32("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32("qwen2.rope.freq_base", 1000000.0)
    for name, field in r.fields.items():
        if name.startswith("tokenizer.") and name != "tokenizer.chat_template":
            value = field.contents()
            kind = field.types[0]
            if kind == gguf.GGUFValueType.ARRAY:
                w.add_array(name, value)
            elif kind == gguf.GGUFValueType.STRING:
                w.add_string(name, value)
            elif kind == gguf.GGUFValueType.BOOL:
                w.add_bool(name, value)
            else:
                w.add_uint32(name, value)
    rng = np.random.default_rng(3)
    mat = lambda name, rows, cols, std: w.add_tensor(name, (rng.standard_normal((rows, cols)) * std).astype(np.float16))  # noqa: E731
    ones = lambda name, n: w.add_tensor(name, np.ones(n, dtype=np.float32))  # noqa: E731
    mat("token_embd.weight", n_vocab, 256, 1.0)
    ones("output_norm.weight", 256)
    for il in range(2):
        p = f"blk.{il}."
        ones(p + "attn_norm.weight", 256)
        ones(p + "ffn_norm.weight", 256)
        mat(p + "attn_q.weight", 256, 256, 0.06)
        mat(p + "attn_k.weight", 128, 256, 0.06)
        mat(p + "attn_v.weight", 128, 256, 0.06)
        mat(p + "attn_output.weight", 256, 256, 0.06)
        mat(p + "ffn_gate.weight", 512, 256, 0.06)
        mat(p + "ffn_up.weight", 512, 256, 0.06)
        mat(p + "ffn_down.weight", 256, 512, 0.06)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lookup", type=int, default=16, help="ferrollama's draft length (default 16)")
    ap.add_argument("--zero-acceptance", action="store_true", help="also measure a draft model that is never right")
    ap.add_argument("--zero-acceptance-only", action="store_true",
                    help="only ferrollama plain and the never-right draft model (no llama-cpp-python needed)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import ferrollama as fl
    path = B.model_path(MODEL, None)
    runs = {
        "ferrollama plain": lambda: run_ferrollama(path, None),
        "ferrollama lookup": lambda: run_ferrollama(path, fl.PromptLookupDecoding(max_ngram_size=3, num_pred_tokens=args.lookup)),
        "llama-cpp-python plain": lambda: run_llama_cpp(path, False),
        "llama-cpp-python lookup": lambda: run_llama_cpp(path, True),
    }
    if args.zero_acceptance_only:
        args.zero_acceptance = True
        runs = {"ferrollama plain": runs["ferrollama plain"]}
    if args.zero_acceptance:
        draft = zero_acceptance_draft(path, Path(path).parent)
        runs["ferrollama draft model (never right)"] = lambda: run_ferrollama(
            path, fl.DraftModel(str(draft), draft_max=4, draft_p_min=0.0, n_ctx=2048, n_threads=2))
    results: dict[str, list[dict]] = {k: [] for k in runs}
    names = list(runs)
    for rep in range(args.reps + 1):  # rep 0 warms up
        order = names if rep % 2 == 0 else names[::-1]
        for name in order:
            r = runs[name]()
            if rep:
                results[name].append(r)
            print(f"rep {rep} {name}: {r['tokens']} tokens, {r['tokens'] / r['seconds']:.1f} t/s", file=sys.stderr)
    plain_text = results["ferrollama plain"][0]["text"]
    if args.zero_acceptance_only:
        return _zero_acceptance_report(results, plain_text, args)
    rows = []
    for name, rs in results.items():
        tps = [r["tokens"] / r["seconds"] for r in rs]
        acc = (f"{100 * sum(r['accepted'] for r in rs) / max(1, sum(r['drafted'] for r in rs)):.1f}%"
               if "drafted" in rs[0] and rs[0]["drafted"] else "")
        same = "yes" if all(r["text"] == (plain_text if name.startswith("ferrollama") else results["llama-cpp-python plain"][0]["text"]) for r in rs) else "NO"
        rows.append([name, f"{statistics.median(tps):.1f}", f"{min(tps):.1f}-{max(tps):.1f}", acc, same])
    print(B.markdown_table(["run", "t/s (median)", "range", "draft acceptance", "text = plain greedy"], rows))

    def ratio(a: str, b: str) -> float:
        return statistics.median(x["tokens"] / x["seconds"] / (y["tokens"] / y["seconds"]) for x, y in zip(results[a], results[b]))
    print(f"\nferrollama lookup / ferrollama plain: {ratio('ferrollama lookup', 'ferrollama plain'):.2f}x")
    print(f"ferrollama lookup / llama-cpp-python lookup: {ratio('ferrollama lookup', 'llama-cpp-python lookup'):.2f}x")
    print(f"llama-cpp-python lookup / llama-cpp-python plain: {ratio('llama-cpp-python lookup', 'llama-cpp-python plain'):.2f}x")
    if args.zero_acceptance:
        print(f"draft model never right / plain: {ratio('ferrollama draft model (never right)', 'ferrollama plain'):.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": B.machine_info(), "results": results}, indent=1))
    return 0


def _zero_acceptance_report(results: dict, plain_text: str, args: argparse.Namespace) -> int:
    plain, draft = results["ferrollama plain"], results["ferrollama draft model (never right)"]
    ratios = [d["tokens"] / d["seconds"] / (p["tokens"] / p["seconds"]) for d, p in zip(draft, plain)]
    print(f"plain: {statistics.median(p['tokens'] / p['seconds'] for p in plain):.1f} t/s; never-right draft model: "
          f"{statistics.median(d['tokens'] / d['seconds'] for d in draft):.1f} t/s; ratio per rep "
          f"{', '.join(f'{r:.3f}' for r in ratios)} (median {statistics.median(ratios):.3f}); drafted "
          f"{sum(d['drafted'] for d in draft)}, accepted {sum(d['accepted'] for d in draft)}; "
          f"same text: {all(d['text'] == plain_text for d in draft)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": B.machine_info(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
