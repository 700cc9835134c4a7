"""The high-level API (ferrollama.llama) and its building blocks: UTF-8 streaming, stop strings,
chat templates, and Llama's completion / chat / state on real and tiny models."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from ferrollama.chat import CHATML, GEMMA, ChatTemplate, ChatTemplateError, ChatTemplateWarning
from ferrollama.llama import StopScanner, Utf8Stream, utf8_complete_len

DATA = Path(__file__).parent / "data"
FIXTURES = DATA / "fixtures"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


# --- text streaming ---------------------------------------------------------------------------

def test_utf8_stream_never_splits_a_character():
    text = "héllo 世界 🦀!"
    data = text.encode()
    for cut in range(1, len(data)):
        s = Utf8Stream()
        parts = [s.push(data[:cut]), s.push(data[cut:]), s.flush()]
        assert "".join(parts) == text
        for p in parts[:1]:
            assert "\ufffd" not in p
    s = Utf8Stream()
    assert [s.push(bytes([b])) for b in "🦀".encode()] == ["", "", "", "🦀"]


def test_utf8_stream_replaces_invalid_bytes():
    s = Utf8Stream()
    assert s.push(b"a\xffb") == "a\ufffdb"
    assert s.push(b"\xe4\xb8") == ""
    assert s.flush() == "\ufffd"


@pytest.mark.parametrize("data, n", [(b"", 0), (b"ab", 2), ("é".encode(), 2), ("é".encode()[:1], 0),
                                     ("🦀".encode()[:3], 0), (b"a" + "🦀".encode()[:2], 1), (b"\xff", 1)])
def test_utf8_complete_len(data, n):
    assert utf8_complete_len(data) == n


def test_stop_scanner_holds_back_possible_stops_and_cuts_at_the_first():
    sc = StopScanner(["\n\n", "END"])
    out = []
    for piece in [b"Hello", b" E", b"N", b"x\n", b"more\n", b"\nEND"]:
        text, stopped = sc.push(piece)
        out.append(text)
        if stopped:
            break
    assert out == ["Hello", " ", "", "ENx", "\nmore", ""]
    assert stopped and sc.text == "Hello ENx\nmore"
    assert "".join(out) + sc.flush() == "Hello ENx\nmore"


def test_stop_scanner_without_stops_streams_whole_characters():
    sc = StopScanner([])
    crab = "🦀".encode()
    assert sc.push(b"a" + crab[:2]) == ("a", False)
    assert sc.push(crab[2:]) == ("🦀", False)
    assert sc.flush() == ""


# --- chat templates ------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def gguf_template(path: Path) -> str:
    from ferrollama.cli.inspect import read_header

    return next(f.value for f in read_header(str(path)).fields if f.name == "tokenizer.chat_template")


def qwen_path() -> Path:
    from conftest import model_path

    return model_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")


def test_qwen_template_renders_as_the_recorded_prompt():
    case = next(c for c in fixture("greedy_qwen2.5-coder-0.5b.json")["cases"] if c["kind"] == "chat")
    t = ChatTemplate(gguf_template(qwen_path()), bos_token="<|endoftext|>", eos_token="<|im_end|>")
    assert t.render(case["messages"], add_generation_prompt=True) == case["prompt"]


def test_chatml_fallback_renders_as_the_recorded_prompt():
    case = next(c for c in fixture("greedy_gemma-3-270m.json")["cases"] if c["kind"] == "chat")
    t = ChatTemplate(CHATML, bos_token="<bos>", eos_token="<eos>", add_bos=True)
    assert t.apply(case["messages"], add_generation_prompt=True) == case["prompt"]


def test_gemma_builtin_renders_as_llama_cpp_s():
    """llama.cpp's built-in gemma format (llama_chat_apply_template with "gemma"): the system
    message folded into the first user turn, "assistant" written "model"."""
    data = fixture("chat_templates.json")
    t = ChatTemplate(GEMMA)
    expected = data["models"]["gemma-3-270m"]["llama_chat_apply_template_gemma_builtin"]
    assert t.render(data["messages"], add_generation_prompt=True) == expected


def test_a_model_without_a_template_gets_its_family_s_or_chatml_with_one_warning(gemma_model, tiny_model):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")                          # Gemma: llama.cpp's gemma format, silently
        assert ChatTemplate.from_model(gemma_model).source == GEMMA
    with pytest.warns(ChatTemplateWarning) as caught:           # llama: no family format in llama.cpp
        assert ChatTemplate.from_model(tiny_model).source == CHATML
    (warning,) = caught
    message = str(warning.message)
    assert message.startswith("this llama model has no chat template (tokenizer.chat_template) and llama.cpp "
                              "knows no format for its family: using ChatML")
    assert "--chat-template NAME|JINJA" in message and "chat_format=NAME" in message
    assert ChatTemplate.from_model(tiny_model, "gemma").source == GEMMA     # a name picks a built-in format


def test_stop_strings_of_a_template_are_its_turn_markers():
    assert ChatTemplate(CHATML).stop_strings() == ["<|im_end|>", "<|im_start|>"]
    assert ChatTemplate(GEMMA).stop_strings() == ["<end_of_turn>", "<start_of_turn>"]


def test_tools_render_with_hf_tojson():
    t = ChatTemplate(gguf_template(qwen_path()))
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Météo <now> & later",
                                             "parameters": {"z": 1, "a": 2}}}
    text = t.render([{"role": "user", "content": "hi"}], tools=[tool])
    # key order kept, no HTML escaping, non-ASCII kept: HF's tojson, not jinja's
    assert json.dumps(tool, ensure_ascii=False) in text
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"b": "<x>", "a": 1}}}]}
    text = t.render([{"role": "user", "content": "hi"}, call], add_generation_prompt=False)
    assert '{"name": "f", "arguments": {"b": "<x>", "a": 1}}' in text


def test_template_helpers():
    t = ChatTemplate("{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no ' + m.role) }}"
                     "{% endif %}{% generation %}{{ m.content | tojson(indent=1) }}{% endgeneration %}"
                     "{% if loop.index > 1 %}{% break %}{% endif %}{% endfor %}[{{ strftime_now('%Y') }}]",
                     bos_token="<s>", add_bos=True)
    msgs = [{"role": "user", "content": ["a"]}, {"role": "user", "content": "b"}, {"role": "user", "content": "c"}]
    import datetime

    year = datetime.datetime.now().strftime("%Y")
    assert t.render(msgs) == f'<s>[\n "a"\n]"b"[{year}]'
    assert t.apply(msgs) == f'[\n "a"\n]"b"[{year}]'
    with pytest.raises(ChatTemplateError, match="no bad"):
        t.render([{"role": "bad", "content": ""}])
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for %}")


def test_template_sandbox_refuses_unsafe_access():
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        t.render([])


# --- Llama on real and tiny models -------------------------------------------------------------

QWEN = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
TINY = DATA / "models" / "tiny-llama-f32.gguf"


@pytest.fixture(scope="module")
def qwen():
    from ferrollama.llama import Llama

    return Llama(qwen_path(), n_ctx=512, n_batch=512)


@pytest.fixture(scope="module")
def tiny():
    from ferrollama.llama import Llama

    return Llama(TINY, n_ctx=256, type_k="f32", type_v="f32")


def test_greedy_completion_is_llama_cpp_s(qwen):
    from test_cli_generate import stable_text

    for case in fixture("greedy_qwen2.5-coder-0.5b.json")["cases"]:
        out = qwen(case["prompt"], max_tokens=len(case["generated_tokens"]), temperature=0.0)
        assert out["object"] == "text_completion"
        assert out["usage"]["prompt_tokens"] == len(case["prompt_tokens"])
        text, whole = stable_text(case)     # up to llama.cpp's first near-tie
        if whole:
            assert out["choices"][0]["text"] == case["text"]
            assert out["choices"][0]["finish_reason"] == ("stop" if case["stopped_on_eog"] else "length")
        else:
            assert out["choices"][0]["text"].startswith(text)


def test_seeded_sampling_is_llama_cpp_python_s(qwen):
    """llama-cpp-python's chain (penalties, top-k, typical, top-p, min-p, temp, dist) with seed 42."""
    rec = fixture("sampler_chain_qwen2.5-coder-0.5b.json")
    out = qwen(rec["prompt"], max_tokens=len(rec["tokens"]), temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
               typical_p=1.0, repeat_penalty=1.0, seed=42)
    assert out["choices"][0]["text"] == rec["text"]


def test_streaming_gives_the_same_text_in_pieces(qwen):
    chunks = list(qwen("def is_prime(n):\n", max_tokens=24, temperature=0.0, stream=True))
    whole = qwen("def is_prime(n):\n", max_tokens=24, temperature=0.0)
    assert len(chunks) > 5
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 24


def test_stop_strings_cut_the_text(qwen):
    out = qwen("def is_prime(n):\n", max_tokens=32, temperature=0.0, stop=["return"])
    assert out["choices"][0]["text"] == "    if n <= 1:\n        "
    assert out["choices"][0]["finish_reason"] == "stop"
    chunks = list(qwen("def is_prime(n):\n", max_tokens=32, temperature=0.0, stop=["return"], stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == "    if n <= 1:\n        "


def test_prompt_prefix_is_reused(qwen):
    qwen.reset()
    qwen("def is_prime(n):\n", max_tokens=4, temperature=0.0)
    before = qwen.ctx.perf["n_p_eval"]
    qwen("def is_prime(n):\n    if n < 2:", max_tokens=1, temperature=0.0)
    n_new = len(qwen.tokenize("def is_prime(n):\n    if n < 2:")) - len(qwen.tokenize("def is_prime(n):\n"))
    assert qwen.ctx.perf["n_p_eval"] - before <= n_new + 1


def test_a_repeated_prompt_continues_as_it_did(qwen):
    """The same prompt again is not decoded again (not even its last token, which decoded alone
    would round differently from the batch that decoded it first): the same text follows."""
    qwen.reset()
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox"
    decoded = lambda: qwen.ctx.perf["n_p_eval"] + qwen.ctx.perf["n_eval"]
    start = decoded()
    first = qwen(prompt, max_tokens=12, temperature=0.0)["choices"][0]["text"]
    n_first = decoded() - start
    again = "".join(c["choices"][0]["text"] for c in qwen(prompt, max_tokens=12, temperature=0.0, stream=True))
    assert again == first
    assert decoded() - start - n_first == n_first - len(qwen.tokenize(prompt))   # only the generated tokens


def test_logprobs(qwen):
    out = qwen("def is_prime(n):\n", max_tokens=5, temperature=0.0, logprobs=3)
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 5
    assert "".join(lp["tokens"]) == out["choices"][0]["text"]
    for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert value <= 0 and len(top) == 3 and max(top.values()) == pytest.approx(value)   # greedy: the best one
    # llama-cpp-python's offsets count from the start of the prompt's text
    assert lp["text_offset"][0] == len("def is_prime(n):\n")
    assert lp["text_offset"][1] == lp["text_offset"][0] + len(lp["tokens"][0])


def test_chat_completion_is_llama_cpp_s(qwen):
    case = next(c for c in fixture("greedy_qwen2.5-coder-0.5b.json")["cases"] if c["kind"] == "chat")
    from test_cli_generate import stable_text

    out = qwen.create_chat_completion(case["messages"], temperature=0.0, max_tokens=len(case["generated_tokens"]))
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert out["usage"]["prompt_tokens"] == len(case["prompt_tokens"])
    text, whole = stable_text(case)         # this record has near-ties from its 3rd token on
    content = out["choices"][0]["message"]["content"]
    assert content == case["text"] if whole else content.startswith(text)
    chunks = list(qwen.create_chat_completion(case["messages"], temperature=0.0,
                                              max_tokens=len(case["generated_tokens"]), stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == content
    assert chunks[-1]["choices"][0]["finish_reason"] == out["choices"][0]["finish_reason"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_chat_without_max_tokens_ends_with_the_turn(qwen):
    """max_tokens=None: the answer ends at the template's end of turn, not at the context's end."""
    out = qwen.create_chat_completion([{"role": "user", "content": "What is the capital of France?"}],
                                      temperature=0.0)
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["choices"][0]["message"]["content"] == "The capital of France is Paris."


def test_json_schema_response(qwen):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    out = qwen.create_chat_completion([{"role": "user", "content": "What is 6 times 7? Answer in JSON."}],
                                      temperature=0.0, max_tokens=32,
                                      response_format={"type": "json_object", "schema": schema})
    assert set(json.loads(out["choices"][0]["message"]["content"])) == {"answer"}


def test_template_from_the_model_matches_the_recorded_tokens(qwen):
    case = next(c for c in fixture("greedy_qwen2.5-coder-0.5b.json")["cases"] if c["kind"] == "chat")
    assert qwen.chat_template.tokens(qwen.model, case["messages"]) == case["prompt_tokens"]


def test_generate_yields_tokens(tiny):
    import numpy as np

    tokens = tiny.tokenize("Hello")
    gen = tiny.generate(tokens, temp=0.0)
    got = [next(gen) for _ in range(5)]
    gen.close()
    import ferrollama as fl

    ctx = fl.Context(tiny.model, n_ctx=256, type_k="f32", type_v="f32")
    ctx.decode(fl.Batch.from_tokens(tokens, logits="last"))
    want = []
    for i in range(5):
        want.append(int(np.argmax(ctx.logits(-1))))
        ctx.decode(fl.Batch.from_tokens([want[-1]], pos0=len(tokens) + i, logits="last"))
    assert got == want


def test_tokenize_detokenize(tiny):
    tokens = tiny.tokenize(b"Hello world")
    assert tokens[0] == tiny.model.bos
    assert tiny.detokenize(tokens).decode().strip() == "Hello world"
    assert tiny.tokenize("Hello", add_bos=False)[0] != tiny.model.bos


def test_save_and_load_state(tiny):
    first = tiny("Once upon a time", max_tokens=8, temperature=0.0)
    state = tiny.save_state()
    assert state.n_tokens == tiny.n_tokens and state.llama_state_size > 0
    assert list(state.input_ids[:state.n_tokens]) == list(tiny.input_ids[:tiny.n_tokens])
    tail = tiny.generate([], temp=0.0, reset=False)
    a = [next(tail) for _ in range(4)]
    tail.close()
    tiny.load_state(state)
    tail = tiny.generate([], temp=0.0, reset=False)
    b = [next(tail) for _ in range(4)]
    tail.close()
    assert a == b and first["choices"][0]["text"]


def test_embeddings_mean_pooled():
    from ferrollama.llama import Llama

    tiny = Llama(TINY, n_ctx=256, embedding=True, pooling_type=1)     # LLAMA_POOLING_TYPE_MEAN
    vec = tiny.embed("hello world")
    vecs, count = tiny.embed(["hello world", "bye"], normalize=True, return_count=True)
    assert len(vec) == 256 and len(vecs) == 2 and count > 2
    assert np.linalg.norm(vecs[0]) == pytest.approx(1.0, abs=1e-5)
    assert np.asarray(vecs[0]) == pytest.approx(np.asarray(vec) / np.linalg.norm(vec), abs=1e-5)
    out = tiny.create_embedding("hello")
    assert out["object"] == "list" and out["data"][0]["object"] == "embedding"


def test_empty_prompt_and_full_context(tiny):
    out = tiny("", max_tokens=4, temperature=0.0)            # just BOS
    assert out["usage"]["prompt_tokens"] == 1
    with pytest.raises(ValueError, match=r"Requested tokens \(300\) exceed context window of 256"):
        tiny([1] * 300, max_tokens=1)


def test_embeddings_follow_the_model_s_pooling_type(tiny):
    """As in llama-cpp-python: a model whose file names no pooling type gets one vector per token."""
    per_token = tiny.embed("hello world")
    assert len(per_token) == len(tiny.tokenize("hello world")) and len(per_token[0]) == 256


# --- llama-cpp-python's API beyond the recorded suite (tests/test_llama_drop_in.py) ---------------

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_tools_in_auto_mode_come_back_as_tool_calls(qwen):
    """The model's template renders the tools; its <tool_call> answer is parsed, as the server does."""
    messages = [{"role": "user", "content": "What's the weather in Paris right now?"}]
    out = qwen.create_chat_completion(messages, tools=WEATHER, temperature=0.0, max_tokens=64)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    chunks = list(qwen.create_chat_completion(messages, tools=WEATHER, temperature=0.0, max_tokens=64, stream=True))
    streamed = [c["choices"][0]["delta"]["tool_calls"] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert [d[0]["function"]["name"] for d in streamed] == ["get_weather"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_legacy_functions_name_the_call_in_function_call(qwen):
    functions = [WEATHER[0]["function"]]
    out = qwen.create_chat_completion([{"role": "user", "content": "Weather in Rome?"}], functions=functions,
                                      function_call={"name": "get_weather"}, temperature=0.0, max_tokens=64)
    message = out["choices"][0]["message"]
    assert message["function_call"]["name"] == "get_weather"
    assert json.loads(message["function_call"]["arguments"]) == {"city": "Rome"}
    with pytest.raises(ValueError, match="not among the tools"):
        qwen.create_chat_completion([{"role": "user", "content": "hi"}], tools=WEATHER,
                                    tool_choice={"type": "function", "function": {"name": "nope"}})


def test_chat_logprobs_without_logits_all(qwen):
    out = qwen.create_chat_completion([{"role": "user", "content": "Say hi."}], temperature=0.0, max_tokens=4,
                                      logprobs=True, top_logprobs=3)
    content = out["choices"][0]["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == out["choices"][0]["message"]["content"]
    for c in content:
        assert len(c["top_logprobs"]) >= 3 and c["logprob"] == pytest.approx(max(t["logprob"] for t in c["top_logprobs"]))


def test_fill_in_the_middle_uses_the_model_s_fim_tokens(qwen):
    m = qwen.model
    tokens = qwen._completion_prompt("def add(a, b):\n    ", "\n\nprint(add(1, 2))")
    assert tokens[0] == m.fim_pre and m.fim_suf in tokens and tokens[-1] == m.fim_mid
    out = qwen("def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))", max_tokens=8, temperature=0.0)
    assert out["choices"][0]["text"].startswith("return a + b")


def test_fill_in_the_middle_needs_fim_tokens(tiny):
    with pytest.raises(ValueError, match="FIM"):
        tiny("Once", suffix="end", max_tokens=2)


def test_min_tokens_processor_and_logit_bias(qwen):
    eos = qwen.token_eos()
    prompt = "The capital of France is"
    out = qwen(prompt, max_tokens=3, temperature=0.0, logit_bias={qwen.tokenize(b" Lyon", add_bos=False)[0]: 100.0})
    assert out["choices"][0]["text"].startswith(" Lyon")
    from ferrollama import LogitsProcessorList, MinTokensLogitsProcessor

    proc = MinTokensLogitsProcessor(2, 3)
    scores = proc(np.array([1, 2, 3], dtype=np.intc), np.zeros(8, dtype=np.float32))
    assert scores[3] == -np.inf                                  # the first token: EOS forbidden
    after = LogitsProcessorList([proc])(np.array([1, 2, 3, 4, 5], dtype=np.intc), np.zeros(8, dtype=np.float32))
    assert after[3] == 0                                         # two tokens later: allowed
    out = qwen("Say OK.", max_tokens=6, temperature=0.0,
               logits_processor=LogitsProcessorList([MinTokensLogitsProcessor(6, eos)]))
    assert out["usage"]["completion_tokens"] == 6


def test_constructor_keywords_and_their_errors(tiny):
    from ferrollama.llama import NO_EFFECT_ON_CPU, Llama, ModelPathError

    llm = Llama(TINY, n_ctx=128, verbose=False, **{k: v for k, v in zip(
        NO_EFFECT_ON_CPU, (-1, 1, 0, [1.0], False, True, True, True, False, True))})
    assert llm.n_ctx() == 256 and llm.pooling_type() == "none"      # n_ctx is padded to 256 cells
    with pytest.raises(ModelPathError) as e:
        Llama("/no/such/model.gguf")
    assert isinstance(e.value, ValueError) and isinstance(e.value, fl_errors().GGUFError)
    with pytest.raises(fl_errors().UnsupportedError, match="non-causal"):
        Llama(TINY, n_ctx=128, verbose=False, attention_type=1)
    with pytest.raises(ValueError, match="cache type"):
        Llama(TINY, n_ctx=128, verbose=False, type_k=99)


def test_unknown_keywords_warn_once_and_wrappers_old_keywords_pass_silently(tiny):
    import warnings

    from ferrollama.llama import Llama

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = Llama(TINY, n_ctx=128, verbose=False, temprature=0.5, top_kk=3, n_seq_max=2,
                    n_parts=-1, f16_kv=True, device="cpu")         # LangChain's, to every Llama
    assert [str(w.message) for w in caught] == ["Llama: unknown keyword arguments ignored: temprature, top_kk"]
    assert caught[0].filename == __file__                          # the caller's line
    assert llm.context_params.n_seq_max == 2                        # a Context's keyword goes to it
    assert "temprature" not in llm.__getstate__()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Llama(TINY, n_ctx=128, verbose=False, n_parts=-1, f16_kv=True, low_vram=False, mul_mat_q=True)


def test_context_and_model_params_with_llama_cpp_python_s_names(tiny):
    from ferrollama.llama import Llama

    llm = Llama(TINY, n_ctx=128, n_batch=64, n_threads=1, verbose=False, type_k="q8_0", flash_attn=True,
                rope_freq_base=20000.0, use_mlock=True, n_gpu_layers=-1, tensor_split=[1.0])
    cp, mp = llm.context_params, llm.model_params
    assert (cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch, cp.n_seq_max) == (128, 64, 64, 1, 1, 1)
    assert (cp.type_k, cp.type_v, cp.flash_attn_type, cp.rope_freq_base, cp.rope_scaling_type) == (8, 1, 1, 20000.0, -1)
    assert (cp.pooling_type, cp.attention_type, cp.embeddings, cp.yarn_ext_factor) == (-1, -1, False, -1.0)
    assert (mp.n_gpu_layers, mp.use_mmap, mp.use_mlock, mp.load_mode, mp.vocab_only, mp.tensor_split) == (
        -1, True, True, 3, False, (1.0,))
    assert (llm.n_threads, llm.n_threads_batch, llm.numa, llm.tensor_split, llm.verbose) == (1, 1, False, [1.0], False)
    assert str(llm.model_path) == str(TINY)
    with pytest.raises(AttributeError):
        cp.n_ctx = 256
    embed = Llama(TINY, n_ctx=0, verbose=False, embedding=True, pooling_type=1, n_threads=1, n_threads_batch=2)
    assert (embed.context_params.n_ctx, embed.context_params.pooling_type, embed.context_params.embeddings) == (
        embed.model.n_ctx_train, 1, True)
    assert (embed.n_threads, embed.n_threads_batch, embed.context_params.n_threads_batch) == (1, 2, 2)


def fl_errors():
    import ferrollama

    return ferrollama


def test_vocab_only_tokenizes_but_does_not_generate():
    from ferrollama.llama import Llama

    llm = Llama(TINY, vocab_only=True, verbose=False)
    assert llm.tokenize(b"hello")[0] == llm.token_bos()
    with pytest.raises(ValueError, match="no context"):
        llm("hello", max_tokens=2)


def test_from_pretrained_needs_huggingface_hub(monkeypatch):
    import sys

    from ferrollama.llama import Llama

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match="huggingface-hub"):
        Llama.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "*q4_k_m.gguf")


def test_a_llama_cpp_python_style_draft_model_is_called_with_the_tokens(qwen):
    """llama-cpp-python's draft models are callables from the input ids to drafted ids."""
    from ferrollama.llama import Llama

    seen = []

    def drafter(input_ids):
        seen.append(len(input_ids))
        return np.array([], dtype=np.intc)

    llm = Llama(qwen_path(), n_ctx=512, verbose=False, draft_model=drafter)
    plain = qwen("The three primary colors are", max_tokens=6, temperature=0.0)["choices"][0]["text"]
    assert llm("The three primary colors are", max_tokens=6, temperature=0.0)["choices"][0]["text"] == plain
    assert seen and seen == sorted(seen)


def test_chat_formats_by_name_and_the_llama_2_fallback():
    """chat_format names llama-cpp-python's formats (ferrollama.llama_chat_format); a model
    without a template chats in its "llama-2" format, as there."""
    from ferrollama import llama_chat_format
    from ferrollama.llama import Llama

    with pytest.raises(ValueError, match="vicunaa"):
        Llama(TINY, n_ctx=256, verbose=False, chat_format="vicunaa")
    llm = Llama(TINY, n_ctx=256, verbose=False)
    messages = [{"role": "user", "content": "hi"}]
    formatted = llama_chat_format.format_llama2(messages=messages)
    out = llm.create_chat_completion(messages, max_tokens=3, temperature=0.0)
    assert out["usage"]["prompt_tokens"] == len(llm.tokenize(formatted.prompt.encode(), special=True))


def test_llama_cpp_python_s_prompt_lookup_class_drafts_as_a_callable(qwen):
    from ferrollama import LlamaDraftModel, LlamaPromptLookupDecoding
    from ferrollama.llama import Llama

    drafter = LlamaPromptLookupDecoding(num_pred_tokens=4)
    assert isinstance(drafter, LlamaDraftModel)
    assert drafter(np.array([7, 8, 9, 7, 8], dtype=np.intc)).tolist() == [9, 7, 8]
    llm = Llama(qwen_path(), n_ctx=512, verbose=False, draft_model=drafter)
    prompt = "a b c d e f a b c d e f a b c"
    plain = qwen(prompt, max_tokens=8, temperature=0.0)["choices"][0]["text"]
    assert llm(prompt, max_tokens=8, temperature=0.0)["choices"][0]["text"] == plain
    assert llm.speculative_stats.n_accepted > 0


def test_lora_path_and_scale_apply_the_adapter_as_the_core_api_does():
    import ferrollama as fl
    from ferrollama.llama import Llama

    base = str(DATA / "models" / "tiny-llama3-f32.gguf")
    adapter = str(DATA / "lora" / "lora-llama3-a.gguf")
    llm = Llama(base, n_ctx=256, verbose=False, lora_path=adapter, lora_scale=0.5, lora_base="ignored.gguf")
    tokens = llm.tokenize(b"Once upon a time")
    llm.eval(tokens)
    model = fl.Model(base)
    ctx = fl.Context(model, n_ctx=256)
    ctx.set_lora(fl.LoraAdapter(model, adapter), 0.5)
    ctx.decode(fl.Batch.from_tokens(tokens, logits="last"))
    assert np.array_equal(llm.ctx.logits(-1), ctx.logits(-1))
    plain = fl.Context(model, n_ctx=256)
    plain.decode(fl.Batch.from_tokens(tokens, logits="last"))
    assert np.abs(plain.logits(-1) - ctx.logits(-1)).max() > 0.1          # the adapter matters
    with pytest.raises(RuntimeError, match="Failed to initialize LoRA adapter"):
        Llama(TINY, n_ctx=256, verbose=False, lora_path=str(DATA / "lora" / "lora-phi3.gguf"))   # a phi3 adapter
