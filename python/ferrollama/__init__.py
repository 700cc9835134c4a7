"""ferrollama: llama.cpp's engine rebuilt in Rust, run from Python.

The core (``Model``, ``Context``, ``Batch``, ``samplers``) follows llama.cpp's concepts;
``Llama`` is the high-level API built on it.
"""
import signal as _signal

# The imports below start threads (numpy's OpenBLAS pool): they start with the asynchronous
# signals blocked, as the core's own threads do, so that the kernel hands Ctrl-C's SIGINT to
# the main thread. One delivered to such a thread would not interrupt the main thread's
# blocking read (the chat prompt), and Python, whose handlers run on the main thread, would
# only act on it after the next line of input.
_ASYNC_SIGNALS = _signal.valid_signals() - {_signal.SIGSEGV, _signal.SIGBUS, _signal.SIGFPE, _signal.SIGILL,
                                            getattr(_signal, "SIGTRAP", _signal.SIGILL), getattr(_signal, "SIGSYS", _signal.SIGILL)}
_saved_mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, _ASYNC_SIGNALS) if hasattr(_signal, "pthread_sigmask") else None
try:
    from ._core import (
        Batch,
        BusyError,
        Context,
        DecodeError,
        Error,
        GGUFError,
        GrammarError,
        KVCache,
        Model,
        StateError,
        StreamDecoder,
        TensorInfo,
        UnsupportedError,
        __version__,
    )
    from . import samplers
    from .llama import Llama, LlamaState
finally:
    if _saved_mask is not None:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, _saved_mask)

__all__ = [
    "Batch",
    "BusyError",
    "Context",
    "DecodeError",
    "Error",
    "GGUFError",
    "GrammarError",
    "KVCache",
    "Llama",
    "LlamaState",
    "Model",
    "StateError",
    "StreamDecoder",
    "TensorInfo",
    "UnsupportedError",
    "__version__",
    "samplers",
]
