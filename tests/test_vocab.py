"""Tokenizers through the Python API: llama.cpp's vocabulary suite (vocab-only files) and
tokenize.json (tokens and pieces of the real models and the tiny vocabulary), exactly."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ferrollama as fl
from conftest import load_model

DATA = Path(__file__).parent / "data"
SUITE = sorted(p.name[len("ggml-vocab-"):-len(".gguf.inp")] for p in (DATA / "vocab").glob("*.inp"))


def read_suite(name: str) -> dict[bytes, list[int]]:
    """The cases as llama.cpp's test-tokenizer-0 reads them (text -> ids; a repeated text keeps
    its last expectation)."""
    raw = (DATA / "vocab" / f"ggml-vocab-{name}.gguf.inp").read_bytes()
    texts = raw.split(b"\n__ggml_vocab_test__\n")
    if texts and texts[-1] == b"":
        texts.pop()
    lines = (DATA / "vocab" / f"ggml-vocab-{name}.gguf.out").read_text().split("\n")
    return {t: [int(x) for x in line.split()] for t, line in zip(texts, lines)}


@pytest.mark.parametrize("name", SUITE)
def test_llama_cpp_vocab_suite(name: str) -> None:
    model = fl.Model(DATA / "vocab" / f"ggml-vocab-{name}.gguf", vocab_only=True)
    cases = read_suite(name)
    assert len(cases) > 20
    wrong = [(t, ids, model.tokenize(t, add_special=False, parse_special=False))
             for t, ids in cases.items() if model.tokenize(t, add_special=False, parse_special=False) != ids]
    assert not wrong, f"{len(wrong)}/{len(cases)} differ, first: {wrong[0]}"


TOKENIZE = json.loads((DATA / "tokenize.json").read_text())


@pytest.mark.parametrize("entry", TOKENIZE, ids=[e["model"] for e in TOKENIZE])
def test_tokenize_json(entry: dict) -> None:
    model = load_model(entry["model"])
    for case in entry["cases"]:
        got = model.tokenize(case["text"], add_special=case["add_special"], parse_special=case["parse_special"])
        assert got == case["tokens"], case["text"][:60]
        # The records render a piece's broken UTF-8 bytes as backslash escapes.
        pieces = [model.token_to_piece(t, special=True).decode("utf-8", "backslashreplace") for t in got]
        assert pieces == case["pieces"], case["text"][:60]


def test_vocab_only_model_has_no_context() -> None:
    model = fl.Model(DATA / "vocab" / "ggml-vocab-qwen2.gguf", vocab_only=True)
    with pytest.raises(ValueError, match="vocab_only"):
        fl.Context(model)


def test_bad_tokens_raise_value_error(tiny_model: fl.Model) -> None:
    with pytest.raises(ValueError):
        tiny_model.token_to_piece(tiny_model.n_vocab)
    with pytest.raises(ValueError):
        tiny_model.detokenize([0, -1])
    with pytest.raises(ValueError):
        tiny_model.tokenize(123)  # type: ignore[arg-type]


def test_stream_decoder_never_splits_characters() -> None:
    model = load_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    text = "naïve café — 東京 🦀 ok"
    ids = model.tokenize(text, add_special=False)
    dec = model.stream_decoder()
    parts = [dec.push(t) for t in ids] + [dec.flush()]
    assert "".join(parts) == text
    assert all("\ufffd" not in p for p in parts)


@pytest.mark.parametrize("file_name", ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "gemma-3-270m-q4_k_m.gguf"])
@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80))
def test_round_trip(file_name: str, text: str) -> None:
    # BPE (Qwen2) and SPM with byte fallback (Gemma 3) represent every string; neither adds a
    # space prefix here, so detokenize(tokenize(s)) is s itself.
    model = load_model(file_name)
    assert model.detokenize(model.tokenize(text, add_special=False)) == text
