"""Token sequences: whether a model's tokenizer puts BOS first, and shared prefixes (cache reuse)."""
from __future__ import annotations

from typing import Sequence

from .._core import Model

__all__ = ["add_bos_of", "common_prefix_len"]


def add_bos_of(model: Model) -> bool:
    """Whether tokenizing with add_special puts BOS first (llama_vocab_get_add_bos)."""
    return bool(model.add_bos) and model.bos is not None


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
