"""Several sequences decoded in one batch (llama.cpp's llama-batched).

The prompt is decoded once with every sequence id on its tokens; then each step puts one token of
every unfinished sequence in a single batch. Each sequence samples with its own seed.

    python examples/batched.py [-m MODEL] [-p PROMPT] [-np SEQUENCES] [-n TOKENS]
"""
import argparse

import ferrollama as fl
from ferrollama import samplers as S


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", default=None, help="a GGUF model (default: Qwen2.5-Coder-0.5B-Instruct)")
    ap.add_argument("-p", "--prompt", default="Hello my name is")
    ap.add_argument("-np", "--n-parallel", type=int, default=4)
    ap.add_argument("-n", "--n-predict", type=int, default=32, help="length of each sequence, prompt included")
    ap.add_argument("-s", "--seed", type=int, default=1234)
    args = ap.parse_args()

    from ferrollama.models import default_model_path

    model = fl.Model(args.model or str(default_model_path()))
    tokens = model.tokenize(args.prompt, add_special=True, parse_special=True)
    n_seq = args.n_parallel
    ctx = fl.Context(model, n_ctx=len(tokens) + (args.n_predict - len(tokens)) * n_seq + 1,
                     n_batch=max(len(tokens), n_seq), n_seq_max=n_seq)
    chains = [S.Chain([S.TopK(40), S.TopP(0.9, min_keep=1), S.Temp(0.4), S.Dist(seed=args.seed + i)])
              for i in range(n_seq)]

    batch = fl.Batch(n_tokens_max=max(len(tokens), n_seq), n_seq_max=n_seq)
    for pos, t in enumerate(tokens):
        batch.add(t, pos, seq_ids=list(range(n_seq)), logits=pos == len(tokens) - 1)
    ctx.decode(batch)

    texts = [b""] * n_seq
    i_batch = [len(tokens) - 1] * n_seq          # where each sequence's logits are in the last batch
    n_cur = len(tokens)
    while n_cur < args.n_predict:
        batch.clear()
        for i in range(n_seq):
            if i_batch[i] < 0:
                continue
            token = chains[i].sample(ctx, i_batch[i])
            if model.is_eog(token):
                i_batch[i] = -1                      # this sequence is done
                continue
            texts[i] += model.token_to_piece(token)
            i_batch[i] = len(batch)
            batch.add(token, n_cur, seq_ids=(i,), logits=True)
        if len(batch) == 0:
            break
        n_cur += 1
        ctx.decode(batch)

    for i, text in enumerate(texts):
        print(f"sequence {i}: {args.prompt}{text.decode('utf-8', errors='replace')}")


if __name__ == "__main__":
    main()
