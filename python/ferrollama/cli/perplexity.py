"""``ferrollama perplexity -f TEXT``: llama-perplexity's chunked method.

The text is tokenized (with BOS) and cut into chunks of -c tokens; each chunk is decoded from an
empty cache with BOS in its first place, and the second half of the chunk is scored (the logits
at position i predict token i+1). With -b a multiple of -c, several chunks share a batch, one
sequence each. The running estimate is printed per chunk, then the final PPL ± its uncertainty.

``--kl-divergence-base FILE`` also saves the log-probabilities in llama.cpp's format (so files
are interchangeable with llama-perplexity's); ``--kl-divergence --kl-divergence-base FILE``
compares this model with the saved one on the saved tokens.
"""
from __future__ import annotations

import argparse
import math
import struct
import sys
from dataclasses import dataclass, field

import numpy as np

from .._core import Batch
from ..generation.tokens import add_bos_of
from .common import CLIError, add_context_args, add_model_args, int_value, load_model, log, make_context, progress, \
    read_text_file

MAGIC = b"_logits_"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_context_args(p, n_ctx=512)
    g = p.add_argument_group("perplexity")
    g.add_argument("-f", "--file", metavar="FNAME", default=None, help="the text to score")
    g.add_argument("--chunks", type=int_value, default=-1, metavar="N", help="score at most N chunks (default: all)")
    g.add_argument("--kl-divergence-base", metavar="FNAME", default=None,
                   help="save the log-probabilities here (or, with --kl-divergence, read them)")
    g.add_argument("--kl-divergence", action="store_true", help="compare with the log-probabilities saved in --kl-divergence-base")


# --- the chunked evaluation ---------------------------------------------------------------------

@dataclass
class Plan:
    n_ctx: int
    n_batch: int
    n_seq: int
    n_chunk: int

    @property
    def first(self) -> int:
        return self.n_ctx // 2

    @property
    def n_scored(self) -> int:
        return self.n_ctx - 1 - self.first


def make_plan(n_tokens: int, n_ctx: int, n_batch: int, chunks: int) -> Plan:
    if n_ctx <= 0:
        raise CLIError("perplexity needs a context size: -c N with N > 0")
    if n_tokens < 2 * n_ctx:
        # Two chunks at least (llama-perplexity's rule): the largest context this text allows is half of it.
        fits = f"pass -c {n_tokens // 2} (or less) or a longer text" if n_tokens >= 4 else "pass a longer text"
        raise CLIError(f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of {n_ctx}; "
                       f"the text has {n_tokens}: {fits}")
    return chunk_plan(n_tokens, n_ctx, n_batch, chunks)


def chunk_plan(n_tokens: int, n_ctx: int, n_batch: int, chunks: int) -> Plan:
    """llama-perplexity's (and llama-imatrix's) split of a text into chunks of n_ctx tokens, n_seq
    of them decoded together in a batch of n_batch."""
    n_seq = max(1, n_batch // n_ctx)
    n_batch = min(n_batch, n_seq * n_ctx)
    if not (n_batch < n_ctx or n_batch % n_ctx == 0):
        raise CLIError(f"the batch size ({n_batch}) must be below the context size ({n_ctx}) or a multiple of it")
    n_chunk_max = n_tokens // n_ctx
    return Plan(n_ctx, n_batch, n_seq, n_chunk_max if chunks < 0 else min(chunks, n_chunk_max))


def chunk_logits(ctx, plan: Plan, tokens: list[int], start_chunk: int, n_seq: int, bos: int | None) -> list[np.ndarray]:
    """Decodes n_seq chunks (one sequence each); returns, per chunk, the logits of positions first..n_ctx-1."""
    ctx.kv.clear()
    n_ctx, first = plan.n_ctx, plan.first
    outputs: list[list[np.ndarray]] = [[] for _ in range(n_seq)]
    for j in range(0, n_ctx, plan.n_batch):
        size = min(plan.n_batch, n_ctx - j)
        batch = Batch(n_tokens_max=size * n_seq, n_seq_max=n_seq)
        for seq in range(n_seq):
            start = (start_chunk + seq) * n_ctx + j
            for k in range(size):
                token = bos if (bos is not None and j == 0 and k == 0) else tokens[start + k]
                batch.add(token, j + k, (seq,), j + k >= first)
        ctx.decode(batch)
        n_out = sum(1 for k in range(size) if j + k >= first)
        if n_out:
            rows = ctx.logits_all()
            for seq in range(n_seq):
                outputs[seq].append(np.asarray(rows[seq * n_out:(seq + 1) * n_out]))
    return [np.concatenate(o) for o in outputs]


def nll_of(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of each target under its row of logits (float64 sums, as llama.cpp)."""
    x = logits.astype(np.float32)
    m = x.max(axis=1)
    lse = np.log(np.exp(x - m[:, None]).astype(np.float64).sum(axis=1))
    return m + lse - x[np.arange(len(targets)), targets]


# --- llama.cpp's compressed log-probabilities (the --kl-divergence-base file) ------------------

def row_width(n_vocab: int) -> int:
    return 2 * ((n_vocab + 1) // 2) + 4


def compress_log_probs(logits: np.ndarray) -> np.ndarray:
    """Rows of uint16: (scale, min log-prob) as two float32, then each token's log-prob quantized."""
    x = logits.astype(np.float32)
    n_rows, n_vocab = x.shape
    max_l = x.max(axis=1)
    min_l = np.maximum(x.min(axis=1), max_l - 16)
    lse = np.log(np.exp(x - max_l[:, None]).astype(np.float64).sum(axis=1)).astype(np.float32)
    min_lp = (min_l - max_l - lse).astype(np.float32)
    scale = ((max_l - min_l) / np.float32(65535)).astype(np.float32)
    out = np.zeros((n_rows, row_width(n_vocab)), dtype=np.uint16)
    head = np.stack([scale, min_lp], axis=1).astype("<f4").view(np.uint16)
    out[:, :4] = head
    inv = np.divide(1, scale, out=np.zeros_like(scale), where=scale != 0)
    q = np.rint(inv[:, None] * (x - min_l[:, None]))
    out[:, 4:4 + n_vocab] = np.where(x > min_l[:, None], np.clip(q, 0, 65535), 0).astype(np.uint16)
    return out


def expand_log_probs(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    head = np.ascontiguousarray(rows[:, :4]).view("<f4")
    scale, min_lp = head[:, 0], head[:, 1]
    return scale[:, None] * rows[:, 4:4 + n_vocab].astype(np.float32) + min_lp[:, None]


class LogitsFile:
    """Writer and reader of llama-perplexity's log-probability file."""

    @staticmethod
    def write_header(f, n_ctx: int, n_vocab: int, n_chunk: int, tokens: list[int]) -> None:
        f.write(MAGIC + struct.pack("<iii", n_ctx, n_vocab, n_chunk))
        f.write(np.asarray(tokens[: n_chunk * n_ctx], dtype="<i4").tobytes())

    @staticmethod
    def read_header(f, path: str) -> tuple[int, int, int, list[int]]:
        head = f.read(20)
        if len(head) < 20 or head[:8] != MAGIC:
            raise CLIError(f"{path}: not a file of log-probabilities (llama-perplexity --kl-divergence-base)")
        n_ctx, n_vocab, n_chunk = struct.unpack("<iii", head[8:])
        if n_ctx <= 0 or n_vocab <= 0 or n_chunk <= 0 or n_ctx * n_chunk > 1 << 31:
            raise CLIError(f"{path}: malformed header (n_ctx {n_ctx}, n_vocab {n_vocab}, chunks {n_chunk})")
        raw = f.read(4 * n_ctx * n_chunk)
        if len(raw) != 4 * n_ctx * n_chunk:
            raise CLIError(f"{path}: truncated (the tokens are missing)")
        return n_ctx, n_vocab, n_chunk, np.frombuffer(raw, dtype="<i4").tolist()


# --- perplexity ---------------------------------------------------------------------------------

@dataclass
class Totals:
    nll: float = 0.0
    nll2: float = 0.0
    count: int = 0
    history: list[float] = field(default_factory=list)

    def add(self, values: np.ndarray) -> None:
        self.nll += float(values.sum())
        self.nll2 += float((values.astype(np.float64) ** 2).sum())
        self.count += len(values)

    def ppl(self) -> float:
        return math.exp(self.nll / self.count)

    def uncertainty(self) -> float:
        mean = self.nll / self.count
        var = self.nll2 / self.count - mean * mean
        return math.sqrt(var / (self.count - 1)) * self.ppl() if var > 0 and self.count > 1 else 0.0


def perplexity(args: argparse.Namespace) -> int:
    if args.file is None:
        raise CLIError("give the text with -f")
    text = read_text_file(args.file, "text file")
    model = load_model(args)
    tokens = list(model.tokenize(text, add_special=True, parse_special=False))
    plan = make_plan(len(tokens), args.ctx_size, args.batch_size, args.chunks)
    ctx = make_context(args, model, n_ctx=plan.n_ctx * plan.n_seq, n_batch=plan.n_batch, n_seq_max=plan.n_seq)
    bos = model.bos if add_bos_of(model) else None
    log(f"perplexity: calculating perplexity over {plan.n_chunk} chunks, n_ctx={plan.n_ctx}, "
        f"batch_size={plan.n_batch}, n_seq={plan.n_seq}")
    out = open(args.kl_divergence_base, "wb") if args.kl_divergence_base else None
    totals = Totals()
    try:
        if out is not None:
            LogitsFile.write_header(out, plan.n_ctx, model.n_vocab, plan.n_chunk, tokens)
        with progress(plan.n_chunk, "perplexity", unit="chunk") as bar:
            for i in range(0, plan.n_chunk, plan.n_seq):
                n_seq = min(plan.n_seq, plan.n_chunk - i)
                for seq, logits in enumerate(chunk_logits(ctx, plan, tokens, i, n_seq, bos)):
                    start = (i + seq) * plan.n_ctx + plan.first
                    targets = np.asarray(tokens[start + 1:start + 1 + plan.n_scored])
                    rows = logits[:plan.n_scored]
                    totals.add(nll_of(rows, targets))
                    if out is not None:
                        out.write(compress_log_probs(rows).astype("<u2").tobytes())
                    sys.stdout.write(f"[{i + seq + 1}]{totals.ppl():.4f},")
                    sys.stdout.flush()
                    bar.update(1)
    finally:
        if out is not None:
            out.close()
    print()
    print(f"Final estimate: PPL = {totals.ppl():.4f} +/- {totals.uncertainty():.5f}")
    return 0


# --- KL divergence ------------------------------------------------------------------------------

@dataclass
class KLTotals:
    nll: list[float] = field(default_factory=list)
    nll_base: list[float] = field(default_factory=list)
    kld: list[float] = field(default_factory=list)
    p_diff: list[float] = field(default_factory=list)
    same_top: int = 0

    def add(self, logits: np.ndarray, base_rows: np.ndarray, targets: np.ndarray, n_vocab: int) -> None:
        x = logits.astype(np.float32)
        m = x.max(axis=1)
        lse = np.log(np.exp(x - m[:, None]).astype(np.float64).sum(axis=1))
        logp = x - (m + lse)[:, None]
        base = expand_log_probs(base_rows, n_vocab)
        idx = np.arange(len(targets))
        nll, nll_base = -logp[idx, targets], -base[idx, targets]
        keep = base > -16
        kld = np.where(keep, np.exp(base) * (base - logp), 0.0).sum(axis=1)
        self.nll += nll.tolist()
        self.nll_base += nll_base.tolist()
        self.kld += kld.tolist()
        self.p_diff += (np.exp(-nll) - np.exp(-nll_base)).tolist()
        self.same_top += int((x.argmax(axis=1) == base.argmax(axis=1)).sum())


def _mean_err(values) -> tuple[float, float]:
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return float(v.mean()) if len(v) else 0.0, 0.0
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v)))


def _chunk_line(i: int, t: KLTotals) -> str:
    n = len(t.kld)
    ppl = math.exp(np.mean(t.nll))
    ppl_err = ppl * _mean_err(t.nll)[1]
    ratio, ratio_err = _mean_err(np.asarray(t.nll) - np.asarray(t.nll_base))
    kld, kld_err = _mean_err(t.kld)
    rms = math.sqrt(float(np.mean(np.square(t.p_diff))))
    top = t.same_top / n
    top_err = math.sqrt(top * (1 - top) / (n - 1)) if n > 1 else 0.0
    return (f"{i:4d}    {ppl:10.4f} ± {ppl_err:10.5f}    {ratio:10.5f} ± {ratio_err:10.5f}    "
            f"{kld:10.6f} ± {kld_err:10.6f}    {100 * rms:6.3f} %    {100 * top:6.3f} ± {100 * top_err:6.3f} %")


def _print_kl_summary(t: KLTotals) -> None:
    nll, nll_base = np.asarray(t.nll), np.asarray(t.nll_base)
    ppl, ppl_base = math.exp(nll.mean()), math.exp(nll_base.mean())
    kld = np.sort(np.asarray(t.kld))
    pct = lambda q: float(np.quantile(kld, q))  # noqa: E731
    print("====== Perplexity statistics ======")
    print(f"Mean PPL(Q)                   : {ppl:10.6f}")
    print(f"Mean PPL(base)                : {ppl_base:10.6f}")
    if len(nll) > 1 and nll.std() > 0 and nll_base.std() > 0:
        print(f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * float(np.corrcoef(nll, nll_base)[0, 1]):6.2f}%")
    ratio, ratio_err = _mean_err(nll - nll_base)
    print(f"Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6f} ± {ratio_err:10.6f}")
    print(f"Mean PPL(Q)/PPL(base)         : {math.exp(ratio):10.6f}")
    print(f"Mean PPL(Q)-PPL(base)         : {ppl - ppl_base:10.6f}")
    print()
    mean, err = _mean_err(kld)
    print("====== KL divergence statistics ======")
    print(f"Mean    KLD: {mean:10.6f} ± {err:10.6f}")
    for label, q in (("Maximum", 1.0), ("99.9%  ", 0.999), ("99.0%  ", 0.99), ("Median ", 0.5), ("10.0%  ", 0.1),
                     (" 5.0%  ", 0.05), (" 1.0%  ", 0.01), ("Minimum", 0.0)):
        print(f"{label} KLD: {pct(q):10.6f}")
    print()
    mean_p, err_p = _mean_err(t.p_diff)
    top = t.same_top / len(kld)
    print("====== Token probability statistics ======")
    print(f"Mean    Δp: {100 * mean_p:6.3f} ± {100 * err_p:5.3f} %")
    print(f"Maximum Δp: {100 * float(np.max(t.p_diff)):6.3f}%")
    print(f"Minimum Δp: {100 * float(np.min(t.p_diff)):6.3f}%")
    print(f"RMS Δp    : {100 * math.sqrt(float(np.mean(np.square(t.p_diff)))):6.3f} %")
    print(f"Same top p: {100 * top:6.3f} ± {100 * math.sqrt(top * (1 - top) / max(len(kld) - 1, 1)):5.3f} %")


def kl_divergence(args: argparse.Namespace) -> int:
    path = args.kl_divergence_base
    if not path:
        raise CLIError("--kl-divergence needs --kl-divergence-base FILE (saved by a run without --kl-divergence)")
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise CLIError(f"{path}: no such file") from None
    with f:
        n_ctx, n_vocab, n_chunk, tokens = LogitsFile.read_header(f, path)
        model = load_model(args)
        if n_vocab != model.n_vocab:
            raise CLIError(f"{path}: saved with a vocabulary of {n_vocab} tokens; this model has {model.n_vocab}")
        plan = Plan(n_ctx, min(args.batch_size, n_ctx), 1, n_chunk if args.chunks < 0 else min(args.chunks, n_chunk))
        ctx = make_context(args, model, n_ctx=n_ctx, n_batch=plan.n_batch)
        bos = model.bos if add_bos_of(model) else None
        width = row_width(n_vocab)
        totals = KLTotals()
        print("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p")
        with progress(plan.n_chunk, "kl-divergence", unit="chunk") as bar:
            for i in range(plan.n_chunk):
                raw = f.read(2 * width * plan.n_scored)
                if len(raw) != 2 * width * plan.n_scored:
                    raise CLIError(f"{path}: truncated (log-probabilities of chunk {i + 1} are missing)")
                base_rows = np.frombuffer(raw, dtype="<u2").reshape(plan.n_scored, width)
                logits = chunk_logits(ctx, plan, tokens, i, 1, bos)[0][:plan.n_scored]
                start = i * n_ctx + plan.first
                totals.add(logits, base_rows, np.asarray(tokens[start + 1:start + 1 + plan.n_scored]), n_vocab)
                print(_chunk_line(i + 1, totals), flush=True)
                bar.update(1)
    print()
    _print_kl_summary(totals)
    return 0


def run(args: argparse.Namespace) -> int:
    return kl_divergence(args) if args.kl_divergence else perplexity(args)
