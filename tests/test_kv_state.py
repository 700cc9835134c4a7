"""The KV cache through Context.kv and the state API: cell contents after llama.cpp's worked
examples, all-or-none decode on a full cache, errors that leave the context usable, state
round trips that continue with bit-identical logits, and broken blobs refused."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import ferrollama as fl


def ctx_for(model: fl.Model, **kw) -> fl.Context:
    kw.setdefault("n_ctx", 256)
    kw.setdefault("n_batch", 64)
    kw.setdefault("n_ubatch", 64)
    return fl.Context(model, **kw)


def decode_run(ctx: fl.Context, tokens: list[int], pos0: int = 0, seq: int = 0) -> np.ndarray:
    ctx.decode(fl.Batch.from_tokens(tokens, pos0=pos0, seq_id=seq))
    return ctx.logits(-1)


def test_self_extend_worked_example(tiny_model: fl.Model) -> None:
    # llama-cli's group-attention pass with ga_w=4, ga_n=2 over 5 tokens: positions 0,0,1,1,2.
    ctx = ctx_for(tiny_model)
    decode_run(ctx, [1, 10, 20, 30, 40])
    ga_n, ga_w, ga_i, n_past = 2, 4, 0, 5
    ib = ga_i // ga_w
    bd = (ga_w // ga_n) * (ga_n - 1)
    dd = (ga_w // ga_n) - ib * bd - ga_w
    ctx.kv.seq_add(0, ga_i, n_past, ib * bd)
    ctx.kv.seq_div(0, ga_i + ib * bd, ga_i + ib * bd + ga_w, ga_n)
    ctx.kv.seq_add(0, ga_i + ib * bd + ga_w, n_past + ib * bd, dd)
    cells = [c for c in ctx.kv.cells() if c[0] >= 0]
    assert [p for p, _ in cells] == [0, 0, 1, 1, 2]
    assert all(s == frozenset({0}) for _, s in cells)
    assert (ctx.kv.seq_pos_min(0), ctx.kv.seq_pos_max(0)) == (0, 2)


def test_full_cache_fails_whole_and_leaves_cells(tiny_model: fl.Model) -> None:
    ctx = ctx_for(tiny_model, n_ctx=256, n_batch=256, n_ubatch=32)
    decode_run(ctx, list(range(1, 201)))
    before = ctx.kv.cells()
    with pytest.raises(fl.DecodeError):
        ctx.decode(fl.Batch.from_tokens(list(range(1, 101)), pos0=200))
    assert ctx.kv.cells() == before and ctx.kv.used == 200
    decode_run(ctx, [5, 6], pos0=200)  # still usable
    assert ctx.kv.used == 202


def test_bad_inputs_raise_and_keep_context_usable(tiny_model: fl.Model) -> None:
    ctx = ctx_for(tiny_model, n_seq_max=2)
    with pytest.raises(ValueError):
        ctx.decode(fl.Batch.from_tokens([tiny_model.n_vocab]))
    with pytest.raises(ValueError):
        ctx.kv.seq_cp(0, 5)
    with pytest.raises(ValueError):
        ctx.kv.seq_add(7, 0, -1, 1)
    with pytest.raises(ValueError):
        ctx.logits(0)  # nothing decoded yet
    decode_run(ctx, [1, 2, 3])
    with pytest.raises(fl.DecodeError, match="Y = X"):
        ctx.decode(fl.Batch.from_tokens([4], pos0=7))
    b = fl.Batch(4, 2)
    with pytest.raises(ValueError):
        b.add(1, 0, [0, 1, 1])
    assert ctx.kv.seq_pos_max(0) == 2
    decode_run(ctx, [4], pos0=3)


def test_seq_rm_partial_and_all(tiny_model: fl.Model) -> None:
    ctx = ctx_for(tiny_model, n_seq_max=3)
    decode_run(ctx, [1, 2, 3, 4])
    ctx.kv.seq_cp(0, 1)
    ctx.kv.seq_cp(0, 2, 0, 2)
    assert ctx.kv.seq_rm(0, 2, -1) is True
    cells = {p: s for p, s in ctx.kv.cells() if p >= 0}
    assert cells == {0: {0, 1, 2}, 1: {0, 1, 2}, 2: {1}, 3: {1}}
    assert ctx.kv.seq_rm(-1, -1, -1) is True and ctx.kv.used == 0


def test_state_round_trip_is_bit_identical(tiny_model: fl.Model) -> None:
    ctx = ctx_for(tiny_model)
    decode_run(ctx, [1, 50, 60, 70, 80])
    blob = ctx.state_get()
    want = decode_run(ctx, [90], pos0=5).copy()
    other = ctx_for(tiny_model)
    other.state_set(blob)
    assert np.array_equal(other.logits(-1), ctx_for(tiny_model) and decode_run(ctx_for(tiny_model), [1, 50, 60, 70, 80]))
    assert np.array_equal(decode_run(other, [90], pos0=5), want)


def test_seq_state_into_another_id_and_context(qwen_model: fl.Model) -> None:
    ctx = fl.Context(qwen_model, n_ctx=256, n_seq_max=2)
    prompt = qwen_model.tokenize("The quick brown fox")
    decode_run(ctx, prompt)
    blob = ctx.seq_state_get(0)
    want = decode_run(ctx, [264], pos0=len(prompt)).copy()
    other = fl.Context(qwen_model, n_ctx=256, n_seq_max=2)
    other.seq_state_set(blob, 1)
    assert other.kv.seq_pos_max(1) == len(prompt) - 1 and other.kv.seq_pos_max(0) == -1
    got = decode_run(other, [264], pos0=len(prompt), seq=1)
    assert np.array_equal(got, want)


def test_broken_blobs_are_refused_and_leave_the_context(tiny_model: fl.Model, tmp_path) -> None:
    ctx = ctx_for(tiny_model)
    decode_run(ctx, [1, 2, 3])
    blob = ctx.state_get()
    target = ctx_for(tiny_model)
    decode_run(target, [1, 9])
    before = target.kv.cells()
    for broken in (blob[:-7], blob[:20], b"junk" + blob[4:], blob + b"x", blob[:12] + bytes([blob[12] ^ 1]) + blob[13:]):
        with pytest.raises(fl.StateError):
            target.state_set(broken)
        assert target.kv.cells() == before
    with pytest.raises(fl.StateError):
        ctx_for(tiny_model, type_k="f32", type_v="f32").state_set(blob)
    other_model = fl.Model(str(tiny_model.path).replace("f32", "q8_0"))
    with pytest.raises(fl.StateError, match="another model"):
        ctx_for(other_model).state_set(blob)
    # session files
    path = tmp_path / "s.bin"
    ctx.state_save(path, [1, 2, 3])
    fresh = ctx_for(tiny_model)
    assert fresh.state_load(path) == [1, 2, 3]
    assert fresh.kv.seq_pos_max(0) == 2
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(fl.StateError):
        fresh.state_load(path)
    with pytest.raises(fl.StateError):
        fresh.state_load(tmp_path / "missing.bin")


@pytest.mark.parametrize("cache_type", ["f16", "f32"])
def test_defrag_moves_rows_unchanged(tiny_model: fl.Model, cache_type: str) -> None:
    a, b = (ctx_for(tiny_model, n_seq_max=2, type_k=cache_type, type_v=cache_type) for _ in range(2))
    for ctx in (a, b):
        decode_run(ctx, [1, 2, 3, 4, 5, 6], seq=1)
        decode_run(ctx, [1, 7, 8, 9], seq=0)
        ctx.kv.seq_rm(1)
    b.kv.defrag()
    assert [p for p, _ in a.kv.cells()[6:10]] == [0, 1, 2, 3]
    assert [p for p, _ in b.kv.cells()[:4]] == [0, 1, 2, 3]
    # The sequence's state holds each cell's K and V rows: moved, not recomputed, they are
    # the same bytes.
    assert a.seq_state_get(0) == b.seq_state_get(0)
    # The next token reads them from other cells, so its sums run in other lanes (which cell
    # goes to which accumulator depends on its index, as in llama.cpp). With an F32 cache
    # that is all that differs (measured 1.2e-6). An F16 cache also rounds each probability
    # to f16 after that sum, which flips some roundings (measured 4e-5 between the two
    # layouts, each 1.1e-3 from exact float64): its rows are checked above, its logits not.
    if cache_type == "f32":
        assert np.allclose(decode_run(a, [10], pos0=4), decode_run(b, [10], pos0=4), atol=1e-5)


def test_concurrent_use_is_refused(qwen_model: fl.Model) -> None:
    ctx = fl.Context(qwen_model, n_ctx=512, n_batch=512, n_ubatch=512)
    tokens = list(range(100, 500))
    errors: list[BaseException] = []

    def long_decode() -> None:
        try:
            ctx.decode(fl.Batch.from_tokens(tokens))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=long_decode)
    t.start()
    refused = 0
    while t.is_alive():
        try:
            ctx.kv.seq_pos_max(0)
        except fl.BusyError:
            refused += 1
    t.join()
    assert not errors and refused > 0
    assert ctx.kv.seq_pos_max(0) == len(tokens) - 1


def test_embeddings_mean_pooling(tiny_model: fl.Model) -> None:
    ctx = fl.Context(tiny_model, n_ctx=256, embeddings=True, pooling="mean", n_seq_max=2)
    b = fl.Batch(8, 2)
    for i, t in enumerate([1, 5, 6]):
        b.add(t, i, [0])
    for i, t in enumerate([1, 9]):
        b.add(t, i, [1])
    ctx.decode(b)
    rows = np.stack([ctx.embeddings(i) for i in range(5)])
    assert rows.shape == (5, tiny_model.n_embd)
    assert np.allclose(ctx.embeddings_seq(0), rows[:3].mean(0), atol=1e-6)
    assert np.allclose(ctx.embeddings_seq(1), rows[3:].mean(0), atol=1e-6)


def test_control_vector_shifts_the_output(tiny_model: fl.Model) -> None:
    ctx = ctx_for(tiny_model)
    base = decode_run(ctx, [1, 2, 3]).copy()
    ctx.kv.clear()
    ctx.set_control_vector(np.zeros((tiny_model.n_layer, tiny_model.n_embd), np.float32))
    assert np.array_equal(decode_run(ctx, [1, 2, 3]), base)
    ctx.kv.clear()
    ctx.set_control_vector(np.full((tiny_model.n_layer, tiny_model.n_embd), 0.5, np.float32), 1, 1)
    assert not np.allclose(decode_run(ctx, [1, 2, 3]), base)
    with pytest.raises(ValueError):
        ctx.set_control_vector(np.zeros((1, 3), np.float32))


def test_window_held_says_when_a_sliding_window_was_reused() -> None:
    # Gemma 3's sliding layers (window 32) keep a smaller cache (256 cells here) that reuses
    # cells the window hides: cut back into those, the sequence cannot go on (llama-server
    # re-processes the prompt then)
    from conftest import load_model
    from ferrollama.generation.checkpoints import Checkpoints

    model = load_model("tiny-gemma3-f32.gguf")
    ctx = fl.Context(model, n_ctx=512, n_batch=512, n_ubatch=64, n_threads=1)
    assert ctx.kv.sizes == [512, 256]
    tokens = [1] + [int(t) for t in np.random.default_rng(5).integers(3, 400, 299)]
    ctx.decode(fl.Batch.from_tokens(tokens, 0, 0, "last"))
    assert ctx.kv.seq_pos_min(0) > 0              # the sliding cache lost the first positions
    assert ctx.kv.window_held(0, 300) and ctx.kv.window_held(0, 250) and not ctx.kv.window_held(0, 40)
    assert ctx.kv.window_held(0, 0)               # the start needs nothing before it
    ctx.kv.seq_rm(0, 40, -1)
    with pytest.raises(fl.DecodeError, match="sliding-window cache"):
        ctx.decode(fl.Batch.from_tokens(tokens[40:41], 40, 0))
    # Checkpoints.rewind (Llama's and the server's prefix reuse) starts over instead
    ctx.kv.clear()
    ctx.decode(fl.Batch.from_tokens(tokens, 0, 0, "last"))
    assert Checkpoints(ctx, 0).rewind(0, 40) == 0 and ctx.kv.seq_pos_max(0) == -1
    ctx.decode(fl.Batch.from_tokens(tokens, 0, 0, "last"))
    assert Checkpoints(ctx, 0).rewind(0, 290) == 290
    with pytest.raises(ValueError):
        ctx.kv.window_held(5, 10)
