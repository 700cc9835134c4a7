"""ferrollama.llama_tokenizer against llama-cpp-python 0.3.36's LlamaTokenizer on the Qwen model."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ferrollama import llama_tokenizer as lt

RECORD = json.loads((Path(__file__).parent / "data" / "fixtures" / "chat_formats.json").read_text())["tokenizer"]


@pytest.fixture(scope="module")
def tokenizer(qwen_model):
    return lt.LlamaTokenizer(SimpleNamespace(model=qwen_model))  # what it uses of a Llama: .model


@pytest.mark.parametrize("case", RECORD["cases"], ids=lambda c: f"{c['text'][:12]!r}-bos{c['add_bos']}-sp{c['special']}")
def test_tokenizer_as_llama_cpp_python(tokenizer, case):
    ids = tokenizer.tokenize(case["text"].encode(), add_bos=case["add_bos"], special=case["special"])
    assert ids == case["tokens"]
    assert tokenizer.detokenize(ids).decode("utf-8", "replace") == case["detokenized"]
    assert tokenizer.detokenize(ids, special=True).decode("utf-8", "replace") == case["detokenized_special"]
    assert tokenizer.decode(ids) == case["decode"]
    assert tokenizer.encode(case["text"], add_bos=case["add_bos"], special=case["special"]) == case["encode"]


def test_the_record_exercises_special_parsing():
    specials = [c for c in RECORD["cases"] if c["text"].startswith("<|im_start|>") and not c["add_bos"]]
    assert len(specials[0]["tokens"]) < len(specials[1]["tokens"])  # special=True parses <|im_start|> as one token


class FakeHF:
    """A Hugging Face tokenizer's encode/decode over characters; ids >= 1000 are special."""

    def encode(self, text, add_special_tokens=True):
        return ([1000] if add_special_tokens else []) + [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join("<s>" if i >= 1000 else chr(i) for i in ids if not (skip_special_tokens and i >= 1000))


def test_hf_tokenizer_wraps_encode_and_decode():
    tok = lt.LlamaHFTokenizer(FakeHF())
    assert tok.tokenize(b"ab") == [1000, 97, 98] and tok.tokenize(b"ab", special=False) == [97, 98]
    assert tok.detokenize([1000, 97]) == b"a" and tok.detokenize([1000, 97], special=True) == b"<s>a"
    assert tok.detokenize([99], prev_tokens=[1000, 97], special=True) == b"c"


def test_hf_tokenizer_needs_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match="The `transformers` library is required"):
        lt.LlamaHFTokenizer.from_pretrained("some/model")


def test_base_tokenizer_is_abstract():
    with pytest.raises(TypeError):
        lt.BaseLlamaTokenizer()
