#!/usr/bin/env python3
"""Records llama.cpp's embeddings of the tiny encoders (tests/data/make_tiny_bert.py) into
tests/data/fixtures/bert_embeddings.json: for each model and text, llama.cpp's tokens
(add_special, i.e. [CLS] ... [SEP]) and the pooled embedding of the sequence with mean and
with CLS pooling (llama_get_embeddings_seq, not normalized), and one batch of all the texts
on separate sequences (mean pooling). llama-cpp-python 0.3.36's low-level API, 2 threads.

  /path/to/bench-venv/bin/python benches/record_bert.py
"""
from __future__ import annotations

import ctypes
import json
from pathlib import Path

import llama_cpp as L

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
TEXTS = ["The capital of France is Paris.", "A small dog runs in the park", "hello world",
         "Embeddings of sentences: unknown words like zyxwvut become pieces."]
POOLING = {"mean": 1, "cls": 2}


@L.llama_log_callback
def _quiet(level, text, user_data):  # noqa: ANN001
    pass


def tokenize(vocab, text: str) -> list[int]:
    buf = (L.llama_token * 512)()
    n = L.llama_tokenize(vocab, text.encode(), len(text.encode()), buf, 512, True, False)
    return list(buf[:n])


def embed(model, seqs: list[list[int]], pooling: int, n_embd: int) -> list[list[float]]:
    p = L.llama_context_default_params()
    p.n_ctx = p.n_batch = p.n_ubatch = 128
    p.n_seq_max = len(seqs)
    p.n_threads = p.n_threads_batch = 2
    p.embeddings = True
    p.pooling_type = pooling
    p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(model, p)
    n = sum(map(len, seqs))
    batch = L.llama_batch_init(n, 0, 1)
    i = 0
    for s, toks in enumerate(seqs):
        for pos, t in enumerate(toks):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, pos, 1, True
            batch.seq_id[i][0] = s
            i += 1
    batch.n_tokens = n
    assert L.llama_decode(ctx, batch) == 0
    out = []
    for s in range(len(seqs)):
        ptr = ctypes.cast(L.llama_get_embeddings_seq(ctx, s), ctypes.POINTER(ctypes.c_float))
        out.append([round(float(ptr[k]), 7) for k in range(n_embd)])
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    return out


def main() -> None:
    L.llama_backend_init()
    L.llama_log_set(_quiet, None)
    records = []
    for name in ("tiny-bert-f32.gguf", "tiny-nomic-bert-f32.gguf"):
        mp = L.llama_model_default_params()
        model = L.llama_model_load_from_file(str(DATA / "models" / name).encode(), mp)
        vocab = L.llama_model_get_vocab(model)
        n_embd = L.llama_model_n_embd(model)
        tokens = [tokenize(vocab, t) for t in TEXTS]
        rec = {"model": name, "texts": TEXTS, "tokens": tokens}
        for pname, ptype in POOLING.items():
            rec[pname] = [embed(model, [t], ptype, n_embd)[0] for t in tokens]
        rec["batch_mean"] = embed(model, tokens, POOLING["mean"], n_embd)
        records.append(rec)
        L.llama_model_free(model)
    out = DATA / "fixtures" / "bert_embeddings.json"
    out.write_text(json.dumps({"recorded_with": f"llama-cpp-python {L.__version__}, CPU, 2 threads", "records": records}))
    print("wrote", out)


if __name__ == "__main__":
    main()
