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
    KERNEL_ISA,
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
from .generation.media import MediaError
from .generation.multimodal import MEDIA_MARKER, Projector
from .generation.speculative import DraftModel, PromptLookupDecoding
from .llama import Llama, LlamaState
from .llama_cache import BaseLlamaCache, LlamaCache, LlamaDiskCache, LlamaRAMCache
from .llama_grammar import LlamaGrammar
from .llama_tokenizer import BaseLlamaTokenizer, LlamaHFTokenizer, LlamaTokenizer
from . import llama_chat_format, llama_speculative, llama_types
from .llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding
from .llama_types import *  # noqa: F401,F403 - llama_cpp exposes its types at the top level too
from . import llama_cpp
from .llama_cpp import *  # noqa: F401,F403 - and its C API (llama_cpp/__init__.py: from .llama_cpp import *)
from .models import default_model_path

#: llama-cpp-python's modules that ferrollama has, by their name under llama_cpp
LLAMA_CPP_MODULES = ("llama", "llama_cache", "llama_chat_format", "llama_cpp", "llama_grammar", "llama_speculative",
                     "llama_tokenizer", "llama_types")


def install_as_llama_cpp() -> None:
    """Makes ``import llama_cpp`` (and ``llama_cpp.llama``, ``llama_cpp.llama_chat_format``, ...: the
    modules in LLAMA_CPP_MODULES) give ferrollama's, as pymysql.install_as_MySQLdb() does, for
    libraries that import llama_cpp themselves (LangChain, llama-index, outlines, guidance ...).
    Importing another llama_cpp module (llama_cpp.server, llama_cpp.mtmd_cpp) then fails with
    ModuleNotFoundError rather than loading a second copy of one of ferrollama's."""
    import importlib
    import sys

    sys.modules["llama_cpp"] = sys.modules[__name__]
    for name in LLAMA_CPP_MODULES:
        sys.modules[f"llama_cpp.{name}"] = importlib.import_module(f".{name}", __name__)
    if not any(isinstance(f, _NoOtherLlamaCppModule) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoOtherLlamaCppModule())


class _NoOtherLlamaCppModule:
    """Finds no llama_cpp module but the installed ones (which sys.modules holds): without it,
    ``import llama_cpp.server`` would load a second copy of ferrollama.server under that name."""

    def find_spec(self, name: str, path=None, target=None):  # noqa: ANN001 - the finder protocol
        import sys

        if name.startswith("llama_cpp.") and sys.modules.get("llama_cpp") is sys.modules[__name__]:
            raise ModuleNotFoundError(f"No module named {name!r}: ferrollama stands in for llama_cpp's "
                                      f"{', '.join(LLAMA_CPP_MODULES)}", name=name)
        return None


__all__ = [
    "Batch",
    "KERNEL_ISA",
    "MEDIA_MARKER",
    "MediaError",
    "Projector",
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
    "llama_cpp",
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
    "install_as_llama_cpp",
    "samplers",
]
__all__ += llama_cpp.__all__  # the C API's names, at the top level as in llama_cpp
