"""ferrollama.llama_cpp: llama-cpp-python's low-level module (llama.cpp's C API) over the engine,
against llama.cpp's answers through llama-cpp-python 0.3.36 (benches/record_llama_cpp_c_api.py)."""
from __future__ import annotations

import ctypes
import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import ferrollama
from ferrollama import llama_cpp as L

RECORD = json.loads((Path(__file__).parent / "data" / "fixtures" / "llama_cpp_c_api.json").read_text())
SPECIAL_GETTERS = ("bos", "eos", "eot", "sep", "nl", "pad", "fim_pre", "fim_suf", "fim_mid")


@pytest.fixture(scope="module")
def llm():
    return ferrollama.Llama(str(ferrollama.default_model_path()), n_ctx=256, verbose=False)


@pytest.fixture(scope="module")
def vocab(llm):
    return L.llama_model_get_vocab(llm.model)


def pieces_digest(vocab, n: int, special: bool, lstrip: int) -> str:
    buf = ctypes.create_string_buffer(256)
    h = hashlib.sha256()
    for t in range(n):
        k = L.llama_token_to_piece(vocab, t, buf, 256, lstrip, special)
        h.update(k.to_bytes(4, "little", signed=True) + bytes(buf[:max(k, 0)]))
    return h.hexdigest()


def tokenize_with(function, vocab, text: str, add_special: bool, parse_special: bool) -> list[int]:
    data = text.encode()
    out = (L.llama_token * 64)()
    n = function(vocab, data, len(data), out, 64, add_special, parse_special)
    return list(out[:n])


def test_the_vocabulary_is_llama_cpps(vocab):
    n = L.llama_vocab_n_tokens(vocab)
    assert n == L.llama_n_vocab(vocab) == RECORD["n_tokens"]
    assert L.llama_vocab_type(vocab) == RECORD["vocab_type"]
    assert {g: getattr(L, f"llama_vocab_{g}")(vocab) for g in SPECIAL_GETTERS} == RECORD["special"]
    assert (L.llama_vocab_get_add_bos(vocab), L.llama_vocab_get_add_eos(vocab)) == (RECORD["add_bos"], RECORD["add_eos"])
    attrs = np.array([L.llama_token_get_attr(vocab, t) for t in range(n)], "<i4")
    assert hashlib.sha256(attrs.tobytes()).hexdigest() == RECORD["attrs"]
    assert attrs[RECORD["special"]["eos"]] & L.LLAMA_TOKEN_ATTR_CONTROL


def test_every_piece_is_llama_cpps(vocab):
    n = L.llama_vocab_n_tokens(vocab)
    assert {f"special={s},lstrip={k}": pieces_digest(vocab, n, s, k)
            for s in (False, True) for k in (0, 1)} == RECORD["pieces"]
    hello = tokenize_with(L.llama_tokenize, vocab, "Hello", False, False)[0]
    too_small = ctypes.create_string_buffer(2)
    assert L.llama_token_to_piece(vocab, hello, too_small, 2, 0, False) == RECORD["piece_too_small"]
    assert too_small.raw == b"\0\0"


def test_tokenizing_through_the_c_function_is_llama_cpps(llm, vocab):
    """The function llguidance calls by its address (llama_cpp._lib.llama_tokenize) tokenizes as
    llama.cpp and as ferrollama's Llama.tokenize."""
    c_function = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
                                  ctypes.POINTER(ctypes.c_int32), ctypes.c_int32, ctypes.c_bool, ctypes.c_bool)(
        ctypes.cast(L._lib.llama_tokenize, ctypes.c_void_p).value)
    for key, expected in RECORD["tokenize"].items():
        add, parse, text = key.split(",", 2)
        add, parse = add == "True", parse == "True"
        assert tokenize_with(c_function, vocab, text, add, parse) == expected, key
        assert tokenize_with(L.llama_tokenize, vocab, text, add, parse) == expected, key
        assert llm.tokenize(text.encode(), add_bos=add, special=parse) == expected, key
    one = (L.llama_token * 1)()
    assert L.llama_tokenize(vocab, b"Hello world!", 12, one, 1, False, False) == RECORD["tokenize_too_small"]


def test_detokenizing_is_llama_cpps(vocab):
    """llama_detokenize with each pair of flags (remove_special, unparse_special), on texts with
    special tokens, an end-of-text token and a piece that ends inside a character, writes
    llama.cpp's bytes; a buffer too small gets minus the length and nothing written."""
    for key, (tokens, expected_n, expected_hex) in RECORD["detokenize"].items():
        remove, unparse = (flag == "True" for flag in key.split(",", 2)[:2])
        array = (L.llama_token * max(len(tokens), 1))(*tokens)
        text = ctypes.create_string_buffer(512)
        n = L.llama_detokenize(vocab, array, len(tokens), text, 512, remove, unparse)
        assert (n, text.raw[:max(n, 0)].hex()) == (expected_n, expected_hex), key
    hello = tokenize_with(L.llama_tokenize, vocab, "Hello world!", False, False)
    small = ctypes.create_string_buffer(3)
    assert L.llama_detokenize(vocab, (L.llama_token * len(hello))(*hello), len(hello), small, 3, False, False) \
        == RECORD["detokenize_too_small"] == -len(b"Hello world!")
    assert small.raw == b"\0\0\0"


def test_the_c_function_from_threads_without_the_gil(vocab):
    """llguidance calls it from its own threads: ctypes releases the GIL around a foreign call."""
    expected = RECORD["tokenize"]["False,False,Hello world! こんにちは世界！ wave 👋"]
    results: list[list[int]] = []

    def work() -> None:
        for _ in range(200):
            results.append(tokenize_with(L._lib.llama_tokenize, vocab, "Hello world! こんにちは世界！ wave 👋", False, False))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 800 and all(r == expected for r in results)


def test_the_c_function_refuses_what_llama_cpp_cannot_answer():
    """A null vocabulary or a negative length: INT32_MIN (llama.cpp's failure), never a crash."""
    out = (L.llama_token * 4)()
    assert L._lib.llama_tokenize(None, b"x", 1, out, 4, False, False) == -2**31
    assert L._lib.llama_tokenize(1, b"x", -1, out, 4, False, False) == -2**31


def test_unknown_handles_are_refused(llm):
    with pytest.raises(ValueError, match="not a vocabulary"):
        L.llama_vocab_n_tokens(12345)
    with pytest.raises(TypeError, match="ferrollama.Model"):
        L.llama_model_get_vocab(llm)
    with pytest.raises(ValueError, match="out of range"):
        L.llama_token_to_piece(L.llama_model_get_vocab(llm.model), 10**7, ctypes.create_string_buffer(8), 8, 0, True)


def fill(batch, tokens: list[int], pos0: int = 0) -> None:
    """As guidance fills a batch."""
    batch.n_tokens = len(tokens)
    for j, t in enumerate(tokens):
        batch.token[j], batch.pos[j], batch.n_seq_id[j], batch.logits[j] = t, pos0 + j, 1, True
        batch.seq_id[j][0] = 0


#: top logits this close in llama.cpp are a near-tie (REFERENCE.md: quantized weights, max |Δlogit|)
NEAR_TIE = 0.35


def assert_greedy_as_llama_cpp(greedy: list[int]) -> None:
    """llama.cpp's greedy token at each position, or one of its five best within a near-tie of it."""
    assert len(greedy) == len(RECORD["greedy_next"])
    for pos, (mine, top5) in enumerate(zip(greedy, RECORD["top5"])):
        best, best_logit = top5[0]
        assert best == RECORD["greedy_next"][pos]
        theirs = dict(top5)
        assert mine == best or (mine in theirs and best_logit - theirs[mine] <= NEAR_TIE), (pos, mine, top5)


def test_a_batch_decoded_gives_llama_cpps_greedy_tokens(llm):
    """A llama_batch filled as guidance fills it, decoded with llama_decode: the logits rows seen
    through np.ctypeslib as llama.cpp's (the greedy token at each position), and equal to the
    engine's own decode of the same tokens."""
    prompt, n = RECORD["prompt"], RECORD["n_tokens"]
    batch = L.llama_batch_init(64, 0, 1)
    try:
        L.llama_memory_seq_rm(L.llama_get_memory(llm.ctx), -1, 0, -1)
        fill(batch, prompt)
        assert L.llama_decode(llm.ctx, batch) == 0
        logits = np.ctypeslib.as_array(L.llama_get_logits(llm.ctx), shape=(len(prompt), n)).copy()
        last = np.ctypeslib.as_array(L.llama_get_logits_ith(llm.ctx, -1), shape=(n,))
        assert_greedy_as_llama_cpp(logits.argmax(axis=1).tolist())
        assert np.array_equal(last, logits[-1])
        # the memory: drop the last two positions and decode them again, the same rows come back
        assert L.llama_memory_seq_pos_max(L.llama_get_memory(llm.ctx), 0) == len(prompt) - 1
        assert L.llama_memory_seq_rm(L.llama_get_memory(llm.ctx), -1, len(prompt) - 2, -1)
        fill(batch, prompt[-2:], len(prompt) - 2)
        assert L.llama_decode(llm.ctx, batch) == 0
        again = np.ctypeslib.as_array(L.llama_get_logits(llm.ctx), shape=(2, n))
        np.testing.assert_array_equal(again.argmax(axis=1), logits[-2:].argmax(axis=1))
        ctx = ferrollama.Context(llm.model, n_ctx=256)
        ctx.decode(ferrollama.Batch.from_tokens(prompt, logits="all"))
        np.testing.assert_array_equal(ctx.logits_all(), logits)
    finally:
        L.llama_batch_free(batch)


def test_a_bad_batch_is_refused_with_llama_cpps_code(llm):
    batch = L.llama_batch_init(4, 0, 1)
    try:
        fill(batch, [RECORD["n_tokens"] + 5])
        assert L.llama_decode(llm.ctx, batch) == -1
    finally:
        L.llama_batch_free(batch)


def test_the_alias_resolves_the_c_api_module():
    """After install_as_llama_cpp, llama_cpp.llama_cpp is this module and its names are at the top."""
    code = ("import ferrollama; ferrollama.install_as_llama_cpp()\n"
            "import llama_cpp, llama_cpp.llama_cpp as C\n"
            "assert C is ferrollama.llama_cpp and llama_cpp.llama_model_get_vocab is C.llama_model_get_vocab\n"
            "assert llama_cpp.LLAMA_TOKEN_ATTR_CONTROL == 8 and llama_cpp.llama_cpp._lib.llama_tokenize\n")
    subprocess.run([sys.executable, "-c", code], check=True)
