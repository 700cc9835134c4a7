"""Records llama.cpp's C API through llama-cpp-python 0.3.36 (the .bench-venv's) on the default
model, for tests/test_llama_cpp_c_api.py: the vocabulary (special ids, every token's piece and
attributes, as sha256 digests), tokenizing, and the greedy next token (and the five best with
their logits) at each position of a decoded batch. Writes tests/data/fixtures/llama_cpp_c_api.json.

    /work/main/.bench-venv/bin/python benches/record_llama_cpp_c_api.py
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
from pathlib import Path

import llama_cpp as L
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "fixtures" / "llama_cpp_c_api.json"
MODEL = Path(os.environ.get("FERROLLAMA_CACHE", Path.home() / ".cache" / "ferrollama")) / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
#: texts tokenized with each (add_special, parse_special)
TEXTS = ["Hello world!", " leading space", "<|im_start|>user\nHi<|im_end|>", "Hello world! こんにちは世界！ wave 👋", ""]
#: the prompt decoded with logits at every position
PROMPT = "The capital of France is Paris, and the capital of Italy is"
SPECIAL_GETTERS = ("bos", "eos", "eot", "sep", "nl", "pad", "fim_pre", "fim_suf", "fim_mid")


def pieces_digest(vocab, n: int, special: bool, lstrip: int) -> str:
    buf = ctypes.create_string_buffer(256)
    h = hashlib.sha256()
    for t in range(n):
        k = L.llama_token_to_piece(vocab, t, buf, 256, lstrip, special)
        h.update(k.to_bytes(4, "little", signed=True) + bytes(buf[:max(k, 0)]))
    return h.hexdigest()


def tokenize(vocab, text: str, add_special: bool, parse_special: bool) -> list[int]:
    data = text.encode()
    out = (L.llama_token * 64)()
    n = L.llama_tokenize(vocab, data, len(data), out, 64, add_special, parse_special)
    return list(out[:n])


def detokenize(vocab, tokens: list[int], remove_special: bool, unparse_special: bool, size: int = 512) -> tuple[int, str]:
    """llama_detokenize's return and the bytes it wrote (hex)."""
    array = (L.llama_token * max(len(tokens), 1))(*tokens)
    text = ctypes.create_string_buffer(size)
    n = L.llama_detokenize(vocab, array, len(tokens), text, size, remove_special, unparse_special)
    return n, text.raw[:max(n, 0)].hex()


def detokenize_cases(vocab) -> dict:
    """Each text's tokens (special ones parsed, and with the end-of-text token appended), the first
    tokens of the emoji text (a piece ending inside a character), with each pair of flags."""
    eos = L.llama_vocab_eos(vocab)
    sequences = {text: tokenize(vocab, text, True, True) for text in TEXTS}
    sequences["with eos"] = tokenize(vocab, "<|im_start|>user\nHi", True, True) + [eos]
    sequences["cut emoji"] = tokenize(vocab, "wave 👋", False, False)[:-1]
    return {f"{remove},{unparse},{name}": [tokens, *detokenize(vocab, tokens, remove, unparse)]
            for name, tokens in sequences.items() for remove in (False, True) for unparse in (False, True)}


def main() -> None:
    llm = L.Llama(str(MODEL), n_ctx=256, n_threads=2, verbose=False)
    vocab = L.llama_model_get_vocab(llm.model)
    n = L.llama_vocab_n_tokens(vocab)
    too_small = ctypes.create_string_buffer(2)
    record = {
        "recorded_with": f"llama-cpp-python {L.__version__}",
        "n_tokens": n, "vocab_type": L.llama_vocab_type(vocab),
        "special": {g: getattr(L, f"llama_vocab_{g}")(vocab) for g in SPECIAL_GETTERS},
        "add_bos": L.llama_vocab_get_add_bos(vocab), "add_eos": L.llama_vocab_get_add_eos(vocab),
        "pieces": {f"special={s},lstrip={k}": pieces_digest(vocab, n, s, k) for s in (False, True) for k in (0, 1)},
        "attrs": hashlib.sha256(np.array([L.llama_token_get_attr(vocab, t) for t in range(n)], "<i4").tobytes()).hexdigest(),
        "piece_too_small": L.llama_token_to_piece(vocab, tokenize(vocab, "Hello", False, False)[0], too_small, 2, 0, False),
        "tokenize": {f"{add},{parse},{text}": tokenize(vocab, text, add, parse)
                     for text in TEXTS for add in (False, True) for parse in (False, True)},
        "tokenize_too_small": L.llama_tokenize(vocab, b"Hello world!", 12, (L.llama_token * 1)(), 1, False, False),
        "detokenize": detokenize_cases(vocab),
        "detokenize_too_small": detokenize(vocab, tokenize(vocab, "Hello world!", False, False), False, False, 3)[0],
    }
    prompt = llm.tokenize(PROMPT.encode(), add_bos=False)
    batch = L.llama_batch_init(len(prompt), 0, 1)
    batch.n_tokens = len(prompt)
    for i, t in enumerate(prompt):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, True
        batch.seq_id[i][0] = 0
    assert L.llama_decode(llm.ctx, batch) == 0
    logits = np.ctypeslib.as_array(L.llama_get_logits(llm.ctx), shape=(len(prompt), n))
    record["prompt"] = prompt
    record["greedy_next"] = [int(i) for i in logits.argmax(axis=1)]
    # each position's five best tokens and their logits: a near-tie shows there
    top = np.argsort(-logits, axis=1)[:, :5]
    record["top5"] = [[[int(t), float(row[t])] for t in ids] for row, ids in zip(logits, top)]
    L.llama_batch_free(batch)
    FIXTURE.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record)[:800])


if __name__ == "__main__":
    main()
