"""ferrollama: llama.cpp's engine rebuilt in Rust, run from Python.

The core (``Model``, ``Context``, ``Batch``, ``samplers``) follows llama.cpp's concepts;
``Llama`` is the high-level API built on it. This module is the public face of the package:
nothing inside the package imports it (the layers and their contract: README, "Architecture").
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
from ._llama_hooks import (
    LogitsProcessor,
    LogitsProcessorList,
    MinTokensLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
)
from .generation.speculative import DraftModel, PromptLookupDecoding
from .llama import Llama, LlamaState
from .llama_cache import BaseLlamaCache, LlamaCache, LlamaDiskCache, LlamaRAMCache
from .llama_grammar import LlamaGrammar
from .llama_tokenizer import BaseLlamaTokenizer, LlamaHFTokenizer, LlamaTokenizer
from . import llama_chat_format, llama_speculative, llama_types
from .llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding
from .llama_types import *  # noqa: F401,F403 - llama_cpp exposes its types at the top level too
from .models import default_model_path

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
    "BaseLlamaCache",
    "BaseLlamaTokenizer",
    "LlamaCache",
    "LlamaDiskCache",
    "LlamaGrammar",
    "LlamaHFTokenizer",
    "LlamaRAMCache",
    "LlamaTokenizer",
    "llama_chat_format",
    "llama_speculative",
    "LlamaDraftModel",
    "LlamaPromptLookupDecoding",
    "llama_types",
    "LogitsProcessor",
    "LogitsProcessorList",
    "MinTokensLogitsProcessor",
    "StoppingCriteria",
    "StoppingCriteriaList",
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
