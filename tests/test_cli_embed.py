"""`ferrollama embed`: mean-pooled embeddings, normalization and the similarity matrix."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ferrollama as fl

DATA = Path(__file__).parent / "data"
TINY = DATA / "models" / "tiny-llama-f32.gguf"


def ferrollama(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferrollama.cli", *map(str, args)], capture_output=True, text=True)


def test_json_embeddings_are_normalized_means():
    r = ferrollama("embed", "-m", TINY, "-p", "hello world\\nanother text", "--embd-output-format", "json+")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    vecs = [np.asarray(d["embedding"]) for d in out["data"]]
    assert len(vecs) == 2 and all(len(v) == 256 for v in vecs)
    assert all(np.linalg.norm(v) == pytest.approx(1.0, abs=1e-5) for v in vecs)
    assert out["cosineSimilarity"][0][0] == pytest.approx(1.0, abs=1e-5)
    model = fl.Model(str(TINY))
    ctx = fl.Context(model, n_ctx=256, embeddings=True, pooling="mean")
    tokens = model.tokenize("hello world", add_special=True, parse_special=True)
    ctx.decode(fl.Batch.from_tokens(tokens, logits="all"))
    ref = np.asarray(ctx.embeddings_seq(0), dtype=np.float64)
    assert vecs[0] == pytest.approx(ref / np.linalg.norm(ref), abs=1e-5)


def test_text_output_and_matrix():
    r = ferrollama("embed", "-m", TINY, "-p", "a cat\\na dog\\nthe stock market")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("embedding ") == 3
    assert "cosine similarity matrix:" in r.stdout


def test_normalization_modes():
    from ferrollama.cli.embed import normalize

    v = np.array([3.0, -4.0], dtype=np.float32)
    assert normalize(v, 2).tolist() == pytest.approx([0.6, -0.8])
    assert normalize(v, 1).tolist() == pytest.approx([3 / 7, -4 / 7])
    assert normalize(v, -1).tolist() == [3.0, -4.0]
    assert normalize(v, 0).tolist() == pytest.approx([3 * 32760 / 4, -32760])
    assert normalize(v, 3).tolist() == pytest.approx((v / (27 + 64) ** (1 / 3)).tolist())
