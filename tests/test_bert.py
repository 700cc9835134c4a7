"""Encoders (bert, nomic-bert): tokenization and pooled embeddings equal llama.cpp's records
(tests/data/fixtures/bert_embeddings.json, from benches/record_bert.py) within 1e-3, and
`ferrollama embed` runs on them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ferrollama as fl

DATA = Path(__file__).parent / "data"
RECORDS = json.loads((DATA / "fixtures" / "bert_embeddings.json").read_text())["records"]
TOL = 1e-3


def model(rec: dict) -> fl.Model:
    return fl.Model(str(DATA / "models" / rec["model"]))


def pooled(m: fl.Model, seqs: list[list[int]], pooling: str) -> list[np.ndarray]:
    ctx = fl.Context(m, n_ctx=128, n_batch=128, n_ubatch=128, n_seq_max=len(seqs), embeddings=True, pooling=pooling)
    batch = fl.Batch(n_tokens_max=sum(map(len, seqs)), n_seq_max=1)
    for s, toks in enumerate(seqs):
        for pos, t in enumerate(toks):
            batch.add(t, pos, (s,), True)
    ctx.decode(batch)
    return [ctx.embeddings_seq(s) for s in range(len(seqs))]


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r["model"])
def test_tokens_equal_llama_cpp(rec):
    m = model(rec)
    for text, want in zip(rec["texts"], rec["tokens"]):
        assert m.tokenize(text, add_special=True) == want


@pytest.mark.parametrize("pooling", ["mean", "cls"])
@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r["model"])
def test_pooled_embeddings_equal_llama_cpp(rec, pooling):
    m = model(rec)
    for toks, want in zip(rec["tokens"], rec[pooling]):
        got = pooled(m, [toks], pooling)[0]
        assert np.abs(got - np.asarray(want)).max() <= TOL


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r["model"])
def test_sequences_of_one_batch_attend_only_to_themselves(rec):
    got = pooled(model(rec), rec["tokens"], "mean")
    for g, want in zip(got, rec["batch_mean"]):
        assert np.abs(g - np.asarray(want)).max() <= TOL


def test_the_models_pooling_is_the_default_and_there_are_no_logits():
    rec = RECORDS[0]
    m = model(rec)
    ctx = fl.Context(m, n_ctx=128, n_ubatch=128)
    ctx.decode(fl.Batch.from_tokens(rec["tokens"][0], logits="all"))
    assert np.abs(ctx.embeddings_seq(0) - np.asarray(rec["mean"][0])).max() <= TOL
    with pytest.raises(ValueError, match="is an encoder: it has no logits"):
        ctx.logits(-1)


def test_a_batch_larger_than_the_micro_batch_is_refused():
    ctx = fl.Context(model(RECORDS[0]), n_ctx=128, n_batch=128, n_ubatch=8)
    with pytest.raises(ValueError, match="needs n_ubatch >= 12"):
        ctx.decode(fl.Batch.from_tokens(list(range(100, 112)), logits="all"))


def test_embed_command_prints_llama_cpps_normalized_embedding():
    rec = RECORDS[0]
    r = subprocess.run([sys.executable, "-m", "ferrollama.cli", "embed", "-m", str(DATA / "models" / rec["model"]),
                        "-p", rec["texts"][0], "--embd-output-format", "array"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = np.asarray(json.loads(r.stdout)[0])
    want = np.asarray(rec["mean"][0])
    assert np.abs(got - want / np.linalg.norm(want)).max() <= TOL
