"""What batch-invariant logits (``batch_invariant=True``, ``--batch-invariant``) buy a user
(issue 40, goal 4), on the default model: a seeded
server request repeated gives the same text, alone, without the prompt cache and among
concurrent requests; a greedy request's text does not depend on the others in the batch;
speculative decoding's greedy text is plain decoding's; a state restored gives the text again."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

import ferrollama as fl
from conftest import REAL_MODELS, load_model, model_path
from serving import start_server

PROMPTS = ["Write a haiku about the sea.", "What is the capital of France?", "Name three prime numbers.",
           "Explain recursion in one sentence.", "Tell me a joke about cats.", "What does HTTP stand for?",
           "Write a Python function that reverses a string.", "Describe the color blue to someone who cannot see."]
N_TOKENS = 24


@pytest.fixture(scope="module")
def client():
    server, scheduler = start_server(load_model(REAL_MODELS["qwen2"]), n_seq=8, n_ctx=8 * 512, batch_invariant=True)
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    server.stop()
    scheduler.close()


def ask(client: openai.OpenAI, prompt: str, seed: int | None, cache_prompt: bool = True) -> str:
    sampling = {"temperature": 1.0, "seed": seed} if seed is not None else {"temperature": 0.0}
    r = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": prompt}], max_tokens=N_TOKENS,
                                       extra_body={"cache_prompt": cache_prompt}, **sampling)
    return r.choices[0].message.content


@pytest.mark.parametrize("seed", [1234, None], ids=["seeded", "greedy"])
def test_a_request_gives_the_same_text_alone_again_uncached_and_among_others(client, seed):
    alone = [ask(client, p, seed) for p in PROMPTS]
    assert [ask(client, p, seed) for p in PROMPTS] == alone  # again: its prompt now cached
    assert [ask(client, p, seed, cache_prompt=False) for p in PROMPTS] == alone
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: ask(client, p, seed), PROMPTS))
    assert together == alone
    assert len(set(alone)) == len(PROMPTS)  # the prompts did get their own texts


def speculative_prompts() -> list[str]:
    """benches/speculative_agreement.py's prompts: the start of each text of tests/data/texts and
    three short ones."""
    texts = [p.read_text()[:400] for p in sorted((Path(__file__).parent / "data" / "texts").glob("*"))]
    return texts + ["def quicksort(items):\n", "Write a haiku about the sea.\n\n", "The three laws of motion are"]


def greedy(llm: fl.Llama, prompt: str, n: int = 48) -> list[int]:
    out = []
    for t in llm.generate(llm.tokenize(prompt.encode(), add_bos=True, special=False), temp=0.0):
        if llm.model.is_eog(t) or len(out) == n:
            break
        out.append(t)
    return out


def test_speculative_decoding_gives_plain_decodings_greedy_text():
    path = str(model_path(REAL_MODELS["qwen2"]))
    plain = fl.Llama(path, n_ctx=1024, verbose=False, batch_invariant=True)
    drafters = {"lookup": fl.PromptLookupDecoding(max_ngram_size=3, num_pred_tokens=16),
                "draft model": fl.DraftModel(path, draft_max=12, draft_p_min=0.0, n_ctx=1024)}
    prompts = speculative_prompts()
    assert len(prompts) >= 7
    want = [greedy(plain, p) for p in prompts]
    for name, drafter in drafters.items():
        llm = fl.Llama(path, n_ctx=1024, draft_model=drafter, verbose=False, batch_invariant=True)
        for prompt, tokens in zip(prompts, want):
            assert greedy(llm, prompt) == tokens, f"{name}: {prompt[:40]!r}"
        assert llm.speculative_stats.n_accepted > 0  # drafts were verified in batches


def test_a_restored_state_gives_the_same_text_again():
    llm = fl.Llama(str(model_path(REAL_MODELS["qwen2"])), n_ctx=512, verbose=False, batch_invariant=True)
    first = "The capital of France is"
    text = llm(first, max_tokens=N_TOKENS, temperature=0.0)["choices"][0]["text"]
    state = llm.save_state()
    llm("Once upon a time, in a land far away,", max_tokens=8, temperature=0.0)
    llm.load_state(state)
    assert llm(first, max_tokens=N_TOKENS, temperature=0.0)["choices"][0]["text"] == text
