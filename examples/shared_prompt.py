"""A shared prompt decoded once and copied to several sequences with kv.seq_cp.

The common prefix goes into sequence 0; seq_cp shares its cells with sequences 1..N-1 (no
recomputation); each sequence then gets its own suffix, all suffixes decoded in one batch, and
continues greedily.

    python examples/shared_prompt.py [-m MODEL] [-n TOKENS] [--prefix TEXT] [SUFFIX ...]
"""
import argparse

import numpy as np

import ferrollama as fl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", default=None, help="a GGUF model (default: Qwen2.5-Coder-0.5B-Instruct)")
    ap.add_argument("-n", "--n-predict", type=int, default=16)
    ap.add_argument("--prefix", default="Here is a list of fruits and their colours.\n")
    ap.add_argument("suffixes", nargs="*", default=["Banana:", "Cherry:", "Lime:"])
    ap.add_argument("--type-k", default="f16")
    args = ap.parse_args()

    from ferrollama.models import default_model_path

    model = fl.Model(args.model or str(default_model_path()))
    prefix = model.tokenize(args.prefix, add_special=True, parse_special=False)
    suffixes = [model.tokenize(s, add_special=False, parse_special=False) for s in args.suffixes]
    n_seq = len(suffixes)
    longest = max(len(s) for s in suffixes)
    ctx = fl.Context(model, n_ctx=len(prefix) + n_seq * (longest + args.n_predict), n_seq_max=n_seq,
                     type_k=args.type_k, type_v=args.type_k)

    ctx.decode(fl.Batch.from_tokens(prefix, pos0=0, seq_id=0, logits="none"))
    for s in range(1, n_seq):
        ctx.kv.seq_cp(0, s)                      # share the prefix's cells, no recomputation

    batch = fl.Batch(n_tokens_max=sum(len(s) for s in suffixes) + n_seq, n_seq_max=1)
    last = []
    for s, suffix in enumerate(suffixes):
        for k, t in enumerate(suffix):
            batch.add(t, len(prefix) + k, seq_ids=(s,), logits=k == len(suffix) - 1)
        last.append(len(batch) - 1)
    ctx.decode(batch)

    outputs = [list() for _ in range(n_seq)]
    pos = [len(prefix) + len(s) for s in suffixes]
    for _ in range(args.n_predict):
        batch.clear()
        for s in range(n_seq):
            token = int(np.argmax(ctx.logits(last[s])))
            outputs[s].append(token)
            last[s] = len(batch)
            batch.add(token, pos[s], seq_ids=(s,), logits=True)
            pos[s] += 1
        ctx.decode(batch)

    for s in range(n_seq):
        print(f"{args.suffixes[s]}{model.detokenize(outputs[s])!r}")


if __name__ == "__main__":
    main()
