"""llama.cpp's recorded scenarios, replayed through the Python API with F32 and F16 caches,
within the tolerances of tests/data/REFERENCE.md.

For the real models the top-1 agreement leaves out the outputs where llama.cpp's own F32-cache
and F16-cache records name different top tokens (a near-tie llama.cpp resolves both ways: one
output of gemma3-context-shift, 0.008 nats apart); the KL divergence still counts them."""
from __future__ import annotations

import pytest

import scenario_runner as sr
import ferrollama as fl
from conftest import load_model, model_path

ENGINE_SPINE = ("forward-", "incremental", "ubatch-split", "qwen2-text")
KV_CACHE = ("multi-seq-batch", "shared-prefix-keep", "seq-cp-diverge", "seq-rm-regenerate", "seq-rm-middle",
            "seq-div", "seq-add-free", "ring-wrap", "clear-reuse", "context-shift", "self-extend",
            "qwen2-context-shift")
GEMMA3 = ("gemma3-",)
#: tiny models of each further architecture (tests/data/make_tiny_archs.py), F32 and Q8_0
ARCHS = ("arch-",)
#: context RoPE parameters and kv_overrides (tests/data/make_param_scenarios.py)
PARAMS = ("params-",)
#: context shifts of the tiny models with layers without RoPE (tests/data/make_tiny_tail.py)
KSHIFT = ("kshift-",)
NAMES = sr.scenario_names(ENGINE_SPINE + KV_CACHE + GEMMA3 + ARCHS + PARAMS + KSHIFT)
ARCH_NAMES = ("llama3", "mixtral", "qwen3", "qwen3moe", "gemma2", "phi3", "granite", "olmo2", "gpt-oss",
              "smollm3", "mistral3", "qwen2moe", "olmoe", "exaone4", "seed_oss", "ernie4_5", "ernie4_5-moe",
              "cohere2", "starcoder2", "glm4moe", "llama4", "deepseek2", "deepseek2-lite",
              "gemma4", "gemma4-moe", "gemma3n", "gemma3", "qwen2vl", "qwen3vl", "qwen3vlmoe")


#: llama.cpp's other KV cache types (benches/record_kv_types.py: K and V of one type, flash
#: attention on), on a prompt with several sequences and on a context shift (no bf16 there: that
#: shift aborts llama.cpp)
KV_TYPES = ("bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
KV_TYPE_CASES = [("kv-types", t) for t in KV_TYPES] + [("kv-types-shift", t) for t in KV_TYPES if t != "bf16"]


@pytest.mark.parametrize("name, cache_type", KV_TYPE_CASES)
def test_kv_cache_type(name: str, cache_type: str) -> None:
    scn = sr.load(name)
    got = sr.run(scn, load_model(scn["model"]), cache_type)
    cmp = sr.compare(name, scn, got, cache_type)
    assert cmp.n_logits == len([e for e in scn[f"expected_kv_{cache_type}"] if "logits" in e]) > 0
    problems = sr.check(cmp, scn["model"], "llama")
    assert not problems, f"{name} [{cache_type}]: " + "; ".join(problems)


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("name", NAMES)
def test_scenario(name: str, cache_type: str) -> None:
    scn = sr.load(name)
    model = load_model(scn["model"]) if not scn.get("kv_overrides") else fl.Model(
        str(model_path(scn["model"])), kv_overrides=scn["kv_overrides"])
    got = sr.run(scn, model, cache_type)
    cmp = sr.compare(name, scn, got, cache_type)
    assert cmp.n_logits > 0 or cmp.exact_failures == [], "no logits compared"
    problems = sr.check(cmp, scn["model"], model.arch)
    assert not problems, f"{name} [{cache_type}]: " + "; ".join(problems)


def test_every_spine_and_kv_scenario_is_collected() -> None:
    # The families the issues name must all be present in tests/data.
    for prefix in ENGINE_SPINE + KV_CACHE + GEMMA3:
        assert any(n.startswith(prefix) for n in NAMES), prefix
    assert len([n for n in NAMES if n.startswith("forward-")]) == 28
    assert len([n for n in NAMES if n.startswith("gemma3-")]) == 6
    assert sorted(n for n in NAMES if n.startswith("arch-")) == sorted(
        f"arch-{a}-{t}" for a in ARCH_NAMES for t in ("f32", "q8_0"))
    assert sorted(n for n in NAMES if n.startswith("params-")) == [
        "params-kv-overrides", "params-none-ctx", "params-rope-ctx", "params-yarn-ctx"]
    assert sorted(n for n in NAMES if n.startswith("kshift-")) == ["kshift-cohere2", "kshift-exaone4", "kshift-smollm3"]
    assert len(NAMES) == 54 + 54 + 4 + 4 + 3  # every recorded scenario
