"""Weights are repacked on a thread after loading; products run in place until then.

The packed kernels repeat the in-place row arithmetic, so a model gives the same logits,
bit for bit, whether its matrices were repacked or not: what the thread has finished when a
decode starts must not matter.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ferrollama as fl
from conftest import REAL_MODELS, model_path

PROMPT = "def fibonacci(n):\n    "


def _logits(path: str) -> np.ndarray:
    m = fl.Model(path)
    ctx = fl.Context(m, n_ctx=256, n_threads=2)
    ctx.decode(fl.Batch.from_tokens(m.tokenize(PROMPT), logits="all"))
    return ctx.logits_all()


def _has_avx512_vnni() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= set(flags)


def _wait_for_repacking(m: fl.Model, timeout_s: float = 120.0) -> None:
    m.wait_repacked(timeout_s)
    assert m.repack_pending == 0, "the repacking thread did not finish"


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_logits_are_identical_in_place_and_repacked(arch: str) -> None:
    path = str(model_path(REAL_MODELS[arch]))
    # In place only: a process with repacking switched off.
    code = (
        "import json, sys, numpy as np, ferrollama as fl\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from test_repack import _logits\n"
        f"print(json.dumps(_logits({path!r}).view(np.uint32).tolist()))\n"
    )
    env = dict(os.environ, FERROLLAMA_NO_REPACK="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    in_place = np.array(json.loads(out.stdout), dtype=np.uint32).view(np.float32)
    # Repacked: wait for the thread, then decode.
    m = fl.Model(path)
    if _has_avx512_vnni():
        assert m.repack_pending > 0, "the packed kernels exist on this CPU: there is repacking to do"
    _wait_for_repacking(m)
    ctx = fl.Context(m, n_ctx=256, n_threads=2)
    ctx.decode(fl.Batch.from_tokens(m.tokenize(PROMPT), logits="all"))
    packed = ctx.logits_all()
    assert packed.shape == in_place.shape
    assert np.array_equal(packed.view(np.uint32), in_place.view(np.uint32))


def test_a_vocab_only_model_has_nothing_to_repack() -> None:
    m = fl.Model(str(model_path(REAL_MODELS["qwen2"])), vocab_only=True)
    assert m.repack_pending == 0


def test_waiting_for_the_repacking() -> None:
    m = fl.Model(str(model_path(REAL_MODELS["gemma3"])))
    with pytest.raises(ValueError):
        m.wait_repacked(-1.0)
    assert m.wait_repacked() is True
    assert m.repack_pending == 0
    assert m.wait_repacked(0.0) is True
