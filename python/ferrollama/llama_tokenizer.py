"""llama-cpp-python's ``llama_cpp.llama_tokenizer``: tokenizers a Llama can be given.

``LlamaTokenizer`` uses the model's own vocabulary (the engine's tokenizer, which reproduces
llama.cpp's); ``LlamaHFTokenizer`` wraps a Hugging Face tokenizer (needs ``transformers``).
"""
from __future__ import annotations

import abc
import os
from types import SimpleNamespace
from typing import Any, List, Optional, Union

from ._core import Model
from .models import model_file

__all__ = ["BaseLlamaTokenizer", "LlamaTokenizer", "LlamaHFTokenizer"]


class BaseLlamaTokenizer(abc.ABC):
    @abc.abstractmethod
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> List[int]:
        """The tokens of utf-8 text; ``add_bos`` adds the vocabulary's special prefix, ``special``
        parses special-token text (e.g. ``<|im_start|>``) as those tokens."""

    @abc.abstractmethod
    def detokenize(self, tokens: List[int], prev_tokens: Optional[List[int]] = None,
                   special: bool = False) -> bytes:
        """The bytes of tokens; ``prev_tokens`` (if given) precede them, ``special`` renders special tokens."""


class LlamaTokenizer(BaseLlamaTokenizer):
    """The vocabulary of a Llama's model."""

    def __init__(self, llama: Any):
        self._model = llama.model  # a ferrollama.Model

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> List[int]:
        return list(self._model.tokenize(text, add_special=add_bos, parse_special=special))

    def detokenize(self, tokens: List[int], prev_tokens: Optional[List[int]] = None,
                   special: bool = False) -> bytes:
        # Token pieces concatenated, as llama-cpp-python does (it ignores prev_tokens here too),
        # less the leading space a SentencePiece vocabulary puts after BOS.
        tokens = list(tokens)
        text = b"".join(self._model.token_to_piece(int(t), special) for t in tokens)
        if tokens and tokens[0] == self._model.bos and text[:1] == b" ":
            return text[1:]
        return text

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> List[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: List[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

    @classmethod
    def from_ggml_file(cls, path: Union[str, os.PathLike]) -> "LlamaTokenizer":
        """The tokenizer of a GGUF file, its vocabulary loaded alone (as ``Llama(path, vocab_only=True)``
        loads it, and with its ModelPathError for a path that does not exist)."""
        return cls(SimpleNamespace(model=Model(model_file(os.fspath(path)), vocab_only=True)))


class LlamaHFTokenizer(BaseLlamaTokenizer):
    """A Hugging Face tokenizer (``transformers``'s AutoTokenizer or any with encode/decode)."""

    def __init__(self, hf_tokenizer: Any):
        self.hf_tokenizer = hf_tokenizer

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> List[int]:
        return self.hf_tokenizer.encode(text.decode("utf-8", errors="ignore"), add_special_tokens=special)

    def detokenize(self, tokens: List[int], prev_tokens: Optional[List[int]] = None,
                   special: bool = False) -> bytes:
        def decode(ids: List[int]) -> bytes:
            return self.hf_tokenizer.decode(ids, skip_special_tokens=not special).encode("utf-8", errors="ignore")

        if prev_tokens is None:
            return decode(list(tokens))
        # The text the new tokens add after the previous ones (decoding them alone loses joins).
        prev = list(prev_tokens)
        return decode(prev + list(tokens))[len(decode(prev)):]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str) -> "LlamaHFTokenizer":
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise ImportError(
                "The `transformers` library is required to use the `HFTokenizer`."
                "You can install it with `pip install transformers`."
            ) from e
        return cls(AutoTokenizer.from_pretrained(pretrained_model_name_or_path=pretrained_model_name_or_path))
