"""Log-probabilities of sampled tokens in OpenAI's shapes, for ``Llama`` and the server alike.

A :class:`TokenLogprob` is taken from a row of logits when a token is sampled; the completion
shape (tokens, token_logprobs, top_logprobs, text_offset) and the chat shape (content: token,
logprob, bytes, top_logprobs) are made from a list of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["TokenLogprob", "log_softmax", "token_logprob", "completion_logprobs", "chat_logprobs",
           "chat_logprobs_of_completion"]


@dataclass
class TokenLogprob:
    token: int
    #: None for a first prompt token, which nothing scores (OpenAI's echo convention)
    logprob: float | None
    #: (token, logprob) of the most likely tokens, most likely first
    top: list[tuple[int, float]]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """In float64: log-probabilities of 150k-token vocabularies keep their small differences."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def token_logprob(logits: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """The token's log-probability under logits and the n_top most likely tokens."""
    lp = log_softmax(logits)
    top = np.argpartition(-lp, n_top)[:n_top] if 0 < n_top < len(lp) else np.arange(len(lp) if n_top >= len(lp) else 0)
    top = top[np.argsort(-lp[top], kind="stable")]
    return TokenLogprob(int(token), float(lp[token]), [(int(t), float(lp[t])) for t in top])


def _piece(model, token: int) -> str:
    return model.token_to_piece(int(token), False).decode("utf-8", "replace")


def completion_logprobs(model, entries: Sequence[TokenLogprob], offset0: int = 0,
                        with_chosen: bool = False) -> dict:
    """OpenAI's completion logprobs of entries whose text starts at offset0. with_chosen adds the
    chosen token to its top_logprobs (llama-cpp-python's dicts do)."""
    tokens = [_piece(model, e.token) for e in entries]
    offsets, at = [], offset0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    tops: list[dict[str, float] | None] = []
    for e in entries:
        if e.logprob is None:
            tops.append(None)
            continue
        top = {_piece(model, t): lp for t, lp in e.top}
        if with_chosen:
            top[_piece(model, e.token)] = e.logprob
        tops.append(top)
    return {"tokens": tokens, "text_offset": offsets, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": tops}


def chat_logprobs(model, entries: Sequence[TokenLogprob], with_bytes: bool = True) -> dict | None:
    """OpenAI's chat logprobs ({"content": [...]}); with_bytes=False gives bytes None and a
    "refusal" key, as llama-cpp-python does."""
    if not entries:
        return None

    def item(token: int, lp: float | None) -> dict:
        piece = model.token_to_piece(int(token), False)
        return {"token": piece.decode("utf-8", "replace"), "logprob": lp, "bytes": list(piece) if with_bytes else None}

    out: dict = {"content": [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                             for e in entries]}
    if not with_bytes:
        out["refusal"] = None
    return out


def chat_logprobs_of_completion(logprobs: dict | None) -> dict | None:
    """A completion's logprobs in the chat shape, as llama-cpp-python converts them (bytes None)."""
    if logprobs is None:
        return None
    return {"content": [{"token": tok, "bytes": None, "logprob": lp,
                         "top_logprobs": [{"token": t, "logprob": v, "bytes": None} for t, v in (top or {}).items()]}
                        for tok, lp, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"])],
            "refusal": None}
