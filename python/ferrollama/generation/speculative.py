"""Speculative decoding: more than one token per read of the weights.

A drafter proposes the next tokens (prompt lookup: the continuation of an earlier occurrence
of the last n-gram; or a smaller draft model with the same vocabulary, greedily). The target
model decodes the pending token and the draft as one batch; its sampler then walks the rows
in order and keeps each drafted token it samples itself. The first token it samples that
differs from the draft (or the one after a fully accepted draft) is the next pending token,
and the cache drops the rejected drafted cells (``seq_rm``).

Acceptance is the sampler's own choice at each position, so the output is the target model's:
for greedy decoding it is the same text; with sampling, drawing from the target's
distribution and keeping the drafted token when the draw equals it is the standard
speculative sampling rule for a deterministic draft (accept with probability p(d), else draw
from p without d), and it draws one random number per position, as plain decoding does, so
the same seed gives the same tokens. Where the verification batch computes different bits
from one-token decodes (batches of 8 tokens or more take the tiled products, as llama.cpp
does), a near-tie can go the other way: see the README.

Public names: :class:`PromptLookupDecoding` (llama-cpp-python's signature),
:class:`DraftModel`, :func:`speculative_tokens` (the loop, over any Context), and
:class:`SpeculativeStats`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from .._core import Batch, Context, Model
from .checkpoints import Checkpoints

__all__ = ["PromptLookupDecoding", "DraftModel", "Drafter", "SpeculativeStats", "speculative_tokens", "snapshots_for",
           "predicted_draft"]


class Drafter(Protocol):
    """Proposes up to `n_max` tokens to follow `tokens`."""

    def draft(self, tokens: Sequence[int], n_max: int) -> list[int]: ...


class PromptLookupDecoding:
    """Drafts by prompt lookup (llama-cpp-python's LlamaPromptLookupDecoding signature): the
    tokens that followed an earlier occurrence of the last `n` tokens, n from `max_ngram_size`
    down to 1, at most `num_pred_tokens` of them. Where the n-gram occurs several times, the
    latest occurrence is taken (llama-cpp-python takes the first): when a model copies text
    with changes, the latest one has the changes already made (measured on a code-editing
    chat with Qwen2.5-Coder-0.5B: see benches/speculative.py)."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        if max_ngram_size < 1 or num_pred_tokens < 1:
            raise ValueError("max_ngram_size and num_pred_tokens must be at least 1")
        self.max_ngram_size = max_ngram_size
        self.num_pred_tokens = num_pred_tokens

    def __call__(self, input_ids: np.ndarray, /, **kwargs: object) -> np.ndarray:
        """llama-cpp-python's draft-model call: the drafted ids after input_ids."""
        return np.asarray(self.draft(list(input_ids), self.num_pred_tokens), dtype=np.intc)

    def draft(self, tokens: Sequence[int], n_max: int, seq_id: int = 0) -> list[int]:
        """Up to n_max tokens after tokens (the same for any sequence: lookup keeps no state)."""
        del seq_id
        n_max = min(n_max, self.num_pred_tokens)
        ids = np.asarray(tokens, dtype=np.int64)
        for size in range(min(self.max_ngram_size, len(ids) - 1), 0, -1):
            starts = _ngram_ends(ids[:-1], ids[-size:])
            for start in starts[::-1]:
                follow = ids[start:start + n_max]
                if len(follow):
                    return follow.tolist()
        return []


def _ngram_ends(haystack: np.ndarray, ngram: np.ndarray) -> np.ndarray:
    """Where each occurrence of ngram in haystack ends (the index after it), in order."""
    windows = np.lib.stride_tricks.sliding_window_view(haystack, len(ngram))
    return np.flatnonzero((windows == ngram).all(axis=1)) + len(ngram)


#: the longest n-gram of the generated tokens looked up in a predicted output
PREDICTION_NGRAM = 4


def predicted_draft(prediction: Sequence[int], generated: Sequence[int], n_max: int) -> list[int]:
    """Up to n_max tokens drafted from a predicted output (OpenAI's ``prediction``): what follows,
    in the prediction, the longest n-gram (at most PREDICTION_NGRAM) that ends the generated
    tokens; of its occurrences, the one ending nearest the generated length (an answer that
    repeats the prediction is at about the same place in it)."""
    pred, gen = np.asarray(prediction, dtype=np.int64), np.asarray(generated, dtype=np.int64)
    for size in range(min(PREDICTION_NGRAM, len(gen), len(pred)), 0, -1):
        ends = _ngram_ends(pred, gen[-size:])
        ends = ends[ends < len(pred)]
        if len(ends):
            start = int(ends[np.argmin(np.abs(ends - len(gen)))])
            return pred[start:start + n_max].tolist()
    return []


class _DraftSeq:
    """What a draft model keeps for one sequence."""

    def __init__(self) -> None:
        #: the tokens in the draft cache for this sequence (positions 0..n-1)
        self.cached: list[int] = []
        #: the last draft and the length of the tokens it followed (to see what was accepted)
        self.last: tuple[int, list[int]] = (0, [])
        #: target tokens to let pass without drafting, and the next pause's length
        self.skip_left = 0
        self.pause = 0
        #: after a pause the draft is one token (a probe) until one is accepted again
        self.probe = False


class DraftModel:
    """Drafts with a smaller model of the same vocabulary, greedily (llama.cpp's
    --draft-max, --draft-min, --draft-p-min): up to `draft_max` tokens, stopping where the
    draft's top probability falls below `draft_p_min`; a draft shorter than `draft_min` is
    not proposed. Its cache follows the target's tokens (shared prefix kept, the rest
    removed with seq_rm); with `n_seq` sequences it follows that many (the server's slots,
    `draft(..., seq_id=...)`), each in `n_ctx / n_seq` cells.

    A draft model that keeps missing costs a forward pass per target token for nothing, so
    after attempts that bring no accepted token (an empty draft, or its first token
    rejected) drafting pauses for 1, 2, 4 ... up to `max_skip` target tokens; after a pause it
    drafts a single token until one is accepted, then full drafts again. The draft cache catches
    up in one batch when it resumes.
    (llama.cpp drafts at every step: `max_skip=0`.)

    A recurrent draft model's cache cannot drop the drafted tokens with seq_rm: each sequence
    keeps a checkpoint of its state before drafting, and follows the target from there."""

    def __init__(self, model: str | os.PathLike[str] | Model, draft_max: int = 16, draft_min: int = 0,
                 draft_p_min: float = 0.75, n_ctx: int = 4096, n_threads: int | None = None, max_skip: int = 32,
                 n_seq: int = 1):
        if draft_max < 1 or draft_min < 0 or draft_min > draft_max or not 0.0 <= draft_p_min <= 1.0:
            raise ValueError("need 1 <= draft_max, 0 <= draft_min <= draft_max, 0 <= draft_p_min <= 1")
        if max_skip < 0 or n_seq < 1:
            raise ValueError(f"need max_skip >= 0 and n_seq >= 1, not {max_skip} and {n_seq}")
        self.model = model if isinstance(model, Model) else Model(str(model))
        self.draft_max, self.draft_min, self.draft_p_min = draft_max, draft_min, draft_p_min
        self.ctx = Context(self.model, n_ctx=n_ctx, n_batch=min(n_ctx, 2048), n_threads=n_threads, n_seq_max=n_seq)
        self.n_ctx_seq = self.ctx.n_ctx // n_seq
        # the state before the last draft, for a recurrent draft model (see _follow)
        self.checkpoints = Checkpoints(self.ctx, max_per_seq=1)
        self.max_skip = max_skip
        self.seqs = [_DraftSeq() for _ in range(n_seq)]

    @property
    def n_seq(self) -> int:
        return len(self.seqs)

    @property
    def cached(self) -> list[int]:
        """The tokens in the draft cache of sequence 0."""
        return self.seqs[0].cached

    def check_vocab(self, target: Model) -> None:
        """The draft must share the target's vocabulary (llama.cpp's rule: same size and specials)."""
        if (self.model.n_vocab, self.model.bos, self.model.eos) != (target.n_vocab, target.bos, target.eos):
            raise ValueError(f"the draft model's vocabulary ({self.model.n_vocab} tokens) differs from the "
                             f"target's ({target.n_vocab})")

    def draft(self, tokens: Sequence[int], n_max: int, seq_id: int = 0) -> list[int]:
        if not 0 <= seq_id < self.n_seq:
            raise ValueError(f"seq_id {seq_id} is not one of the draft model's {self.n_seq} sequences")
        seq = self.seqs[seq_id]
        n_max = min(n_max, self.draft_max, self.n_ctx_seq - len(tokens))
        if n_max <= 0 or self._paused(seq, tokens):
            return []
        if seq.probe:
            n_max = 1
        logits = self._follow(seq, seq_id, tokens)
        self.checkpoints.save(seq_id, len(seq.cached))
        out = self._greedy(seq, seq_id, logits, n_max)
        seq.last = (len(tokens), out)
        return out

    def _paused(self, seq: _DraftSeq, tokens: Sequence[int]) -> bool:
        """Whether to skip drafting now, from what became of the sequence's last draft."""
        if self.max_skip == 0:
            return False
        if seq.skip_left > 0:
            seq.skip_left -= 1
            return True
        at, last = seq.last
        if bool(last) and len(tokens) > at and tokens[at] == last[0]:
            seq.pause, seq.probe = 0, False
        elif at:  # a fruitless attempt: pause, longer each time, then probe with one token
            seq.pause, seq.probe = min(max(1, 2 * seq.pause), self.max_skip), True
            seq.skip_left = seq.pause - 1
            seq.last = (0, [])
            return True
        return False

    def _greedy(self, seq: _DraftSeq, seq_id: int, logits: np.ndarray, n_max: int) -> list[int]:
        out: list[int] = []
        while len(out) < n_max:
            token, p = _top(logits)
            if p < self.draft_p_min:
                break
            out.append(token)
            if len(out) == n_max:
                break
            self.ctx.decode(Batch.from_tokens([token], pos0=len(seq.cached), seq_id=seq_id, logits="last"))
            seq.cached.append(token)
            logits = self.ctx.logits(-1)
        return out if len(out) >= self.draft_min else []

    def _follow(self, seq: _DraftSeq, seq_id: int, tokens: Sequence[int]) -> np.ndarray:
        """Makes the sequence's draft cache hold `tokens` and returns the logits after the last."""
        keep = 0
        limit = min(len(seq.cached), len(tokens) - 1)
        while keep < limit and seq.cached[keep] == tokens[keep]:
            keep += 1
        keep = self.checkpoints.rewind(seq_id, keep)
        del seq.cached[keep:]
        rest = list(tokens[keep:])
        n_batch = self.ctx.n_batch
        for i in range(0, len(rest), n_batch):
            chunk = rest[i:i + n_batch]
            self.ctx.decode(Batch.from_tokens(chunk, pos0=len(seq.cached), seq_id=seq_id, logits="last"))
            seq.cached.extend(chunk)
        return self.ctx.logits(-1)


def snapshots_for(drafter: object, n_ubatch: int) -> int:
    """The n_rs_seq a recurrent target's context needs to drop a rejected draft of `drafter`
    (its longest draft; 16 for a drafter that does not say), within the engine's bounds."""
    longest = getattr(drafter, "draft_max", None) or getattr(drafter, "num_pred_tokens", None) or 16
    return max(0, min(int(longest), 64, n_ubatch - 1))


def _top(logits: np.ndarray) -> tuple[int, float]:
    """The most likely token and its probability."""
    token = int(np.argmax(logits))
    x = logits.astype(np.float64)
    return token, float(1.0 / np.exp(x - x[token]).sum())


@dataclass
class SpeculativeStats:
    """Drafted and accepted token counts (the acceptance rate llama.cpp prints)."""

    n_drafted: int = 0
    n_accepted: int = 0
    n_batches: int = 0

    @property
    def acceptance(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0


def speculative_tokens(ctx: Context, tokens: list[int], logits: np.ndarray, sample: Callable[[np.ndarray], int],
                       drafter: Drafter, n_ctx: int, on_logits: Callable[[np.ndarray, int], None] | None = None,
                       stats: SpeculativeStats | None = None, seq_id: int = 0) -> Iterator[int]:
    """Yields the target's tokens, drafting and verifying in batches.

    `tokens` lists the tokens in the cache of `seq_id` (positions 0..n-1) and is kept true as
    cells are added and removed; `logits` are the target's after the last of them; `sample`
    picks (and accepts) a token from a row of logits, as the plain loop's sampler does.
    """
    stats = stats if stats is not None else SpeculativeStats()
    pending = sample(logits)
    if on_logits is not None:
        on_logits(logits, pending)
    yield pending
    n_batch = ctx.n_batch
    # a recurrent model drops rejected drafted tokens by rolling back to the states the context
    # kept of its last decode (n_rs_seq): drafts no longer than that
    most = ctx.n_rs_seq if ctx.model.is_recurrent else n_batch - 1
    while len(tokens) < n_ctx:
        room = min(n_ctx - len(tokens) - 1, n_batch - 1, most)
        draft = drafter.draft(tokens + [pending], room) if room > 0 else []
        batch = [pending] + draft
        ctx.decode(Batch.from_tokens(batch, pos0=len(tokens), seq_id=seq_id, logits="all"))
        base = len(tokens)
        tokens.extend(batch)
        stats.n_drafted += len(draft)
        stats.n_batches += 1
        for i in range(len(batch)):
            row = ctx.logits(i)
            token = sample(row)
            if on_logits is not None:
                on_logits(row, token)
            if i < len(draft) and token == draft[i]:
                stats.n_accepted += 1
                yield token
                continue
            # The first token the draft did not predict: drop the drafted cells after it.
            keep = base + 1 + i
            if not ctx.kv.seq_rm(seq_id, keep, -1):
                raise RuntimeError(f"the context could not drop {len(batch) - 1 - i} rejected drafted tokens "
                                   f"(a recurrent model keeps n_rs_seq = {ctx.n_rs_seq} of them)")
            del tokens[keep:]
            pending = token
            yield token
            break
