"""The sampler chain: llama.cpp's common_sampler over the engine's samplers (ferrollama.samplers).

The same samplers in the same order with the same defaults as llama.cpp's common_sampler_init,
the grammar applied by rejection as llama.cpp does.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from .. import samplers as S
from .._core import Context, Model
from .params import SamplingParams, resolve_seed
from .text import decode_tokens

__all__ = ["Sampler"]


def _chain_members(model: Model, p: SamplingParams, seed: int) -> list[tuple[str, Any]]:
    """The samplers of common_sampler_init, in its order, with their names (the grammar is kept apart)."""
    members: list[tuple[str, Any]] = []
    if p.logit_bias:
        members.append(("logit_bias", S.LogitBias({int(t): float(b) for t, b in p.logit_bias.items()})))
    if p.mirostat == 1:
        return members + [("temperature", S.Temp(p.temp)),
                          ("mirostat", S.MirostatV1(model.n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100))]
    if p.mirostat == 2:
        return members + [("temperature", S.Temp(p.temp)),
                          ("mirostat", S.MirostatV2(seed, p.mirostat_tau, p.mirostat_eta))]
    build: dict[str, Callable[[], Any]] = {
        "penalties": lambda: S.Penalties(last_n=p.penalty_last_n, repeat=p.penalty_repeat,
                                         freq=p.penalty_freq, present=p.penalty_present),
        "dry": lambda: S.DRY(model, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                             p.dry_penalty_last_n, list(p.dry_sequence_breakers)),
        "top_n_sigma": lambda: S.TopNSigma(p.top_n_sigma),
        "top_k": lambda: S.TopK(p.top_k),
        "typ_p": lambda: S.Typical(p.typ_p, min_keep=p.min_keep),
        "top_p": lambda: S.TopP(p.top_p, min_keep=p.min_keep),
        "min_p": lambda: S.MinP(p.min_p, min_keep=p.min_keep),
        "xtc": lambda: S.XTC(p=p.xtc_probability, threshold=p.xtc_threshold, min_keep=p.min_keep, seed=seed),
        "temperature": lambda: S.TempExt(p.temp, p.dynatemp_range, p.dynatemp_exponent),
    }
    members += [(name, build[name]()) for name in p.samplers]
    members.append(("dist", S.Dist(seed=seed)))
    return members


def _grammar_of(model: Model, p: SamplingParams):
    if p.json_schema is not None:
        return S.Grammar.from_json_schema(model, p.json_schema)
    if p.grammar:
        return S.Grammar(model, p.grammar, root="root")
    return None


#: samplers that only change logit values and keep a history of accepted tokens (the prompt's too)
_HISTORY_SAMPLERS = {"logit_bias", "penalties", "dry"}


def _leading_history(names: list[str]) -> int | None:
    """How many leading samplers only re-weight logits; None when a history sampler comes later."""
    n = 0
    while n < len(names) and names[n] in _HISTORY_SAMPLERS:
        n += 1
    return None if any(name in ("penalties", "dry") for name in names[n:]) else n


class Sampler:
    """llama.cpp's common_sampler: a chain of samplers plus an optional grammar.

    The chosen token is checked against the grammar and, only when the grammar rejects it,
    the chain runs again on the logits the grammar allows (llama.cpp's rejection sampling).
    Prompt tokens are accepted by the samplers that keep a history (penalties, DRY), never by
    the grammar. With a grammar, the chain is split in two: the samplers that only re-weight
    logits and keep a history (logit bias, penalties, DRY, which lead llama.cpp's chain), then
    the rest with the grammar, where the engine checks the chosen token alone.
    """

    def __init__(self, model: Model, params: SamplingParams | None = None):
        self.params = params = params or SamplingParams()
        params.validate()
        self.model = model
        self.seed = resolve_seed(params.seed)
        members = _chain_members(model, params, self.seed)
        grammar = _grammar_of(model, params)
        split = _leading_history([name for name, _ in members]) if grammar is not None else None
        #: the samplers before the grammar's part (all of them without a grammar)
        self.chain = S.Chain([smp for _, smp in (members if split is None else members[:split])])
        #: with a grammar: the samplers after the history ones, and the grammar
        self.constrained = None if split is None else S.Chain([smp for _, smp in members[split:]] + [grammar])
        #: a grammar the chain could not be split around (a custom sampler order): checked apart
        self.grammar = S.Chain([grammar]) if grammar is not None and split is None else None
        #: the last tokens accepted (prompt and output), newest last
        self.prev: list[int] = []
        self.t_sample_ms = 0.0
        self.n_sample = 0

    @staticmethod
    def _logits_of(cands, n: int) -> np.ndarray:
        out = np.full(n, -np.inf, dtype=np.float32)
        out[np.asarray(cands.ids)] = np.asarray(cands.logits)
        return out

    def _sample(self, logits: np.ndarray) -> int:
        if self.constrained is not None:
            weighted = self._logits_of(self.chain.apply(logits), len(logits)) if len(self.chain) else logits
            return int(self.constrained.sample_logits(weighted))
        if self.grammar is None:
            return int(self.chain.sample_logits(logits))
        cands = self.chain.apply(logits)
        token = int(cands.ids[cands.selected])
        allowed = self._logits_of(self.grammar.apply(logits), len(logits))
        if allowed[token] != -np.inf:
            return token
        cands = self.chain.apply(allowed)
        return int(cands.ids[cands.selected])

    def sample_logits(self, logits: np.ndarray) -> int:
        """The token chosen from one row of logits (not yet accepted)."""
        t0 = time.perf_counter()
        try:
            return self._sample(np.asarray(logits, dtype=np.float32))
        finally:
            self.t_sample_ms += (time.perf_counter() - t0) * 1e3
            self.n_sample += 1

    def sample(self, ctx: Context, i: int = -1) -> int:
        """The token chosen from the logits of batch index ``i`` of the last decode."""
        return self.sample_logits(ctx.logits(i))

    def accept(self, token: int, accept_grammar: bool = True) -> None:
        """Feeds a token to the samplers' state (penalties, DRY) and, when asked, to the grammar."""
        self.chain.accept(token)
        if accept_grammar:
            for part in (self.constrained, self.grammar):
                if part is not None:
                    part.accept(token)
        self.prev.append(token)
        if len(self.prev) > 256:
            del self.prev[:-64]

    def reset(self) -> None:
        """Forgets accepted tokens (llama.cpp resets the chain, not the grammar)."""
        self.chain.reset()
        self.prev.clear()

    def prev_text(self, n: int) -> str:
        """The text of the last n accepted tokens (for reverse prompts)."""
        return decode_tokens(self.model, self.prev[-n:], special=True) if n > 0 else ""
