"""What the engine does with what a file holds beyond the tensors and keys it computes with:
every tensor must be used (a tensor the architecture's graph does not apply is refused,
naming it), and metadata values it cannot honour are refused too. The logits of each
architecture are in test_conformance.py (arch-* scenarios)."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import ferrollama as fl

sys.path.insert(0, str(Path(__file__).parent / "data"))
import make_tiny_archs as mk  # noqa: E402


def spec(name: str) -> mk.Spec:
    return next(s for s in mk.specs() if s.name == name)


def write(tmp_path: Path, s: mk.Spec) -> str:
    path = tmp_path / f"{s.name}.gguf"
    mk.write_model(s, "f32", path)
    return str(path)


def test_every_architecture_of_the_issue_is_in_the_table():
    for arch in ("llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "gemma4", "phi3", "granite", "olmo2",
                 "smollm3", "mistral3", "qwen2moe", "olmoe", "exaone4", "seed_oss", "ernie4_5", "ernie4_5-moe",
                 "cohere2", "starcoder2", "deepseek2", "gemma3n"):
        assert arch in fl._core.SUPPORTED_ARCHITECTURES


@pytest.mark.parametrize("base, extra", [
    # Llama 3's frequency factors in a qwen3 file: qwen3's graph rotates without them.
    ("qwen3", "rope_freqs.weight"),
    # Q/K norms in a llama file: llama's graph has none.
    ("llama3", "blk.0.attn_q_norm.weight"),
    # An output bias Phi-3's graph does not add.
    ("phi3", "output.bias"),
    # An output matrix Gemma 2 does not read (its output is the token embedding).
    ("gemma2", "output.weight"),
])
def test_a_tensor_the_architecture_does_not_use_is_refused_by_name(tmp_path, base, extra):
    s = spec(base)
    n = {"rope_freqs.weight": 64, "blk.0.attn_q_norm.weight": 64, "output.bias": mk.N_VOCAB}.get(extra)
    tensors = dict(s.global_tensors)
    if extra == "output.weight":
        s = replace(s, tied=False)
    else:
        tensors[extra] = np.ones(n, dtype=np.float32)
    path = write(tmp_path, replace(s, global_tensors=tensors))
    with pytest.raises(fl.UnsupportedError, match=f"tensor '{extra}' is not used by the engine's '{s.arch}' architecture"):
        fl.Model(path)


def test_a_file_without_its_extra_tensor_loads(tmp_path):
    # The same construction without the extra tensor is a working model: the refusal above
    # is about the tensor, not the file.
    model = fl.Model(write(tmp_path, spec("qwen3")))
    ctx = fl.Context(model, n_ctx=64)
    ctx.decode(fl.Batch.from_tokens([1, 20, 30], logits="last"))
    assert np.isfinite(ctx.logits(-1)).all()


def test_an_unknown_rope_scaling_type_is_refused(tmp_path):
    s = spec("llama3")
    s = replace(s, metadata={**s.metadata, "rope.scaling.type": "llama4-magic"})
    with pytest.raises(fl.UnsupportedError, match="rope.scaling.type 'llama4-magic'"):
        fl.Model(write(tmp_path, s))


def test_rope_freqs_change_the_logits(tmp_path):
    # The silent bug of issue 23: with its factors ignored, a Llama 3 file decoded with
    # logits up to 0.56 away from llama.cpp's. The factors must reach the forward pass.
    s = spec("llama3")
    with_factors = fl.Model(write(tmp_path, s))
    plain = fl.Model(str(Path(write(tmp_path, replace(s, name="plain", global_tensors={})))))
    tokens = list(range(1, 60))
    out = []
    for m in (with_factors, plain):
        ctx = fl.Context(m, n_ctx=64, type_k="f32", type_v="f32")
        ctx.decode(fl.Batch.from_tokens(tokens, logits="last"))
        out.append(ctx.logits(-1))
    assert np.abs(out[0] - out[1]).max() > 0.05


def test_inspect_names_the_supported_architectures(tmp_path):
    s = replace(spec("llama3"), arch="mamba9")
    path = tmp_path / "m.gguf"
    mk.write_model(s, "f32", path)
    r = subprocess.run([sys.executable, "-m", "ferrollama.cli", "inspect", "--no-tensors", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Architecture 'mamba9' is not supported by ferrollama (supported: llama, qwen2, qwen3" in r.stdout
    with pytest.raises(fl.UnsupportedError, match="architecture 'mamba9' is not supported"):
        fl.Model(str(path))
    ok = subprocess.run([sys.executable, "-m", "ferrollama.cli", "inspect", "--no-tensors",
                         str(Path(__file__).parent / "data" / "models" / "tiny-qwen3-f32.gguf")],
                        capture_output=True, text=True)
    assert "Architecture qwen3: supported by ferrollama" in ok.stdout


def write_glm_llama4(tmp_path: Path, name: str, drop: tuple[str, ...] = (), extra: dict | None = None) -> str:
    import make_tiny_glm_llama4 as gl
    path = tmp_path / f"{name}.gguf"
    gl.write_model(name, "f32", path, drop=drop, extra=extra)
    return str(path)


def test_glm4moe_nextn_block_is_accounted_for_not_ignored(tmp_path):
    # The NextN block (blk.2) is loaded the way llama.cpp loads it for plain decoding: present
    # and never run. Its required tensors stay required, and a tensor it does not have is refused.
    fl.Model(write_glm_llama4(tmp_path, "glm4moe"))
    with pytest.raises(Exception, match="missing tensor 'blk.2.nextn.enorm.weight'"):
        fl.Model(write_glm_llama4(tmp_path, "glm4moe", drop=("blk.2.nextn.enorm.weight",)))
    with pytest.raises(fl.UnsupportedError, match="tensor 'blk.2.nextn.extra.weight' is not used"):
        fl.Model(write_glm_llama4(tmp_path, "glm4moe", extra={"blk.2.nextn.extra.weight": np.ones(8)}))


def test_glm4moe_trunk_converted_without_its_nextn_block_loads(tmp_path):
    # nextn_predict_layers 1 but no blk.2 tensors at all: llama.cpp's trunk_only case.
    model = fl.Model(write_glm_llama4(tmp_path, "glm4moe", drop=("blk.2.",)))
    assert model.n_layer == 2


def test_llama4_without_chunked_attention_is_refused(tmp_path):
    path = write_glm_llama4(tmp_path, "llama4")
    with pytest.raises(fl.UnsupportedError, match="attention.sliding_window 0"):
        fl.Model(path, kv_overrides={"llama4.attention.sliding_window": 0})


GEMMA3N = str(Path(__file__).parent / "data" / "models" / "tiny-gemma3n-f32.gguf")


@pytest.mark.parametrize("key, value", [
    ("gemma3n.altup.num_inputs", 3),
    ("gemma3n.altup.active_idx", 1),
    ("gemma3n.embedding_length_per_layer_input", 128),
    ("gemma3n.attention.shared_kv_layers", 4),
    ("gemma3n.final_logit_softcapping", 50.0),
])
def test_gemma3n_metadata_that_llama_cpp_fixes_otherwise_is_refused(key, value):
    # llama.cpp's gemma3n graph reads none of these keys and computes with fixed values; a file
    # stating other values cannot be run the same by both, so it is refused, naming the key.
    short = key.removeprefix("gemma3n.")
    with pytest.raises(fl.UnsupportedError, match=short):
        fl.Model(GEMMA3N, kv_overrides={key: value})
    assert fl.Model(GEMMA3N).arch == "gemma3n"
