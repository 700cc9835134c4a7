"""Sentence embeddings with mean pooling, and their cosine similarities.

    python examples/embeddings.py [-m MODEL] [TEXT ...]
"""
import argparse

import numpy as np

from ferrollama.llama import Llama


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", default=None, help="a GGUF model (default: Qwen2.5-Coder-0.5B-Instruct)")
    ap.add_argument("texts", nargs="*", default=["The cat sat on the mat.", "A cat was sitting on a rug.",
                                                  "Stock markets fell sharply today."])
    args = ap.parse_args()

    llm = Llama(args.model, n_ctx=512, embedding=True, pooling="mean")
    vectors = np.asarray(llm.embed(args.texts, normalize=True))
    print(f"{len(vectors)} embeddings of {vectors.shape[1]} values")
    sims = vectors @ vectors.T
    for i, text in enumerate(args.texts):
        print(" ".join(f"{s:6.3f}" for s in sims[i]), " ", text)


if __name__ == "__main__":
    main()
