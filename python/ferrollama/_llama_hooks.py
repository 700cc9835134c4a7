"""llama-cpp-python's generation hooks: logits processors and stopping criteria (and their lists).

They are llama-cpp-python's ``llama_cpp.llama`` names; ``Llama`` and ``llama_chat_format`` both
use them, so they live here, below both (``ferrollama.Llama...`` and ``ferrollama.llama`` export them).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["LogitsProcessor", "StoppingCriteria", "LogitsProcessorList", "StoppingCriteriaList",
           "MinTokensLogitsProcessor"]

LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]
StoppingCriteria = Callable[[np.ndarray, np.ndarray], bool]


class LogitsProcessorList(list):
    """Callables ``(input_ids, scores) -> scores`` applied in order before sampling."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list):
    """Callables ``(input_ids, logits) -> bool``: generation stops when any says so."""

    def __call__(self, input_ids: np.ndarray, logits: np.ndarray) -> bool:
        return any(criterion(input_ids, logits) for criterion in self)


class MinTokensLogitsProcessor:
    """Forbids the end-of-sequence token until min_tokens tokens were generated."""

    def __init__(self, min_tokens: int, token_eos: int):
        self.min_tokens = min_tokens
        self.token_eos = token_eos
        self.prompt_tokens: int | None = None

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        if len(input_ids) - self.prompt_tokens < self.min_tokens:
            scores[self.token_eos] = -np.inf
        return scores
