"""`ferrollama imatrix`: the importance matrix of the tiny models against llama.cpp's, recorded with
llama-imatrix's loop and collector on llama.cpp's eval callback (benches/record_imatrix.py).

The counts and the set of matrices are llama.cpp's exactly. The sums are float32 sums of squared
activations over 640 tokens, added in llama-imatrix's order: where the activations are the same
bits (layer 0's Q/K/V input, the RMS norm of the embeddings), the sums are bit for bit llama.cpp's.
Deeper, the activations are the engine's, which differ from ggml's in the last bits of the
matrix products (the logits agree to 1e-4, tests/data/REFERENCE.md); every sum then agrees with
llama.cpp's to within 1e-4 of the matrix's largest sum (measured: at most 2.5e-5 dense, 3.0e-5
with experts; a small column relative to itself: 2.2e-4)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import ferrollama as fl

DATA = Path(__file__).parent / "data"
TEXT = DATA / "imatrix" / "calibration.txt"
RTOL = 1e-4


def ferrollama(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferrollama.cli", *map(str, args)], capture_output=True, text=True)


def read_imatrix(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    r = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return fields, {t.name: np.asarray(t.data, dtype=np.float32) for t in r.tensors}


@pytest.mark.parametrize("name", ["tiny-llama-f32", "tiny-qwen3moe-f32", "tiny-phi3-f32"])
def test_imatrix_matches_llama_imatrix(tmp_path, name):
    out = tmp_path / "imatrix.gguf"
    r = ferrollama("imatrix", "-m", DATA / "models" / f"{name}.gguf", "-f", TEXT, "-o", out, "-c", 64, "-b", 128)
    assert r.returncode == 0, r.stderr
    fields, got = read_imatrix(out)
    ref_fields, want = read_imatrix(DATA / "imatrix" / f"{name}.imatrix.gguf")
    assert fields["general.type"] == "imatrix" and "general.architecture" not in fields
    assert fields["imatrix.chunk_count"] == ref_fields["imatrix.chunk_count"] == 10
    assert fields["imatrix.chunk_size"] == 64
    assert fields["imatrix.datasets"] == [str(TEXT)]
    assert sorted(got) == sorted(want)
    for key, ref in want.items():
        assert got[key].shape == ref.shape, key
        if key.endswith(".counts"):
            assert np.array_equal(got[key], ref), key
        else:
            assert np.abs(got[key] - ref).max() <= RTOL * np.abs(ref).max(), key
    layer0_qkv = [k for k in want if k.startswith(("blk.0.attn_q", "blk.0.attn_k", "blk.0.attn_v")) and k.endswith("in_sum2")]
    assert layer0_qkv
    for key in layer0_qkv:
        assert got[key].tobytes() == want[key].tobytes(), key


def test_stats_are_collected_only_when_enabled():
    model = fl.Model(str(DATA / "models" / "tiny-llama-f32.gguf"))
    ctx = fl.Context(model, n_ctx=64)
    ctx.decode(fl.Batch.from_tokens(list(range(1, 33)), logits="all"))
    assert ctx.take_activation_stats() == {}
    ctx.kv.clear()
    ctx.set_activation_stats(True)
    ctx.decode(fl.Batch.from_tokens(list(range(1, 16)), logits="all"))
    assert ctx.take_activation_stats() == {}  # micro-batches under 16 tokens are skipped, as llama-imatrix does
    ctx.kv.clear()
    ctx.decode(fl.Batch.from_tokens(list(range(1, 17)), logits="all"))
    stats = ctx.take_activation_stats()
    sums, counts = stats["blk.1.ffn_down.weight"]
    assert sums.shape == (1, 512) and counts.tolist() == [16]
    assert ctx.take_activation_stats() == {}


def test_a_text_shorter_than_two_chunks_is_refused(tmp_path):
    r = ferrollama("imatrix", "-m", DATA / "models" / "tiny-llama-f32.gguf", "-f", TEXT, "-o", tmp_path / "x.gguf", "-c", 512)
    assert r.returncode == 1
    assert "you need at least 1024 tokens for a context of 512 tokens" in r.stderr
