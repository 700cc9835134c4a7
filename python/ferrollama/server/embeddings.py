"""Embeddings for the server: a second Context with embeddings on, made at the first request."""
from __future__ import annotations

import threading

import numpy as np

from .._core import Batch, Context, Model

MODEL_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last"}


class Embedder:
    """Pooled, L2-normalized embeddings (OpenAI's), one input at a time under a lock."""

    def __init__(self, model: Model, n_ctx: int = 2048, n_threads: int | None = None, loras=()):
        self.model, self.n_ctx, self.n_threads = model, n_ctx, n_threads
        self.loras = list(loras)  # (LoraAdapter, scale) pairs, as the completions' context has them
        self._ctx: Context | None = None
        self._lock = threading.Lock()

    def _pooling(self) -> str:
        kind = self.model.metadata.get(f"{self.model.arch}.pooling_type")
        pooling = MODEL_POOLING.get(kind, "mean") if kind else "mean"
        return "mean" if pooling == "none" else pooling  # one vector per input, as OpenAI's API returns

    def _context(self) -> Context:
        if self._ctx is None:
            self._ctx = Context(self.model, n_ctx=self.n_ctx, n_batch=self.n_ctx, n_ubatch=self.n_ctx,
                                n_threads=self.n_threads, n_threads_batch=self.n_threads, embeddings=True,
                                pooling=self._pooling())
            for adapter, scale in self.loras:
                self._ctx.set_lora(adapter, scale)
        return self._ctx

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """ValueError for an input longer than the context."""
        for i, tokens in enumerate(inputs):
            if not tokens:
                raise ValueError(f"input {i} is empty")
            if len(tokens) > self.n_ctx:
                raise ValueError(f"input {i} has {len(tokens)} tokens; the embedding context holds {self.n_ctx}")
            if not all(0 <= t < self.model.n_vocab for t in tokens):
                raise ValueError(f"input {i} has a token outside the vocabulary (0..{self.model.n_vocab - 1})")
        with self._lock:
            ctx = self._context()
            return [self._one(ctx, tokens) for tokens in inputs]

    @staticmethod
    def _one(ctx: Context, tokens: list[int]) -> list[float]:
        ctx.kv.clear()
        ctx.decode(Batch.from_tokens(tokens, pos0=0, seq_id=0, logits="all"))
        vec = np.asarray(ctx.embeddings_seq(0), dtype=np.float64)
        norm = float(np.linalg.norm(vec))
        return (vec / norm if norm > 0 else vec).astype(np.float32).tolist()
