"""``ferrollama embed``: embeddings of texts (llama-embedding).

Each prompt (the text split at --embd-separator, a newline by default) is decoded on its own
sequence with embeddings on; the pooled vector (mean by default) is normalized with
--embd-normalize (llama.cpp's common_embd_normalize) and printed; with several prompts the
cosine-similarity matrix follows. --embd-output-format json prints OpenAI's shape.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from .._core import Batch
from .common import (CLIError, add_context_args, add_model_args, int_value, load_model, make_context,
                     process_escapes, read_text_file)

POOLING = ("none", "mean", "cls", "last", "rank")
MODEL_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_context_args(p)
    g = p.add_argument_group("embeddings")
    g.add_argument("-p", "--prompt", default=None, help="the text(s), separated by --embd-separator")
    g.add_argument("-f", "--file", metavar="FNAME", default=None, help="a file holding the text(s)")
    g.add_argument("--pooling", choices=POOLING, default=None,
                   help="pooling of the token embeddings (default: the model's, else mean)")
    g.add_argument("--embd-normalize", type=int_value, default=2, metavar="N",
                   help="-1 none, 0 max absolute int16, 1 taxicab, 2 euclidean (default), >2 p-norm")
    g.add_argument("--embd-separator", default="\n", metavar="STRING", help="prompt separator (default: newline)")
    g.add_argument("--embd-output-format", choices=("", "array", "json", "json+"), default="",
                   help="'' text (default), 'array', 'json' (OpenAI), 'json+' (with the cosine similarities)")


def normalize(vec: np.ndarray, mode: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize."""
    x = vec.astype(np.float64)
    if mode == -1:
        total = 1.0
    elif mode == 0:
        total = float(np.abs(x).max(initial=0.0)) / 32760.0
    elif mode == 2:
        total = float(np.sqrt((x * x).sum()))
    else:
        total = float((np.abs(x) ** mode).sum() ** (1.0 / mode))
    return (x * (1.0 / total if total > 0 else 0.0)).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.prompt is not None and args.file is not None:
        raise CLIError("give -p or -f, not both")
    text = read_text_file(args.file, "text file") if args.file is not None else args.prompt
    if text is None:
        raise CLIError("give the text with -p or -f")
    sep = process_escapes(args.embd_separator)
    prompts = [p for p in process_escapes(text).split(sep) if p] if args.file is None else [p for p in text.split(sep) if p]
    if not prompts:
        raise CLIError("the text is empty")
    return prompts


def _pooling(args: argparse.Namespace, model) -> str:
    if args.pooling:
        return args.pooling
    kind = model.metadata.get(f"{model.arch}.pooling_type")
    return MODEL_POOLING.get(kind, "mean") if kind else "mean"


def embed_all(args: argparse.Namespace) -> tuple[list[str], list[np.ndarray]]:
    prompts = _prompts(args)
    model = load_model(args)
    pooling = _pooling(args, model)
    ctx = make_context(args, model, embeddings=True, pooling=pooling)
    vectors = []
    for text in prompts:
        tokens = list(model.tokenize(text, add_special=True, parse_special=True))
        if len(tokens) > ctx.n_batch:
            raise CLIError(f"a prompt has {len(tokens)} tokens, more than the batch size {ctx.n_batch}; raise -b and -ub")
        ctx.kv.clear()
        ctx.decode(Batch.from_tokens(tokens, pos0=0, seq_id=0, logits="all"))
        if pooling == "none":
            vectors += [normalize(np.asarray(ctx.embeddings(i)), args.embd_normalize) for i in range(len(tokens))]
        else:
            vectors.append(normalize(np.asarray(ctx.embeddings_seq(0)), args.embd_normalize))
    return prompts, vectors


def _print_text(prompts: list[str], vectors: list[np.ndarray], mode: int) -> None:
    fmt = (lambda v: f"{v:6.0f} ") if mode == 0 else (lambda v: f"{v:9.6f} ")
    for j, vec in enumerate(vectors):
        head = "".join(fmt(v) for v in vec[:3])
        tail = "".join(fmt(v) for v in vec[-3:])
        print(f"embedding {j}: {head} ... {tail}" if len(vec) > 6 else f"embedding {j}: " + "".join(fmt(v) for v in vec))
    if len(prompts) > 1 and len(prompts) == len(vectors):
        print("\ncosine similarity matrix:\n")
        print(" ".join(f"{p[:6]:>6}" for p in prompts))
        for i, a in enumerate(vectors):
            print(" ".join(f"{cosine(a, b):6.2f}" for b in vectors) + f" {prompts[i][:10]}")


def run(args: argparse.Namespace) -> int:
    prompts, vectors = embed_all(args)
    kind = args.embd_output_format
    if kind == "":
        _print_text(prompts, vectors, args.embd_normalize)
    elif kind == "array":
        print(json.dumps([v.tolist() for v in vectors]))
    else:
        out: dict = {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": v.tolist()}
                                               for i, v in enumerate(vectors)]}
        if kind == "json+" and len(vectors) > 1:
            out["cosineSimilarity"] = [[cosine(a, b) for b in vectors] for a in vectors]
        json.dump(out, sys.stdout, indent=1)
        print()
    return 0
