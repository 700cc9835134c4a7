"""`ferrollama tokenize`: llama.cpp's tokens for the recorded texts, ids and pieces."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_path

DATA = Path(__file__).parent / "data"
SUITES = {s["model"]: s["cases"] for s in json.loads((DATA / "tokenize.json").read_text())}


def ferrollama(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferrollama.cli", *map(str, args)], capture_output=True, **kwargs)


@pytest.mark.parametrize("model", ["tiny-llama-f32.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"])
def test_ids_match_llama_cpp(tmp_path, model):
    for i, case in enumerate(SUITES[model]):
        src = tmp_path / f"{i}.txt"
        src.write_text(case["text"], encoding="utf-8")
        flags = [] if case["add_special"] else ["--no-bos"]
        flags += [] if case["parse_special"] else ["--no-parse-special"]
        r = ferrollama("tokenize", "-m", model_path(model), "-f", src, "--ids", *flags)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == case["tokens"], case["text"][:40]


def test_pieces_and_count():
    case = SUITES["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"][0]
    r = ferrollama("tokenize", "-m", model_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), "--stdin", "--show-count",
                   input=case["text"].encode())
    assert r.returncode == 0, r.stderr
    expected = "".join(f"{token:6d} -> '{piece}'\n" for token, piece in zip(case["tokens"], case["pieces"]))
    assert r.stdout.decode() == expected + f"Total number of tokens: {len(case['tokens'])}\n"


def test_byte_pieces_are_escaped():
    r = ferrollama("tokenize", "-m", DATA / "models" / "tiny-llama-f32.gguf", "-p", "é")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert "(utf-8 decode failure)" in out and "\\xc3" in out


def test_escapes_in_prompt():
    tiny = DATA / "models" / "tiny-llama-f32.gguf"
    a = ferrollama("tokenize", "-m", tiny, "-p", "a\\nb", "--ids")
    b = ferrollama("tokenize", "-m", tiny, "-p", "a\nb", "--ids")
    c = ferrollama("tokenize", "-m", tiny, "-p", "a\\nb", "--ids", "--no-escape")
    assert a.stdout == b.stdout != c.stdout
