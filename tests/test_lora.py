"""LoRA adapters in GGUF, as llama.cpp applies them: logits against llama.cpp's records
(tests/data/scenarios/lora-*.json, recorded by benches/record_lora.py with the adapters of
tests/data/make_tiny_loras.py), what setting, rescaling and removing an adapter do, and the
files an adapter load refuses."""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import ferrollama as fl
import scenario_runner as sr

sys.path.insert(0, str(Path(__file__).parent / "data"))
import make_tiny_loras as mkl  # noqa: E402

MODELS = sr.TINY_MODELS
LORA = sr.DATA / "lora"
NAMES = sr.scenario_names(("lora-",))
PROMPT = [1, 40, 7, 300, 12, 99, 5, 64, 201, 33]


def test_every_lora_scenario_is_collected() -> None:
    assert sorted(NAMES) == sorted(name for name, _, _ in mkl.scenarios())


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("name", NAMES)
def test_logits_with_adapters_match_llama_cpp(name: str, cache_type: str) -> None:
    scn = sr.load(name)
    model = fl.Model(str(MODELS / scn["model"]))
    adapters = [(fl.LoraAdapter(model, str(LORA / f)), s) for f, s in scn["lora"]]

    def setup(ctx: fl.Context) -> None:
        for a, s in adapters:
            ctx.set_lora(a, s)

    got = sr.run(scn, model, cache_type, setup=setup)
    cmp = sr.compare(name, scn, got, cache_type)
    assert cmp.n_logits == len(scn["expected"])
    assert not sr.check(cmp, scn["model"], model.arch), cmp.row()


@pytest.mark.parametrize("name", ["lora-llama3-f32-a1", "lora-mixtral-f32", "lora-phi3-f32"])
def test_the_records_are_far_from_the_base_models(name: str) -> None:
    # The adapters move llama.cpp's logits by units: a test that ignored them would fail.
    scn = sr.load(name)
    base = sr.load(scn["model"].replace("tiny-", "arch-").removesuffix(".gguf"))
    assert base["steps"] == scn["steps"]
    diff = max(np.abs(np.array(a["logits"]) - np.array(b["logits"])).max()
               for a, b in zip(scn["expected"], base["expected"]))
    assert diff > 1.0


def decode_prompt(ctx: fl.Context) -> np.ndarray:
    ctx.kv.clear()
    ctx.decode(fl.Batch.from_tokens(PROMPT, logits="all"))
    return ctx.logits_all().copy()


@pytest.fixture(scope="module")
def llama3() -> fl.Model:
    return fl.Model(str(MODELS / "tiny-llama3-f32.gguf"))


def test_set_rescale_remove_and_clear(llama3: fl.Model) -> None:
    a = fl.LoraAdapter(llama3, str(LORA / "lora-llama3-a.gguf"))
    b = fl.LoraAdapter(llama3, str(LORA / "lora-llama3-b.gguf"))
    ctx = fl.Context(llama3, n_ctx=64)
    base = decode_prompt(ctx)
    ctx.set_lora(a)
    with_a = decode_prompt(ctx)
    assert np.abs(with_a - base).max() > 0.5
    ctx.set_lora(a, 0.0)   # scale 0: llama.cpp leaves the adapter out
    np.testing.assert_array_equal(decode_prompt(ctx), base)
    ctx.set_lora(a, 1.0)
    np.testing.assert_array_equal(decode_prompt(ctx), with_a)
    ctx.set_lora(b, 0.75)
    both = decode_prompt(ctx)
    assert np.abs(both - with_a).max() > 0.5
    assert ctx.remove_lora(b) is True
    assert ctx.remove_lora(b) is False
    np.testing.assert_array_equal(decode_prompt(ctx), with_a)
    ctx.clear_lora()
    np.testing.assert_array_equal(decode_prompt(ctx), base)


def test_adapter_properties(llama3: fl.Model) -> None:
    a = fl.LoraAdapter(llama3, str(LORA / "lora-llama3-a.gguf"))
    assert a.alpha == 8.0 and a.model is llama3
    assert a.ranks["blk.1.ffn_down.weight"] == 4 and len(a.ranks) == 14
    assert a.metadata["general.type"] == "adapter" and a.metadata["adapter.type"] == "lora"
    b = fl.LoraAdapter(llama3, str(LORA / "lora-llama3-b.gguf"))
    assert b.alpha == 0.0 and b.ranks["token_embd.weight"] == 8
    # llama.cpp skips norm tensors in an adapter ("most adapters still work fine without it").
    assert b.skipped == ["blk.0.attn_norm.weight"]


def test_an_adapter_of_another_model_object_is_refused(llama3: fl.Model) -> None:
    other = fl.Model(str(MODELS / "tiny-llama3-f32.gguf"))
    a = fl.LoraAdapter(other, str(LORA / "lora-llama3-a.gguf"))
    with pytest.raises(ValueError, match="loaded for another model"):
        fl.Context(llama3, n_ctx=64).set_lora(a)


def test_a_non_finite_scale_is_refused(llama3: fl.Model) -> None:
    a = fl.LoraAdapter(llama3, str(LORA / "lora-llama3-a.gguf"))
    with pytest.raises(ValueError, match="finite"):
        fl.Context(llama3, n_ctx=64).set_lora(a, float("nan"))


def adapter_a() -> mkl.Adapter:
    return next(ad for ad in mkl.adapters() if ad.name == "lora-llama3-a")


def write(tmp_path: Path, ad: mkl.Adapter, **kw) -> str:
    path = tmp_path / f"{ad.name}.gguf"
    mkl.write_adapter(ad, path, **kw)
    return str(path)


def test_a_model_file_is_not_an_adapter(llama3: fl.Model) -> None:
    with pytest.raises(ValueError, match="not a LoRA adapter .general.type is 'model'|not a LoRA adapter .general.type is ''"):
        fl.LoraAdapter(llama3, str(MODELS / "tiny-llama3-f32.gguf"))


def test_an_adapter_of_another_architecture_is_refused(tmp_path, llama3: fl.Model) -> None:
    path = write(tmp_path, replace(adapter_a(), arch="qwen3"))
    with pytest.raises(ValueError, match="adapter is for architecture 'qwen3', the model is 'llama'"):
        fl.LoraAdapter(llama3, path)


def test_a_pair_of_the_wrong_shape_is_refused(tmp_path, llama3: fl.Model) -> None:
    path = write(tmp_path, adapter_a(), shape_override={"blk.1.ffn_up.weight": (256, 256)})
    with pytest.raises(ValueError, match="tensor 'blk.1.ffn_up.weight' has incorrect shape"):
        fl.LoraAdapter(llama3, path)


def test_a_pair_for_a_tensor_the_model_lacks_is_refused(tmp_path, llama3: fl.Model) -> None:
    # The mixtral adapter's expert pairs name tensors the dense llama3 does not have.
    path = write(tmp_path, replace(adapter_a(), layer_tensors=("attn_q", "ffn_up_exps")),
                 shape_override={f"blk.{i}.ffn_up_exps.weight": (4, 512, 256) for i in range(2)})
    with pytest.raises(ValueError, match="'blk.0.ffn_up_exps.weight' does not exist in the base model"):
        fl.LoraAdapter(llama3, path)


def test_a_tensor_of_unexpected_suffix_or_half_a_pair_is_refused(tmp_path, llama3: fl.Model) -> None:
    import gguf

    for extra, message in [("blk.0.attn_q.weight.lora_c", "has unexpected suffix"),
                           ("blk.0.attn_norm.weight.lora_a", "pair for 'blk.0.attn_norm.weight' is missing one component")]:
        path = tmp_path / "bad.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
        w.add_tensor(extra, np.ones((4, 256), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with pytest.raises(fl.GGUFError, match=message):
            fl.LoraAdapter(llama3, str(path))


def test_a_token_embedding_pair_on_a_tied_output_is_refused(tmp_path) -> None:
    # Gemma 2's output projection is its token embedding: llama.cpp would run the output
    # product with the embedding's transposed A and abort.
    gemma2 = fl.Model(str(MODELS / "tiny-gemma2-f32.gguf"))
    ad = mkl.Adapter("gemma2-embd", "tiny-gemma2-f32.gguf", (), ("token_embd.weight",))
    with pytest.raises(fl.UnsupportedError, match="token_embd.weight' on a model whose output projection is the token embedding"):
        fl.LoraAdapter(gemma2, write(tmp_path, ad))


def test_a_missing_or_truncated_file_raises(tmp_path, llama3: fl.Model) -> None:
    with pytest.raises(fl.Error):
        fl.LoraAdapter(llama3, str(tmp_path / "absent.gguf"))
    data = (LORA / "lora-llama3-a.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(fl.GGUFError):
        fl.LoraAdapter(llama3, str(cut))


# --- the command line: --lora and --lora-scaled, as llama.cpp's common arguments ----------------

LLAMA3 = MODELS / "tiny-llama3-f32.gguf"
A, B = LORA / "lora-llama3-a.gguf", LORA / "lora-llama3-b.gguf"


def ferrollama(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferrollama.cli", *map(str, args)], capture_output=True,
                          text=True, encoding="utf-8")


def test_generate_with_adapters() -> None:
    base = ["generate", "-m", LLAMA3, "-p", "Hello", "-n", 12, "--temp", "0", "--ignore-eos", "--no-display-prompt"]
    plain = ferrollama(*base)
    with_a = ferrollama(*base, "--lora", A)
    assert plain.returncode == 0 and with_a.returncode == 0, with_a.stderr
    assert with_a.stdout != plain.stdout
    # llama.cpp's forms: FNAME:SCALE (comma-separated), and the older FNAME SCALE
    assert ferrollama(*base, "--lora-scaled", f"{A}:1.0").stdout == with_a.stdout
    assert ferrollama(*base, "--lora-scaled", A, "1").stdout == with_a.stdout
    assert ferrollama(*base, "--lora-scaled", f"{A}:0").stdout == plain.stdout
    both = ferrollama(*base, "--lora", f"{A},{B}")
    assert both.stdout == ferrollama(*base, "--lora", A, "--lora", B).stdout != with_a.stdout


@pytest.mark.parametrize("args, message", [
    (["--lora", "absent.gguf"], "absent.gguf: no such LoRA adapter file"),
    (["--lora", LLAMA3], "not a LoRA adapter"),
    (["--lora", LORA / "lora-mixtral.gguf"], "does not exist in the base model"),
    (["--lora-scaled", f"{A}"], "--lora-scaled format: FNAME:SCALE"),
    (["--lora-scaled", f"{A}:x"], "expected a number"),
])
def test_generate_adapter_errors_are_one_line(args, message) -> None:
    r = ferrollama("generate", "-m", LLAMA3, "-p", "Hello", "-n", 2, *args)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_perplexity_with_an_adapter_is_the_core_api_s(tmp_path) -> None:
    from test_cli_perplexity import direct_ppl

    text = tmp_path / "text.txt"
    text.write_text("\n".join(p.read_text() for p in sorted((sr.DATA / "texts").glob("*.txt"))))
    r = ferrollama("perplexity", "-m", LLAMA3, "-f", text, "-c", 64, "-b", 64, "--lora-scaled", f"{A}:0.5")
    assert r.returncode == 0, r.stderr
    final = float(re.search(r"Final estimate: PPL = ([\d.]+)", r.stdout).group(1))
    assert final == pytest.approx(direct_ppl(LLAMA3, text.read_text(), 64, [(A, 0.5)])[0], rel=2e-4)
    assert final != pytest.approx(direct_ppl(LLAMA3, text.read_text(), 64)[0], rel=1e-2)


def test_the_server_s_contexts_get_the_adapters(llama3: fl.Model) -> None:
    from ferrollama.server.embeddings import Embedder
    from ferrollama.server.scheduler import Scheduler

    a = fl.LoraAdapter(llama3, str(LORA / "lora-llama3-a.gguf"))
    direct = fl.Context(llama3, n_ctx=64)
    direct.set_lora(a, 0.5)
    scheduler = Scheduler(llama3, n_ctx=64, n_seq=1, n_batch=64, loras=[(a, 0.5)])
    np.testing.assert_array_equal(decode_prompt(scheduler.ctx), decode_prompt(direct))
    embedder = Embedder(llama3, n_ctx=64, loras=scheduler.loras)
    plain = Embedder(llama3, n_ctx=64)
    assert not np.array_equal(embedder.embed([PROMPT])[0], plain.embed([PROMPT])[0])
