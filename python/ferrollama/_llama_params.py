"""What ``Llama`` shows of its parameters as llama-cpp-python's ``Llama`` does, for the libraries
that read them (llama-index reads ``llm.context_params.n_ctx``): read-only views with the field
names of llama.cpp's llama_context_params and llama_model_params, and the sorting of the extra
keywords llama-cpp-python's constructor takes through ``**kwargs``.
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any

from ._core import Context

__all__ = ["LlamaContextParams", "LlamaModelParams", "IGNORED_KEYWORDS", "GGML_TYPE_IDS", "context_keywords",
           "sort_extra_keywords", "load_mode"]

#: keywords of older llama-cpp-python versions (and LangChain's ``device``) that wrappers still
#: pass to every Llama: llama-cpp-python 0.3.x takes them through **kwargs without effect, and
#: so does this Llama, silently (README "Llama, as llama-cpp-python's")
IGNORED_KEYWORDS = ("n_parts", "f16_kv", "low_vram", "mul_mat_q", "n_gqa", "rms_norm_eps", "device")

#: llama.cpp's ggml_type ids by the cache type names a context takes
GGML_TYPE_IDS = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}

#: llama_load_mode's values (llama_model_params.load_mode)
LOAD_MODE_NONE, LOAD_MODE_MMAP, LOAD_MODE_MLOCK, LOAD_MODE_MMAP_MLOCK = 0, 1, 2, 3


def context_keywords() -> frozenset[str]:
    """The keywords a Context takes (those Llama does not have are passed through to it)."""
    return frozenset(inspect.signature(Context).parameters) - {"model"}


def sort_extra_keywords(extra: dict[str, Any], llama_keywords: frozenset[str]) -> dict[str, Any]:
    """The extra constructor keywords a Context takes; the ignored ones dropped, and one warning
    naming every other (llama-cpp-python ignores them without a word; a misspelling is worth one)."""
    passed = {k: v for k, v in extra.items() if k in context_keywords() - llama_keywords}
    unknown = sorted(set(extra) - set(passed) - set(IGNORED_KEYWORDS))
    if unknown:
        warnings.warn(f"Llama: unknown keyword arguments ignored: {', '.join(unknown)}", UserWarning, stacklevel=3)
    return passed


@dataclass(frozen=True)
class LlamaContextParams:
    """The parameters the Llama's context was made with, named as llama_context_params names them
    (ids for the enums, as llama-cpp-python keeps them)."""

    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_rs_seq: int
    n_threads: int
    n_threads_batch: int
    rope_scaling_type: int
    pooling_type: int
    attention_type: int
    flash_attn_type: int
    rope_freq_base: float
    rope_freq_scale: float
    yarn_ext_factor: float
    yarn_attn_factor: float
    yarn_beta_fast: float
    yarn_beta_slow: float
    yarn_orig_ctx: int
    defrag_thold: float
    type_k: int
    type_v: int
    embeddings: bool
    offload_kqv: bool
    no_perf: bool
    op_offload: bool
    swa_full: bool
    kv_unified: bool


@dataclass(frozen=True)
class LlamaModelParams:
    """The parameters the Llama's model was loaded with, named as llama_model_params names them
    (``use_mmap`` and ``use_mlock``, which llama.cpp folded into ``load_mode``, too)."""

    n_gpu_layers: int
    split_mode: int
    main_gpu: int
    tensor_split: tuple[float, ...] | None
    load_mode: int
    use_mmap: bool
    use_mlock: bool
    vocab_only: bool
    check_tensors: bool
    kv_overrides: dict | None


def load_mode(use_mmap: bool, use_mlock: bool) -> int:
    """llama-cpp-python's load_mode of its use_mmap and use_mlock."""
    return (LOAD_MODE_MMAP if use_mmap else LOAD_MODE_NONE) | (LOAD_MODE_MLOCK if use_mlock else LOAD_MODE_NONE)
