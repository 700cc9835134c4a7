"""Model and context parameters that change results: kv_overrides' rules (the logits themselves
are compared with llama.cpp's in test_conformance's params-* scenarios)."""
from __future__ import annotations

import pytest

import ferrollama as fl
from conftest import model_path

TINY = str(model_path("tiny-llama3-f32.gguf"))


def test_an_override_of_another_kind_is_refused() -> None:
    with pytest.raises(fl.GGUFError, match="llama.rope.freq_base.*FLOAT32.*STRING"):
        fl.Model(TINY, kv_overrides={"llama.rope.freq_base": "fast"})
    with pytest.raises(fl.GGUFError, match="block_count.*UINT32.*FLOAT64"):
        fl.Model(TINY, kv_overrides={"llama.block_count": 2.0})


def test_values_of_other_python_types_are_refused() -> None:
    with pytest.raises(ValueError, match="bool, int, float or str"):
        fl.Model(TINY, kv_overrides={"llama.rope.freq_base": [1.0]})


def test_an_override_changes_what_the_engine_reads() -> None:
    base = fl.Model(TINY)
    assert fl.Model(TINY, kv_overrides={"llama.context_length": 77}).n_ctx_train == 77 != base.n_ctx_train
    # tokenizer settings too: no BOS when the override says so
    no_bos = fl.Model(TINY, kv_overrides={"tokenizer.ggml.add_bos_token": False})
    assert base.tokenize("hello")[0] == base.bos
    assert no_bos.tokenize("hello") == base.tokenize("hello")[1:]


def test_a_key_the_file_lacks_is_added() -> None:
    m = fl.Model(TINY, kv_overrides={"llama.rope.scaling.factor": 2.0})
    ctx_plain, ctx_scaled = fl.Context(fl.Model(TINY), n_ctx=64), fl.Context(m, n_ctx=64)
    for ctx in (ctx_plain, ctx_scaled):
        ctx.decode(fl.Batch.from_tokens([1, 5, 9, 30, 7], logits="last"))
    assert abs(ctx_plain.logits() - ctx_scaled.logits()).max() > 1e-3


def test_bad_context_rope_parameters() -> None:
    m = fl.Model(TINY)
    with pytest.raises(ValueError, match="rope_scaling_type"):
        fl.Context(m, n_ctx=64, rope_scaling_type="cubic")
    with pytest.raises(ValueError, match="positive"):
        fl.Context(m, n_ctx=64, rope_freq_base=-5.0)
