"""The text models of Qwen2-VL / Qwen2.5-VL (qwen2vl), Qwen3-VL (qwen3vl) and Qwen3-VL-MoE
(qwen3vlmoe), and Qwen3.5's (qwen35, qwen35moe), with M-RoPE positions: llama.cpp's records of embedding rows at mtmd's 2-D positions
(tests/data/scenarios/mrope-*.json, benches/record_qwenvl.py; the text-only scenarios arch-qwen*vl*
run in test_conformance.py), and the rules of llama.cpp's batches for such models."""
from __future__ import annotations

import numpy as np
import pytest

import ferrollama as fl
import scenario_runner as sr
from conftest import load_model
from scenario_rows import image_positions

NAMES = sr.scenario_names(("mrope-",))
QWEN3VL = "tiny-qwen3vl-f32.gguf"


def test_every_model_has_its_scenario():
    # and Qwen3.5's (interleaved M-RoPE, images through the qwen3vl projector)
    vl = [f"{a}-{t}" for a in ("qwen2vl", "qwen3vl", "qwen3vlmoe") for t in ("f32", "q8_0")]
    assert sorted(n.split("-", 1)[1] for n in NAMES) == sorted(vl + ["qwen35-f32", "qwen35moe-f32"])


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("name", NAMES)
def test_embeddings_at_mrope_positions_match_llama_cpp(name: str, cache_type: str) -> None:
    scn = sr.load(name)
    model = load_model(scn["model"])
    cmp = sr.compare(name, scn, sr.run(scn, model, cache_type), cache_type)
    assert cmp.n_logits == 14
    problems = sr.check(cmp, scn["model"], model.arch)
    assert not problems, f"{name} [{cache_type}]: " + "; ".join(problems)


def test_models_say_their_input_width_and_rope():
    qwen3vl, qwen2vl, qwen3 = (load_model(f"tiny-{a}-f32.gguf") for a in ("qwen3vl", "qwen2vl", "qwen3"))
    assert (qwen3vl.n_embd, qwen3vl.n_embd_inp, qwen3vl.uses_mrope) == (256, 768, True)
    assert (qwen2vl.n_embd_inp, qwen2vl.uses_mrope) == (256, True)
    assert (qwen3.n_embd_inp, qwen3.uses_mrope) == (256, False)


def context(model: fl.Model) -> fl.Context:
    return fl.Context(model, n_ctx=64, n_batch=32, n_ubatch=32)


def test_deepstack_rows_need_the_input_width():
    ctx = context(load_model(QWEN3VL))
    with pytest.raises(ValueError, match="256 values per token, the model's input width is 768"):
        ctx.decode(fl.Batch.from_embeddings(np.zeros((2, 256), np.float32)))


def test_mrope_positions_are_refused_by_other_models():
    ctx = context(load_model("tiny-qwen3-f32.gguf"))
    batch = fl.Batch.from_embeddings(np.zeros((2, 256), np.float32), positions=[[0, 0, 0, 0], [0, 0, 1, 0]])
    assert batch.positions == [[0, 0, 0, 0], [0, 0, 1, 0]] and batch.pos == [0, 0]
    with pytest.raises(ValueError, match="M-RoPE positions .* 'qwen3' rotates with one position per token"):
        ctx.decode(batch)


@pytest.mark.parametrize("positions, message", [
    (np.zeros((2, 3), np.int32), r"shape \(n_tokens, 4\)"),
    (np.zeros((2, 4), np.float32), "integer array"),
    (np.zeros((3, 4), np.int64), "3 M-RoPE positions for 2 embedding rows"),
    ([[0, 0, 0, 0], [0, -1, 0, 0]], "negative"),
    ([[0, 0, 0, 0], [2 ** 31, 0, 0, 0]], "out of range"),
])
def test_bad_positions_are_refused(positions, message):
    with pytest.raises(ValueError, match=message):
        fl.Batch.from_embeddings(np.zeros((2, 256), np.float32), positions=positions)


def test_positions_follow_llama_cpps_mrope_rules():
    """Text after the cache's last position (X < Y), embeddings at it or after (X <= Y: an
    image's tokens share their time position), and gaps allowed (an image takes fewer
    positions than it has tokens)."""
    model = load_model("tiny-qwen2vl-f32.gguf")
    ctx = context(model)
    ctx.decode(fl.Batch.from_tokens([1, 20, 30], 0, 0, "none"))
    rows = np.ones((4, model.n_embd_inp), np.float32)
    with pytest.raises(fl.DecodeError, match="ends at position 2 but the batch starts at 1"):
        ctx.decode(fl.Batch.from_embeddings(rows, positions=image_positions(1, 2, 2)))
    ctx.decode(fl.Batch.from_embeddings(rows[:2], positions=image_positions(3, 2, 2)[:2], logits="none"))
    ctx.decode(fl.Batch.from_embeddings(rows[2:], positions=image_positions(3, 2, 2)[2:], logits="none"))
    assert (ctx.kv.seq_pos_min(0), ctx.kv.seq_pos_max(0)) == (0, 3)
    with pytest.raises(fl.DecodeError, match="with M-RoPE a batch of tokens starts after it"):
        ctx.decode(fl.Batch.from_tokens([40], 3, 0))
    ctx.decode(fl.Batch.from_tokens([40, 41], 9, 0))
    assert ctx.kv.seq_pos_max(0) == 10


def test_mrope_keys_cannot_shift():
    ctx = context(load_model("tiny-qwen3vlmoe-f32.gguf"))
    ctx.decode(fl.Batch.from_tokens([1, 20, 30], 0, 0))
    assert not ctx.kv.can_shift
    with pytest.raises(fl.UnsupportedError, match="M-RoPE"):
        ctx.kv.seq_add(0, 1, -1, 2)


@pytest.mark.parametrize("arch", ["qwen2vl", "qwen3vl"])
def test_embeddings_without_positions_are_text_positions(arch):
    """Token embeddings given as rows (zero DeepStack parts, as llama.cpp pads a token's) decode
    exactly as the tokens: without M-RoPE positions a row takes a text token's."""
    import gguf
    from conftest import model_path
    file = f"tiny-{arch}-f32.gguf"
    model = load_model(file)
    tokens = [1, 45, 300, 7, 99]
    table = next(t for t in gguf.GGUFReader(model_path(file)).tensors if t.name == "token_embd.weight")
    rows = np.zeros((len(tokens), model.n_embd_inp), np.float32)
    rows[:, :model.n_embd] = np.asarray(table.data)[tokens]
    by_tokens, by_rows = context(model), context(model)
    by_tokens.decode(fl.Batch.from_tokens([2, 3], 0, 0, "none"))
    by_rows.decode(fl.Batch.from_tokens([2, 3], 0, 0, "none"))
    by_tokens.decode(fl.Batch.from_tokens(tokens, 2, 0, "all"))
    by_rows.decode(fl.Batch.from_embeddings(rows, 2, 0, "all"))
    for i in range(len(tokens)):
        np.testing.assert_array_equal(by_rows.logits(i), by_tokens.logits(i))


def write_variant(tmp_path, arch: str, **metadata) -> str:  # noqa: ANN001
    """make_tiny_qwenvl.py's model of `arch` with metadata replaced (None: removed)."""
    import sys
    from dataclasses import replace
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "data"))
    import make_tiny_qwenvl as mq

    spec, dims = next((s, d) for s, d in mq.MODELS if s.name == arch)
    meta = {k: v for k, v in {**spec.metadata, **metadata}.items() if v is not None}
    path = tmp_path / f"{arch}.gguf"
    mq.mk.write_model(replace(spec, metadata=meta), "f32", path, dims=dims, vocab=mq.qwen_vocab)
    return str(path)


@pytest.mark.parametrize("arch, metadata, match", [
    ("qwen2vl", {"rope.dimension_sections": None}, "missing metadata key qwen2vl.rope.dimension_sections"),
    ("qwen2vl", {"rope.dimension_sections": [0, 0, 0, 8]}, "sections"),
    ("qwen3vl", {"rope.dimension_sections": [64, 32, 32, 1]}, r"sections \[64, 32, 32, 1\] for heads of 128"),
    ("qwen3vl", {"n_deepstack_layers": 3}, "n_deepstack_layers 3 of 3 blocks"),
])
def test_files_the_graphs_cannot_run_are_refused(tmp_path, arch, metadata, match):
    with pytest.raises(fl.GGUFError, match=match):
        fl.Model(write_variant(tmp_path, arch, **metadata))
