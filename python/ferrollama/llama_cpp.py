"""llama-cpp-python's low-level module (``llama_cpp.llama_cpp``: llama.cpp's C API through ctypes)
for what libraries built on llama-cpp-python call: the vocabulary, tokenizing, batches, decoding,
logits and the memory (outlines, guidance, llguidance). Same names, arguments and returns as
llama-cpp-python 0.3.36; the handles are ferrollama's objects: a ``llama_model_p`` is a
:class:`~ferrollama.Model` (``Llama.model``), a ``llama_context_p`` a :class:`~ferrollama.Context`
(``Llama.ctx``), a ``llama_memory_t`` its :class:`~ferrollama.KVCache`, and a ``llama_vocab_p`` is an
address as in llama.cpp (``Model.vocab_ptr``), which the C function behind
``_lib.llama_tokenize`` takes too (llguidance calls it from its own threads).
"""
from __future__ import annotations

import ctypes
import importlib
import weakref
import numpy as np

from ._core import Batch, Context, DecodeError, KVCache, Model

# --- types (llama-cpp-python's names) ------------------------------------------------------------

llama_vocab_p = int
llama_vocab_p_ctypes = ctypes.c_void_p
llama_model_p = Model
llama_context_p = Context
llama_memory_t = KVCache
llama_pos = ctypes.c_int32
llama_token = ctypes.c_int32
llama_token_p = ctypes.POINTER(llama_token)
llama_seq_id = ctypes.c_int32

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
LLAMA_TOKEN_NULL = -1

# enum llama_token_attr (bit flags)
LLAMA_TOKEN_ATTR_UNDEFINED = 0
LLAMA_TOKEN_ATTR_UNKNOWN = 1 << 0
LLAMA_TOKEN_ATTR_UNUSED = 1 << 1
LLAMA_TOKEN_ATTR_NORMAL = 1 << 2
LLAMA_TOKEN_ATTR_CONTROL = 1 << 3
LLAMA_TOKEN_ATTR_USER_DEFINED = 1 << 4
LLAMA_TOKEN_ATTR_BYTE = 1 << 5
LLAMA_TOKEN_ATTR_NORMALIZED = 1 << 6
LLAMA_TOKEN_ATTR_LSTRIP = 1 << 7
LLAMA_TOKEN_ATTR_RSTRIP = 1 << 8
LLAMA_TOKEN_ATTR_SINGLE_WORD = 1 << 9

# enum llama_vocab_type
LLAMA_VOCAB_TYPE_NONE = 0
LLAMA_VOCAB_TYPE_SPM = 1
LLAMA_VOCAB_TYPE_BPE = 2
LLAMA_VOCAB_TYPE_WPM = 3
LLAMA_VOCAB_TYPE_UGM = 4
LLAMA_VOCAB_TYPE_RWKV = 5
LLAMA_VOCAB_TYPE_PLAMO2 = 6
#: by tokenizer.ggml.model, as llama-vocab.cpp reads it
_VOCAB_TYPES = {"llama": LLAMA_VOCAB_TYPE_SPM, "gpt2": LLAMA_VOCAB_TYPE_BPE, "bert": LLAMA_VOCAB_TYPE_WPM,
                "t5": LLAMA_VOCAB_TYPE_UGM, "rwkv": LLAMA_VOCAB_TYPE_RWKV, "plamo2": LLAMA_VOCAB_TYPE_PLAMO2}


class llama_batch(ctypes.Structure):
    """Input of llama_decode, as llama.h lays it out: n_tokens entries of each array."""

    _fields_ = [
        ("n_tokens", ctypes.c_int32),
        ("token", ctypes.POINTER(llama_token)),
        ("embd", ctypes.POINTER(ctypes.c_float)),
        ("pos", ctypes.POINTER(llama_pos)),
        ("n_seq_id", ctypes.POINTER(ctypes.c_int32)),
        ("seq_id", ctypes.POINTER(ctypes.POINTER(llama_seq_id))),
        ("logits", ctypes.POINTER(ctypes.c_int8)),
    ]


# --- the C function ------------------------------------------------------------------------------

class _Lib:
    """``llama_cpp.llama_cpp._lib``: the C functions of the extension a caller may take the address
    of (``ctypes.cast(_lib.llama_tokenize, ctypes.c_void_p)``), under llama.cpp's names."""

    def __init__(self) -> None:
        # the extension itself (import-linter would read `from . import _core` as the package root)
        core = ctypes.CDLL(importlib.import_module(f"{__package__}._core").__file__)
        self.llama_tokenize = core.ferrollama_llama_tokenize
        self.llama_tokenize.argtypes = [llama_vocab_p_ctypes, ctypes.c_char_p, ctypes.c_int32, llama_token_p,
                                        ctypes.c_int32, ctypes.c_bool, ctypes.c_bool]
        self.llama_tokenize.restype = ctypes.c_int32


_lib = _Lib()

# --- the vocabulary ------------------------------------------------------------------------------

#: the models whose vocabulary address llama_model_get_vocab gave, by that address
_VOCABS: "weakref.WeakValueDictionary[int, Model]" = weakref.WeakValueDictionary()


def _model_of(vocab: int) -> Model:
    model = _VOCABS.get(vocab) if isinstance(vocab, int) else None
    if model is None:
        raise ValueError(f"{vocab!r} is not a vocabulary llama_model_get_vocab gave (of a model still alive)")
    return model


def _token_id(value: int | None) -> int:
    return LLAMA_TOKEN_NULL if value is None else value


def llama_model_get_vocab(model: Model, /) -> int:
    """The model's vocabulary: its address (valid while the model lives)."""
    if not isinstance(model, Model):
        raise TypeError(f"llama_model_get_vocab takes a ferrollama.Model (Llama.model), not {type(model).__name__}")
    _VOCABS[model.vocab_ptr] = model
    return model.vocab_ptr


def llama_vocab_type(vocab: int, /) -> int:
    return _VOCAB_TYPES.get(_model_of(vocab).vocab_type, LLAMA_VOCAB_TYPE_NONE)


def llama_vocab_n_tokens(vocab: int, /) -> int:
    return _model_of(vocab).n_vocab


def llama_n_vocab(vocab: int, /) -> int:
    """Deprecated in llama.cpp for llama_vocab_n_tokens (it takes the vocabulary too)."""
    return llama_vocab_n_tokens(vocab)


def llama_vocab_get_text(vocab: int, token: int, /) -> bytes:
    return _model_of(vocab).token_text(token)


def llama_vocab_get_score(vocab: int, token: int, /) -> float:
    return _model_of(vocab).token_score(token)


def llama_vocab_get_attr(vocab: int, token: int, /) -> int:
    return _model_of(vocab).token_attr(token)


def llama_vocab_is_eog(vocab: int, token: int, /) -> bool:
    return _model_of(vocab).is_eog(token)


def llama_vocab_is_control(vocab: int, token: int, /) -> bool:
    return _model_of(vocab).is_control(token)


def llama_vocab_get_add_bos(vocab: int, /) -> bool:
    return _model_of(vocab).add_bos


def llama_vocab_get_add_eos(vocab: int, /) -> bool:
    return _model_of(vocab).add_eos


def _special_token_getter(name: str):
    def getter(vocab: int, /) -> int:
        return _token_id(getattr(_model_of(vocab), name))
    getter.__name__ = getter.__qualname__ = f"llama_vocab_{name}"
    getter.__doc__ = f"The vocabulary's {name} token, LLAMA_TOKEN_NULL (-1) when it has none."
    return getter


llama_vocab_bos = _special_token_getter("bos")
llama_vocab_eos = _special_token_getter("eos")
llama_vocab_eot = _special_token_getter("eot")
llama_vocab_sep = _special_token_getter("sep")
llama_vocab_nl = _special_token_getter("nl")
llama_vocab_pad = _special_token_getter("pad")
llama_vocab_fim_pre = _special_token_getter("fim_pre")
llama_vocab_fim_suf = _special_token_getter("fim_suf")
llama_vocab_fim_mid = _special_token_getter("fim_mid")

# the names llama.cpp deprecated for the llama_vocab_* ones (llama-cpp-python keeps them)
llama_token_get_text = llama_vocab_get_text
llama_token_get_score = llama_vocab_get_score
llama_token_get_attr = llama_vocab_get_attr
llama_token_is_eog = llama_vocab_is_eog
llama_token_is_control = llama_vocab_is_control
llama_token_bos = llama_vocab_bos
llama_token_eos = llama_vocab_eos
llama_token_eot = llama_vocab_eot
llama_token_sep = llama_vocab_sep
llama_token_nl = llama_vocab_nl
llama_token_pad = llama_vocab_pad


def llama_token_to_piece(vocab: int, token: int, buf, length: int, lstrip: int, special: bool, /) -> int:
    """The token's piece written into ``buf`` (a ctypes char buffer, no terminating NUL) after
    skipping up to ``lstrip`` leading spaces: its length, or minus it when ``length`` is too small
    (nothing written). Control and unknown tokens give nothing unless ``special``."""
    model = _model_of(vocab)
    piece = model.token_to_piece(token, special)
    if not special and model.token_attr(token) & (LLAMA_TOKEN_ATTR_UNKNOWN | LLAMA_TOKEN_ATTR_CONTROL):
        return 0
    skipped = 0
    while skipped < lstrip and skipped < len(piece) and piece[skipped:skipped + 1] == b" ":
        skipped += 1
    piece = piece[skipped:]
    if length < len(piece):
        return -len(piece)
    ctypes.memmove(buf, piece, len(piece))
    return len(piece)


def llama_tokenize(vocab: int, text: bytes, text_len: int, tokens, n_tokens_max: int, add_special: bool,
                   parse_special: bool, /) -> int:
    """The tokens of ``text[:text_len]`` into ``tokens`` (a ctypes llama_token array): their number,
    or minus it when ``n_tokens_max`` is too small. Through the C function callers may hold."""
    _model_of(vocab)  # a live model's vocabulary, before C reads it
    return _lib.llama_tokenize(vocab, text, text_len, tokens, n_tokens_max, add_special, parse_special)


def llama_detokenize(vocab: int, tokens, n_tokens: int, text, text_len_max: int, remove_special: bool,
                     unparse_special: bool, /) -> int:
    """The text of ``tokens[:n_tokens]`` into ``text`` (a ctypes char buffer, no terminating NUL):
    its length in bytes, or minus it when ``text_len_max`` is too small (nothing written). With
    ``remove_special``, a leading BOS and a trailing EOS the vocabulary adds are left out; with
    ``unparse_special``, control tokens are written as their text."""
    model = _model_of(vocab)
    if n_tokens < 0:
        raise ValueError(f"n_tokens {n_tokens} is negative")
    ids = [int(tokens[i]) for i in range(n_tokens)]
    written = model.detokenize_bytes(ids, remove_special, unparse_special)
    if text_len_max < len(written):
        return -len(written)
    ctypes.memmove(text, written, len(written))
    return len(written)


# --- the model and the context -------------------------------------------------------------------

def llama_get_model(ctx: Context, /) -> Model:
    return ctx.model


def llama_model_n_ctx_train(model: Model, /) -> int:
    return model.n_ctx_train


def llama_model_n_embd(model: Model, /) -> int:
    return model.n_embd


def llama_model_n_layer(model: Model, /) -> int:
    return model.n_layer


llama_n_ctx_train = llama_model_n_ctx_train
llama_n_embd = llama_model_n_embd
llama_n_layer = llama_model_n_layer


def llama_n_ctx(ctx: Context, /) -> int:
    return ctx.n_ctx


def llama_n_batch(ctx: Context, /) -> int:
    return ctx.n_batch


def llama_n_ubatch(ctx: Context, /) -> int:
    return ctx.n_ubatch


def llama_n_seq_max(ctx: Context, /) -> int:
    return ctx.n_seq_max


# --- batches and decoding ------------------------------------------------------------------------

#: the arrays of the batches llama_batch_init made, by the address of their token array (a
#: llama_batch is passed by value: its copies share the arrays)
_BATCH_ARRAYS: dict[int, tuple] = {}


def _array_address(pointer) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def llama_batch_init(n_tokens: int, embd: int, n_seq_max: int, /) -> llama_batch:
    """A batch of room for ``n_tokens`` tokens (or embeddings of ``embd`` floats when embd > 0),
    each in up to ``n_seq_max`` sequences; llama_batch_free releases its arrays."""
    if n_tokens <= 0 or n_seq_max <= 0 or embd < 0:
        raise ValueError(f"llama_batch_init: n_tokens ({n_tokens}) and n_seq_max ({n_seq_max}) must be > 0, embd >= 0")
    seq_rows = [(llama_seq_id * n_seq_max)() for _ in range(n_tokens)]
    arrays = dict(
        token=(llama_token * n_tokens)() if embd == 0 else None,
        embd=(ctypes.c_float * (n_tokens * embd))() if embd else None,
        pos=(llama_pos * n_tokens)(),
        n_seq_id=(ctypes.c_int32 * n_tokens)(),
        seq_id=(ctypes.POINTER(llama_seq_id) * (n_tokens + 1))(
            *[ctypes.cast(row, ctypes.POINTER(llama_seq_id)) for row in seq_rows]),
        logits=(ctypes.c_int8 * n_tokens)(),
    )
    batch = llama_batch(n_tokens=0, **{k: ctypes.cast(v, dict(llama_batch._fields_)[k]) for k, v in arrays.items()
                                       if v is not None})
    _BATCH_ARRAYS[_array_address(batch.token if embd == 0 else batch.embd)] = (arrays, seq_rows)
    return batch


def llama_batch_free(batch: llama_batch, /) -> None:
    _BATCH_ARRAYS.pop(_array_address(batch.token if batch.token else batch.embd), None)


def _engine_batch(batch: llama_batch, ctx: Context) -> Batch:
    """The engine's batch of a llama_batch's entries (llama.cpp's defaults where an array is
    NULL: positions after the sequence's last, sequence 0, logits of the last token only)."""
    n = batch.n_tokens
    if not batch.token:
        raise ValueError("llama_decode: batches of embeddings (token NULL) are not supported here; use Batch.from_embeddings")
    seq_ids = [[batch.seq_id[i][j] for j in range(batch.n_seq_id[i])] if batch.seq_id else [0] for i in range(n)]
    next_pos: dict[int, int] = {}
    out = Batch(n, max((len(s) for s in seq_ids), default=1))
    for i in range(n):
        if batch.pos:
            pos = batch.pos[i]
        else:
            seq = seq_ids[i][0]
            pos = next_pos.get(seq, ctx.kv.seq_pos_max(seq) + 1)
            next_pos[seq] = pos + 1
        logits = bool(batch.logits[i]) if batch.logits else i == n - 1
        out.add(batch.token[i], pos, seq_ids[i], logits)
    return out


#: per context, the logits arrays handed out since its last llama_decode (alive until the next)
_LOGITS_HANDED_OUT: "weakref.WeakKeyDictionary[Context, list[np.ndarray]]" = weakref.WeakKeyDictionary()


def llama_decode(ctx: Context, batch: llama_batch, /) -> int:
    """Decodes the batch: 0, 1 when the memory has no room for it (the cache as before), -1 for
    an invalid batch, as llama.cpp returns."""
    _LOGITS_HANDED_OUT.pop(ctx, None)
    try:
        ctx.decode(_engine_batch(batch, ctx))
    except DecodeError:
        return 1
    except ValueError:
        return -1
    return 0


def _float_pointer(ctx: Context, values: np.ndarray):
    """A pointer to ``values`` (kept alive until the context's next llama_decode)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    _LOGITS_HANDED_OUT.setdefault(ctx, []).append(values)
    return values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def llama_get_logits(ctx: Context, /):
    """The last decode's logits, one row of n_vocab floats per output, as a ctypes float pointer."""
    return _float_pointer(ctx, ctx.logits_all())


def llama_get_logits_ith(ctx: Context, i: int, /):
    """The logits of batch index ``i`` of the last decode (negative: from the last output)."""
    return _float_pointer(ctx, ctx.logits(i))


def llama_get_embeddings_ith(ctx: Context, i: int, /):
    return _float_pointer(ctx, ctx.embeddings(i))


def llama_get_embeddings_seq(ctx: Context, seq_id: int, /):
    return _float_pointer(ctx, ctx.embeddings_seq(seq_id))


# --- the memory ----------------------------------------------------------------------------------

def llama_get_memory(ctx: Context, /) -> KVCache:
    return ctx.kv


def llama_memory_clear(mem: KVCache, data: bool, /) -> None:
    del data  # the cache's contents go with its cells
    mem.clear()


def llama_memory_seq_rm(mem: KVCache, seq_id: int, p0: int, p1: int, /) -> bool:
    return mem.seq_rm(seq_id, p0, p1)


def llama_memory_seq_cp(mem: KVCache, seq_id_src: int, seq_id_dst: int, p0: int, p1: int, /) -> None:
    mem.seq_cp(seq_id_src, seq_id_dst, p0, p1)


def llama_memory_seq_keep(mem: KVCache, seq_id: int, /) -> None:
    mem.seq_keep(seq_id)


def llama_memory_seq_add(mem: KVCache, seq_id: int, p0: int, p1: int, delta: int, /) -> None:
    mem.seq_add(seq_id, p0, p1, delta)


def llama_memory_seq_div(mem: KVCache, seq_id: int, p0: int, p1: int, d: int, /) -> None:
    mem.seq_div(seq_id, p0, p1, d)


def llama_memory_seq_pos_min(mem: KVCache, seq_id: int, /) -> int:
    return mem.seq_pos_min(seq_id)


def llama_memory_seq_pos_max(mem: KVCache, seq_id: int, /) -> int:
    return mem.seq_pos_max(seq_id)


def llama_memory_can_shift(mem: KVCache, /) -> bool:
    return mem.can_shift


__all__ = [name for name in dir() if name.startswith(("llama_", "LLAMA_"))]
