"""Rewinding sequences of recurrent models: state checkpoints (llama-server's context checkpoints).

A recurrent or hybrid model (Mamba-2, Qwen3.5's delta-net, LFM2's short convolutions) keeps one
state per sequence that holds all of its past at once: ``seq_rm`` cannot cut it back to a shorter
prefix (it returns False). To reuse a cached prefix anyway, the states are saved at some prefix
lengths (:meth:`Checkpoints.save`, the recurrent part alone: a hybrid's attention cells are cut by
``seq_rm`` as usual), and :meth:`Checkpoints.rewind` restores the longest one within the prefix to
keep; the tokens after it are decoded again. Where ``seq_rm`` can cut (attention-only models, or a
rollback within the context's ``n_rs_seq`` snapshots), rewinding is that ``seq_rm``.

``Llama`` and the scheduler save a checkpoint just before the last token of each prompt they
decode: the same prompt again then decodes one token, and a conversation whose next prompt
re-renders the previous answer differently (a template that drops the reasoning) resumes from
its previous prompt rather than from nothing.
"""
from __future__ import annotations

from .._core import Context

__all__ = ["Checkpoints", "DEFAULT_CHECKPOINTS"]

#: Checkpoints kept per sequence (the oldest are dropped first). llama-server keeps up to 32;
#: each holds the model's recurrent states (about 19 MiB for Qwen3.5-0.8B), so fewer here.
DEFAULT_CHECKPOINTS = 8


class Checkpoints:
    """The saved recurrent states of a context's sequences, by the number of tokens they cover."""

    def __init__(self, ctx: Context, max_per_seq: int = DEFAULT_CHECKPOINTS) -> None:
        if max_per_seq < 0:
            raise ValueError(f"the number of checkpoints must be >= 0, not {max_per_seq}")
        self.ctx = ctx
        self.max_per_seq = max_per_seq
        #: whether checkpoints are taken at all: only a recurrent model's sequences need them
        self.enabled = ctx.model.is_recurrent and max_per_seq > 0
        self._saved: dict[int, list[tuple[int, bytes]]] = {}

    def save(self, seq_id: int, n_tokens: int) -> None:
        """Keeps the states of `seq_id` now that it holds its first `n_tokens` tokens."""
        if not self.enabled:
            return
        saved = [c for c in self._saved.get(seq_id, []) if c[0] != n_tokens]
        saved.append((n_tokens, self.ctx.seq_state_get(seq_id, partial=True)))
        self._saved[seq_id] = saved[-self.max_per_seq:]

    def rewind(self, seq_id: int, keep: int) -> int:
        """Makes `seq_id` hold at most its first `keep` tokens, as ``seq_rm(seq_id, keep, -1)``,
        and returns how many it holds: `keep`, or, where the state cannot be cut there, the
        longest checkpoint within `keep` (0, the sequence cleared, when there is none). The
        caller decodes the tokens from there on."""
        kv = self.ctx.kv
        if kv.seq_rm(seq_id, keep, -1):
            if keep == 0 or kv.window_held(seq_id, keep):
                self.forget_after(seq_id, keep)
                return keep
            # the sliding-window cache reused the cells just before `keep`: from the start
            # (llama-server's "forcing full prompt re-processing due to lack of cache data")
        for n, blob in sorted(self._saved.get(seq_id, []), key=lambda c: -c[0]):
            if n <= keep:
                self.ctx.seq_state_set(blob, seq_id, partial=True)
                if not kv.seq_rm(seq_id, n, -1):
                    raise RuntimeError(f"sequence {seq_id}: restoring a checkpoint at {n} tokens left a state that cannot be cut")
                self.forget_after(seq_id, n)
                return n
        kv.seq_rm(seq_id, 0, -1)
        self._saved.pop(seq_id, None)
        return 0

    def forget_after(self, seq_id: int, n_tokens: int) -> None:
        """Drops the checkpoints of `seq_id` beyond its first `n_tokens` tokens (those tokens
        are about to change)."""
        if seq_id in self._saved:
            self._saved[seq_id] = [c for c in self._saved[seq_id] if c[0] <= n_tokens]

    def copy(self, src: int, dst: int, n_tokens: int) -> None:
        """After ``seq_cp(src, dst)`` of the first `n_tokens` tokens: `dst` shares `src`'s
        checkpoints within them."""
        self._saved[dst] = [c for c in self._saved.get(src, []) if c[0] <= n_tokens]

    def clear(self, seq_id: int | None = None) -> None:
        """Forgets the checkpoints of one sequence, or of all (after ``kv.clear()``)."""
        if seq_id is None:
            self._saved.clear()
        else:
            self._saved.pop(seq_id, None)

    def count(self, seq_id: int) -> int:
        return len(self._saved.get(seq_id, []))
