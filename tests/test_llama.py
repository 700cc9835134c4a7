"""The high-level API (ferrollama.llama) and its building blocks: UTF-8 streaming, stop strings,
chat templates, and Llama's completion / chat / state on real and tiny models."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from ferrollama.chat import CHATML, ChatTemplate, ChatTemplateError
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
