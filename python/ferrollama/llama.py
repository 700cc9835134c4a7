"""The high-level API: llama-cpp-python's ``Llama`` on the engine.

Its methods and the dicts they return follow llama-cpp-python's ``Llama`` (completion and chat
completion shaped as OpenAI's API, streaming, embeddings, state). The generation it drives is
the generation layer's (ferrollama.generation): :class:`SamplingParams`, :class:`Sampler`
(llama.cpp's common_sampler), :class:`StopScanner`, the continuous-batching scheduler for a list
of prompts, speculative decoding; those names are importable from here too, as before.
"""
from __future__ import annotations

import os
import random
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from . import samplers as S
from ._core import Batch, Context, GGUFError, LoraAdapter, Model, UnsupportedError
from ._llama_hooks import LogitsProcessorList, MinTokensLogitsProcessor, StoppingCriteriaList
from ._llama_params import (GGML_TYPE_IDS, LlamaContextParams, LlamaModelParams, load_mode,
                            sort_extra_keywords)
from .chat import tools as T
from .chat.media import media_sources, with_media_markers
from .chat.templates import ChatTemplate
from .generation.logprobs import TokenLogprob, chat_logprobs_of_completion, completion_logprobs, token_logprob
from .generation.params import DEFAULT_SEED, SamplingParams
from .generation.sampler import Sampler
from .generation.checkpoints import DEFAULT_CHECKPOINTS, Checkpoints
from .generation.media import load_image_url
from .generation.multimodal import Chunk, ImageChunk, eval_image, key_runs, prompt_keys, whole_image_prefix
from .generation.speculative import SpeculativeStats, snapshots_for, speculative_tokens
from .generation.text import StopScanner, Utf8Stream, decode_tokens
from .generation.tokens import add_bos_of, common_prefix_len
from .llama_tokenizer import LlamaTokenizer
from .models import ModelPathError, model_file

# names that lived here before the generation layer had modules of its own, importable from here still
from ._llama_hooks import LogitsProcessor, StoppingCriteria  # noqa: F401,E402
from .generation.logprobs import log_softmax  # noqa: F401,E402
from .generation.params import SAMPLER_CHARS, SAMPLER_NAMES, resolve_seed  # noqa: F401,E402
from .generation.text import utf8_complete_len  # noqa: F401,E402

__all__ = [
    "DEFAULT_SEED", "SamplingParams", "Sampler", "Utf8Stream", "StopScanner", "Llama", "LlamaState",
    "decode_tokens", "add_bos_of", "common_prefix_len", "log_softmax", "SAMPLER_NAMES", "LogitsProcessorList",
    "StoppingCriteriaList", "MinTokensLogitsProcessor", "LlamaCppSampler", "ModelPathError", "NO_EFFECT_ON_CPU",
]

# --- the high-level API ------------------------------------------------------------------------

class LlamaState:
    """What ``Llama.save_state`` returns (llama-cpp-python's fields): the tokens in the context,
    the logits kept for them, and the context's state."""

    def __init__(self, input_ids: np.ndarray, scores: np.ndarray, n_tokens: int, llama_state: bytes,
                 llama_state_size: int, seed: int):
        self.input_ids = input_ids
        self.scores = scores
        self.n_tokens = n_tokens
        self.llama_state = llama_state
        self.llama_state_size = llama_state_size
        self.seed = seed


#: llama.cpp's ggml_type ids of the cache types a context takes (llama-cpp-python's type_k/type_v)
_CACHE_TYPE_IDS = {i: name for name, i in GGML_TYPE_IDS.items()}
#: llama_pooling_type ids
_POOLING_IDS = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
#: llama_rope_scaling_type ids
_ROPE_SCALING_IDS = {0: "none", 1: "linear", 2: "yarn", 3: "longrope"}


def _cache_type(value: int | str | None) -> str:
    if value is None:
        return "f16"
    if isinstance(value, str):
        return value
    if value not in _CACHE_TYPE_IDS:
        raise ValueError(f"cache type {value} is not one a context stores (ggml type ids: {sorted(_CACHE_TYPE_IDS)})")
    return _CACHE_TYPE_IDS[value]


def _pooling_name(pooling: str | None, pooling_type: int) -> str | None:
    """The context's pooling: ferrollama's name, else llama-cpp-python's pooling_type id (-1: the model's)."""
    if pooling is not None:
        return pooling
    if pooling_type == -1:
        return None
    if pooling_type not in _POOLING_IDS:
        raise ValueError(f"pooling_type must be -1 (the model's) or one of {_POOLING_IDS}, not {pooling_type}")
    return _POOLING_IDS[pooling_type]


def _rope_kwargs(rope_scaling_type: int | None, rope_freq_base: float, rope_freq_scale: float,
                 yarn_ext_factor: float, yarn_attn_factor: float, yarn_beta_fast: float, yarn_beta_slow: float,
                 yarn_orig_ctx: int) -> dict:
    """A context's RoPE parameters as llama_context_params holds them (llama-cpp-python's defaults
    pass yarn_attn_factor 1, yarn_beta_fast 32 and yarn_beta_slow 1 through)."""
    if rope_scaling_type not in (None, -1) and rope_scaling_type not in _ROPE_SCALING_IDS:
        raise ValueError(f"rope_scaling_type must be -1 or one of {_ROPE_SCALING_IDS}, not {rope_scaling_type}")
    return dict(rope_scaling_type=_ROPE_SCALING_IDS.get(rope_scaling_type) if rope_scaling_type is not None else None,
                rope_freq_base=rope_freq_base, rope_freq_scale=rope_freq_scale, yarn_ext_factor=yarn_ext_factor,
                yarn_attn_factor=yarn_attn_factor, yarn_beta_fast=yarn_beta_fast, yarn_beta_slow=yarn_beta_slow,
                yarn_orig_ctx=yarn_orig_ctx)


def _metadata_strings(model: Model) -> dict[str, str]:
    """The model's metadata as llama.cpp's llama_model_meta_val_str gives it: every key but the
    arrays, values as text."""
    out: dict[str, str] = {}
    for key, value in model.metadata.items():
        if isinstance(value, (list, tuple)):
            continue
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, float):
            out[key] = f"{value:.6f}"
        elif isinstance(value, bytes):
            out[key] = value.decode("utf-8", "replace")
        else:
            out[key] = str(value)
    return out


class _ModelTokenizer:
    """The model's own tokenizer with llama-cpp-python's tokenizer methods."""

    def __init__(self, model: Model):
        self.model = model

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        return list(self.model.tokenize(text, add_special=add_bos, parse_special=special))

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        del prev_tokens  # a piece does not depend on the tokens before it in these vocabularies
        return b"".join(self.model.token_to_piece(int(t), special) for t in tokens)


class LlamaCppSampler:
    """llama-cpp-python's sampler chain, on the engine's samplers: the logits processors (and
    logit_bias), penalties over the last ``last_n_tokens_size`` sampled tokens (the prompt's
    are not counted), the grammar applied to every candidate, then greedy (temperature 0),
    dist (temperature < 0), mirostat, or top-k, typical, top-p, min-p, temperature and dist."""

    def __init__(self, llama: "Llama", *, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.8, repeat_penalty: float = 1.0,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, mirostat_mode: int = 0,
                 mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 logits_processor: LogitsProcessorList | None = None, grammar: Any = None,
                 logit_bias: dict[int, float] | None = None):
        seed = int(llama._seed) & 0xFFFFFFFF
        if mirostat_mode not in (0, 1, 2):
            raise ValueError(f"mirostat_mode must be 0, 1 or 2, not {mirostat_mode}")
        members: list[Any] = [S.Penalties(last_n=llama.last_n_tokens_size, repeat=repeat_penalty,
                                          freq=frequency_penalty, present=presence_penalty)]
        if grammar is not None:
            members.append(_grammar_sampler(llama.model, grammar))
        if temp < 0.0:
            members.append(S.Dist(seed=seed))
        elif temp == 0.0:
            members.append(S.Greedy())
        elif mirostat_mode == 1:
            members.append(S.MirostatV1(llama.model.n_vocab, seed, mirostat_tau, mirostat_eta, 100))
        elif mirostat_mode == 2:
            members.append(S.MirostatV2(seed, mirostat_tau, mirostat_eta))
        else:
            members += [S.TopK(top_k), S.Typical(typical_p, min_keep=1), S.TopP(top_p, min_keep=1),
                        S.MinP(min_p, min_keep=1), S.Temp(temp), S.Dist(seed=seed)]
        self.chain = S.Chain(members)
        self.llama = llama
        self.processors = LogitsProcessorList(logits_processor or [])
        if logit_bias:
            bias = {int(t): float(b) for t, b in logit_bias.items()}
            self.processors.append(lambda ids, scores: _add_bias(scores, bias))

    def sample_logits(self, logits: np.ndarray) -> int:
        logits = np.asarray(logits, dtype=np.float32)
        if self.processors:
            scores = self.processors(self.llama._input_ids, logits.copy())
            logits = np.asarray(scores, dtype=np.float32)
        return int(self.chain.sample_logits(logits))

    def accept(self, token: int, accept_grammar: bool = True) -> None:
        del accept_grammar  # the grammar is a member of the chain: it accepts what the chain does
        self.chain.accept(int(token))


def _add_bias(scores: np.ndarray, bias: dict[int, float]) -> np.ndarray:
    out = np.copy(scores)
    for token, value in bias.items():
        out[token] = value + scores[token]
    return out


def _grammar_sampler(model: Model, grammar: Any):
    """The engine's grammar sampler for a LlamaGrammar (or a GBNF text)."""
    if isinstance(grammar, str):
        return S.Grammar(model, grammar, root="root")
    return S.Grammar(model, grammar._grammar, root=getattr(grammar, "_root", "root"))


#: constructor keywords that have no effect on a CPU-only engine (accepted for llama-cpp-python's
#: programs; README "Llama, as llama-cpp-python's" lists them)
NO_EFFECT_ON_CPU = ("n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "use_mlock", "offload_kqv",
                    "flash_attn", "op_offload", "numa", "no_perf")
class Llama:
    """llama-cpp-python's ``Llama`` on this engine: the same constructor keywords, methods,
    defaults and return shapes (its ``llama_types``).

    The context keeps the tokens of the last call: a prompt that starts with them is only
    decoded from where it differs. ``model_path=None`` loads the default model.
    """

    def __init__(self, model_path: str | os.PathLike[str] | None = None, *,
                 # model
                 n_gpu_layers: int = 0, split_mode: int = 1, main_gpu: int = 0, tensor_split: list[float] | None = None,
                 vocab_only: bool = False, use_mmap: bool = True, use_mlock: bool = False,
                 kv_overrides: dict[str, bool | int | float | str] | None = None,
                 # context
                 seed: int = DEFAULT_SEED, n_ctx: int = 512, n_batch: int = 512, n_ubatch: int = 512,
                 n_threads: int | None = None, n_threads_batch: int | None = None,
                 rope_scaling_type: int | None = -1, pooling_type: int = -1, attention_type: int = -1,
                 rope_freq_base: float = 0.0, rope_freq_scale: float = 0.0, yarn_ext_factor: float = -1.0,
                 yarn_attn_factor: float = 1.0, yarn_beta_fast: float = 32.0, yarn_beta_slow: float = 1.0,
                 yarn_orig_ctx: int = 0, logits_all: bool = False, embedding: bool = False, offload_kqv: bool = True,
                 flash_attn: bool = False, op_offload: bool | None = None, swa_full: bool | None = None,
                 # sampling
                 no_perf: bool = False, last_n_tokens_size: int = 64,
                 # LoRA
                 lora_base: str | None = None, lora_scale: float = 1.0, lora_path: str | None = None,
                 numa: bool | int = False,
                 # chat
                 chat_format: str | None = None, chat_handler: Callable[..., Any] | None = None,
                 draft_model: Any = None, tokenizer: Any = None,
                 type_k: int | str | None = None, type_v: int | str | None = None,
                 spm_infill: bool = False, verbose: bool = True,
                 # ferrollama's own
                 chat_template: str | None = None, pooling: str | None = None,
                 ctx_checkpoints: int = DEFAULT_CHECKPOINTS, tool_calls_in_content: bool = True, **extra: Any):
        self._init_args = {k: v for k, v in locals().items() if k not in ("self", "extra", "__class__")}
        # llama-cpp-python takes any keyword through **kwargs: a Context's are passed to it
        context_params = sort_extra_keywords(extra, frozenset(self._init_args) | {"embeddings"})
        self._init_args.update(context_params)
        self.verbose = verbose
        # the tool calls of a chat answer stay in its content too (where llama-cpp-python leaves
        # them, and its readers such as autogen's client take them), beside tool_calls
        self.tool_calls_in_content = tool_calls_in_content
        self.numa, self.tensor_split = numa, tensor_split
        t0 = time.perf_counter()
        self.model_path = model_file(model_path)
        self.model = Model(self.model_path, use_mmap=use_mmap, vocab_only=vocab_only, kv_overrides=kv_overrides)
        # lora_base has no effect, as in llama-cpp-python 0.3.x (a leftover of merging into an f16 base)
        self._lora = _load_lora(self.model, lora_path) if lora_path else None
        self.kv_overrides = kv_overrides
        self._seed = seed
        self.last_n_tokens_size = last_n_tokens_size
        # (llama-cpp-python turns logits_all on with a draft model, for its own verification; the
        # speculative loop here reads the verified rows from the context)
        self._logits_all = logits_all
        self.lora_base, self.lora_scale, self.lora_path = lora_base, lora_scale, lora_path
        self.spm_infill = spm_infill
        self.cache: Any = None
        self.tokenizer_ = tokenizer or _ModelTokenizer(self.model)
        n_ctx = n_ctx if n_ctx > 0 else self.model.n_ctx_train
        self.n_batch = min(n_ctx, n_batch)
        if attention_type not in (-1, 0, 1):
            raise ValueError(f"attention_type must be -1, 0 (causal) or 1 (non-causal), not {attention_type}")
        if attention_type == 1 and not self.model.arch.endswith("bert"):
            raise UnsupportedError(f"non-causal attention for the decoder '{self.model.arch}' (only encoders attend both ways)")
        self._pooling = _pooling_name(pooling, pooling_type)
        self._context_kwargs = dict(n_ctx=n_ctx, n_batch=self.n_batch, n_ubatch=min(self.n_batch, n_ubatch),
                                    n_threads=n_threads, n_threads_batch=n_threads_batch, type_k=_cache_type(type_k),
                                    type_v=_cache_type(type_v),
                                    **_rope_kwargs(rope_scaling_type, rope_freq_base, rope_freq_scale, yarn_ext_factor,
                                                   yarn_attn_factor, yarn_beta_fast, yarn_beta_slow, yarn_orig_ctx),
                                    **({"swa_full": swa_full} if swa_full is not None else {}), **context_params)
        if draft_model is not None and self.model.is_recurrent and "n_rs_seq" not in context_params:
            # a recurrent model drops rejected drafted tokens by rolling back to kept states
            self._context_kwargs["n_rs_seq"] = snapshots_for(draft_model, self._context_kwargs["n_ubatch"])
        self._embedding = embedding
        self.ctx: Context | None = None if vocab_only else self._new_context(
            embeddings=embedding, pooling=self._pooling if embedding else None)
        self._embed_ctx: Context | None = self.ctx if embedding else None
        self._n_ctx = self.ctx.n_ctx if self.ctx is not None else n_ctx
        # the threads the context runs on (llama-cpp-python's defaults where there is none)
        self.n_threads = self.ctx.n_threads if self.ctx is not None else n_threads or max((os.cpu_count() or 2) // 2, 1)
        self.n_threads_batch = n_threads_batch or self.n_threads
        self.context_params = self._context_params_view()
        self.model_params = LlamaModelParams(
            n_gpu_layers=n_gpu_layers, split_mode=split_mode, main_gpu=main_gpu,
            tensor_split=tuple(tensor_split) if tensor_split is not None else None,
            load_mode=load_mode(use_mmap, use_mlock), use_mmap=use_mmap, use_mlock=use_mlock, vocab_only=vocab_only,
            check_tensors=False, kv_overrides=kv_overrides)
        #: a recurrent model's saved states, from which a shorter cached prefix is resumed
        self._checkpoints = Checkpoints(self.ctx, ctx_checkpoints) if self.ctx is not None else None
        self._n_vocab = self.model.n_vocab
        #: the cached prompt: token ids, and an image's positions as its negative key (`_media`)
        self._tokens: list[int] = []
        #: the images of the cached and the next prompt, by key (generation.multimodal.image_key)
        self._media: dict[int, ImageChunk] = {}
        self._scores_buf: np.ndarray | None = None
        #: the last prepared prompt's length and the logits it gave (see `_prepare`)
        self._prompt_logits: tuple[int, np.ndarray] | None = None
        self.metadata = _metadata_strings(self.model)
        self.chat_format, self.chat_handler = chat_format, chat_handler
        self._chat_template_source = chat_template
        if chat_format is not None:
            from .llama_chat_format import get_chat_completion_handler

            get_chat_completion_handler(chat_format)  # an unknown name fails here, not at the first chat
        self._chat_template = None
        self._add_bos: bool | None = None
        #: speculative decoding's drafter (ferrollama.PromptLookupDecoding or DraftModel), or None
        self.draft_model = draft_model
        if hasattr(draft_model, "check_vocab"):
            draft_model.check_vocab(self.model)
        #: drafted and accepted tokens since the Llama was made
        self.speculative_stats = SpeculativeStats()
        #: the scheduler that decodes a list of prompts together (made at the first such call)
        self._batcher = None
        if verbose:
            print(f"ferrollama: {self.model_path}: {self.model.arch}, {self.model.n_params / 1e6:.0f}M parameters, "
                  f"n_ctx {self._n_ctx}, loaded in {(time.perf_counter() - t0) * 1e3:.0f} ms", file=sys.stderr)

    def _context_params_view(self) -> LlamaContextParams:
        """llama_context_params as this Llama made its context (the pooling and RoPE scaling as ids)."""
        a, ck = self._init_args, self._context_kwargs
        pooling_ids = {name: i for i, name in _POOLING_IDS.items()}
        return LlamaContextParams(
            n_ctx=ck["n_ctx"], n_batch=ck["n_batch"], n_ubatch=ck["n_ubatch"], n_seq_max=ck.get("n_seq_max", 1),
            n_rs_seq=ck.get("n_rs_seq", 0), n_threads=self.n_threads, n_threads_batch=self.n_threads_batch,
            rope_scaling_type=-1 if a["rope_scaling_type"] is None else a["rope_scaling_type"],
            pooling_type=pooling_ids[self._pooling] if self._pooling is not None else -1,
            attention_type=a["attention_type"], flash_attn_type=int(bool(a["flash_attn"])),
            **{k: a[k] for k in ("rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor",
                                 "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx", "offload_kqv", "no_perf")},
            defrag_thold=ck.get("defrag_thold", -1.0), type_k=GGML_TYPE_IDS[ck["type_k"].lower()],
            type_v=GGML_TYPE_IDS[ck["type_v"].lower()], embeddings=a["embedding"],
            op_offload=True if a["op_offload"] is None else a["op_offload"], swa_full=ck.get("swa_full", False),
            kv_unified=ck.get("kv_unified", True))

    # --- llama-cpp-python's accessors ---
    def n_ctx(self) -> int:
        return self._n_ctx

    def n_embd(self) -> int:
        return self.model.n_embd

    def n_vocab(self) -> int:
        return self._n_vocab

    def token_bos(self) -> int:
        return -1 if self.model.bos is None else self.model.bos

    def token_eos(self) -> int:
        return -1 if self.model.eos is None else self.model.eos

    def token_nl(self) -> int:
        return -1 if self.model.nl is None else self.model.nl

    def pooling_type(self) -> str:
        return str(self._pooling if self._pooling is not None else _POOLING_IDS.get(self.model.metadata.get(
            f"{self.model.arch}.pooling_type", 0), "none"))

    def tokenizer(self):
        return LlamaTokenizer(self)

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    @n_tokens.setter
    def n_tokens(self, n: int) -> None:
        """Keeps the first n tokens (and their cache cells)."""
        if not 0 <= n <= len(self._tokens):
            raise ValueError(f"n_tokens must be in 0..{len(self._tokens)}, not {n}")
        tokens = self._tokens[:n]
        self._rewind(n)
        self._prompt_logits = None
        if len(self._tokens) < n:  # a recurrent state resumed from an earlier checkpoint
            self._eval_keys(tokens[len(self._tokens):])

    @property
    def input_ids(self) -> np.ndarray:
        """The context's tokens, n_ctx long (the first n_tokens are valid), as llama-cpp-python keeps them."""
        out = np.zeros(self._n_ctx, dtype=np.intc)
        out[:len(self._tokens)] = self._input_ids
        return out

    @property
    def _input_ids(self) -> np.ndarray:
        # an image's positions hold no token: 0 there, as for the rest of the context
        return np.maximum(np.asarray(self._tokens, dtype=np.intc), 0)

    @property
    def scores(self) -> np.ndarray:
        """Logits kept per position (n_ctx rows), with logits_all=True (as in llama-cpp-python,
        the rows are not kept otherwise: generating would copy a row of n_vocab per token)."""
        if self._scores_buf is None:
            self._scores_buf = np.zeros((self._n_ctx, self._n_vocab), dtype=np.float32)  # pages come as rows are written
        return self._scores_buf

    @property
    def _scores(self) -> np.ndarray:
        return self.scores[:len(self._tokens)]

    @property
    def eval_tokens(self) -> deque:
        return deque(self._tokens, maxlen=self._n_ctx)

    @property
    def eval_logits(self) -> deque:
        return deque(self._scores.tolist(), maxlen=self._n_ctx if self._logits_all else 1)

    @property
    def add_bos(self) -> bool:
        if self._add_bos is None:
            self._add_bos = add_bos_of(self.model)
        return self._add_bos

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def set_cache(self, cache: Any) -> None:
        """A LlamaRAMCache or LlamaDiskCache that keeps states of earlier completions."""
        self.cache = cache

    def close(self) -> None:
        """Frees the context and the model (the Llama is unusable afterwards)."""
        if self._batcher is not None:
            self._batcher.close()
            self._batcher = None
        self.ctx = self._embed_ctx = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __getstate__(self) -> dict:
        return dict(self._init_args, seed=self._seed)

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    @staticmethod
    def logits_to_logprobs(logits: np.ndarray | list, axis: int = -1) -> np.ndarray:
        """Log-softmax along an axis (float32), as llama-cpp-python computes it."""
        logits = np.asarray(logits, dtype=np.float32)
        maximum = np.max(logits, axis=axis, keepdims=True)
        shifted = logits - maximum
        with np.errstate(divide="ignore"):
            return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))

    @staticmethod
    def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
        return common_prefix_len(a, b)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, additional_files: list[str] | None = None,
                        local_dir: str | os.PathLike[str] | None = None, local_dir_use_symlinks: bool | str = "auto",
                        cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> "Llama":
        """Downloads a GGUF file of a Hugging Face repository (huggingface-hub) and loads it; the
        file name may be a glob (the one match), as in llama-cpp-python."""
        from .hub import download_model

        path = download_model(repo_id, filename, additional_files, local_dir, local_dir_use_symlinks, cache_dir)
        return cls(model_path=path, **kwargs)

    def _new_context(self, **kw: Any) -> Context:
        """A context of the model with the Llama's settings and its LoRA adapter."""
        ctx = Context(self.model, **kw, **self._context_kwargs)
        if self._lora is not None:
            ctx.set_lora(self._lora, self.lora_scale)
        return ctx

    def _require_ctx(self) -> Context:
        if self.ctx is None:
            raise ValueError("this Llama has no context (vocab_only=True, or closed)")
        return self.ctx

    # --- tokens ---
    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of text; add_bos adds the model's special tokens (BOS) as it asks for them."""
        return self.tokenizer_.tokenize(text, add_bos, special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """The bytes of tokens (their pieces)."""
        return self.tokenizer_.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def reset(self) -> None:
        """Forgets the cached prompt."""
        if self.ctx is not None:
            self.ctx.kv.clear()
        if self._checkpoints is not None:
            self._checkpoints.clear()
        self._tokens = []
        self._prompt_logits = None

    def _rewind(self, keep: int) -> int:
        """Keeps at most the first `keep` cached tokens (all of them where the cache can cut
        there; for a recurrent model, those of its longest checkpoint within them); returns how
        many are kept."""
        n = self._checkpoints.rewind(0, keep) if self._checkpoints is not None else keep
        del self._tokens[n:]
        return n

    # --- evaluation ---
    def eval(self, tokens: Sequence[int]) -> None:
        """Decodes tokens after those already cached, in batches of n_batch; keeps the logits of
        every token with logits_all=True, of the last one otherwise. The positions of an image
        (its negative key, see `_media_prompt`) decode its embeddings, whole."""
        if len(tokens) and tokens[-1] < 0:
            raise ValueError("a prompt must end with text after its last image (the logits come from a token)")
        self._eval_keys(tokens)

    def _eval_keys(self, tokens: Sequence[int]) -> None:
        """`eval` of any part of a prompt: it may end with an image (the part before a prompt's
        last token, where a recurrent model's checkpoint is taken)."""
        self._require_ctx().kv.seq_rm(0, len(self._tokens), -1)
        for start, end in key_runs(tokens):
            if tokens[start] < 0:
                self._eval_image(tokens[start], end - start)
            else:
                self._eval_tokens(tokens[start:end], is_last=end == len(tokens))

    def _eval_image(self, key: int, n: int) -> None:
        chunk = self._media.get(key)
        if chunk is None or n != chunk.n_pos:
            raise ValueError("an image's positions decode only whole, from the image's own embeddings")
        if len(self._tokens) + n > self._n_ctx:
            raise ValueError(f"the context is full ({self._n_ctx} tokens)")
        eval_image(self._require_ctx(), chunk, len(self._tokens), 0, self.n_batch)
        self._tokens.extend([key] * n)

    def _eval_tokens(self, tokens: Sequence[int], is_last: bool = True) -> None:
        ctx = self._require_ctx()
        for i in range(0, len(tokens), self.n_batch):
            chunk = [int(t) for t in tokens[i:i + self.n_batch]]
            n_past = len(self._tokens)
            if n_past + len(chunk) > self._n_ctx:
                raise ValueError(f"the context is full ({self._n_ctx} tokens)")
            last = is_last and i + self.n_batch >= len(tokens)
            want = "all" if self._logits_all else ("last" if last else "none")
            ctx.decode(Batch.from_tokens(chunk, pos0=n_past, seq_id=0, logits=want))
            self._tokens.extend(chunk)
            if self._logits_all:
                self.scores[n_past:n_past + len(chunk)] = ctx.logits_all()[-len(chunk):]

    def _prepare(self, tokens: Sequence[int]) -> np.ndarray:
        """Makes the cache hold tokens, reusing the longest cached prefix; returns the logits after
        the last."""
        if not tokens:
            raise ValueError("the prompt is empty")
        if len(tokens) > self._n_ctx:
            raise ValueError(f"the prompt has {len(tokens)} tokens; the context holds {self._n_ctx}")
        ctx = self._require_ctx()
        common = common_prefix_len(self._tokens, tokens)
        saved = self._prompt_logits
        if saved is not None and common == len(tokens) == saved[0] and self._rewind(common) == common:
            # The same prompt again, cached with the logits it gave: decoding its last token again
            # alone would round differently from the batch that decoded it first (products over 8
            # tokens or more sum differently, as in llama.cpp), and could continue differently.
            return saved[1].copy()
        keep = self._rewind(whole_image_prefix(tokens, min(common, len(tokens) - 1)))
        ckpt = self._checkpoints
        if ckpt is not None and ckpt.enabled and len(tokens) - keep > 1:
            # a recurrent model: keep the states before the prompt's last token (the same prompt
            # again) and after it (a longer prompt that starts with it)
            self._eval_keys(tokens[keep:-1])
            ckpt.save(0, len(self._tokens))
            self.eval(tokens[-1:])
        else:
            self.eval(tokens[keep:])
        if ckpt is not None:
            ckpt.save(0, len(self._tokens))
        logits = ctx.logits(-1)
        self._prompt_logits = (len(tokens), logits.copy())
        return logits

    # --- sampling ---
    def _compat_sampler(self, **kw: Any) -> LlamaCppSampler:
        kw.pop("tfs_z", None)        # tail-free sampling is gone from llama.cpp: no effect (as in llama-cpp-python)
        kw.pop("penalize_nl", None)  # llama.cpp's penalties sampler has no such switch any more
        return LlamaCppSampler(self, **kw)

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True, logits_processor: LogitsProcessorList | None = None,
               grammar: Any = None, idx: int | None = None) -> int:
        """A token sampled from the logits after the last evaluated token (or position idx, with
        logits_all=True), by a fresh chain with these parameters."""
        if not self._tokens:
            raise ValueError("nothing evaluated yet: call eval() first")
        row = len(self._tokens) - 1 if idx is None else idx
        logits = self._require_ctx().logits(-1) if idx is None else self.scores[row]
        sampler = self._compat_sampler(
            top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temp=temp, repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, logits_processor=logits_processor, grammar=grammar)
        del tfs_z, penalize_nl
        return sampler.sample_logits(logits)

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: LogitsProcessorList | None = None,
                 stopping_criteria: StoppingCriteriaList | None = None, grammar: Any = None,
                 logit_bias: dict[int, float] | None = None, seed: int | None = None,
                 sampling: SamplingParams | None = None) -> Iterator[int]:
        """Yields sampled tokens, decoding each one, until the caller stops, a stopping criterion
        says so or the context is full. ``reset=False`` continues after the tokens already cached.

        ``sampling`` (ferrollama's) samples with llama.cpp's common_sampler instead of
        llama-cpp-python's chain."""
        if seed is not None:
            self.set_seed(seed)
        if sampling is not None:
            sampler: Any = self._sampler(sampling, seed)
        else:
            sampler = self._compat_sampler(
                top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temp=temp, repeat_penalty=repeat_penalty,
                frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, mirostat_mode=mirostat_mode,
                mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, logits_processor=logits_processor,
                grammar=grammar, logit_bias=logit_bias)
        del tfs_z, penalize_nl
        if reset:
            logits = self._prepare(list(tokens))
        else:
            if tokens:
                self.eval(list(tokens))
            if not self._tokens:
                raise ValueError("nothing to continue from: the context is empty")
            logits = self._require_ctx().logits(-1)
        yield from self._sample_loop(sampler, None, logits, stopping_criteria)

    def _sampler(self, params: SamplingParams, seed: int | None) -> Sampler:
        return Sampler(self.model, replace(params, seed=self._seed if seed is None else seed))

    def _sample_loop(self, sampler: Any, on_logits: Callable[[np.ndarray, int], None] | None,
                     logits: np.ndarray, stopping_criteria: StoppingCriteriaList | None = None) -> Iterator[int]:
        """Samples from logits (those after the last cached token), then decodes each sampled token
        (with a draft model, several at a time: ferrollama.generation.speculative)."""
        # the drafters read tokens, and an image's positions hold none: no drafts after images
        if self.draft_model is not None and min(self._tokens, default=0) >= 0:
            yield from self._speculative_loop(sampler, on_logits, logits, stopping_criteria)
            return
        while True:
            token = sampler.sample_logits(logits)
            sampler.accept(token)
            if stopping_criteria is not None and stopping_criteria(self._input_ids, logits):
                return
            if on_logits is not None:
                on_logits(logits, token)
            yield token
            if len(self._tokens) >= self._n_ctx:
                return
            self.eval([token])
            logits = self._require_ctx().logits(-1)

    def _speculative_loop(self, sampler: Any, on_logits: Callable[[np.ndarray, int], None] | None,
                          logits: np.ndarray, stopping_criteria: StoppingCriteriaList | None) -> Iterator[int]:
        def sample(row: np.ndarray) -> int:
            token = sampler.sample_logits(row)
            sampler.accept(token)
            return token

        last: dict[str, np.ndarray] = {}

        def seen(row: np.ndarray, token: int) -> None:
            last["row"] = row
            if on_logits is not None:
                on_logits(row, token)

        for token in speculative_tokens(self._require_ctx(), self._tokens, logits, sample, _drafter(self.draft_model),
                                        self._n_ctx, seen, self.speculative_stats):
            if stopping_criteria is not None and stopping_criteria(self._input_ids, last["row"]):
                return
            yield token

    # --- completion ---
    def create_completion(self, prompt: str | Sequence[int] | list[str] | list[list[int]], suffix: str | None = None,
                          max_tokens: int | None = 16, temperature: float = 0.8, top_p: float = 0.95,
                          min_p: float = 0.05, typical_p: float = 1.0, logprobs: int | None = None,
                          echo: bool = False, stop: str | Sequence[str] | None = None,
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                          repeat_penalty: float = 1.0, top_k: int = 40, stream: bool = False,
                          seed: int | None = None, tfs_z: float = 1.0, mirostat_mode: int = 0,
                          mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                          stopping_criteria: StoppingCriteriaList | None = None,
                          logits_processor: LogitsProcessorList | None = None, grammar: Any = None,
                          logit_bias: dict[int, float] | None = None, *, json_schema: Any = None,
                          stop_tokens: Iterable[int] = (), special: bool = False) -> dict | Iterator[dict]:
        """A text completion as an OpenAI-shaped dict, or an iterator of chunks with stream=True.

        ``max_tokens`` None or <= 0: until an end of generation or the end of the context.
        ``suffix`` asks for the middle between prompt and suffix with the model's fill-in-the-middle
        tokens. ``json_schema`` constrains the text to JSON of that schema; ``stop_tokens`` end the
        completion as end-of-generation tokens do; ``special`` renders special tokens' text.
        A list of prompts (texts or token lists) is decoded together, one sequence each (continuous
        batching, ferrollama.server.Scheduler): one choice per prompt, in order.
        """
        del tfs_z  # tail-free sampling is gone from llama.cpp: no effect (as in llama-cpp-python)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if json_schema is not None:
            if grammar is not None:
                raise ValueError("give a grammar or a JSON schema, not both")
            grammar = S.Grammar.json_schema_to_gbnf(json_schema)
        if _is_prompt_list(prompt):
            if suffix is not None or echo or stopping_criteria or logits_processor:
                raise ValueError("a list of prompts takes neither suffix, echo, stopping_criteria nor logits_processor")
            params = SamplingParams(
                top_k=top_k, top_p=top_p, min_p=min_p, typ_p=typical_p, temp=temperature,
                penalty_repeat=repeat_penalty, penalty_freq=frequency_penalty, penalty_present=presence_penalty,
                mirostat=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
                logit_bias=dict(logit_bias or {}), grammar=_grammar_text(grammar))
            chunks = self._batched_chunks([self._completion_prompt(p, None) for p in prompt], params, seed, max_tokens,
                                          stops, logprobs, model or self.model_path)
            return chunks if stream else _merge_choices(list(chunks))
        tokens = self._completion_prompt(prompt, suffix)
        sampling = dict(top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temp=temperature,
                        repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                        mirostat_eta=mirostat_eta, logits_processor=logits_processor, grammar=grammar,
                        logit_bias=logit_bias)
        prompt_text = prompt if isinstance(prompt, str) else self.detokenize([t for t in tokens if t >= 0]).decode(
            "utf-8", "replace")
        job = _CompletionJob(tokens, prompt_text, max_tokens, stops, logprobs, echo, model or self.model_path,
                             frozenset(int(t) for t in stop_tokens), special, stopping_criteria, seed)
        chunks = self._completion_chunks(job, sampling)
        return chunks if stream else _merge_completion(list(chunks))

    __call__ = create_completion

    def _completion_prompt(self, prompt: str | bytes | Sequence[int], suffix: str | None) -> list[int]:
        """The prompt's tokens as llama-cpp-python makes them: the model's BOS (and EOS) around the
        text's tokens; with a suffix, the model's fill-in-the-middle layout."""
        text_prompt = isinstance(prompt, (str, bytes))
        if suffix is None and not text_prompt:
            return [int(t) for t in prompt]
        bos = [self.model.bos] if self.add_bos and self.model.bos is not None else []
        if suffix is None:
            body = self.tokenize(prompt, add_bos=False, special=True) if prompt else []
            eos = [self.model.eos] if self.model.add_eos and self.model.eos is not None else []
            tokens = bos + body + eos
            if not tokens:
                raise ValueError("the prompt is empty (and the model has no BOS token to start from)")
            return tokens
        pre, suf, mid = self.model.fim_pre, self.model.fim_suf, self.model.fim_mid
        if pre is None or suf is None or mid is None:
            raise ValueError("suffix (fill-in-the-middle) needs the model's FIM prefix/suffix/middle tokens; "
                             "this model has none")
        prefix_tokens = self.tokenize(prompt, add_bos=False) if text_prompt else [int(t) for t in prompt]
        suffix_tokens = self.tokenize(suffix, add_bos=False) if suffix else []
        if self.spm_infill:
            return bos + [suf] + suffix_tokens + [pre] + prefix_tokens + [mid]
        return bos + [pre] + prefix_tokens + [suf] + suffix_tokens + [mid]

    def _completion_chunks(self, job: "_CompletionJob", sampling: dict) -> Iterator[dict]:
        """Generates and yields completion chunks; the last carries finish_reason and usage."""
        tokens = job.tokens
        if len(tokens) >= self._n_ctx:
            raise ValueError(f"Requested tokens ({len(tokens)}) exceed context window of {self._n_ctx}")
        if job.echo and job.logprobs is not None and not self._logits_all:
            raise ValueError("echo with logprobs needs logits_all=True: the prompt's logits are kept only then")
        limit = job.max_tokens if job.max_tokens is not None and job.max_tokens > 0 else self._n_ctx - len(tokens)
        limit = min(limit, self._n_ctx - len(tokens))
        self._restore_from_cache(tokens)
        self.set_seed(job.seed if job.seed is not None else random.Random(self._seed).randint(0, 2**32))
        sampler = self._compat_sampler(**sampling)
        cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())
        lp = _LogprobsCollector(self, job.logprobs, 0 if job.echo else len(job.prompt_text))
        criteria = _Fired(job.stopping_criteria)
        logits = self._prepare(tokens)
        if job.echo:
            if job.logprobs is not None:
                lp.add_prompt(tokens)
            yield _chunk(cid, created, job.model_name, job.prompt_text, lp.take(job.prompt_text), None)
        # Invalid UTF-8 in the output is dropped, as llama-cpp-python decodes it.
        scanner, finish, out = StopScanner(job.stops, errors="ignore"), "length", []
        for token in self._sample_loop(sampler, lp.record if job.logprobs is not None else None, logits,
                                       criteria if job.stopping_criteria is not None else None):
            if self.model.is_eog(token) or token in job.stop_tokens:
                finish = "stop"
                break
            out.append(token)
            text, stopped = scanner.push(self.model.token_to_piece(token, job.special))
            if text:
                yield _chunk(cid, created, job.model_name, text, lp.take(text), None)
            if stopped:
                finish = "stop"
                break
            if len(out) >= limit:
                break
        if criteria.fired:
            finish = "stop"
        tail = scanner.flush()
        if self.cache is not None:
            self.cache[tokens + out] = self.save_state()
        usage = {"prompt_tokens": len(tokens), "completion_tokens": len(out), "total_tokens": len(tokens) + len(out)}
        yield _chunk(cid, created, job.model_name, tail, lp.take(tail) if tail else None, finish, usage)

    def _restore_from_cache(self, tokens: list[int]) -> None:
        """Loads the cached state sharing the longest prefix with tokens, when it shares more than
        the context holds (llama-cpp-python's set_cache)."""
        if self.cache is None:
            return
        try:
            item = self.cache[tokens]
        except KeyError:
            return
        cached = [int(t) for t in np.asarray(item.input_ids)[:item.n_tokens]]
        if common_prefix_len(cached, tokens) > common_prefix_len(self._tokens, tokens):
            self.load_state(item)

    def _batched_chunks(self, prompts: list[list[int]], params: SamplingParams, seed: int | None,
                        max_tokens: int | None, stops: list[str], logprobs: int | None, model_name: str) -> Iterator[dict]:
        """Completion chunks of several prompts decoded together, choice by choice."""
        from .generation.scheduler import Request, completion_logprobs

        limit = None if max_tokens is None or max_tokens <= 0 else max_tokens
        sched = self._batch_scheduler(len(prompts))
        jobs = sched.submit_many([Request(t, params, limit, stops, logprobs) for t in prompts],
                                 [self._sampler(params, seed) for _ in prompts])
        cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())
        for i, job in enumerate(jobs):
            offset = 0
            for out in job:
                lp = completion_logprobs(self.model, [out], offset) if logprobs is not None else None
                offset += len(out.text)
                usage = None if out.usage is None else {
                    "prompt_tokens": out.usage["prompt_tokens"], "completion_tokens": out.usage["completion_tokens"],
                    "total_tokens": out.usage["prompt_tokens"] + out.usage["completion_tokens"]}
                chunk = _chunk(cid, created, model_name, out.text, lp, out.finish_reason, usage)
                chunk["choices"][0]["index"] = i
                yield chunk

    def _batch_scheduler(self, n_prompts: int):
        """A scheduler with a sequence per prompt (at most 16; more wait for a free one), each
        holding n_ctx tokens; kept for the next batch."""
        from .generation.scheduler import Scheduler

        n_seq = min(max(n_prompts, 1), 16)
        if self._batcher is None or self._batcher.n_seq < n_seq:
            if self._batcher is not None:
                self._batcher.close()
            kw = self._context_kwargs
            self._batcher = Scheduler(self.model, n_ctx=kw["n_ctx"] * n_seq, n_seq=n_seq, n_batch=kw["n_batch"],
                                      n_threads=kw["n_threads"], queue_size=1 << 30, type_k=kw["type_k"],
                                      type_v=kw["type_v"], loras=[(self._lora, self.lora_scale)] if self._lora else (),
                                      batch_invariant=kw.get("batch_invariant", False))
        return self._batcher

    # --- chat ---
    @property
    def chat_template(self):
        """The chat template the model's own chats use (ferrollama.chat.ChatTemplate): the
        ``chat_template=`` given, else the model's."""
        if self._chat_template is None:
            self._chat_template = ChatTemplate.from_model(self.model, self._chat_template_source)
        return self._chat_template

    def _chat_handler_for_call(self):
        """llama-cpp-python's handler when one is asked for (chat_handler, a chat_format name), or
        when the model has no template (its "llama-2" fallback); None: the model's template."""
        if self.chat_handler is not None:
            return self.chat_handler
        if self._chat_template_source is not None:
            return None
        name = self.chat_format or (None if self.model.chat_template else "llama-2")
        if name is None:
            return None
        from .llama_chat_format import get_chat_completion_handler

        return get_chat_completion_handler(name)

    def create_chat_completion(self, messages: list[dict], functions: list[dict] | None = None,
                               function_call: str | dict | None = None, tools: list[dict] | None = None,
                               tool_choice: str | dict | None = None, temperature: float = 0.2, top_p: float = 0.95,
                               top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: str | Sequence[str] | None = None, seed: int | None = None,
                               response_format: dict | None = None, max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                               logits_processor: LogitsProcessorList | None = None, grammar: Any = None,
                               logit_bias: dict[int, float] | None = None, logprobs: bool | None = None,
                               top_logprobs: int | None = None) -> dict | Iterator[dict]:
        """A chat completion shaped as OpenAI's API returns it.

        With the model's template, ``tools`` (or the older ``functions``) are rendered by it and
        the answer is parsed into ``tool_calls`` in the format of the model's family
        (ferrollama.chat.tools); ``tool_choice`` "required" or a named function forces a call by
        grammar. ``response_format={"type": "json_object", "schema": {...}}`` constrains the
        answer to JSON. The answer ends at the model's end-of-generation tokens and the
        template's turn markers.
        """
        args = dict(messages=messages, functions=functions, function_call=function_call, tools=tools,
                    tool_choice=tool_choice, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                    typical_p=typical_p, stream=stream, stop=stop if stop is not None else [], seed=seed,
                    response_format=response_format, max_tokens=max_tokens, presence_penalty=presence_penalty,
                    frequency_penalty=frequency_penalty, repeat_penalty=repeat_penalty, tfs_z=tfs_z,
                    mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, model=model,
                    logits_processor=logits_processor, grammar=grammar, logit_bias=logit_bias, logprobs=logprobs,
                    top_logprobs=top_logprobs)
        handler = self._chat_handler_for_call()
        if not hasattr(handler, "projector") and media_sources(messages):
            raise ValueError("image_url and input_audio content need the model's projector: "
                             "Llama(..., chat_handler=MTMDChatHandler(clip_model_path='mmproj.gguf'))")
        if handler is not None:
            return handler(llama=self, **args)
        return self._template_chat(**args)

    def _template_chat(self, messages: list[dict], functions: list[dict] | None, function_call: Any,
                       tools: list[dict] | None, tool_choice: Any, stream: bool, stop: Any,
                       response_format: dict | None, grammar: Any, logprobs: bool | None, top_logprobs: int | None,
                       media: Any = None, template: ChatTemplate | None = None, media_text: str | None = None,
                       **sampling: Any) -> dict | Iterator[dict]:
        """The chat through the template; ``media`` (a generation.multimodal.Projector) takes the
        messages' image_url parts (MTMDChatHandler). A handler with its own chat format passes it
        as ``template`` (the model's otherwise) and, with images, the prompt text it renders with
        their media markers as ``media_text`` (Llava15ChatHandler)."""
        legacy = functions is not None
        if legacy:
            if tools:
                raise ValueError("give tools or functions, not both")
            tools = [{"type": "function", "function": f} for f in functions]
            tool_choice = T.tool_choice_of_function_call(function_call)
        template = template or self.chat_template
        plan = T.plan_tools(template.source, [dict(m) for m in messages], list(tools or []), tool_choice,
                            S.Grammar.json_schema_to_gbnf)
        if media is not None:
            prompt = self._media_prompt(media, template, plan.messages, plan.template_kwargs, media_text)
        else:
            prompt = template.tokens(self.model, plan.messages, add_generation_prompt=True, **plan.template_kwargs)
        schema = _schema_of(response_format)
        if sum(x is not None for x in (grammar, plan.grammar, schema)) > 1:
            raise ValueError("give one of grammar, response_format and a forced tool_choice")
        stops = ([stop] if isinstance(stop, str) else list(stop or [])) + template.stop_strings()
        completion = self.create_completion(
            prompt, max_tokens=sampling.pop("max_tokens"), stop=stops, stream=stream,
            logprobs=(top_logprobs or 0) if logprobs else None, grammar=grammar or plan.grammar, json_schema=schema,
            stop_tokens=template.stop_tokens(self.model), special=plan.format in ("hermes", "mistral", "gpt-oss"),
            temperature=sampling.pop("temperature"), **sampling)
        if stream:
            return _chat_stream(completion, plan.format, legacy)  # type: ignore[arg-type]
        return _chat_response(completion, plan.format, legacy, self.tool_calls_in_content)  # type: ignore[arg-type]

    def _media_prompt(self, media: Any, template: ChatTemplate, messages: list[dict], template_kwargs: dict,
                      text: str | None = None) -> list[int]:
        """The keys of a chat prompt with images (mtmd_tokenize of ``text``, by default the
        template's text with each image part a media marker); the images are kept for `eval`."""
        # an image's URL loads here; an audio part's bytes go to the projector as they are
        images = [load_image_url(s, media.limits) if isinstance(s, str) else s for s in media_sources(messages)]
        if text is None:
            text = template.apply(with_media_markers(messages), add_generation_prompt=True, **template_kwargs)
        return self._register_media(media.tokenize(text, images))

    def _register_media(self, chunks: Sequence[Chunk]) -> list[int]:
        """A prompt's keys (`eval`); its images are kept with those of the cached prompt."""
        keys, images = prompt_keys(chunks)
        cached = set(self._tokens)
        self._media = {k: v for k, v in self._media.items() if k in cached} | images
        return keys

    def create_chat_completion_openai_v1(self, *args: Any, **kwargs: Any):
        """create_chat_completion's result as the openai package's ChatCompletion (or chunks)."""
        try:
            from openai.types.chat import ChatCompletion, ChatCompletionChunk
        except ImportError:
            raise ImportError("To use create_chat_completion_openai_v1, you must install the openai package. "
                              "You can install it with `pip install openai`.") from None
        if kwargs.get("stream", False):
            return (ChatCompletionChunk(**chunk) for chunk in self.create_chat_completion(*args, **kwargs))
        return ChatCompletion(**self.create_chat_completion(*args, **kwargs))

    # --- embeddings ---
    def _embedding_context(self) -> Context:
        if self._embed_ctx is None:
            self._embed_ctx = self._new_context(embeddings=True, pooling=self._pooling)
        return self._embed_ctx

    def embed(self, input: str | Sequence[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False):
        """Embeddings of a text or of several, pooled as the context pools (the model's pooling
        type unless pooling_type/pooling says): one vector per text, or with no pooling one per
        token of each text."""
        inputs = [input] if isinstance(input, str) else list(input)
        ctx = self._embedding_context()
        out, count = [], 0
        for text in inputs:
            tokens = self.tokenize(text, add_bos=True, special=True)
            if len(tokens) > ctx.n_batch:
                if not truncate:
                    raise ValueError(f"the input has {len(tokens)} tokens; the batch holds {ctx.n_batch}")
                tokens = tokens[:ctx.n_batch]
            if ctx is self.ctx:
                self.reset()  # the completions' cache is this one: it no longer holds their tokens
            else:
                ctx.kv.clear()
            ctx.decode(Batch.from_tokens(tokens, pos0=0, seq_id=0, logits="all"))
            if ctx.pooling == "none":
                vecs = [_normalized(np.asarray(ctx.embeddings(i), dtype=np.float32), normalize)
                        for i in range(len(tokens))]
                out.append([v.tolist() for v in vecs])
            else:
                out.append(_normalized(np.asarray(ctx.embeddings_seq(0), dtype=np.float32), normalize).tolist())
            count += len(tokens)
        result = out[0] if isinstance(input, str) else out
        return (result, count) if return_count else result

    def create_embedding(self, input: str | Sequence[str], model: str | None = None) -> dict:
        """OpenAI-shaped embeddings."""
        inputs = [input] if isinstance(input, str) else list(input)
        vectors, count = self.embed(inputs, return_count=True)
        return {"object": "list", "model": model or self.model_path,
                "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": count, "total_tokens": count}}

    # --- state ---
    def save_state(self) -> LlamaState:
        state = bytes(self._require_ctx().state_get())
        # the kept logits only exist with logits_all (no rows of zeros to copy otherwise)
        scores = self._scores.copy() if self._logits_all else np.zeros((0, self._n_vocab), dtype=np.float32)
        # an image's positions keep their key (the image is kept too), so a restored prompt is
        # reused only with the same image
        ids = np.zeros(self._n_ctx, dtype=np.intc)
        ids[:len(self._tokens)] = self._tokens
        return LlamaState(ids, scores, len(self._tokens), state, len(state), self._seed)

    def load_state(self, state: LlamaState) -> None:
        self._require_ctx().state_set(state.llama_state)
        if self._checkpoints is not None:
            self._checkpoints.clear()  # they were of the tokens the cache held before
        n = int(state.n_tokens)
        self._tokens = [int(t) for t in np.asarray(state.input_ids)[:n]]
        scores = np.asarray(state.scores)
        if len(scores):
            self.scores[:len(scores)] = scores
        self._prompt_logits = None
        self._seed = state.seed


def _load_lora(model: Model, path: str):
    """The adapter at path for model; RuntimeError as llama-cpp-python raises it (the engine's
    reason chained)."""
    try:
        return LoraAdapter(model, os.fspath(path))
    except (ValueError, GGUFError, UnsupportedError) as e:
        raise RuntimeError(f"Failed to initialize LoRA adapter from lora path: {path}: {e}") from e


def _normalized(vec: np.ndarray, normalize: bool) -> np.ndarray:
    return vec / max(float(np.linalg.norm(vec)), 1e-12) if normalize else vec


def _grammar_text(grammar: Any) -> str:
    if grammar is None:
        return ""
    return grammar if isinstance(grammar, str) else grammar._grammar


class _Drafter:
    """A llama-cpp-python draft model (a callable from the tokens so far to drafted tokens) with
    the draft(tokens, room) method ferrollama.generation.speculative calls."""

    def __init__(self, draft_model: Any):
        self.draft_model = draft_model

    def draft(self, tokens: list[int], room: int) -> list[int]:
        drafted = self.draft_model(np.asarray(tokens, dtype=np.intc))
        return [int(t) for t in np.asarray(drafted).tolist()[:room]]


def _drafter(draft_model: Any) -> Any:
    return draft_model if hasattr(draft_model, "draft") else _Drafter(draft_model)


class _Fired:
    """A stopping criteria list that remembers whether it stopped the generation."""

    def __init__(self, criteria: StoppingCriteriaList | None):
        self.criteria = criteria
        self.fired = False

    def __call__(self, input_ids: np.ndarray, logits: np.ndarray) -> bool:
        self.fired = bool(self.criteria(input_ids, logits)) if self.criteria is not None else False
        return self.fired


@dataclass
class _CompletionJob:
    tokens: list[int]
    prompt_text: str
    max_tokens: int | None
    stops: list[str]
    logprobs: int | None
    echo: bool
    model_name: str
    stop_tokens: frozenset[int]
    special: bool
    stopping_criteria: StoppingCriteriaList | None
    seed: int | None


class _LogprobsCollector:
    """llama-cpp-python's completion logprobs (ferrollama.generation.logprobs): per token its text, its
    offset in the text (counted from the start of the prompt's text), its log-probability and
    the top ones, with the chosen token's added."""

    def __init__(self, llama: Llama, n: int | None, offset: int):
        self.llama, self.n = llama, n
        self.pending: list[TokenLogprob] = []
        self.offset = offset

    def record(self, logits: np.ndarray, token: int) -> None:
        self.pending.append(token_logprob(logits, token, self.n or 0))

    def add_prompt(self, tokens: list[int]) -> None:
        """The prompt's tokens (a leading BOS left out), each scored by the logits before it; the
        first has none (OpenAI's convention)."""
        scores = self.llama.scores
        start = 1 if tokens and tokens[0] == self.llama.model.bos else 0
        if start < len(tokens):
            self.pending.append(TokenLogprob(tokens[start], None, []))
        self.pending += [token_logprob(scores[i - 1], tokens[i], self.n or 0) for i in range(start + 1, len(tokens))]

    def take(self, text: str) -> dict | None:
        if self.n is None:
            return None
        out = completion_logprobs(self.llama.model, self.pending, self.offset, with_chosen=True)
        self.offset += sum(len(t) for t in out["tokens"])
        self.pending = []
        return out


def _chunk(cid: str, created: int, model: str, text: str, logprobs: dict | None, finish: str | None,
           usage: dict | None = None) -> dict:
    out = {"id": cid, "object": "text_completion", "created": created, "model": model,
           "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}]}
    if usage is not None:
        out["usage"] = usage
    return out


def _merge_completion(chunks: list[dict]) -> dict:
    first, last = chunks[0], chunks[-1]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    lps = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"] is not None]
    logprobs = None
    if lps:
        logprobs = {k: [v for lp in lps for v in lp[k]] for k in ("tokens", "text_offset", "token_logprobs", "top_logprobs")}
    return {"id": first["id"], "object": "text_completion", "created": first["created"], "model": first["model"],
            "choices": [{"text": text, "index": 0, "logprobs": logprobs,
                         "finish_reason": last["choices"][0]["finish_reason"]}],
            "usage": last["usage"]}


def _is_prompt_list(prompt: Any) -> bool:
    """A list of prompts (texts or token lists), not one prompt of token ids."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(isinstance(p, (str, list, tuple)) for p in prompt)


def _merge_choices(chunks: list[dict]) -> dict:
    """One completion dict with a choice per prompt from the chunks of several."""
    by_choice: dict[int, list[dict]] = {}
    for c in chunks:
        by_choice.setdefault(c["choices"][0]["index"], []).append(c)
    merged = [_merge_completion(by_choice[i]) for i in sorted(by_choice)]
    choices = [{**m["choices"][0], "index": i} for i, m in enumerate(merged)]
    usage = {k: sum(m["usage"][k] for m in merged) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return {**merged[0], "choices": choices, "usage": usage}


def _chat_response(completion: dict, fmt: str | None = None, legacy: bool = False,
                   calls_in_content: bool = False) -> dict:
    choice = completion["choices"][0]
    message, finish = T.assistant_message(choice["text"], fmt, True, choice["finish_reason"], calls_in_content)
    return {"id": "chat" + completion["id"], "object": "chat.completion", "created": completion["created"],
            "model": completion["model"],
            "choices": [{"index": 0, "message": T.with_function_call(message, legacy),
                         "logprobs": chat_logprobs_of_completion(choice["logprobs"]), "finish_reason": finish}],
            "usage": completion["usage"]}


def _chat_stream(chunks: Iterator[dict], fmt: str | None = None, legacy: bool = False) -> Iterator[dict]:
    gate, first = T.ToolGate(fmt), True
    for c in chunks:
        base = {"id": "chat" + c["id"], "object": "chat.completion.chunk", "created": c["created"], "model": c["model"]}
        delta = lambda d, finish=None, lp=None: {  # noqa: E731
            **base, "choices": [{"index": 0, "delta": d, "logprobs": lp, "finish_reason": finish}]}
        if first:
            yield delta({"role": "assistant"})
            first = False
        choice = c["choices"][0]
        text = gate.push(choice["text"])
        if text:
            yield delta({"content": text}, lp=chat_logprobs_of_completion(choice["logprobs"]))
        if choice["finish_reason"] is None:
            continue
        rest, calls, reasoning = gate.finish()
        if reasoning:
            yield delta({"reasoning_content": reasoning})
        if rest:
            yield delta({"content": rest})
        if calls:
            d: dict[str, Any] = {"tool_calls": [call.to_openai(k) for k, call in enumerate(calls)]}
            if legacy:
                d["function_call"] = {"name": calls[0].name, "arguments": calls[0].arguments}
            yield delta(d)
        yield delta({}, T.finish_reason(calls, choice["finish_reason"]))


def _schema_of(response_format: dict | None) -> Any:
    """The JSON schema a response_format asks for ({} for any JSON object), or None."""
    if not response_format or response_format.get("type") in (None, "text"):
        return None
    kind = response_format["type"]
    if kind == "json_object":
        return response_format.get("schema") or {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        return spec.get("schema", spec) or {"type": "object"}
    raise ValueError(f"unknown response_format type {kind!r}")
