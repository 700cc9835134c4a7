"""ferrollama.llama_chat_format against llama-cpp-python 0.3.36's records (benches/record_chat_formats.py)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from ferrollama import llama_chat_format as lcf
from ferrollama import llama_grammar

RECORD = json.loads((Path(__file__).parent / "data" / "fixtures" / "chat_formats.json").read_text())
CONVERSATIONS = RECORD["conversations"]


def rendered(formatter, messages, **kwargs) -> dict:
    try:
        r = formatter(messages=copy.deepcopy(messages), **kwargs)
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e)}
    return {"prompt": r.prompt, "stop": r.stop, "added_special": r.added_special,
            "has_stopping_criteria": r.stopping_criteria is not None}


def test_the_same_handler_names_are_registered():
    assert list(lcf.LlamaChatCompletionHandlerRegistry()._chat_handlers) == [
        n for n in RECORD["registered"] if n not in ("functionary", "functionary-v1", "functionary-v2",
                                                     "chatml-function-calling")
    ] + ["chatml-function-calling", "functionary", "functionary-v1", "functionary-v2"]
    assert sorted(lcf._FORMATTERS) == sorted(RECORD["formats"])


FORMAT_CASES = [(f, c) for f in RECORD["formats"] for c in RECORD["formats"][f]]


@pytest.mark.parametrize("fmt,conversation", FORMAT_CASES, ids=[f"{f}/{c}" for f, c in FORMAT_CASES])
def test_format_renders_as_llama_cpp_python(fmt, conversation):
    expected = RECORD["formats"][fmt][conversation]
    assert rendered(lcf._FORMATTERS[fmt], CONVERSATIONS[conversation]) == expected


JINJA_CASES = [(t, c) for t in RECORD["jinja"] for c in RECORD["jinja"][t]["cases"]]


@pytest.mark.parametrize("template,case", JINJA_CASES, ids=[f"{t}/{c}" for t, c in JINJA_CASES])
def test_jinja2_chat_formatter_renders_as_llama_cpp_python(template, case):
    rec = RECORD["jinja"][template]
    conversation, flag = case.split("/")
    formatter = lcf.Jinja2ChatFormatter(template=rec["template"], eos_token=rec["eos_token"],
                                        bos_token=rec["bos_token"], add_generation_prompt=flag.endswith("True"),
                                        stop_token_ids=[7])
    got = rendered(formatter, CONVERSATIONS[conversation])
    expected = rec["cases"][case]
    if "error" in expected:  # the template's raise_exception: a ValueError with its message
        assert expected["error"] == "ValueError" and isinstance(formatter, lcf.Jinja2ChatFormatter)
        assert got == {"error": "ChatTemplateError", "message": expected["message"]}
    else:
        assert got == expected


def test_jinja2_stopping_criteria_stop_on_the_listed_tokens():
    r = lcf.Jinja2ChatFormatter("{{ messages[0]['content'] }}", "</s>", "<s>", stop_token_ids=[7, 9])(
        messages=[{"role": "user", "content": "x"}])
    logits = np.zeros((1, 4), dtype=np.float32)
    assert [r.stopping_criteria(np.array(ids, dtype=np.intc), logits) for ids in ([1, 7], [7, 1], [9])] == [
        True, False, True]
    assert lcf.Jinja2ChatFormatter("x", "</s>", "<s>")(messages=[]).stopping_criteria is None


def test_a_template_that_does_not_parse_is_a_value_error():
    with pytest.raises(ValueError, match="does not parse"):
        lcf.Jinja2ChatFormatter("{% for m in messages %}", "</s>", "<s>")


@pytest.mark.parametrize("case", list(RECORD["hf_tokenizer_config"]["cases"]))
def test_hf_tokenizer_config_formatter_renders_as_llama_cpp_python(case):
    rec = RECORD["hf_tokenizer_config"]
    conversation, flag = case.split("/")
    formatter = lcf.hf_tokenizer_config_to_chat_formatter(rec["config"], add_generation_prompt=flag.endswith("True"))
    assert rendered(formatter, CONVERSATIONS[conversation]) == rec["cases"][case]


@pytest.mark.parametrize("case", list(RECORD["guess"]))
def test_guess_chat_format_as_llama_cpp_python(case):
    rec = RECORD["guess"][case]
    assert lcf.guess_chat_format_from_gguf_metadata(rec["metadata"]) == rec["guess"]


def test_the_real_models_guesses():
    # Qwen2.5's template is its own (not the plain ChatML constant); gemma-3-270m's GGUF has none.
    assert {k: RECORD["guess"][k]["guess"] for k in ("chatml", "mistral", "mixtral", "llama3")} == {
        "chatml": "chatml", "mistral": "mistral-instruct", "mixtral": "mistral-instruct", "llama3": "llama-3"}
    assert RECORD["guess"]["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]["guess"] is None


def test_unknown_handler_name_is_a_value_error():
    with pytest.raises(ValueError, match=r"Invalid chat handler: nope \(valid formats: \['llama-2'"):
        lcf.get_chat_completion_handler("nope")
    with pytest.raises(lcf.LlamaChatCompletionHandlerNotFoundException):
        lcf.get_chat_completion_handler("nope")


def test_registering_a_taken_name_needs_overwrite():
    registry = lcf.LlamaChatCompletionHandlerRegistry()
    assert registry is lcf.LlamaChatCompletionHandlerRegistry()
    with pytest.raises(ValueError, match="already registered"):
        lcf.register_chat_format("chatml")(lcf.format_chatml)

    @lcf.register_chat_completion_handler("test-only-handler")
    def handler(**kwargs):
        return "answer"

    try:
        assert lcf.get_chat_completion_handler("test-only-handler")() == "answer"
    finally:
        registry.unregister_chat_handler("test-only-handler")
    with pytest.raises(ValueError, match="No formatter registered"):
        registry.unregister_chat_handler("test-only-handler")


# --- handlers, driven by a fake llama with canned completions ------------------------------------

class FakeLlama:
    """The recorder's fake: tokenize marks BOS and special parsing; create_completion replays responses."""

    verbose = False

    def __init__(self, responses: list):
        self.responses = copy.deepcopy(responses)
        self.calls = []

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list:
        return ([1] if add_bos else []) + list(text) + ([-1] if special else [])

    def create_completion(self, **kwargs):
        self.calls.append(kwargs)
        response = self.responses.pop(0)
        return iter(response) if kwargs.get("stream") else response


def described(call: dict) -> dict:
    out = dict(call)
    grammar = out.get("grammar")
    if grammar is not None:
        assert isinstance(grammar, llama_grammar.LlamaGrammar) and grammar._root == "root"
        out["grammar"] = grammar._grammar
    for key in ("stopping_criteria", "logits_processor"):
        if key in out:
            out[key] = None if out[key] is None else "present"
    return out


def expected_call(call: dict, handler: str, request: dict) -> dict:
    """The recorded call, with the engine's grammar for a JSON schema (llama-cpp-python's older Python
    converter writes other GBNF for the same schemas), and, for chatml-function-calling, the seed and
    logit_bias it is given (llama-cpp-python drops them there)."""
    out = dict(call)
    grammar = out.get("grammar")
    if grammar is not None:
        out["grammar"] = (grammar["gbnf"] if "gbnf" in grammar
                          else llama_grammar.json_schema_to_gbnf(json.dumps(grammar["json_schema"])))
    if handler == "chatml-function-calling":
        out["seed"] = request.get("seed")
        out["logit_bias"] = request.get("logit_bias")
        if request.get("tool_choice", request.get("function_call")) == "auto":
            # The automatic flow's message is free text (llama-cpp-python constrains it with the
            # next-function grammar), and max_tokens bounds the message and the arguments.
            if out["prompt"].endswith("message:\n"):
                out["grammar"], out["max_tokens"] = None, request.get("max_tokens")
            elif out["prompt"].endswith(":\n"):
                out["max_tokens"] = request.get("max_tokens")
    return out


@pytest.mark.parametrize("case", list(RECORD["handlers"]))
def test_handler_as_llama_cpp_python(case):
    rec = RECORD["handlers"][case]
    llama = FakeLlama(rec["responses"])
    handler = lcf.get_chat_completion_handler(rec["handler"])
    if "error" in rec:
        with pytest.raises(ValueError) as e:
            result = handler(llama=llama, **copy.deepcopy(rec["request"]))
            list(result) if rec["request"].get("stream") else result
        assert str(e.value) == rec["error"]["message"]
    else:
        result = handler(llama=llama, **copy.deepcopy(rec["request"]))
        result = list(result) if rec["request"].get("stream") else result
        expected = copy.deepcopy(rec["result"])
        if case == "cfc/auto_one_call":  # llama-cpp-python names the legacy function_call "" here
            message = expected["choices"][0]["message"]
            assert message["function_call"]["name"] == ""
            message["function_call"]["name"] = message["tool_calls"][0]["function"]["name"]
        assert result == expected
    assert [described(c) for c in llama.calls] == [expected_call(c, rec["handler"], rec["request"])
                                                    for c in rec["calls"]]


def test_handler_cases_cover_the_shapes():
    handlers = RECORD["handlers"]
    assert handlers["cfc/auto_two_calls"]["result"]["choices"][0]["message"]["tool_calls"][1]["function"] == {
        "name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}
    assert [c["choices"][0]["finish_reason"] for c in handlers["cfc/named_stream"]["result"]] == [
        None, None, None, None, "tool_calls"]
    assert handlers["chatml/logprobs"]["result"]["choices"][0]["logprobs"]["content"][1] == {
        "token": "!", "bytes": None, "logprob": -1.5,
        "top_logprobs": [{"token": "!", "logprob": -1.5, "bytes": None}, {"token": ".", "logprob": -1.75, "bytes": None}]}


def test_chatml_function_calling_refuses_what_it_cannot_honour():
    with pytest.raises(TypeError, match="does not take \\['suffix'\\]"):
        lcf.chatml_function_calling(llama=FakeLlama([]), messages=CONVERSATIONS["user"], suffix="x")
    with pytest.raises(ValueError, match="tool_choice must be"):
        lcf.chatml_function_calling(llama=FakeLlama([]), messages=CONVERSATIONS["user"],
                                    tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
                                    tool_choice="any")


def test_chatml_function_calling_required_must_call_a_function():
    # llama-cpp-python 0.3.36 fails an assertion on "required"; here it is "auto" without "message:".
    rec = RECORD["handlers"]["cfc/auto_one_call"]
    request = dict(copy.deepcopy(rec["request"]), tool_choice="required")
    del request["function_call"]
    llama = FakeLlama(rec["responses"])
    result = lcf.get_chat_completion_handler("chatml-function-calling")(llama=llama, **request)
    assert llama.calls[0]["grammar"]._grammar == (
        'root   ::= functions\nfunctions ::= "functions.get_weather:" | "functions.get_time:"\n')
    assert [c["function"] for c in result["choices"][0]["message"]["tool_calls"]] == [
        {"name": "get_time", "arguments": "{\"tz\": \"CET\"}"}]
    assert result["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("name", ["functionary", "functionary-v1", "functionary-v2"])
def test_functionary_says_why_it_is_unavailable(name):
    with pytest.raises(lcf.ChatHandlerUnavailableError, match="Hugging Face tokenizer"):
        lcf.get_chat_completion_handler(name)(llama=FakeLlama([]), messages=CONVERSATIONS["user"])


@pytest.mark.parametrize("cls", [lcf.MTMDChatHandler, lcf.Gemma4ChatHandler, lcf.Llava15ChatHandler,
                                 lcf.Llava16ChatHandler, lcf.ObsidianChatHandler, lcf.MoondreamChatHandler,
                                 lcf.NanoLlavaChatHandler, lcf.Llama3VisionAlpha, lcf.Qwen25VLChatHandler,
                                 lcf.MiniCPMv26ChatHandler])
def test_mtmd_handlers_need_an_existing_projector_file(cls, tmp_path):
    # as llama-cpp-python's: the path is checked at construction, the file loaded at the first chat
    with pytest.raises(ValueError, match="does not exist"):
        cls(clip_model_path=str(tmp_path / "mmproj.gguf"))
    with pytest.raises(ValueError, match="Hugging Face"):
        cls.from_pretrained(repo_id="x", filename="y")


def test_hf_autotokenizer_needs_transformers(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match="transformers"):
        lcf.hf_autotokenizer_to_chat_formatter("some/model")
