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
HYBRID_ARCHS = ("mamba2", "granitehybrid", "falcon-h1", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe",
                "qwen35", "qwen35moe", "qwen3next")
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


def _decode(ctx, tokens, pos0, seq=0):
    import ferrollama as fl
    ctx.decode(fl.Batch.from_tokens(tokens, pos0=pos0, seq_id=seq, logits="last"))
    return ctx.logits(len(tokens) - 1)


@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_rollback_snapshots_rewind_the_state_of_the_last_decode(arch: str) -> None:
    """With n_rs_seq, seq_rm of up to that many tokens of the last decode restores the state
    before them (a speculative decoder's rejected drafts); the next token's logits are those of
    a context that never saw the removed tokens. Without it, the same seq_rm is refused."""
    import numpy as np
    import ferrollama as fl
    model = load_model(f"tiny-{arch}-f32.gguf")
    prompt, drafts, fix = [5, 17, 99, 23, 42, 7, 300, 11], [60, 61, 62, 63], 77
    ctx = fl.Context(model, n_ctx=128, n_rs_seq=4, type_k="f32", type_v="f32")
    _decode(ctx, prompt, 0)
    _decode(ctx, drafts, len(prompt))
    assert not ctx.kv.seq_rm(0, len(prompt) - 1, -1), "5 tokens back: beyond the snapshots"
    assert ctx.kv.seq_rm(0, len(prompt) + 1, -1)
    assert ctx.kv.seq_pos_max(0) == len(prompt)
    got = _decode(ctx, [fix], len(prompt) + 1)
    fresh = fl.Context(model, n_ctx=128, type_k="f32", type_v="f32")
    _decode(fresh, prompt + drafts[:1], 0)
    want = _decode(fresh, [fix], len(prompt) + 1)
    assert np.abs(np.asarray(got) - np.asarray(want)).max() < 1e-4
    plain = fl.Context(model, n_ctx=128, type_k="f32", type_v="f32")
    _decode(plain, prompt + drafts, 0)
    assert not plain.kv.seq_rm(0, len(prompt) + 1, -1)
    assert plain.kv.seq_pos_max(0) == len(prompt) + len(drafts) - 1


@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_a_partial_state_checkpoint_rewinds_a_sequence(arch: str) -> None:
    """A checkpoint of a sequence's recurrent states (seq_state_get(partial=True)), restored
    after more tokens were decoded, then seq_rm of the positions after it: the sequence
    continues as if those tokens had never been decoded (llama-server's context checkpoints)."""
    import numpy as np
    import ferrollama as fl
    model = load_model(f"tiny-{arch}-f32.gguf")
    prompt, later, fix = [5, 17, 99, 23, 42, 7, 300, 11], [60, 61, 62], 77
    ctx = fl.Context(model, n_ctx=128, type_k="f32", type_v="f32")
    _decode(ctx, prompt, 0)
    checkpoint = ctx.seq_state_get(0, partial=True)
    _decode(ctx, later, len(prompt))
    assert not ctx.kv.seq_rm(0, len(prompt), -1)
    ctx.seq_state_set(checkpoint, 0, partial=True)
    assert ctx.kv.seq_rm(0, len(prompt), -1)
    assert ctx.kv.seq_pos_max(0) == len(prompt) - 1
    got = _decode(ctx, [fix], len(prompt))
    fresh = fl.Context(model, n_ctx=128, type_k="f32", type_v="f32")
    _decode(fresh, prompt, 0)
    want = _decode(fresh, [fix], len(prompt))
    assert np.abs(np.asarray(got) - np.asarray(want)).max() < 1e-4


def test_positions_of_m_rope_keys_cannot_be_shifted() -> None:
    """llama.cpp cannot K-shift keys rotated with several positions per token (Qwen3.5's
    interleaved M-RoPE: get_can_shift is false, the next decode aborts); the engine refuses
    seq_add / seq_div there and leaves the cache as it was. Qwen3-Next's plain RoPE shifts."""
    import ferrollama as fl
    for arch, can_shift in (("qwen35", False), ("qwen3next", True)):
        ctx = fl.Context(load_model(f"tiny-{arch}-f32.gguf"), n_ctx=64, type_k="f32", type_v="f32")
        _decode(ctx, [1, 5, 17, 99], 0)
        if can_shift:
            ctx.kv.seq_add(0, 0, -1, 3)
            assert ctx.kv.seq_pos_max(0) == 6
            continue
        for move in (lambda: ctx.kv.seq_add(0, 0, -1, 3), lambda: ctx.kv.seq_div(0, 0, -1, 2)):
            with pytest.raises(fl.UnsupportedError, match="M-RoPE"):
                move()
        assert ctx.kv.seq_pos_max(0) == 3
        ctx.kv.seq_add(0, 0, -1, 0)  # no move: nothing to refuse
        _decode(ctx, [7], 4)
