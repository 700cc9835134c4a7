"""One suite of llama-cpp-python API uses, run on either package.

Each case is a function ``case(m, models)`` where ``m`` is the package (``llama_cpp`` or
``ferrollama``) and ``models`` maps "qwen" (Qwen2.5-Coder-0.5B-Instruct Q4_K_M) and "tiny" (the
tiny llama of tests/data) to paths. It returns what a program would look at — texts, shapes,
finish reasons, token ids, numbers — as JSON values; an exception is recorded as its kind.

benches/record_llama_api.py runs the cases with llama-cpp-python 0.3.36 (and ferrollama, in the
same venv, printing the comparison) and records llama-cpp-python's results in
tests/data/fixtures/llama_cpp_api.json; tests/test_llama_drop_in.py runs them with ferrollama
and compares. Floats are compared within ``FLOAT_TOL`` (llama.cpp's and the engine's logits
differ by rounding, REFERENCE.md); everything else exactly.
"""
from __future__ import annotations

import json
import pickle
from typing import Any, Callable

import numpy as np

#: |Δ| allowed between the two packages' log-probabilities and embeddings' cosine distance
FLOAT_TOL = 0.05
COSINE_TOL = 1e-3

CASES: dict[str, Callable[[Any, dict], Any]] = {}

#: one Llama per (package, model, keywords), shared by the cases that do not change its settings
_LOADED: dict[tuple, Any] = {}


def case(fn: Callable[[Any, dict], Any]) -> Callable[[Any, dict], Any]:
    CASES[fn.__name__] = fn
    return fn


def llama(m: Any, path: str, **kw: Any) -> Any:
    key = (m.__name__, path, json.dumps(kw, sort_keys=True, default=str))
    if key not in _LOADED:
        _LOADED[key] = m.Llama(path, verbose=False, **kw)
    return _LOADED[key]


def text_of(out: dict) -> dict:
    choice = out["choices"][0]
    return {"text": choice["text"], "finish_reason": choice["finish_reason"], "usage": out["usage"]}


_KINDS = (("ValueError", ValueError), ("TypeError", TypeError), ("RuntimeError", RuntimeError),
          ("ImportError", ImportError), ("KeyError", KeyError))


def outcome(m: Any, fn: Callable[[], Any]) -> Any:
    """The result of fn, or the kinds of exception it raised (the classes a program catches)."""
    del m
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the kind is the result
        return {"raises": [name for name, cls in _KINDS if isinstance(e, cls)]}


#: prompts whose greedy continuations have no near-tie (top two logits > 0.1 apart) in 24 tokens,
#: so that rounding differences between the engines cannot flip them
PROMPTS = ["import numpy as np\n\n# a 3x3 identity matrix\n", "The first five prime numbers are",
           "The three primary colors are"]
CHAT = [{"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three primary colors, comma separated."}]


# --- construction -----------------------------------------------------------------------------

@case
def constructor_keywords(m: Any, models: dict) -> Any:
    """The keywords llama-cpp-python programs pass, GPU ones included (no effect on a CPU)."""
    llm = m.Llama(models["qwen"], n_gpu_layers=-1, split_mode=1, main_gpu=0, tensor_split=None, vocab_only=False,
                  use_mmap=True, use_mlock=False, seed=1234, n_ctx=1024, n_batch=256, n_ubatch=256, n_threads=2,
                  n_threads_batch=2, rope_scaling_type=-1, pooling_type=-1, attention_type=-1, rope_freq_base=0.0,
                  rope_freq_scale=0.0, yarn_ext_factor=-1.0, yarn_attn_factor=1.0, yarn_beta_fast=32.0,
                  yarn_beta_slow=1.0, yarn_orig_ctx=0, logits_all=False, embedding=False, offload_kqv=True,
                  flash_attn=False, no_perf=True, last_n_tokens_size=64, lora_base=None, lora_path=None, numa=False,
                  chat_format=None, chat_handler=None, draft_model=None, tokenizer=None, type_k=1, type_v=1,
                  spm_infill=False, verbose=False)
    return {"n_ctx": llm.n_ctx(), "n_vocab": llm.n_vocab(), "n_embd": llm.n_embd(), "bos": llm.token_bos(),
            "eos": llm.token_eos(), "nl": llm.token_nl(), "n_tokens": llm.n_tokens,
            "input_ids": list(np.shape(llm.input_ids)), "text": text_of(llm("Hello", max_tokens=8, temperature=0.0))}


@case
def default_context_is_512(m: Any, models: dict) -> Any:
    return llama(m, models["tiny"]).n_ctx()


@case
def metadata(m: Any, models: dict) -> Any:
    md = llama(m, models["qwen"]).metadata
    keys = ["general.architecture", "general.name", "qwen2.block_count", "qwen2.context_length",
            "qwen2.rope.freq_base", "tokenizer.ggml.model", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"]
    return {k: md.get(k) for k in keys}


@case
def missing_model_file(m: Any, models: dict) -> Any:
    return outcome(m, lambda: m.Llama("/nonexistent/model.gguf", verbose=False))


@case
def kv_overrides_change_the_model(m: Any, models: dict) -> Any:
    llm = m.Llama(models["tiny"], kv_overrides={"llama.rope.freq_base": 1000.0}, n_ctx=256, verbose=False)
    return text_of(llm("Once upon a time", max_tokens=12, temperature=0.0))


@case
def rope_freq_base_changes_the_context(m: Any, models: dict) -> Any:
    llm = m.Llama(models["tiny"], rope_freq_base=2500.0, n_ctx=256, verbose=False)
    return text_of(llm("Once upon a time", max_tokens=12, temperature=0.0))


# --- tokens -----------------------------------------------------------------------------------

@case
def tokenize_detokenize(m: Any, models: dict) -> Any:
    llm = llama(m, models["qwen"])
    text = "Hello <|im_start|> world"
    return {"plain": llm.tokenize(text.encode()), "special": llm.tokenize(text.encode(), special=True),
            "no_bos": llm.tokenize(b"hi", add_bos=False),
            "back": llm.detokenize(llm.tokenize(text.encode(), special=True)).decode(),
            "back_special": llm.detokenize(llm.tokenize(text.encode(), special=True), special=True).decode(),
            "tiny_bos": llama(m, models["tiny"]).tokenize(b"hello")[:1]}


@case
def tokenizer_object(m: Any, models: dict) -> Any:
    tok = llama(m, models["qwen"]).tokenizer()
    ids = tok.encode("print('hi')")
    return {"ids": ids, "text": tok.decode(ids)}


# --- completion -------------------------------------------------------------------------------

@case
def greedy_completions(m: Any, models: dict) -> Any:
    llm = llama(m, models["qwen"], n_ctx=1024)
    return [text_of(llm(p, max_tokens=24, temperature=0.0)) for p in PROMPTS]


@case
def seeded_sampling(m: Any, models: dict) -> Any:
    """The same seed gives the same tokens: llama-cpp-python's chain, on the tiny F32 model with an
    F32 cache, where the two engines' logits are equal (REFERENCE.md), so no draw can land on the
    other side of a boundary. (On the real Q4_K_M model logits differ by rounding and a draw
    within ~1% of a boundary goes either way: measured 2 of 8 draws.) And the seeds a completion
    without one derives from the Llama's, call after call."""
    llm = llama(m, models["tiny"], type_k=0, type_v=0)
    prompt = llm.tokenize(b"Once upon a time")
    given = []
    for s in (1, 2, 3, 42):
        llm.set_seed(s)
        tokens = []
        for t in llm.generate(prompt, temp=0.8):
            tokens.append(int(t))
            if len(tokens) == 16:
                break
        given.append(tokens)
    own = m.Llama(models["tiny"], n_ctx=512, seed=77, verbose=False)
    derived = []
    for _ in range(3):
        own("Once upon a time", max_tokens=2, temperature=1.0)
        derived.append(int(own._seed))
    return {"given": given, "derived": derived}


@case
def stop_echo_and_stream(m: Any, models: dict) -> Any:
    llm = llama(m, models["qwen"], n_ctx=1024)
    stopped = llm(PROMPTS[0], max_tokens=32, temperature=0.0, stop=["np."])
    echoed = llm(PROMPTS[1], max_tokens=6, temperature=0.0, echo=True)
    chunks = list(llm(PROMPTS[0], max_tokens=20, temperature=0.0, stream=True))
    return {"stopped": text_of(stopped), "echo": echoed["choices"][0]["text"],
            "stream": "".join(c["choices"][0]["text"] for c in chunks),
            "stream_finish": chunks[-1]["choices"][0]["finish_reason"],
            "stream_objects": sorted({c["object"] for c in chunks})}


@case
def max_tokens_beyond_the_context(m: Any, models: dict) -> Any:
    llm = llama(m, models["tiny"])
    out = llm("Once upon a time", max_tokens=2000, temperature=0.0)
    return {"usage": out["usage"], "finish": out["choices"][0]["finish_reason"],
            "too_long": outcome(m, lambda: llm([1] * 600, max_tokens=1))}


@case
def logprobs_with_logits_all(m: Any, models: dict) -> Any:
    llm = llama(m, models["qwen"], n_ctx=1024, logits_all=True)
    out = llm(PROMPTS[0], max_tokens=6, temperature=0.0, logprobs=3)
    lp = out["choices"][0]["logprobs"]
    return {"tokens": lp["tokens"], "text_offset": lp["text_offset"],
            "token_logprobs": lp["token_logprobs"], "top_keys": [sorted(t) for t in lp["top_logprobs"]]}


@case
def grammar_constrains(m: Any, models: dict) -> Any:
    llm = llama(m, models["qwen"], n_ctx=1024)
    grammar = m.LlamaGrammar.from_string('root ::= "yes" | "no"', verbose=False)
    schema = m.LlamaGrammar.from_json_schema(json.dumps(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}), verbose=False)
    return {"yes_no": llm("Is water wet? Answer:", max_tokens=4, temperature=0.0, grammar=grammar)["choices"][0]["text"],
            "json": llm("Two plus two as JSON:", max_tokens=16, temperature=0.0, grammar=schema)["choices"][0]["text"]}


@case
def logits_processor_and_stopping_criteria(m: Any, models: dict) -> Any:
    llm = llama(m, models["qwen"], n_ctx=1024)
    banned = llm.tokenize(b"identity", add_bos=False)[0]

    def ban(input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores[banned] = -np.inf
        return scores

    def five_after_prompt(input_ids: np.ndarray, logits: np.ndarray) -> bool:
        return len(input_ids) >= n_prompt + 5

    n_prompt = len(llm.tokenize(PROMPTS[0].encode()))
    processed = llm(PROMPTS[0], max_tokens=12, temperature=0.0, logits_processor=m.LogitsProcessorList([ban]))
    stopped = llm(PROMPTS[0], max_tokens=12, temperature=0.0,
                  stopping_criteria=m.StoppingCriteriaList([five_after_prompt]))
    return {"processed": text_of(processed), "stopped": text_of(stopped)}


@case
def generate_and_sample(m: Any, models: dict) -> Any:
    llm = llama(m, models["qwen"], n_ctx=1024)
    tokens = llm.tokenize(PROMPTS[2].encode())
    out = []
    for t in llm.generate(tokens, temp=0.0):
        out.append(int(t))
        if len(out) == 8:
            break
    llm.reset()
    llm.eval(tokens)
    return {"generate": out, "sample": int(llm.sample(temp=0.0)), "n_tokens": llm.n_tokens}


@case
def save_and_load_state(m: Any, models: dict) -> Any:
    llm = llama(m, models["tiny"])
    llm("Once upon a time", max_tokens=4, temperature=0.0)
    state = llm.save_state()
    first = llm("Once upon a time there", max_tokens=6, temperature=0.0)["choices"][0]["text"]
    llm.load_state(state)
    again = llm("Once upon a time there", max_tokens=6, temperature=0.0)["choices"][0]["text"]
    return {"same": first == again, "n_tokens": state.n_tokens, "fields": sorted(
        k for k in ("input_ids", "scores", "n_tokens", "llama_state", "llama_state_size", "seed") if hasattr(state, k))}


@case
def ram_cache(m: Any, models: dict) -> Any:
    llm = m.Llama(models["tiny"], n_ctx=256, verbose=False)
    llm.set_cache(m.LlamaRAMCache(capacity_bytes=1 << 30))
    a = llm("Once upon a time", max_tokens=6, temperature=0.0)["choices"][0]["text"]
    llm.reset()
    b = llm("Once upon a time", max_tokens=6, temperature=0.0)["choices"][0]["text"]
    return {"same": a == b, "entries": len(llm.cache.cache_state) if hasattr(llm.cache, "cache_state") else None}


@case
def logits_to_logprobs(m: Any, models: dict) -> Any:
    return [round(float(x), 5) for x in m.Llama.logits_to_logprobs(np.array([1.0, 2.0, 3.0], dtype=np.float32))]


@case
def pickled_and_restored(m: Any, models: dict) -> Any:
    llm = m.Llama(models["qwen"], n_ctx=256, seed=5, verbose=False)
    again = pickle.loads(pickle.dumps(llm))
    return {"n_ctx": again.n_ctx(), "text": again(PROMPTS[1], max_tokens=8, temperature=0.0)["choices"][0]["text"]}


# --- chat -------------------------------------------------------------------------------------

@case
def chat_greedy(m: Any, models: dict) -> Any:
    llm = llama(m, models["qwen"], n_ctx=1024)
    out = llm.create_chat_completion(CHAT, temperature=0.0, max_tokens=32)
    chunks = list(llm.create_chat_completion(CHAT, temperature=0.0, max_tokens=32, stream=True))
    choice = out["choices"][0]
    return {"object": out["object"], "message": choice["message"], "finish": choice["finish_reason"],
            "prompt_tokens": out["usage"]["prompt_tokens"], "id_prefix": out["id"][:8],
            "stream": "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks),
            "first_delta": chunks[0]["choices"][0]["delta"]}


@case
def chat_json_response_format(m: Any, models: dict) -> Any:
    llm = llama(m, models["qwen"], n_ctx=1024)
    schema = {"type": "object", "properties": {"colors": {"type": "array", "items": {"type": "string"}}},
              "required": ["colors"]}
    out = llm.create_chat_completion(CHAT, temperature=0.0, max_tokens=48,
                                     response_format={"type": "json_object", "schema": schema})
    return json.loads(out["choices"][0]["message"]["content"])


@case
def chat_forced_tool_call(m: Any, models: dict) -> Any:
    llm = llama(m, models["qwen"], n_ctx=1024)
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    out = llm.create_chat_completion([{"role": "user", "content": "What is the weather in Paris?"}], tools=tools,
                                     tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                     temperature=0.0, max_tokens=48)
    msg = out["choices"][0]["message"]
    calls = msg.get("tool_calls") or []
    return {"names": [c["function"]["name"] for c in calls],
            "arguments": [json.loads(c["function"]["arguments"]) for c in calls]}


@case
def chat_logprobs(m: Any, models: dict) -> Any:
    llm = llama(m, models["qwen"], n_ctx=1024, logits_all=True)
    out = llm.create_chat_completion(CHAT, temperature=0.0, max_tokens=6, logprobs=True, top_logprobs=2)
    content = out["choices"][0]["logprobs"]["content"]
    return {"tokens": [c["token"] for c in content], "n_top": [len(c["top_logprobs"]) >= 2 for c in content],
            "keys": sorted(content[0])}


@case
def chat_format_by_name(m: Any, models: dict) -> Any:
    llm = m.Llama(models["qwen"], n_ctx=1024, chat_format="chatml", verbose=False)
    out = llm.create_chat_completion(CHAT, temperature=0.0, max_tokens=24)
    return {"content": out["choices"][0]["message"]["content"], "finish": out["choices"][0]["finish_reason"]}


@case
def unknown_keyword_is_a_type_error(m: Any, models: dict) -> Any:
    llm = llama(m, models["tiny"])
    return outcome(m, lambda: llm.create_chat_completion(CHAT, temprature=0.0))


# --- embeddings -------------------------------------------------------------------------------

@case
def embeddings(m: Any, models: dict) -> Any:
    llm = llama(m, models["qwen"], n_ctx=512, embedding=True, pooling_type=1)
    vecs = llm.embed(["hello world", "goodbye"], normalize=True)
    out = llm.create_embedding("hello world")
    return {"vectors": [[round(float(x), 6) for x in v] for v in vecs], "object": out["object"],
            "usage": out["usage"], "dim": len(out["data"][0]["embedding"])}


def compare(name: str, ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Where two results differ: floats beyond FLOAT_TOL, embedding vectors beyond COSINE_TOL in
    cosine distance, anything else unequal."""
    where = f"{name}{path}"
    if name == "embeddings" and path.endswith("['vectors']"):
        problems = []
        for i, (a, b) in enumerate(zip(ours, theirs)):
            a, b = np.asarray(a), np.asarray(b)
            cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
            if 1 - cos > COSINE_TOL:
                problems.append(f"{where}[{i}]: cosine {cos:.5f}")
        return problems + ([] if len(ours) == len(theirs) else [f"{where}: {len(ours)} vectors, not {len(theirs)}"])
    if isinstance(theirs, float) and isinstance(ours, (int, float)):
        return [] if abs(ours - theirs) <= FLOAT_TOL else [f"{where}: {ours} vs {theirs}"]
    if isinstance(theirs, dict) and isinstance(ours, dict):
        if set(ours) != set(theirs):
            return [f"{where}: keys {sorted(ours)} vs {sorted(theirs)}"]
        return [p for k in theirs for p in compare(name, ours[k], theirs[k], f"{path}[{k!r}]")]
    if isinstance(theirs, list) and isinstance(ours, list):
        if len(ours) != len(theirs):
            return [f"{where}: {len(ours)} items vs {len(theirs)}: {ours!r} vs {theirs!r}"]
        return [p for i, (a, b) in enumerate(zip(ours, theirs)) for p in compare(name, a, b, f"{path}[{i}]")]
    return [] if ours == theirs else [f"{where}: {ours!r} vs {theirs!r}"]


def run_case(m: Any, name: str, models: dict) -> Any:
    """The case's result as JSON values (tuples become lists)."""
    return json.loads(json.dumps(outcome(m, lambda: CASES[name](m, models)), default=_plain))


def _plain(value: Any) -> Any:
    """numpy values as JSON's (llama-cpp-python returns some log-probabilities as numpy floats)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not a JSON value")
