"""ferrollama: llama.cpp's engine rebuilt in Rust, run from Python.

The core (``Model``, ``Context``, ``Batch``, ``samplers``) follows llama.cpp's concepts;
``Llama`` is the high-level API built on it.
"""
from ._core import (
    Batch,
    BusyError,
    Context,
    DecodeError,
    Error,
    GGUFError,
    GrammarError,
    KVCache,
    LoraAdapter,
    Model,
    StateError,
    StreamDecoder,
    TensorInfo,
    UnsupportedError,
    __version__,
)
from . import samplers
from .llama import Llama, LlamaState
from .models import default_model_path
from .speculative import DraftModel, PromptLookupDecoding

__all__ = [
    "Batch",
    "BusyError",
    "Context",
    "DecodeError",
    "DraftModel",
    "Error",
    "GGUFError",
    "GrammarError",
    "KVCache",
    "Llama",
    "LlamaState",
    "LoraAdapter",
    "Model",
    "PromptLookupDecoding",
    "StateError",
    "StreamDecoder",
    "TensorInfo",
    "UnsupportedError",
    "__version__",
    "default_model_path",
    "samplers",
]
