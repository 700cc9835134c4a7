"""`ferrollama chat`: llama.cpp's answers through the chat template, the cache reused between
turns, context shifting, and Ctrl-C through a pseudo-terminal."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_path
from test_cli_generate import read_until, spawn, stable_text, wait

DATA = Path(__file__).parent / "data"
TINY = DATA / "models" / "tiny-llama-f32.gguf"


def ferrollama(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferrollama.cli", *map(str, args)], capture_output=True,
                          text=True, encoding="utf-8", **kwargs)


def chat_case(name: str) -> dict:
    data = json.loads((DATA / "fixtures" / f"greedy_{name}.json").read_text())
    return next(c for c in data["cases"] if c["kind"] == "chat")


@pytest.mark.parametrize("model, fixture", [("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b"),
                                            ("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m")])
def test_single_turn_answer_is_llama_cpp_s(model, fixture):
    case = chat_case(fixture)
    (message,) = case["messages"]
    r = ferrollama("chat", "-m", model_path(model), "-p", message["content"], "-st", "--temp", "0",
                   "-n", len(case["generated_tokens"]), "-c", case["context"]["n_ctx"])
    assert r.returncode == 0, r.stderr
    text, whole = stable_text(case)         # up to llama.cpp's first near-tie (see test_cli_generate)
    if whole:
        assert r.stdout == case["text"] + "\n"
    else:
        assert r.stdout.startswith(text) and len(text) >= 4


def conversation(*extra: str):
    from ferrollama.cli import build_parser
    from ferrollama.cli.chat import Conversation

    args = build_parser().parse_args(["chat", "-m", str(TINY), "--temp", "0", "--ignore-eos", "--no-warmup", *extra])
    return Conversation(args)


class Sink:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_second_turn_decodes_only_the_new_tokens():
    conv = conversation("-n", "8")
    conv.answer("Hello there", Sink())
    cached = list(conv.full)
    prompt = conv.template.tokens(conv.model, conv.messages + [{"role": "user", "content": "And then?"}])
    common = next(i for i, (a, b) in enumerate(zip(cached + [-1], prompt)) if a != b)
    before = conv.ctx.perf["n_p_eval"] + conv.ctx.perf["n_eval"]
    conv.answer("And then?", Sink())
    decoded = conv.ctx.perf["n_p_eval"] + conv.ctx.perf["n_eval"] - before
    assert common > 10
    assert decoded == len(prompt) - common + 8       # the new part of the prompt, then the 8 answer tokens
    assert conv.full[:len(prompt)] == prompt


def test_context_shift_in_a_long_conversation():
    conv = conversation("-n", "100", "-c", "256", "--keep", "4")
    for i in range(5):
        conv.answer(f"message number {i}", Sink())
    assert conv.dropped > 0
    assert conv.ctx.kv.seq_pos_max(0) == conv.n_past - 1 < 256
    # what the cache holds is the conversation with one window dropped after the kept tokens
    prompt = conv.template.tokens(conv.model, conv.messages + [{"role": "user", "content": "x"}])
    assert conv.full[:4 + 1] == prompt[:4 + 1]


def test_chat_through_a_terminal_with_ctrl_c():
    pid, fd = spawn(["chat", "-m", TINY, "--temp", "0", "--ignore-eos", "-n", "-1", "-c", "256", "--no-warmup"])
    try:
        read_until(fd, r"\n> $")
        os.write(fd, b"Tell me a very long story\n")
        read_until(fd, r"Tell me a very long story\r?\n.{20}")   # the answer is streaming
        os.write(fd, b"\x03")                                      # Ctrl-C stops the answer, not the program
        read_until(fd, r"\n> $")
        os.write(fd, b"\x03")                                      # at the prompt, Ctrl-C quits
        assert wait(pid, fd) == 130
    finally:
        os.close(fd)


def test_chat_end_of_input_exits_cleanly():
    r = ferrollama("chat", "-m", TINY, "--temp", "0", "-n", "4", "--no-warmup", input="hello\nhow are you\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n> ") == 3
    assert "eval time" in r.stderr


def test_template_errors_are_one_line(tmp_path):
    r = ferrollama("chat", "-m", TINY, "-p", "hi", "-st", "--chat-template", "{{ raise_exception('no chat here') }}")
    assert r.returncode == 1 and r.stderr == "error: no chat here\n"
    r = ferrollama("chat", "-m", TINY, "-p", "hi", "-st", "--chat-template", "{% if %}")
    assert r.returncode == 1 and "does not parse" in r.stderr and r.stderr.count("\n") == 1


def test_single_turn_needs_a_prompt():
    r = ferrollama("chat", "-m", TINY, "-st")
    assert r.returncode == 1 and "--single-turn needs" in r.stderr


del argparse
