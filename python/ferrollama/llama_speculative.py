"""llama-cpp-python's ``llama_speculative`` names: ``LlamaDraftModel`` (the callable interface a
draft model has there) and ``LlamaPromptLookupDecoding`` (ferrollama's prompt lookup, which
takes the same arguments and drafts from the latest n-gram match: see
ferrollama.generation.speculative.PromptLookupDecoding)."""
from __future__ import annotations

import abc

import numpy as np

from .generation.speculative import PromptLookupDecoding

__all__ = ["LlamaDraftModel", "LlamaPromptLookupDecoding"]


class LlamaDraftModel(abc.ABC):
    """A draft model as llama-cpp-python calls it: the drafted ids after input_ids."""

    @abc.abstractmethod
    def __call__(self, input_ids: np.ndarray, /, **kwargs: object) -> np.ndarray:
        """The drafted token ids (a subclass says how)."""


class LlamaPromptLookupDecoding(PromptLookupDecoding, LlamaDraftModel):
    """Prompt lookup under llama-cpp-python's name (max_ngram_size=2, num_pred_tokens=10)."""
