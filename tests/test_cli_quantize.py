"""`ferrollama quantize`: F32 -> the types the gguf package quantizes, byte for byte as the
reference tiny models (written by the gguf package with ggml's reference code), and loadable."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import ferrollama as fl
from ferrollama.cli.inspect import read_header

DATA = Path(__file__).parent / "data"
F32 = DATA / "models" / "tiny-llama-f32.gguf"


def ferrollama(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferrollama.cli", *map(str, args)], capture_output=True, text=True)


def tensors(path: Path) -> dict[str, tuple[str, bytes]]:
    return {t.name: (t.tensor_type.name, np.asarray(t.data).tobytes()) for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "f16", "bf16", "mxfp4", "tq1_0", "tq2_0"])
def test_pure_quantization_matches_the_reference_bytes(tmp_path, kind):
    out = tmp_path / f"{kind}.gguf"
    r = ferrollama("quantize", F32, out, kind.upper(), "--pure")
    assert r.returncode == 0, r.stderr
    assert tensors(out) == tensors(DATA / "models" / f"tiny-llama-{kind}.gguf")
    reader = gguf.GGUFReader(out)
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["tokenizer.ggml.tokens"].contents() == gguf.GGUFReader(F32).fields["tokenizer.ggml.tokens"].contents()
    model = fl.Model(str(out))
    assert {t.type for t in model.tensors} == {kind.upper(), "F32"}
    ctx = fl.Context(model, n_ctx=64, type_k="f32", type_v="f32")
    ctx.decode(fl.Batch.from_tokens([1, 100, 200], logits="last"))
    assert np.isfinite(ctx.logits(-1)).all()


def test_file_type_and_norms(tmp_path):
    out = tmp_path / "q8.gguf"
    assert ferrollama("quantize", F32, out, "q8_0").returncode == 0
    reader = gguf.GGUFReader(out)
    assert reader.fields["general.file_type"].contents() == 7
    norms = [t for t in reader.tensors if "norm" in t.name]
    assert norms and all(t.tensor_type.name == "F32" for t in norms)


def test_mix_rules_of_q4_k_m():
    from ferrollama.cli.quant_plan import ModelFacts, Planner, _use_more_bits

    # llama.cpp's use_more_bits(i, 24): i < 3, i >= 21, or (i - 3) % 3 == 2
    assert [i for i in range(24) if _use_more_bits(i, 24)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]
    layer = lambda i: [(f"blk.{i}.{n}.weight", (256, 256), "F16") for n in ("attn_v", "ffn_down", "ffn_up")]  # noqa: E731
    tensors = [("token_embd.weight", (256, 1000), "F16"), ("output.weight", (256, 1000), "F16")]
    tensors += [t for i in range(24) for t in layer(i)]
    plan = Planner(ModelFacts("llama", 24, 8, 8), "Q4_K_M").plan(tensors)
    assert plan["output.weight"] == "Q6_K" and plan["token_embd.weight"] == "Q4_K"
    assert plan["blk.5.attn_v.weight"] == plan["blk.23.ffn_down.weight"] == "Q6_K"
    assert plan["blk.4.attn_v.weight"] == plan["blk.5.ffn_up.weight"] == "Q4_K"
    tied = Planner(ModelFacts("llama", 24, 8, 8), "Q4_K_M").plan([t for t in tensors if t[0] != "output.weight"])
    assert tied["token_embd.weight"] == "Q6_K"
    assert Planner(ModelFacts("llama", 24, 8, 8), "Q4_K_M", pure=True).plan(tensors)["output.weight"] == "Q4_K"


@pytest.mark.parametrize("args, message", [
    (["Q9_9"], "unknown type 'Q9_9'"),
    (["Q8_0", "--output-tensor-type", "Q1"], "unknown tensor type 'Q1'"),
    (["IQ2_XXS"], "this quantization requires an importance matrix"),
    (["Q2_K_S"], "this quantization requires an importance matrix"),
])
def test_bad_type_is_one_line(tmp_path, args, message):
    r = ferrollama("quantize", F32, tmp_path / "o.gguf", *args)
    assert r.returncode == 1
    assert message in r.stderr and r.stderr.count("\n") == 1


def test_already_quantized_input_needs_allow_requantize(tmp_path):
    src = DATA / "models" / "tiny-llama-q8_0.gguf"
    r = ferrollama("quantize", src, tmp_path / "o.gguf", "Q4_0")
    assert r.returncode == 1 and "already Q8_0" in r.stderr and "--allow-requantize" in r.stderr
    r = ferrollama("quantize", src, tmp_path / "o.gguf", "Q4_0", "--allow-requantize", "--pure")
    assert r.returncode == 0, r.stderr
    assert {v[0] for v in tensors(tmp_path / "o.gguf").values()} == {"Q4_0", "F32"}


def test_missing_input(tmp_path):
    r = ferrollama("quantize", tmp_path / "nope.gguf", tmp_path / "o.gguf", "Q8_0")
    assert r.returncode == 1 and r.stderr.endswith("nope.gguf: no such file\n")


def test_nvfp4_output_and_embedding_match_llama_quantize(tmp_path):
    """llama_model_quantize of the tiny llama to Q8_0 with its output and token embedding in NVFP4
    (tests/data/quants/llama_quantize_nvfp4.json, benches/record_quantize.py nvfp4): ggml's
    quantize_row_nvfp4_ref, byte for byte."""
    import hashlib

    record = json.loads((DATA / "quants" / "llama_quantize_nvfp4.json").read_text())
    out = tmp_path / "o.gguf"
    r = ferrollama("quantize", F32, out, "Q8_0", "--pure", "--output-tensor-type", "NVFP4", "--token-embedding-type", "nvfp4")
    assert r.returncode == 0, r.stderr
    got = {name: [kind, hashlib.sha256(data).hexdigest()] for name, (kind, data) in tensors(out).items()}
    assert got == record["Q8_0 pure, output and token_embd NVFP4"]
    assert got["output.weight"][0] == got["token_embd.weight"][0] == "NVFP4"
    ctx = fl.Context(fl.Model(str(out)), n_ctx=64)
    ctx.decode(fl.Batch.from_tokens([1, 100, 200], logits="last"))
    assert np.isfinite(ctx.logits(-1)).all()


def test_nvfp4_is_no_file_type_as_in_llama_quantize(tmp_path):
    assert json.loads((DATA / "quants" / "llama_quantize_nvfp4.json").read_text())["ftype 39 (MOSTLY_NVFP4)"] == "refused"
    r = ferrollama("quantize", F32, tmp_path / "o.gguf", "NVFP4")
    assert r.returncode == 1 and "NVFP4 is not a file type llama-quantize writes" in r.stderr


@pytest.mark.parametrize("kind", ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"])
def test_k_quants_match_llama_quantize_pure(tmp_path, kind):
    """The reference files were written by llama-quantize --pure (ggml's reference quantizers)."""
    out = tmp_path / f"{kind}.gguf"
    r = ferrollama("quantize", F32, out, kind.upper(), "--pure")
    assert r.returncode == 0, r.stderr
    assert tensors(out) == tensors(DATA / "models" / f"tiny-llama-{kind}.gguf")


@pytest.mark.parametrize("kind, file_type", [("q1_0", 40), ("q2_0", 41)])
def test_q1_0_and_q2_0_models_load_and_decode_as_llama_quantizes(tmp_path, kind, file_type):
    """The files `ferrollama quantize` writes (the gguf package cannot read Q2_0: ferrollama's reader
    here) have llama.cpp's file type, and decode to the same logits as the model llama.cpp's
    llama_model_quantize wrote (tests/data/make_tiny_types.py)."""
    out = tmp_path / f"{kind}.gguf"
    r = ferrollama("quantize", F32, out, kind.upper(), "--pure")
    assert r.returncode == 0, r.stderr
    assert {f.name: f.value for f in read_header(str(out)).fields}["general.file_type"] == file_type
    logits = []
    for path in (out, DATA / "models" / f"tiny-llama-{kind}.gguf"):
        model = fl.Model(str(path))
        assert {t.type for t in model.tensors} == {kind.upper(), "F32"}
        ctx = fl.Context(model, n_ctx=64, type_k="f32", type_v="f32")
        ctx.decode(fl.Batch.from_tokens([1, 100, 200, 300, 400], logits="last"))
        logits.append(np.array(ctx.logits(-1)))
    assert np.isfinite(logits[0]).all() and np.array_equal(logits[0], logits[1])


def test_trailing_unit_dimensions_are_dropped_as_llama_quantize_does(tmp_path):
    """llama-quantize writes ggml_n_dims(t) dimensions: a [256, 1] tensor (Mamba-2's ssm_norm of
    one group is [d_inner, 1] in converted files) comes out [256]; the model loads either way."""
    src = tmp_path / "unit-dim.gguf"
    reader = gguf.GGUFReader(F32)
    w = gguf.GGUFWriter(str(src), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0], field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        data = np.asarray(t.data)
        w.add_tensor(t.name, data.reshape(1, -1) if t.name == "output_norm.weight" else data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shape = lambda path: [int(d) for d in next(t for t in gguf.GGUFReader(path).tensors if t.name == "output_norm.weight").shape]  # noqa: E731
    assert shape(src) == [256, 1]
    out = tmp_path / "q8.gguf"
    r = ferrollama("quantize", src, out, "q8_0")
    assert r.returncode == 0, r.stderr
    assert shape(out) == [256]
    for path in (src, out):
        ctx = fl.Context(fl.Model(str(path)), n_ctx=64, type_k="f32", type_v="f32")
        ctx.decode(fl.Batch.from_tokens([1, 100, 200], logits="last"))
        assert np.isfinite(ctx.logits(-1)).all()
