"""The scheduler without HTTP: continuous batching, prefix reuse in place and by seq_cp,
cancellation, the queue bound, a failing job that leaves the others alone, async iteration, and
Llama.create_completion over a list of prompts."""
from __future__ import annotations

import asyncio

import pytest

from conftest import REAL_MODELS, load_model, model_path
from ferrollama import Llama
from ferrollama.llama import Sampler, SamplingParams
from ferrollama.server import JobFailed, QueueFull, Request, Scheduler

GREEDY = SamplingParams(temp=0)
#: prompts whose greedy continuations have no near-tie, so batching cannot change them
STABLE = ["def is_prime(n):\n", "import os"]


@pytest.fixture(scope="module")
def model():
    return load_model(REAL_MODELS["qwen2"])


@pytest.fixture(scope="module")
def llm():
    return Llama(str(model_path(REAL_MODELS["qwen2"])), n_ctx=512, n_threads=2)


def test_prompts_decoded_together_equal_each_alone(llm):
    together = llm.create_completion(STABLE, max_tokens=12, temperature=0)
    alone = [llm.create_completion(p, max_tokens=12, temperature=0) for p in STABLE]
    assert [c["text"] for c in together["choices"]] == [a["choices"][0]["text"] for a in alone]
    assert [c["index"] for c in together["choices"]] == [0, 1]
    assert together["usage"]["completion_tokens"] == 24
    assert together["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    streamed = list(llm.create_completion(STABLE, max_tokens=12, temperature=0, stream=True))
    for i, c in enumerate(together["choices"]):
        assert "".join(s["choices"][0]["text"] for s in streamed if s["choices"][0]["index"] == i) == c["text"]


def test_a_slot_reuses_its_prefix_and_another_slot_copies_it(model):
    prompt = model.tokenize("def is_prime(n):\n    if n < 2:")
    with Scheduler(model, n_ctx=1024, n_seq=2, n_threads=2) as sched:
        first = sched.submit(Request(prompt, GREEDY, 4)).result()[1][-1].usage
        assert first == {"prompt_tokens": len(prompt), "completion_tokens": 4, "cached_tokens": 0}
        # the same prompt again: every token but the last reused in place
        again = sched.submit(Request(prompt, GREEDY, 4)).result()[1][-1].usage
        assert again["cached_tokens"] == len(prompt) - 1
        # two prompts sharing the first 8 tokens at once: one reuses slot 0, the other copies from it
        a, b = prompt[:8] + model.tokenize(" return"), prompt[:8] + model.tokenize(" pass")
        before = sched.stats.prompt_tokens_decoded
        jobs = sched.submit_many([Request(a, GREEDY, 2), Request(b, GREEDY, 2)])
        usages = [j.result()[1][-1].usage for j in jobs]
        assert [u["cached_tokens"] for u in usages] == [8, 8]
        assert sched.stats.prompt_tokens_copied == 8
        assert sched.stats.prompt_tokens_decoded - before == (len(a) - 8) + (len(b) - 8)


def test_identical_prompts_are_decoded_once(model):
    prompt = model.tokenize("Write a haiku about the sea.")
    with Scheduler(model, n_ctx=1024, n_seq=3, n_threads=2) as sched:
        jobs = sched.submit_many([Request(prompt, GREEDY, 2, cache_prompt=True) for _ in range(3)])
        assert [j.result()[1][-1].usage["completion_tokens"] for j in jobs] == [2, 2, 2]
        # the first reads the whole prompt; the two others copy all but its last token
        assert sched.stats.prompt_tokens_copied == 2 * (len(prompt) - 1)
        assert sched.stats.prompt_tokens_decoded == len(prompt) + 2


def test_cancel_frees_the_slot_and_the_queue_is_bounded(model):
    with Scheduler(model, n_ctx=512, n_seq=1, n_threads=2, queue_size=1) as sched:
        long = sched.submit(Request(model.tokenize("Once"), GREEDY, 200))
        waiting = sched.submit(Request(model.tokenize("Twice"), GREEDY, 2))
        with pytest.raises(QueueFull):
            sched.submit(Request(model.tokenize("Thrice"), GREEDY, 2))
        outs = iter(long)
        next(outs)
        long.cancel()
        assert [o.finish_reason for o in outs][-1] == "cancelled"
        assert waiting.result()[1][-1].finish_reason == "length"
        assert sched.stats.requests_cancelled == 1 and sched.slots_busy == 0


def test_a_failing_job_fails_alone(model):
    class Failing(Sampler):
        def sample_logits(self, logits):
            if self.n_sample == 2:
                raise RuntimeError("broken sampler")
            return super().sample_logits(logits)

    with Scheduler(model, n_ctx=1024, n_seq=2, n_threads=2) as sched:
        good_req = Request(model.tokenize(STABLE[1]), GREEDY, 6)
        bad, good = sched.submit_many([Request(model.tokenize("Hello"), GREEDY, 6), good_req],
                                      [Failing(model, GREEDY), None])
        with pytest.raises(JobFailed, match="broken sampler"):
            bad.result()
        text, outs = good.result()
        assert outs[-1].finish_reason == "length" and outs[-1].usage["completion_tokens"] == 6
        assert sched.stats.requests_failed == 1
        # the failed slot serves the next request
        assert sched.submit(good_req).result()[0] == text


def test_async_iteration_and_prompt_checks(model):
    with Scheduler(model, n_ctx=64, n_seq=2, n_threads=2) as sched:
        async def run() -> str:
            job = sched.submit(Request(model.tokenize(STABLE[1]), GREEDY, 5))
            return "".join([o.text async for o in job])

        assert asyncio.run(run()) == sched.submit(Request(model.tokenize(STABLE[1]), GREEDY, 5)).result()[0]
        with pytest.raises(ValueError, match="a slot's context holds 32"):
            sched.submit(Request(list(range(100, 140)), GREEDY, 1))
        with pytest.raises(ValueError, match="empty"):
            sched.submit(Request([], GREEDY, 1))
        # generation stops at the end of the slot's context
        out = sched.submit(Request(model.tokenize(STABLE[1]), GREEDY, None)).result()[1][-1]
        assert out.finish_reason == "length" and out.usage["prompt_tokens"] + out.usage["completion_tokens"] == 32


#: a prompt the model continues by copying from it (prompt lookup's case)
REPEAT = ("def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n"
          "# the same two functions again:\n")


def test_prompt_lookup_per_slot_keeps_greedy_texts(model):
    """Each slot drafts from its own tokens; the drafted tokens its sampler picks are kept, the
    cells of the rest removed: the texts are plain decoding's, in fewer steps."""
    from ferrollama import PromptLookupDecoding

    prompts = [model.tokenize(REPEAT), model.tokenize(STABLE[0])]
    texts = {}
    for name, drafter in (("plain", None), ("lookup", PromptLookupDecoding(max_ngram_size=2, num_pred_tokens=8))):
        with Scheduler(model, n_ctx=1024, n_seq=2, n_threads=2, drafter=drafter) as sched:
            jobs = sched.submit_many([Request(p, GREEDY, 24) for p in prompts])
            texts[name] = [j.result()[0] for j in jobs]
            stats = sched.stats
            # the caches hold exactly prompt + answer tokens: no drafted cell is left behind
            for slot in sched.slots:
                assert sched.ctx.kv.seq_pos_max(slot.seq_id) == len(slot.tokens) - 1
        if drafter is not None:
            assert stats.drafted_tokens > 0 and 0 < stats.accepted_tokens <= stats.drafted_tokens
            assert stats.decode_steps < 24
    assert texts["lookup"] == texts["plain"]
    assert texts["plain"][0].startswith("def area(w, h):\n    return w * h")


def test_serve_lookup_flag_gives_each_slot_a_drafter():
    from ferrollama.cli import build_parser
    from ferrollama.cli.serve import build_app

    tiny = str(model_path("tiny-llama-f32.gguf"))
    app = build_app(build_parser().parse_args(["serve", "-m", tiny, "--lookup", "6", "--lookup-ngram", "3",
                                               "--no-warmup", "-c", "256", "-np", "2"]))
    scheduler = app.app.state.engine.scheduler          # (the app inside the API-key gate)
    drafter = scheduler.drafter
    assert (drafter.num_pred_tokens, drafter.max_ngram_size) == (6, 3)
    scheduler.close()


def test_a_draft_model_per_slot_keeps_greedy_texts(model):
    """-md in the server: the draft model follows each slot in a sequence of its own (here the
    target itself drafts, so nearly every drafted token is kept)."""
    from ferrollama import DraftModel

    prompts = [model.tokenize(REPEAT), model.tokenize(STABLE[1])]
    texts = {}
    for name, drafter in (("plain", None), ("draft", DraftModel(model, draft_max=4, draft_p_min=0.0, n_ctx=2048,
                                                                 n_seq=2, n_threads=2))):
        with Scheduler(model, n_ctx=1024, n_seq=2, n_threads=2, drafter=drafter) as sched:
            texts[name] = [j.result()[0] for j in sched.submit_many([Request(p, GREEDY, 16) for p in prompts])]
            stats = sched.stats
        if drafter is not None:
            assert stats.accepted_tokens > 0.8 * stats.drafted_tokens > 0
            assert [len(s.cached) for s in drafter.seqs] != [0, 0]
    assert texts["draft"] == texts["plain"]
    with pytest.raises(ValueError, match="2 slots"):
        Scheduler(model, n_ctx=1024, n_seq=2, drafter=DraftModel(model, n_ctx=512, n_seq=1))
