"""`ferrollama perplexity`: llama-perplexity's chunked method, checked against a direct
computation, batched chunks, and the KL-divergence file and statistics."""
from __future__ import annotations

import math
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ferrollama as fl
from ferrollama.cli.perplexity import compress_log_probs, expand_log_probs, row_width

DATA = Path(__file__).parent / "data"
TINY = DATA / "models" / "tiny-llama-f32.gguf"
TINY_Q = DATA / "models" / "tiny-llama-q4_0.gguf"


def ferrollama(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferrollama.cli", *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    text = "\n".join(p.read_text() for p in sorted((DATA / "texts").glob("*.txt"))) * 2
    path = tmp_path_factory.mktemp("ppl") / "text.txt"
    path.write_text(text)
    return path


def direct_ppl(model_file: Path, text: str, n_ctx: int, loras=()) -> tuple[float, list[float]]:
    """The perplexity computed with the core API; `loras`: (adapter file, scale) pairs to set."""
    model = fl.Model(str(model_file))
    tokens = list(model.tokenize(text, add_special=True, parse_special=False))
    ctx = fl.Context(model, n_ctx=n_ctx, n_batch=n_ctx)
    for path, scale in loras:
        ctx.set_lora(fl.LoraAdapter(model, str(path)), scale)
    nll, running = [], []
    first = n_ctx // 2
    for c in range(len(tokens) // n_ctx):
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx]
        chunk[0] = model.bos
        ctx.kv.clear()
        ctx.decode(fl.Batch.from_tokens(chunk, logits="all"))
        logits = ctx.logits_all().astype(np.float64)
        for i in range(first, n_ctx - 1):
            row = logits[i]
            m = row.max()
            nll.append(m + math.log(np.exp(row - m).sum()) - row[chunk[i + 1]])
        running.append(math.exp(sum(nll) / len(nll)))
    return math.exp(sum(nll) / len(nll)), running


def test_matches_a_direct_computation(text_file):
    r = ferrollama("perplexity", "-m", TINY, "-f", text_file, "-c", 64, "-b", 64)
    assert r.returncode == 0, r.stderr
    ppl, running = direct_ppl(TINY, text_file.read_text(), 64)
    shown = [float(v) for v in re.findall(r"\[\d+\]([\d.]+),", r.stdout)]
    assert len(shown) == len(running) >= 4
    assert shown == pytest.approx(running, rel=2e-4)
    final = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", r.stdout)
    assert float(final.group(1)) == pytest.approx(ppl, rel=2e-4)
    assert 0 < float(final.group(2)) < float(final.group(1))


def test_several_chunks_per_batch_give_the_same_result(text_file):
    one = ferrollama("perplexity", "-m", TINY, "-f", text_file, "-c", 64, "-b", 64)
    four = ferrollama("perplexity", "-m", TINY, "-f", text_file, "-c", 64, "-b", 256)
    assert four.returncode == 0, four.stderr
    assert "n_seq=4" in four.stderr
    final = lambda r: float(re.search(r"PPL = ([\d.]+)", r.stdout).group(1))  # noqa: E731
    assert final(four) == pytest.approx(final(one), rel=1e-3)


def test_too_short_a_text(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("just a few words")
    r = ferrollama("perplexity", "-m", TINY, "-f", short, "-c", 64)
    n_tokens = len(fl.Model(str(TINY)).tokenize("just a few words", add_special=True, parse_special=False))
    assert r.returncode == 1
    assert r.stderr == (f"error: you need at least 128 tokens to evaluate perplexity with a context of 64; the text "
                        f"has {n_tokens}: pass -c {n_tokens // 2} (or less) or a longer text\n")


def test_compressed_log_probs_round_trip():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((5, 101)) * 4).astype(np.float32)
    rows = compress_log_probs(logits)
    assert rows.shape == (5, row_width(101)) == (5, 2 * 51 + 4)
    logp = logits - (logits.max(1, keepdims=True) + np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)))
    back = expand_log_probs(rows, 101)
    keep = logp > logp.max(1, keepdims=True) - 16
    scale = np.ascontiguousarray(rows[:, :4]).view("<f4")[:, 0]
    assert np.all(np.abs(back - logp)[keep] <= (scale[:, None] * 0.51 + 1e-5).repeat(101, 1)[keep])


def test_kl_divergence_file_and_statistics(tmp_path, text_file):
    base = tmp_path / "base.kld"
    r = ferrollama("perplexity", "-m", TINY, "-f", text_file, "-c", 64, "--kl-divergence-base", base)
    assert r.returncode == 0, r.stderr
    model = fl.Model(str(TINY))
    n_tokens = len(model.tokenize(text_file.read_text(), add_special=True, parse_special=False))
    n_chunk = n_tokens // 64
    data = base.read_bytes()
    assert data[:8] == b"_logits_" and struct.unpack("<iii", data[8:20]) == (64, 512, n_chunk)
    assert len(data) == 20 + 4 * 64 * n_chunk + n_chunk * 31 * row_width(512) * 2
    same = ferrollama("perplexity", "-m", TINY, "--kl-divergence", "--kl-divergence-base", base, "-c", 64)
    assert same.returncode == 0, same.stderr
    mean_kld = float(re.search(r"Mean    KLD: +(-?[\d.]+)", same.stdout).group(1))
    assert abs(mean_kld) < 1e-4
    assert "Same top p: 100.000" in same.stdout
    quant = ferrollama("perplexity", "-m", TINY_Q, "--kl-divergence", "--kl-divergence-base", base, "-c", 64)
    assert quant.returncode == 0, quant.stderr
    assert float(re.search(r"Mean    KLD: +([\d.]+)", quant.stdout).group(1)) > 10 * max(mean_kld, 1e-6)
    ppl_q = float(re.search(r"Mean PPL\(Q\) +: +([\d.]+)", quant.stdout).group(1))
    ppl_base = float(re.search(r"Mean PPL\(base\) +: +([\d.]+)", quant.stdout).group(1))
    assert ppl_base == pytest.approx(float(re.search(r"PPL = ([\d.]+)", r.stdout).group(1)), rel=1e-3)
    assert ppl_q > 0


def test_kl_divergence_needs_its_file(tmp_path):
    r = ferrollama("perplexity", "-m", TINY, "--kl-divergence")
    assert r.returncode == 1 and "needs --kl-divergence-base" in r.stderr
    junk = tmp_path / "junk"
    junk.write_bytes(b"not logits")
    r = ferrollama("perplexity", "-m", TINY, "--kl-divergence", "--kl-divergence-base", junk)
    assert r.returncode == 1 and "not a file of log-probabilities" in r.stderr
