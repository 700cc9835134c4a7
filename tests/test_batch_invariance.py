"""Batch-invariant logits (issue 40): in a context made with ``batch_invariant=True`` a token
gets the same logits, bit for bit, however it is batched (micro-batch sizes, one token at a
time, among other sequences), on however many threads, and wherever its sequence's cells sit in
the cache (after other sequences' cells, after removals). Both real models, F16 and F32 caches.

The contrast cases show what the default (llama.cpp's arithmetic) does on the same inputs: its
products and attention change kernels with the micro-batch size, as llama.cpp's do."""
from __future__ import annotations

import numpy as np
import pytest

import ferrollama as fl

PROMPT = ("The quick brown fox jumps over the lazy dog. In the beginning the Universe was created. This has made "
          "a lot of people very angry and been widely regarded as a bad move. Far out in the uncharted backwaters "
          "of the unfashionable end of the western spiral arm of the Galaxy lies a small unregarded yellow sun.")


def tokens_of(model: fl.Model) -> list[int]:
    return model.tokenize(PROMPT, add_special=True)[:96]


def decode_all(model: fl.Model, tokens: list[int], *, n_ubatch: int, n_threads: int = 2, type_k: str = "f16",
               invariant: bool = True) -> np.ndarray:
    """Every token's logits of the prompt decoded in micro-batches of n_ubatch."""
    ctx = fl.Context(model, n_ctx=256, n_batch=512, n_ubatch=n_ubatch, n_threads=n_threads, type_k=type_k, type_v=type_k,
                     batch_invariant=invariant)
    ctx.decode(fl.Batch.from_tokens(tokens, pos0=0, seq_id=0, logits="all"))
    return ctx.logits_all().copy()


@pytest.fixture(scope="module", params=["qwen", "gemma"])
def model(request, qwen_model, gemma_model) -> fl.Model:
    return qwen_model if request.param == "qwen" else gemma_model


@pytest.mark.parametrize("type_k", ["f16", "f32"])
def test_logits_do_not_depend_on_the_micro_batch_size_or_threads(model, type_k):
    tokens = tokens_of(model)
    whole = decode_all(model, tokens, n_ubatch=512, type_k=type_k)
    for n_ubatch in (1, 3, 8, 64):
        np.testing.assert_array_equal(decode_all(model, tokens, n_ubatch=n_ubatch, type_k=type_k), whole,
                                      err_msg=f"n_ubatch {n_ubatch}")
    np.testing.assert_array_equal(decode_all(model, tokens, n_ubatch=512, n_threads=1, type_k=type_k), whole)


def test_one_token_after_the_batch_equals_the_batch(model):
    """The found case: decode the prompt, remove its last cell, decode that token alone."""
    tokens = tokens_of(model)
    ctx = fl.Context(model, n_ctx=256, batch_invariant=True)
    ctx.decode(fl.Batch.from_tokens(tokens, pos0=0, seq_id=0, logits="last"))
    batch_logits = ctx.logits(-1).copy()
    assert ctx.kv.seq_rm(0, len(tokens) - 1, -1)
    ctx.decode(fl.Batch.from_tokens(tokens[-1:], pos0=len(tokens) - 1, seq_id=0, logits="last"))
    np.testing.assert_array_equal(ctx.logits(-1), batch_logits)


@pytest.mark.parametrize("n_before", [1, 7, 43])
def test_logits_do_not_depend_on_where_the_cells_sit(model, n_before):
    """The prompt as sequence 1 after n_before cells of sequence 0, and after sequence 0's cells
    were removed and others reused, gives sequence 0's logits alone."""
    tokens = tokens_of(model)[:40]
    alone = fl.Context(model, n_ctx=256, batch_invariant=True)
    alone.decode(fl.Batch.from_tokens(tokens, pos0=0, seq_id=0, logits="all"))
    want = alone.logits_all().copy()
    ctx = fl.Context(model, n_ctx=256, n_seq_max=2, batch_invariant=True)
    other = model.tokenize("Once upon a time there was a model that ran on a CPU and it was fast enough.", add_special=True)
    ctx.decode(fl.Batch.from_tokens((other * 8)[:n_before], pos0=0, seq_id=0, logits="none"))
    ctx.decode(fl.Batch.from_tokens(tokens, pos0=0, seq_id=1, logits="all"))
    np.testing.assert_array_equal(ctx.logits_all(), want)
    # sequence 1's cells freed, sequence 0 grown into some of them, the prompt again one by one
    ctx.kv.seq_rm(1, -1, -1)
    ctx.decode(fl.Batch.from_tokens(other[:5], pos0=n_before, seq_id=0, logits="none"))
    for i, t in enumerate(tokens):
        ctx.decode(fl.Batch.from_tokens([t], pos0=i, seq_id=1, logits="last"))
        np.testing.assert_array_equal(ctx.logits(-1), want[i], err_msg=f"token {i}")


def test_the_default_arithmetic_is_llama_cpps_and_changes_with_the_batch(qwen_model):
    """Without the switch the logits follow llama.cpp's kernels, which change with the micro-batch
    size (what the records were made with): the switch is what makes them equal."""
    tokens = tokens_of(qwen_model)
    whole = decode_all(qwen_model, tokens, n_ubatch=512, invariant=False)
    single = decode_all(qwen_model, tokens, n_ubatch=1, invariant=False)
    assert np.abs(whole - single).max() > 0.01
