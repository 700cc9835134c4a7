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
from ferrollama.cli.common import CLIError
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
    # Gemma 3 270M has no template: the record is of llama.cpp's ChatML fallback, chosen here by name.
    fallback = ["--chat-template", "chatml"] if "gemma" in model else []
    r = ferrollama("chat", "-m", model_path(model), "-p", message["content"], "-st", "--temp", "0",
                   "-n", len(case["generated_tokens"]), "-c", case["context"]["n_ctx"], *fallback)
    assert r.returncode == 0, r.stderr
    text, whole = stable_text(case)         # up to llama.cpp's first near-tie (see test_cli_generate)
    if whole and "<|im_end|>" in case["text"]:
        # llama.cpp runs on into a turn it makes up (<|im_end|> is text to Gemma's vocab); the
        # answer ends at the template's end-of-turn marker, after the same text.
        assert r.stdout == case["text"][:case["text"].index("<|im_end|>")] + "\n"
    elif whole:
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


def test_the_default_model_answers_a_factual_question():
    """No -m: the default model (instruction-tuned, with a chat template) answers and stops at the
    end of its turn."""
    r = ferrollama("chat", "-p", "What is the capital of France?", "-st", "--temp", "0", "-c", 512, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "The capital of France is Paris.\n"
    assert "warning" not in r.stderr


def test_a_message_longer_than_the_context_is_refused_and_the_conversation_goes_on():
    conv = conversation("-n", "4", "-c", "256")
    long_message = "word " * 400
    with pytest.raises(CLIError, match=r"the message is too long \(\d+ tokens with the template's, max 251 for a "
                                       r"context of 256\); use a larger -c"):
        conv.answer(long_message, Sink())
    assert conv.messages == [] and conv.full == [] and conv.ctx.kv.used == 0
    out = Sink()
    conv.answer("Hello there", out)
    assert conv.messages[0] == {"role": "user", "content": "Hello there"} and len(conv.messages) == 2
    assert len(conv.full) == len(conv.template.tokens(conv.model, conv.messages[:1])) + 4


def test_chat_refuses_a_too_long_first_message_as_generate_does():
    r = ferrollama("chat", "-m", TINY, "-p", "word " * 400, "-st", "-c", 256, "--no-warmup")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("warning: this llama model has no chat template")
    assert r.stderr.splitlines()[-1].startswith("error: the message is too long (")
    interactive = ferrollama("chat", "-m", TINY, "-c", 256, "-n", 4, "--temp", "0", "--no-warmup",
                             input="word " * 400 + "\nHello\n")
    assert interactive.returncode == 0, interactive.stderr
    assert "error: the message is too long (" in interactive.stderr
    assert interactive.stdout.count("> ") == 3          # the refused message, "Hello", and the end of input


def test_chat_stops_at_the_template_s_turn_markers(gemma_model):
    """Gemma 3 270M has no template: it gets llama.cpp's built-in gemma format, whose turn markers
    are tokens that end an answer (<end_of_turn> is an end-of-generation token too)."""
    from ferrollama.chat import GEMMA, ChatTemplate

    template = ChatTemplate.from_model(gemma_model)
    assert template.source == GEMMA
    start, end = (gemma_model.tokenize(t, add_special=False, parse_special=True) for t in ("<start_of_turn>", "<end_of_turn>"))
    assert template.stop_tokens(gemma_model) == frozenset(start + end)
