"""Tool-call formats: detection from chat templates, parsing each family's output, and the grammar
that forces a call."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import REAL_MODELS, load_model
from ferrollama import samplers as S
from ferrollama.tools import detect_format, parse_output, required_call_grammar, tool_call_marker

WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def calls(text: str, fmt: str) -> tuple[str, list[tuple[str, dict]]]:
    parsed = parse_output(text, fmt)
    return parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


def test_formats_from_templates():
    qwen = load_model(REAL_MODELS["qwen2"]).chat_template
    gemma = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
    assert detect_format(qwen) == "hermes" and detect_format(gemma) == "generic"
    assert detect_format("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect_format("<|start_header_id|>{% if tools %}{% endif %}") == "llama3"
    assert detect_format("<|start|>assistant<|channel|>final<|message|>") == "gpt-oss"
    assert tool_call_marker("hermes") == "<tool_call>" and tool_call_marker("llama3") is None


@pytest.mark.parametrize("text, fmt, expected", [
    ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "hermes",
     ("Let me check.", [("get_weather", {"city": "Paris"})])),
    ('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {"x": 1}}\n</tool_call>',
     "hermes", ("", [("a", {}), ("b", {"x": 1})])),
    ('{"name": "get_weather", "arguments": {"city": "Rome"}}', "hermes", ("", [("get_weather", {"city": "Rome"})])),
    ('```json\n{"name": "f", "arguments": {"a": 1}}\n```', "hermes", ("", [("f", {"a": 1})])),
    ("Just text, {not json}.", "hermes", ("Just text, {not json}.", [])),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}', "llama3",
     ("", [("get_weather", {"city": "Oslo"})])),
    ('{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}', "llama3", ("", [("f", {"a": 1}), ("g", {})])),
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lima"}, "id": "abc123def"}]', "mistral",
     ("", [("get_weather", {"city": "Lima"})])),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Kyiv"}', "mistral", ("", [("get_weather", {"city": "Kyiv"})])),
    ('<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather '
     '<|constrain|>json<|message|>{"city": "Cairo"}<|call|>', "gpt-oss", ("", [("get_weather", {"city": "Cairo"})])),
    ('<|channel|>final<|message|>Hello there.<|return|>', "gpt-oss", ("Hello there.", [])),
    ('```tool_code\nget_weather(city="Quito")\n```', "generic", ("", [("get_weather", {"city": "Quito"})])),
    ('{"tool_call": {"name": "get_weather", "arguments": {"city": "Lagos"}}}', "generic",
     ("", [("get_weather", {"city": "Lagos"})])),
    ("The weather is fine.", "generic", ("The weather is fine.", [])),
])
def test_parse_output(text, fmt, expected):
    assert calls(text, fmt) == expected


def test_harmony_reasoning():
    parsed = parse_output("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>",
                          "gpt-oss")
    assert (parsed.content, parsed.reasoning, parsed.tool_calls) == ("Hi", "Think.", [])


def test_an_answer_cut_by_max_tokens_ends_with_length_even_with_a_call():
    from ferrollama.chat.tools import assistant_message

    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_w'
    for finish, expected in (("stop", "tool_calls"), ("length", "length")):
        message, reason = assistant_message(text, "hermes", True, finish)
        assert reason == expected and [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
        assert message["content"] == '<tool_call>\n{"name": "get_w'   # the cut call: text, as the model wrote it
    assert assistant_message("Hello.", "hermes", True, "length") == ({"role": "assistant", "content": "Hello."}, "length")


@pytest.mark.parametrize("fmt, sentence", [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("generic", '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
])
def test_required_call_grammar_accepts_the_format_and_nothing_else(fmt, sentence):
    model = load_model(REAL_MODELS["qwen2"])
    gbnf = required_call_grammar(WEATHER, fmt, S.Grammar.json_schema_to_gbnf, parallel=False)

    def allowed(chain) -> set[int]:
        cands = chain.apply(np.zeros(model.n_vocab, dtype=np.float32))
        return {int(i) for i, lg in zip(cands.ids, cands.logits) if lg != -np.inf}

    def accepts(text: str) -> bool:
        """Whether the grammar allows every token of text and then the end."""
        chain = S.Chain([S.Grammar(model, gbnf)])
        for t in model.tokenize(text, add_special=False, parse_special=True):
            if t not in allowed(chain):
                return False
            chain.accept(t)
        return model.eos in allowed(chain)

    assert accepts(sentence)
    assert not accepts(sentence.replace("get_weather", "get_wether"))
    assert not accepts(sentence[:-1])
    assert parse_output(sentence, fmt).tool_calls[0].name == "get_weather"
    with pytest.raises(ValueError, match="gpt-oss"):
        required_call_grammar(WEATHER, "gpt-oss", S.Grammar.json_schema_to_gbnf)
