"""NVFP4 models' per-tensor second scales (`NAME.scale`): where llama.cpp multiplies them in,
and what it refuses. The logits of an NVFP4 model with every scale llama.cpp applies to a
llama graph are llama.cpp's own in test_conformance.py (forward-nvfp4); here the order of
each scale against biases and adapters, the experts' per-expert scales, and the refusals.

The order tests use F32 weights and scales that are powers of two, with which a product
scaled afterwards equals the product of the scaled matrix bit for bit: a file with the
matrix (and bias) multiplied in gives the logits the scale must give, exactly."""
from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import ferrollama as fl

DATA = Path(__file__).parent / "data"
MODELS = DATA / "models"
sys.path.insert(0, str(DATA))
import make_tiny_loras as mkl  # noqa: E402



TOKENS = list(range(1, 40))


def rewrite(src: Path, dst: Path, change: dict[str, np.ndarray | None], add: dict[str, np.ndarray]) -> str:
    """`src` with the tensors of `change` replaced (None: dropped) and those of `add` added."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        writer.add_key_value(name, f.contents(), f.types[0], sub_type=sub)
    for t in reader.tensors:
        data = change.get(t.name, t.data)
        if data is None:
            continue
        quantized = t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        writer.add_tensor(t.name, np.array(data), raw_dtype=t.tensor_type if quantized else None)
    for name, data in add.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(dst)


def tensors(path: Path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}


def one(v: float) -> np.ndarray:
    return np.array([v], dtype=np.float32)


def logits(path: str) -> np.ndarray:
    ctx = fl.Context(fl.Model(path), n_ctx=64, type_k="f32", type_v="f32")
    ctx.decode(fl.Batch.from_tokens(TOKENS, logits="all"))
    return np.array([ctx.logits(i) for i in range(len(TOKENS))])


def test_attention_scales_come_before_the_bias_and_ffn_scales_after_it(tmp_path):
    # build_lora_mm scales Q/K/V/O before the bias is added; build_ffn scales up/gate/down
    # after it. A file with attn_output.weight x2 (bias as is) and ffn_up's weight and bias
    # x2 is what the scales must compute.
    src = MODELS / "tiny-llama-f32.gguf"
    w = tensors(src)
    rng = np.random.default_rng(7)
    o_bias, up_bias = (rng.standard_normal(256) * 0.1).astype(np.float32), (rng.standard_normal(512) * 0.1).astype(np.float32)
    biases = {"blk.0.attn_output.bias": o_bias, "blk.1.ffn_up.bias": up_bias}
    scaled = rewrite(src, tmp_path / "scaled.gguf", {
        "blk.0.attn_q.weight": w["blk.0.attn_q.weight"] * 2, "blk.0.attn_output.weight": w["blk.0.attn_output.weight"] * 2,
        "blk.1.ffn_up.weight": w["blk.1.ffn_up.weight"] * 2, "blk.0.ffn_gate.weight": w["blk.0.ffn_gate.weight"] * 4,
        "blk.1.ffn_down.weight": w["blk.1.ffn_down.weight"] * 0.5}, {**biases, "blk.1.ffn_up.bias": up_bias * 2})
    with_scales = rewrite(src, tmp_path / "with_scales.gguf", {}, {
        **biases, "blk.0.attn_q.scale": one(2), "blk.0.attn_output.scale": one(2), "blk.1.ffn_up.scale": one(2),
        "blk.0.ffn_gate.scale": one(4), "blk.1.ffn_down.scale": one(0.5)})
    plain = rewrite(src, tmp_path / "plain.gguf", {}, biases)
    want = logits(scaled)
    assert np.abs(want - logits(plain)).max() > 0.01, "the scales change the logits"
    np.testing.assert_array_equal(logits(with_scales), want)


def test_expert_scales_multiply_each_experts_product(tmp_path):
    # build_lora_mm_id: expert e's product times scale[e] (mixtral is a llama graph).
    src = MODELS / "tiny-mixtral-f32.gguf"
    w = tensors(src)["blk.0.ffn_up_exps.weight"]
    factors = (2.0 ** np.arange(w.shape[0]) / 4).astype(np.float32)
    scaled = rewrite(src, tmp_path / "scaled.gguf", {"blk.0.ffn_up_exps.weight": w * factors[:, None, None]}, {})
    with_scales = rewrite(src, tmp_path / "with_scales.gguf", {}, {"blk.0.ffn_up_exps.scale": factors})
    want = logits(scaled)
    assert np.abs(want - logits(str(src))).max() > 0.01, "the scales change the logits"
    np.testing.assert_array_equal(logits(with_scales), want)


def test_input_scales_are_read_and_ignored(tmp_path):
    # llama.cpp loads NAME.input_scale and never applies it.
    src = MODELS / "tiny-llama-nvfp4.gguf"
    extra = {"blk.1.ffn_up.input_scale": one(3.0), "output.input_scale": one(5.0)}
    with_more = rewrite(src, tmp_path / "more.gguf", {"blk.0.attn_q.input_scale": one(7.0)}, extra)
    np.testing.assert_array_equal(logits(with_more), logits(str(src)))


@pytest.mark.parametrize("base, extra", [
    # llama.cpp's qwen2, gemma2, gemma3, phi3, granite and olmo2 graphs pass no FFN scales to
    # build_ffn: it loads them and ignores them; the engine refuses them as unread.
    ("tiny-gemma2-f32.gguf", "blk.0.ffn_up.scale"),
    ("tiny-olmo2-f32.gguf", "blk.1.ffn_down.scale"),
    # Nor does its gpt-oss graph pass the experts' scales to build_moe_ffn.
    ("tiny-gpt-oss-f32.gguf", "blk.0.ffn_down_exps.scale"),
    # output.scale is read for an NVFP4 output only.
    ("tiny-llama-f32.gguf", "output.scale"),
])
def test_a_scale_llama_cpp_does_not_apply_is_refused_by_name(tmp_path, base, extra):
    shape = tensors(MODELS / base)[extra.replace(".scale", ".weight")].shape
    n = shape[0] if "_exps" in extra else 1
    path = rewrite(MODELS / base, tmp_path / "m.gguf", {}, {extra: np.full(n, 2.0, dtype=np.float32)})
    with pytest.raises(fl.UnsupportedError, match=f"tensor '{extra}' is not used by the engine"):
        fl.Model(path)


def test_an_nvfp4_ffn_matrix_with_scale_and_bias_is_refused(tmp_path):
    # llama.cpp asserts: build_ffn would scale the bias too.
    path = rewrite(MODELS / "tiny-llama-nvfp4.gguf", tmp_path / "m.gguf", {}, {"blk.0.ffn_up.bias": np.zeros(512, dtype=np.float32)})
    with pytest.raises(fl.UnsupportedError, match=r"'blk.0.ffn_up.weight' \(NVFP4\) with both a scale and a bias \(llama.cpp asserts\)"):
        fl.Model(path)


def test_a_tied_nvfp4_output_with_an_output_scale_is_refused(tmp_path):
    # llama-model.cpp asserts that a tied NVFP4 output has no scale tensors of its own.
    path = rewrite(MODELS / "tiny-llama-nvfp4.gguf", tmp_path / "m.gguf", {"output.weight": None}, {})
    with pytest.raises(fl.UnsupportedError, match="tied to the token embedding \\(llama.cpp asserts\\)"):
        fl.Model(path)


def test_an_adapter_of_a_scaled_nvfp4_ffn_matrix_is_refused(tmp_path):
    # llama.cpp asserts: the scale would multiply the adapter's terms too. Attention matrices
    # take adapters (their scale comes before the terms).
    model = fl.Model(str(MODELS / "tiny-llama-nvfp4.gguf"))
    attn = tmp_path / "attn.gguf"
    mkl.write_adapter(mkl.Adapter("attn", "tiny-llama-nvfp4.gguf", ("attn_q", "attn_output")), attn)
    fl.LoraAdapter(model, str(attn))
    ffn = tmp_path / "ffn.gguf"
    mkl.write_adapter(mkl.Adapter("ffn", "tiny-llama-nvfp4.gguf", ("ffn_down",)), ffn)
    with pytest.raises(fl.UnsupportedError, match="a LoRA adapter of 'blk.0.ffn_down.weight', an NVFP4 matrix with a scale"):
        fl.LoraAdapter(model, str(ffn))
