"""The examples in examples/ run as a user would run them."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import model_path

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"
TINY = ROOT / "tests" / "data" / "models" / "tiny-llama-f32.gguf"
QWEN = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def run(name: str, *args) -> str:
    r = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_completion():
    out = run("completion.py", "-m", model_path(QWEN), "-p", "def is_prime(n):\n", "-n", 32)
    case = json.loads((ROOT / "tests/data/fixtures/greedy_qwen2.5-coder-0.5b.json").read_text())["cases"][0]
    assert out.startswith(case["prompt"] + case["text"] + "\n")
    assert "[32 tokens, finish_reason=length]" in out


def test_streaming_chat():
    out = run("streaming_chat.py", "-m", model_path(QWEN), "-n", 24, "Write a haiku about Rust.", "And about Go?")
    assert out.count("> ") == 2
    answers = re.split(r"^> .*$", out, flags=re.M)[1:]
    assert all(a.strip() for a in answers)


def test_batched():
    out = run("batched.py", "-m", TINY, "-np", 4, "-n", 24, "-p", "Hello")
    lines = [l for l in out.splitlines() if l.startswith("sequence ")]
    assert len(lines) == 4
    assert len(set(lines)) > 1            # each sequence has its own seed


def test_shared_prompt_matches_separate_decoding():
    import ferrollama as fl

    prefix, suffixes = "Once upon a time", ["the cat", "a dog", "my house"]
    out = run("shared_prompt.py", "-m", TINY, "-n", 8, "--prefix", prefix, "--type-k", "f32", *suffixes)
    model = fl.Model(str(TINY))
    for line, suffix in zip(out.splitlines(), suffixes):
        tokens = list(model.tokenize(prefix, add_special=True, parse_special=False)) + \
            list(model.tokenize(suffix, add_special=False, parse_special=False))
        ctx = fl.Context(model, n_ctx=256, type_k="f32", type_v="f32")
        ctx.decode(fl.Batch.from_tokens(tokens, logits="last"))
        got = []
        for i in range(8):
            got.append(int(np.argmax(ctx.logits(-1))))
            ctx.decode(fl.Batch.from_tokens([got[-1]], pos0=len(tokens) + i, logits="last"))
        assert line == f"{suffix}{model.detokenize(got)!r}"


def test_json_output():
    out = run("json_output.py", "-m", model_path(QWEN))
    data = json.loads(out)
    assert set(data) == {"name", "year", "languages"}
    assert isinstance(data["year"], int) and isinstance(data["languages"], list) and len(data["languages"]) <= 3


def test_embeddings():
    out = run("embeddings.py", "-m", model_path(QWEN))
    lines = out.splitlines()
    assert lines[0] == "3 embeddings of 896 values"
    sims = [[float(x) for x in l.split()[:3]] for l in lines[1:4]]
    assert all(abs(sims[i][i] - 1) < 1e-4 for i in range(3))
    assert sims[0][1] > sims[0][2]        # the two sentences about cats are closer
