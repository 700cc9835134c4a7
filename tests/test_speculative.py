"""Speculative decoding (ferrollama.speculative): the target model's output, whatever drafts.

Greedy text with prompt lookup and with a draft model equals plain greedy decoding on the real
model; with sampling, the distribution of a verified token equals the target's (chi-square
over many seeds on a tiny model); the cache is left holding exactly the accepted tokens."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ferrollama as fl
from ferrollama.llama import SamplingParams
from ferrollama.speculative import PromptLookupDecoding, SpeculativeStats, speculative_tokens
from conftest import REAL_MODELS, load_model, model_path

FUNC = '''def mean_and_spread(values):
    total = 0.0
    count = 0
    for value in values:
        total += value
        count += 1
    mean = total / count
    spread = 0.0
    for value in values:
        spread += (value - mean) ** 2
    return mean, (spread / count) ** 0.5
'''
EDIT = [{"role": "system", "content": "Reply with the code only."},
        {"role": "user", "content": "Rename `total` to `acc` in this function and return it:\n\n```python\n" + FUNC + "```"}]


def greedy_chat(draft_model=None) -> tuple[str, fl.Llama]:
    llm = fl.Llama(str(model_path(REAL_MODELS["qwen2"])), n_ctx=1024, draft_model=draft_model)
    r = llm.create_chat_completion(EDIT, max_tokens=96, temperature=0.0)
    return r["choices"][0]["message"]["content"], llm


@pytest.fixture(scope="module")
def plain_text() -> str:
    return greedy_chat()[0]


@pytest.mark.parametrize("n_pred", [6, 16])
def test_prompt_lookup_greedy_equals_plain(plain_text, n_pred):
    text, llm = greedy_chat(PromptLookupDecoding(max_ngram_size=3, num_pred_tokens=n_pred))
    assert text == plain_text
    s = llm.speculative_stats
    # The function is copied back: most drafted tokens are right.
    assert s.n_accepted > 40 and s.n_batches < 60, s


def test_draft_model_greedy_equals_plain(plain_text):
    # The target model as its own draft (same vocabulary, a context of its own): nearly every
    # draft is accepted, and the text must still be exactly plain decoding's.
    draft = fl.DraftModel(str(model_path(REAL_MODELS["qwen2"])), draft_max=5, draft_p_min=0.0, n_ctx=1024)
    text, llm = greedy_chat(draft)
    assert text == plain_text
    assert llm.speculative_stats.acceptance > 0.9


def test_a_draft_model_of_another_vocabulary_is_refused():
    tiny = fl.DraftModel(str(model_path("tiny-llama-f32.gguf")))
    with pytest.raises(ValueError, match="vocabulary"):
        fl.Llama(str(model_path(REAL_MODELS["qwen2"])), n_ctx=256, draft_model=tiny)


def test_lookup_drafts_follow_the_latest_occurrence():
    d = PromptLookupDecoding(max_ngram_size=2, num_pred_tokens=3)
    assert d.draft([1, 2, 3, 4, 1, 2, 5, 6, 9, 1, 2], 10) == [5, 6, 9]
    assert d.draft([7, 8, 9], 10) == []
    assert d.draft([5, 1, 2, 5], 2) == [1, 2]  # unigram fallback
    with pytest.raises(ValueError):
        PromptLookupDecoding(num_pred_tokens=0)


def test_predicted_drafts_follow_the_occurrence_nearest_the_generated_length():
    from ferrollama.generation.speculative import predicted_draft

    prediction = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 7]
    assert predicted_draft(prediction, [1, 2], 3) == [3, 4, 1]            # 2 tokens in: the first "1 2"
    assert predicted_draft(prediction, [9, 9, 9, 9, 9, 1, 2], 3) == [5, 6, 1]   # 7 in: the one ending at 6
    assert predicted_draft(prediction, [8, 4, 1, 2], 2) == [5, 6]         # the longer n-gram "4 1 2" decides
    assert predicted_draft(prediction, [8, 6, 1, 2], 2) == [7]            # "6 1 2": what is left of it
    assert predicted_draft(prediction, [9, 7], 4) == []                   # "7" ends it: nothing follows
    assert predicted_draft(prediction, [42], 4) == [] and predicted_draft([], [1], 4) == []


class _Always:
    """A drafter that proposes fixed tokens (right or wrong)."""

    def __init__(self, tokens):
        self.tokens = tokens

    def draft(self, history, n_max):
        return list(self.tokens[:n_max])


def test_rejected_drafts_leave_only_accepted_tokens_in_the_cache():
    model = load_model("tiny-llama-f32.gguf")
    ctx = fl.Context(model, n_ctx=64, type_k="f32", type_v="f32")
    prompt = [1, 20, 30, 40]
    ctx.decode(fl.Batch.from_tokens(prompt, logits="last"))
    cached = list(prompt)
    stats = SpeculativeStats()
    argmax = lambda row: int(np.argmax(row))  # noqa: E731
    out = []
    for t in speculative_tokens(ctx, cached, ctx.logits(-1), argmax, _Always([3, 3, 3]), 64, stats=stats):
        out.append(t)
        if len(out) == 10:
            break
    # What the cache holds is what `cached` says: every cell a token of the output, in order.
    assert ctx.kv.seq_pos_max(0) == len(cached) - 1
    assert cached[:len(prompt) + len(out) - 1] == prompt + out[:-1]
    # The same tokens as plain greedy decoding.
    ref = fl.Context(model, n_ctx=64, type_k="f32", type_v="f32")
    ref.decode(fl.Batch.from_tokens(prompt, logits="last"))
    plain = []
    for i in range(10):
        plain.append(int(np.argmax(ref.logits(-1))))
        ref.decode(fl.Batch.from_tokens([plain[-1]], pos0=len(prompt) + i, logits="last"))
    assert out == plain
    assert stats.n_drafted >= 3 * stats.n_batches - 3


def _dist_params(seed: int) -> SamplingParams:
    return SamplingParams(seed=seed, temp=1.0, top_k=0, top_p=1.0, min_p=0.0)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def test_sampled_tokens_follow_the_target_distribution():
    # The second generated token is verified in a batch with a (fixed, mostly wrong) draft;
    # its distribution over 400 seeds must be the target's marginal, sum over t1 of
    # p(t1) p(t2 | t1), computed exactly from the model (chi-square, p > 0.001).
    model = load_model("tiny-llama-f32.gguf")
    prompt = [1, 50, 60, 70]
    ctx = fl.Context(model, n_ctx=32, type_k="f32", type_v="f32")
    ctx.decode(fl.Batch.from_tokens(prompt, logits="last"))
    p1 = _softmax(ctx.logits(-1))
    marginal = np.zeros_like(p1)
    for t1 in np.flatnonzero(p1 > 1e-6):
        ctx.kv.seq_rm(0, len(prompt), -1)
        ctx.decode(fl.Batch.from_tokens([int(t1)], pos0=len(prompt), logits="last"))
        marginal += p1[t1] * _softmax(ctx.logits(-1))
    counts = np.zeros_like(p1)
    n = 400
    for seed in range(n):
        sampler = fl.llama.Sampler(model, _dist_params(seed))
        c = fl.Context(model, n_ctx=32, type_k="f32", type_v="f32")
        c.decode(fl.Batch.from_tokens(prompt, logits="last"))
        cached = list(prompt)

        def sample(row):
            t = sampler.sample_logits(row)
            sampler.accept(t)
            return t
        gen = speculative_tokens(c, cached, c.logits(-1), sample, _Always([int(np.argmax(marginal)), 5, 6]), 32)
        next(gen)
        counts[next(gen)] += 1
    top = np.argsort(marginal)[::-1][:8]
    expected = np.append(marginal[top], 1.0 - marginal[top].sum()) * n
    observed = np.append(counts[top], n - counts[top].sum())
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    # 8 degrees of freedom: the 0.001 critical value is 26.12.
    assert chi2 < 26.12, (chi2, observed, expected.round(1))
    assert math.isclose(marginal.sum(), 1.0, rel_tol=1e-6)


def test_a_draft_model_that_keeps_missing_pauses_longer_each_time():
    """Fruitless attempts pause drafting for 1, 2, 4 ... max_skip target tokens and the next
    attempts draft one token (what a never-right draft model costs); an accepted draft ends the
    pauses."""
    tiny = str(model_path("tiny-llama-f32.gguf"))
    dm = fl.DraftModel(tiny, draft_max=2, draft_p_min=0.0, n_ctx=256, max_skip=8)
    tokens = dm.model.tokenize("Once upon a time")
    pattern = []
    for _ in range(24):
        d = dm.draft(tokens, 4)
        pattern.append(len(d) > 0)
        wrong = (d[0] + 1) % dm.model.n_vocab if d else 5
        tokens = tokens + [wrong]                         # the target never takes the draft
    # attempt, pause 1, attempt, pause 2, attempt, pause 4, attempt, pause 8 (max), ...
    assert pattern[:16] == [True, False, True, False, False, True, False, False, False, False,
                            True] + [False] * 5
    d = dm.draft(tokens, 4) if pattern[-1] else None
    while not d:
        tokens = tokens + [5]
        d = dm.draft(tokens, 4)
    assert len(d) == 1                                    # after a pause: a one-token probe
    tokens = tokens + d[:1]                               # accepted: no pause, full drafts again
    assert len(dm.draft(tokens, 4)) == 2
