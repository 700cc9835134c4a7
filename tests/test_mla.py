"""Multi-head latent attention (the `deepseek2` architecture, tests/data/make_tiny_mla.py): the
latent cache's memory, its sequence operations and states against llama.cpp's records
(mla-shift-*, recorded by benches/record_mla.py; the models' logits are in test_conformance.py's
arch-deepseek2* scenarios), and what the engine refuses of such files."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import ferrollama as fl
import scenario_runner as sr
from conftest import load_model, model_path

sys.path.insert(0, str(Path(__file__).parent / "data"))
import make_tiny_loras as loras  # noqa: E402

NAMES = sr.scenario_names(("mla-",))


def test_every_mla_scenario_is_collected() -> None:
    assert NAMES == ["mla-shift-deepseek2-f32", "mla-shift-deepseek2-lite-f32"]


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("name", NAMES)
def test_shift_and_states_match_llama_cpp(name: str, cache_type: str) -> None:
    scn = sr.load(name)
    model = load_model(scn["model"])
    got = sr.run(scn, model, cache_type)
    cmp = sr.compare(name, scn, got, cache_type)
    assert cmp.n_logits > 0 and cmp.exact_failures == []
    problems = sr.check(cmp, scn["model"], model.arch)
    assert not problems, f"{name} [{cache_type}]: " + "; ".join(problems)


@pytest.mark.parametrize("model_file, bytes_per_token", [
    # split attn_k_b/attn_v_b: one latent row per layer (kv_lora_rank 64 + 64 rotated values),
    # no V of its own: 3 layers x 128 x 2 bytes, as llama.cpp's "K (f16): 3.00 MiB, V (f16):
    # 0.00 MiB" for 4096 cells
    ("tiny-deepseek2-f32.gguf", 3 * 128 * 2),
    # joint attn_kv_b: every head's key (128) and value (64): 2 layers x 4 x 192 x 2 bytes
    # (llama.cpp: K 8.00 MiB, V 4.00 MiB)
    ("tiny-deepseek2-lite-f32.gguf", 2 * 4 * 192 * 2),
])
def test_the_cache_holds_what_llama_cpp_holds(model_file: str, bytes_per_token: int) -> None:
    ctx = fl.Context(load_model(model_file), n_ctx=4096, type_k="f16", type_v="f16")
    assert ctx.kv.nbytes == 4096 * bytes_per_token


@pytest.mark.parametrize("override, message", [
    ({"deepseek2.attention.key_length": 96}, "latent attention with key_length 96"),
    ({"deepseek2.attention.temperature_scale": 0.5}, "attention temperature tuning"),
    ({"deepseek2.expert_group_count": 3}, "expert_group_count 3"),
    ({"deepseek2.expert_gating_func": 3}, "expert_gating_func = 3"),
])
def test_what_the_engine_cannot_honour_is_refused(override: dict, message: str) -> None:
    with pytest.raises((fl.UnsupportedError, fl.GGUFError), match=message):
        fl.Model(str(model_path("tiny-deepseek2-f32.gguf")), kv_overrides=override)


def test_an_adapter_of_a_latent_projection_is_refused(tmp_path) -> None:
    # llama.cpp's graph multiplies attn_q_a without adapter terms: refused, not ignored
    ad = loras.Adapter("lora-mla", "tiny-deepseek2-f32.gguf", ("attn_q_a",))
    path = tmp_path / "lora-mla.gguf"
    loras.write_adapter(ad, path)
    with pytest.raises(fl.UnsupportedError, match="does not apply a LoRA adapter to 'blk.0.attn_q_a.weight'"):
        fl.LoraAdapter(load_model("tiny-deepseek2-f32.gguf"), str(path))


@pytest.mark.parametrize("cache_type", ["q8_0", "q4_0"])
def test_a_quantized_latent_cache_is_refused(cache_type: str) -> None:
    # llama.cpp 0.3.36 rotates a quantized cache by Hadamard blocks; for the latent cache the
    # rotated keys are also the values, whose output it never rotates back: not copied.
    model = load_model("tiny-deepseek2-f32.gguf")
    with pytest.raises(fl.UnsupportedError, match=f"cache type (?i:{cache_type}) with latent attention"):
        fl.Context(model, n_ctx=64, type_k=cache_type, type_v=cache_type)
    assert fl.Context(model, n_ctx=64, type_k="bf16", type_v="bf16").kv.nbytes > 0
