"""Recurrent and hybrid models (issue 35): llama.cpp's recorded scenarios on the tiny models of
tests/data/make_tiny_hybrid.py, replayed with F32 and F16 caches within the tolerances of
tests/data/REFERENCE.md. Each scenario exercises the recurrent memory: a prompt split into
micro-batches then single-token steps, several sequences in one batch, seq_cp then a step
on the copy, a refused partial seq_rm, whole and per-sequence state save and load."""
from __future__ import annotations

import pytest

import scenario_runner as sr
from conftest import load_model

#: the architectures of issue 35 the engine runs (each has f32 and q8_0 scenarios)
HYBRID_ARCHS = ("mamba2", "qwen35", "qwen35moe", "qwen3next")
NAMES = [f"hybrid-{a}-{t}" for a in HYBRID_ARCHS for t in ("f32", "q8_0")]


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("name", NAMES)
def test_hybrid_scenario(name: str, cache_type: str) -> None:
    scn = sr.load(name)
    model = load_model(scn["model"])
    got = sr.run(scn, model, cache_type)
    cmp = sr.compare(name, scn, got, cache_type)
    assert cmp.n_logits > 0, "no logits compared"
    problems = sr.check(cmp, scn["model"], model.arch)
    assert not problems, f"{name} [{cache_type}]: " + "; ".join(problems)


def test_every_recorded_hybrid_scenario_is_replayed() -> None:
    assert sorted(sr.scenario_names(("hybrid-",))) == sorted(NAMES)
