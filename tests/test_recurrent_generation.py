"""Recurrent and hybrid models through everything above the engine (issue 35): Llama's prefix
reuse through state checkpoints, the scheduler's slots, speculative decoding (a rejected draft
dropped by rolling the state back), and the command line's context shift.
Each result is compared with the same generation on a fresh context, which never reuses or drops
anything: the expectation is exact (greedy text), and the reuse is checked by counting the prompt
tokens the engine decoded."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import ferrollama as fl
from ferrollama.generation.scheduler import Request, Scheduler
from ferrollama.generation.params import SamplingParams

MODELS = Path(__file__).parent / "data" / "models"
#: a pure state-space model and a hybrid with attention layers
ARCHS = ("mamba2", "qwen35")
PROMPT = [5, 17, 99, 23, 42, 7, 300, 11, 60, 61, 62, 63]
REPEATING = [5, 17, 99, 23, 42, 7, 5, 17, 99, 23, 42, 7, 5, 17, 99, 23]


def llama(arch: str, **kw) -> fl.Llama:
    return fl.Llama(str(MODELS / f"tiny-{arch}-f32.gguf"), n_ctx=256, verbose=False, **kw)


def text(llm: fl.Llama, prompt: list[int], n: int = 8) -> str:
    return llm.create_completion(prompt, max_tokens=n, temperature=0)["choices"][0]["text"]


def fresh_text(arch: str, prompt: list[int], n: int = 8) -> str:
    return text(llama(arch), prompt, n)


def decoded_for(llm: fl.Llama, prompt: list[int]) -> tuple[str, int]:
    """The next token's text after prompt, and how many tokens the engine decoded for it."""
    perf = llm.ctx.perf
    before = perf["n_p_eval"] + perf["n_eval"]
    out = text(llm, prompt, 1)
    perf = llm.ctx.perf
    return out, int(perf["n_p_eval"] + perf["n_eval"] - before)


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_resumes_a_shared_prefix_from_a_checkpoint(arch: str) -> None:
    llm = llama(arch)
    assert llm.model.is_recurrent
    first = text(llm, PROMPT)  # the cache then holds the prompt and 7 generated tokens
    assert first == fresh_text(arch, PROMPT)
    # the same prompt again: back to the checkpoint after it, its saved logits, nothing decoded
    assert decoded_for(llm, PROMPT) == (fresh_text(arch, PROMPT, 1), 0)
    # a prompt that leaves the cached tokens inside the answer: resumed from the prompt's end
    text(llm, PROMPT)
    longer = PROMPT + [77, 78, 79]
    assert decoded_for(llm, longer) == (fresh_text(arch, longer, 1), 3)
    # one that diverges inside the first prompt, before any checkpoint: decoded from the start
    other = PROMPT[:6] + [400, 401]
    assert decoded_for(llm, other) == (fresh_text(arch, other, 1), len(other))
    assert text(llm, other) == fresh_text(arch, other)


@pytest.mark.parametrize("arch", ARCHS)
def test_n_tokens_cuts_a_recurrent_cache_back_through_its_checkpoints(arch: str) -> None:
    llm = llama(arch)
    text(llm, PROMPT, 4)
    llm.n_tokens = len(PROMPT) - 2
    assert llm.n_tokens == len(PROMPT) - 2
    assert text(llm, PROMPT[:-2] + [90]) == fresh_text(arch, PROMPT[:-2] + [90])


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_lookup_decoding_gives_the_plain_greedy_text(arch: str) -> None:
    lookup = llama(arch, draft_model=fl.PromptLookupDecoding(max_ngram_size=2, num_pred_tokens=6))
    assert lookup.ctx.n_rs_seq == 6
    assert text(lookup, REPEATING, 24) == fresh_text(arch, REPEATING, 24)
    assert lookup.speculative_stats.n_drafted > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_a_recurrent_draft_model_follows_the_target_through_its_checkpoint(arch: str) -> None:
    draft = fl.DraftModel(str(MODELS / f"tiny-{arch}-q8_0.gguf"), draft_max=4, draft_p_min=0.0, max_skip=0)
    spec = llama(arch, draft_model=draft)
    assert text(spec, REPEATING, 16) == fresh_text(arch, REPEATING, 16)
    assert spec.speculative_stats.n_drafted > 0


def run_job(sched: Scheduler, prompt: list[int], n: int = 8) -> str:
    job = sched.submit(Request(tokens=list(prompt), params=SamplingParams(temp=0.0), max_tokens=n))
    return "".join(out.text for out in job)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_slot_reuses_its_prefix_through_a_checkpoint(arch: str) -> None:
    model = fl.Model(str(MODELS / f"tiny-{arch}-f32.gguf"))
    with Scheduler(model, n_ctx=512, n_seq=2, n_batch=64) as sched:
        first = run_job(sched, PROMPT)
        decoded = sched.stats.prompt_tokens_decoded
        assert run_job(sched, PROMPT) == first
        # the same prompt again: its last token, from the checkpoint before it (the slot holds
        # the prompt and the answer, which its state cannot be cut back from)
        assert sched.stats.prompt_tokens_decoded - decoded == 1
        assert sched.checkpoints.count(0) + sched.checkpoints.count(1) > 0
    assert first == fresh_text(arch, PROMPT)


@pytest.mark.parametrize("arch", ARCHS)
def test_slots_drafting_by_prompt_lookup_give_the_plain_greedy_text(arch: str) -> None:
    model = fl.Model(str(MODELS / f"tiny-{arch}-f32.gguf"))

    def tokens(drafter=None) -> list[list[int]]:
        with Scheduler(model, n_ctx=512, n_seq=2, n_batch=64, drafter=drafter) as sched:
            jobs = [sched.submit(Request(tokens=list(p), params=SamplingParams(temp=0.0), max_tokens=20))
                    for p in (REPEATING, PROMPT)]
            out = [[o.token for o in job if o.token is not None] for job in jobs]
            assert sched.ctx.n_rs_seq == (5 if drafter else 0)
            assert (sched.stats.drafted_tokens > 0) == (drafter is not None)
        return out

    assert tokens(fl.PromptLookupDecoding(max_ngram_size=2, num_pred_tokens=5)) == tokens()


@pytest.mark.parametrize("arch", ARCHS)
def test_a_context_shift_keeps_a_recurrent_model_generating(arch: str) -> None:
    """As in llama.cpp, removing positions from the middle of a recurrent sequence succeeds and
    leaves its state whole (seq_rm of a range before the state's position); a hybrid's attention
    cells shift. Generation goes on past the context (where the keys can move: not with M-RoPE)."""
    r = subprocess.run([sys.executable, "-m", "ferrollama.cli", "generate", "-m", str(MODELS / f"tiny-{arch}-f32.gguf"),
                        "-p", "Once upon a time", "-n", "300", "-c", "256", "--temp", "0", "--ignore-eos", "--keep", "2",
                        "--no-warmup"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    if arch == "qwen35":
        # Keys with M-RoPE cannot move: as llama.cpp's common init, the shift is turned off and
        # generation stops when the context is full.
        assert "KV cache shifting is not supported for this context" in r.stderr
        assert "context full and context shift is off" in r.stderr
        return
    assert re.search(r"eval time = .* / +299 runs", r.stderr)
