"""`ferrollama generate --lookup N` and `-md DRAFT`: the same greedy text as plain generation,
the acceptance printed, incompatible flags refused."""
from __future__ import annotations

import subprocess
import sys

from conftest import REAL_MODELS, model_path

PROMPT = "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return a + b + c\n\ndef add4(a, b, c, d):\n"


def generate(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferrollama.cli", "generate", "-m", str(model_path(REAL_MODELS["qwen2"])),
                           "-p", PROMPT, "-n", "40", "--temp", "0", "-c", "512", *extra],
                          capture_output=True, text=True)


def test_lookup_and_draft_model_print_plain_greedy_text():
    plain = generate()
    assert plain.returncode == 0, plain.stderr
    lookup = generate("--lookup", "8")
    assert lookup.returncode == 0, lookup.stderr
    assert lookup.stdout == plain.stdout
    assert "accept    = " in lookup.stderr and "n_drafted = " in lookup.stderr
    draft = generate("-md", str(model_path(REAL_MODELS["qwen2"])), "--draft-max", "4")
    assert draft.returncode == 0, draft.stderr
    assert draft.stdout == plain.stdout


def test_flags_that_do_not_combine_are_refused():
    r = generate("--lookup", "8", "-i")
    assert r.returncode != 0 and "-i does not combine with speculative decoding" in r.stderr
    r = generate("--lookup", "8", "-md", "x.gguf")
    assert r.returncode != 0 and "give --lookup or -md, not both" in r.stderr
    r = generate("-md", str(model_path("tiny-llama-f32.gguf")))
    assert r.returncode != 0 and "vocabulary" in r.stderr
