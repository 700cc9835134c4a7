"""The high-level API: ``Llama``, built only on the public core (Model, Context, Batch, samplers).

Its methods and the dicts they return follow llama-cpp-python's ``Llama`` (completion and chat
completion shaped as OpenAI's API, streaming, embeddings, state), and its sampling follows
llama.cpp's ``common_sampler``: the same chain of samplers in the same order with the same
defaults, the grammar applied by rejection like llama.cpp does.

The building blocks are public too, for the command line and for users who drive a
``Context`` themselves: :class:`SamplingParams`, :class:`Sampler`, :class:`Utf8Stream`,
:class:`StopScanner`, :func:`decode_tokens`.
"""
from __future__ import annotations

import codecs
import json
import os
import random
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ._core import Batch, Context, Model

__all__ = [
    "DEFAULT_SEED", "SamplingParams", "Sampler", "Utf8Stream", "StopScanner", "Llama", "LlamaState",
    "decode_tokens", "add_bos_of", "common_prefix_len", "log_softmax", "SAMPLER_NAMES",
]

#: llama.cpp's LLAMA_DEFAULT_SEED: "pick a random seed".
DEFAULT_SEED = 0xFFFFFFFF

#: Sampler names of llama.cpp's --samplers (canonical and alternative spellings) and the letters
#: of --sampling-seq.
SAMPLER_NAMES = {
    "penalties": "penalties", "dry": "dry", "top_n_sigma": "top_n_sigma", "top_k": "top_k",
    "typ_p": "typ_p", "top_p": "top_p", "min_p": "min_p", "xtc": "xtc", "temperature": "temperature",
    "top-k": "top_k", "top-p": "top_p", "top-n-sigma": "top_n_sigma", "nucleus": "top_p",
    "typical-p": "typ_p", "typical": "typ_p", "typ-p": "typ_p", "typ": "typ_p", "min-p": "min_p",
    "temp": "temperature",
}
SAMPLER_CHARS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p",
                 "p": "top_p", "m": "min_p", "x": "xtc", "t": "temperature"}

DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")


@dataclass
class SamplingParams:
    """llama.cpp's common_params_sampling, with its defaults."""

    seed: int = DEFAULT_SEED
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    typ_p: float = 1.0
    temp: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    penalty_last_n: int = 64
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: list[str] = field(default_factory=lambda: ["\n", ":", "\"", "*"])
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    top_n_sigma: float = -1.0
    min_keep: int = 0
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    logit_bias: dict[int, float] = field(default_factory=dict)
    #: a GBNF grammar ("" for none)
    grammar: str = ""
    #: a JSON schema (a JSON text or a dict) turned into a grammar by the engine
    json_schema: Any = None

    def validate(self) -> None:
        """ValueError for values llama.cpp would reject."""
        if self.mirostat not in (0, 1, 2):
            raise ValueError(f"mirostat must be 0, 1 or 2, not {self.mirostat}")
        unknown = [s for s in self.samplers if s not in DEFAULT_SAMPLERS]
        if unknown:
            raise ValueError(f"unknown sampler {unknown[0]!r}; known: {', '.join(DEFAULT_SAMPLERS)}")
        if self.grammar and self.json_schema is not None:
            raise ValueError("give a grammar or a JSON schema, not both")
        if not 0 <= self.seed <= 0xFFFFFFFF:
            raise ValueError(f"seed must be in 0..4294967295, not {self.seed}")


def resolve_seed(seed: int | None) -> int:
    """llama.cpp's rule: LLAMA_DEFAULT_SEED (or None) means a random seed."""
    if seed is None or seed == DEFAULT_SEED:
        return random.SystemRandom().randrange(0, DEFAULT_SEED)
    return int(seed)


def _samplers_module():
    from . import samplers  # the engine's samplers (ferrollama.samplers)

    return samplers


def _chain_members(model: Model, p: SamplingParams, seed: int) -> list[tuple[str, Any]]:
    """The samplers of common_sampler_init, in its order, with their names (the grammar is kept apart)."""
    S = _samplers_module()
    members: list[tuple[str, Any]] = []
    if p.logit_bias:
        members.append(("logit_bias", S.LogitBias({int(t): float(b) for t, b in p.logit_bias.items()})))
    if p.mirostat == 1:
        return members + [("temperature", S.Temp(p.temp)),
                          ("mirostat", S.MirostatV1(model.n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100))]
    if p.mirostat == 2:
        return members + [("temperature", S.Temp(p.temp)),
                          ("mirostat", S.MirostatV2(seed, p.mirostat_tau, p.mirostat_eta))]
    build: dict[str, Callable[[], Any]] = {
        "penalties": lambda: S.Penalties(last_n=p.penalty_last_n, repeat=p.penalty_repeat,
                                         freq=p.penalty_freq, present=p.penalty_present),
        "dry": lambda: S.DRY(model, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                             p.dry_penalty_last_n, list(p.dry_sequence_breakers)),
        "top_n_sigma": lambda: S.TopNSigma(p.top_n_sigma),
        "top_k": lambda: S.TopK(p.top_k),
        "typ_p": lambda: S.Typical(p.typ_p, min_keep=p.min_keep),
        "top_p": lambda: S.TopP(p.top_p, min_keep=p.min_keep),
        "min_p": lambda: S.MinP(p.min_p, min_keep=p.min_keep),
        "xtc": lambda: S.XTC(p=p.xtc_probability, threshold=p.xtc_threshold, min_keep=p.min_keep, seed=seed),
        "temperature": lambda: S.TempExt(p.temp, p.dynatemp_range, p.dynatemp_exponent),
    }
    members += [(name, build[name]()) for name in p.samplers]
    members.append(("dist", S.Dist(seed=seed)))
    return members


def _grammar_of(model: Model, p: SamplingParams):
    S = _samplers_module()
    if p.json_schema is not None:
        return S.Grammar.from_json_schema(model, p.json_schema)
    if p.grammar:
        return S.Grammar(model, p.grammar, root="root")
    return None


#: samplers that only change logit values and keep a history of accepted tokens (the prompt's too)
_HISTORY_SAMPLERS = {"logit_bias", "penalties", "dry"}


def _leading_history(names: list[str]) -> int | None:
    """How many leading samplers only re-weight logits; None when a history sampler comes later."""
    n = 0
    while n < len(names) and names[n] in _HISTORY_SAMPLERS:
        n += 1
    return None if any(name in ("penalties", "dry") for name in names[n:]) else n


class Sampler:
    """llama.cpp's common_sampler: a chain of samplers plus an optional grammar.

    The chosen token is checked against the grammar and, only when the grammar rejects it,
    the chain runs again on the logits the grammar allows (llama.cpp's rejection sampling).
    Prompt tokens are accepted by the samplers that keep a history (penalties, DRY), never by
    the grammar. With a grammar, the chain is split in two: the samplers that only re-weight
    logits and keep a history (logit bias, penalties, DRY, which lead llama.cpp's chain), then
    the rest with the grammar, where the engine checks the chosen token alone.
    """

    def __init__(self, model: Model, params: SamplingParams | None = None):
        self.params = params = params or SamplingParams()
        params.validate()
        self.model = model
        self.seed = resolve_seed(params.seed)
        S = _samplers_module()
        members = _chain_members(model, params, self.seed)
        grammar = _grammar_of(model, params)
        split = _leading_history([name for name, _ in members]) if grammar is not None else None
        #: the samplers before the grammar's part (all of them without a grammar)
        self.chain = S.Chain([smp for _, smp in (members if split is None else members[:split])])
        #: with a grammar: the samplers after the history ones, and the grammar
        self.constrained = None if split is None else S.Chain([smp for _, smp in members[split:]] + [grammar])
        #: a grammar the chain could not be split around (a custom sampler order): checked apart
        self.grammar = S.Chain([grammar]) if grammar is not None and split is None else None
        #: the last tokens accepted (prompt and output), newest last
        self.prev: list[int] = []
        self.t_sample_ms = 0.0
        self.n_sample = 0

    @staticmethod
    def _logits_of(cands, n: int) -> np.ndarray:
        out = np.full(n, -np.inf, dtype=np.float32)
        out[np.asarray(cands.ids)] = np.asarray(cands.logits)
        return out

    def _sample(self, logits: np.ndarray) -> int:
        if self.constrained is not None:
            weighted = self._logits_of(self.chain.apply(logits), len(logits)) if len(self.chain) else logits
            return int(self.constrained.sample_logits(weighted))
        if self.grammar is None:
            return int(self.chain.sample_logits(logits))
        cands = self.chain.apply(logits)
        token = int(cands.ids[cands.selected])
        allowed = self._logits_of(self.grammar.apply(logits), len(logits))
        if allowed[token] != -np.inf:
            return token
        cands = self.chain.apply(allowed)
        return int(cands.ids[cands.selected])

    def sample_logits(self, logits: np.ndarray) -> int:
        """The token chosen from one row of logits (not yet accepted)."""
        t0 = time.perf_counter()
        try:
            return self._sample(np.asarray(logits, dtype=np.float32))
        finally:
            self.t_sample_ms += (time.perf_counter() - t0) * 1e3
            self.n_sample += 1

    def sample(self, ctx: Context, i: int = -1) -> int:
        """The token chosen from the logits of batch index ``i`` of the last decode."""
        return self.sample_logits(ctx.logits(i))

    def accept(self, token: int, accept_grammar: bool = True) -> None:
        """Feeds a token to the samplers' state (penalties, DRY) and, when asked, to the grammar."""
        self.chain.accept(token)
        if accept_grammar:
            for part in (self.constrained, self.grammar):
                if part is not None:
                    part.accept(token)
        self.prev.append(token)
        if len(self.prev) > 256:
            del self.prev[:-64]

    def reset(self) -> None:
        """Forgets accepted tokens (llama.cpp resets the chain, not the grammar)."""
        self.chain.reset()
        self.prev.clear()

    def prev_text(self, n: int) -> str:
        """The text of the last n accepted tokens (for reverse prompts)."""
        return decode_tokens(self.model, self.prev[-n:], special=True) if n > 0 else ""


# --- text --------------------------------------------------------------------------------------

class Utf8Stream:
    """Turns a stream of token pieces (bytes) into text without ever splitting a character.

    Incomplete UTF-8 sequences are held back until the next piece completes them; invalid bytes
    become U+FFFD.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, piece: bytes) -> str:
        return self._decoder.decode(piece)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


def utf8_complete_len(data: bytes) -> int:
    """Length of the longest prefix of data that does not end inside a UTF-8 character."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:          # a continuation byte: look further back
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return n - back if need > back else n
    return n


def decode_tokens(model: Model, tokens: Iterable[int], special: bool = False) -> str:
    """The text of tokens as llama.cpp prints them: their pieces concatenated."""
    return b"".join(model.token_to_piece(t, special) for t in tokens).decode("utf-8", errors="replace")


class StopScanner:
    """Finds stop strings in generated bytes and tells how much text is safe to emit.

    Text that could be the start of a stop string, or an unfinished UTF-8 character, is held
    back until the next token decides.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s.encode("utf-8") for s in stops if s]
        self.data = b""
        self.emitted = 0

    def push(self, piece: bytes) -> tuple[str, bool]:
        """Adds a piece; returns (text now safe to emit, whether a stop string was found)."""
        start = max(0, len(self.data) - max((len(s) for s in self.stops), default=0))
        self.data += piece
        hits = [i for i in (self.data.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.data = self.data[:min(hits)]
            return self._take(len(self.data), final=True), True
        hold = max((k for s in self.stops for k in range(1, min(len(s), len(self.data)) + 1)
                    if self.data.endswith(s[:k])), default=0)
        return self._take(len(self.data) - hold, final=False), False

    def flush(self) -> str:
        return self._take(len(self.data), final=True)

    def _take(self, end: int, final: bool) -> str:
        if not final:
            end = self.emitted + utf8_complete_len(self.data[self.emitted:end])
        text = self.data[self.emitted:end].decode("utf-8", errors="replace")
        self.emitted = max(self.emitted, end)
        return text

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def add_bos_of(model: Model) -> bool:
    """Whether tokenizing with add_special puts BOS first (llama_vocab_get_add_bos)."""
    return bool(model.add_bos) and model.bos is not None


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


# --- the high-level API ------------------------------------------------------------------------

@dataclass
class LlamaState:
    """What ``Llama.save_state`` returns: the context's state and the tokens it holds."""

    input_ids: list[int]
    llama_state: bytes
    seed: int

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def llama_state_size(self) -> int:
        return len(self.llama_state)


def _model_path(model_path: str | os.PathLike[str] | None) -> str:
    if model_path is not None:
        return os.fspath(model_path)
    from .models import default_model_path

    return str(default_model_path())


def _chat_format_template(chat_format: str | None) -> str | None:
    """The Jinja source of a built-in chat format named as llama-cpp-python's chat_format= names it."""
    if chat_format is None:
        return None
    from .chat import BUILTIN_TEMPLATES

    if chat_format not in BUILTIN_TEMPLATES:
        raise ValueError(f"unknown chat_format {chat_format!r}; known: {', '.join(BUILTIN_TEMPLATES)} "
                         "(or pass a Jinja template as chat_template=)")
    return BUILTIN_TEMPLATES[chat_format]


class Llama:
    """A model and a context with llama-cpp-python's high-level methods.

    The context keeps the tokens of the last call: a prompt that starts with them is only
    decoded from where it differs.
    """

    def __init__(self, model_path: str | os.PathLike[str] | None = None, *, n_ctx: int = 2048,
                 n_batch: int = 512, n_ubatch: int = 512, n_threads: int | None = None,
                 n_threads_batch: int | None = None, seed: int = DEFAULT_SEED, embedding: bool = False,
                 pooling: str = "mean", type_k: str = "f16", type_v: str = "f16",
                 chat_template: str | None = None, chat_format: str | None = None, use_mmap: bool = True,
                 verbose: bool = False, draft_model: Any = None, **context_params: Any):
        self.model_path = _model_path(model_path)
        self.model = Model(self.model_path, use_mmap=use_mmap)
        self.verbose = verbose
        self.seed = seed
        self._context_kwargs = dict(n_ctx=n_ctx if n_ctx > 0 else self.model.n_ctx_train, n_batch=n_batch,
                                    n_ubatch=n_ubatch, n_threads=n_threads, n_threads_batch=n_threads_batch,
                                    type_k=type_k, type_v=type_v, **context_params)
        self.pooling = pooling
        self.ctx = Context(self.model, embeddings=embedding, pooling=pooling if embedding else None,
                           **self._context_kwargs)
        self._embed_ctx: Context | None = self.ctx if embedding else None
        #: tokens whose keys and values are in the cache (sequence 0, positions 0..n-1)
        self.input_ids: list[int] = []
        #: the last prepared prompt's length and the logits it gave (see `_prepare`)
        self._prompt_logits: tuple[int, np.ndarray] | None = None
        self._chat_template_source = chat_template or _chat_format_template(chat_format)
        self._chat_template = None
        self._add_bos: bool | None = None
        #: speculative decoding's drafter (ferrollama.PromptLookupDecoding or DraftModel), or None
        self.draft_model = draft_model
        if hasattr(draft_model, "check_vocab"):
            draft_model.check_vocab(self.model)
        from .speculative import SpeculativeStats
        #: drafted and accepted tokens since the Llama was made
        self.speculative_stats = SpeculativeStats()
        #: the scheduler that decodes a list of prompts together (made at the first such call)
        self._batcher = None

    # --- basics ---
    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def n_vocab(self) -> int:
        return self.model.n_vocab

    @property
    def add_bos(self) -> bool:
        if self._add_bos is None:
            self._add_bos = add_bos_of(self.model)
        return self._add_bos

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of text; add_bos adds the model's special tokens (BOS) as it asks for them."""
        return list(self.model.tokenize(text, add_special=add_bos, parse_special=special))

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """The bytes of tokens (their pieces); prev_tokens are the tokens before them, for context."""
        del prev_tokens  # pieces do not depend on what came before in the vocabularies supported
        return b"".join(self.model.token_to_piece(t, special) for t in tokens)

    def reset(self) -> None:
        """Forgets the cached prompt."""
        self.ctx.kv.clear()
        self.input_ids = []
        self._prompt_logits = None

    # --- evaluation ---
    def eval(self, tokens: Sequence[int]) -> None:
        """Decodes tokens after those already cached, in batches of n_batch; logits of the last."""
        n_batch = self.ctx.n_batch
        for i in range(0, len(tokens), n_batch):
            chunk = list(tokens[i:i + n_batch])
            if len(self.input_ids) + len(chunk) > self.n_ctx:
                raise ValueError(f"the context is full ({self.n_ctx} tokens)")
            last = "last" if i + n_batch >= len(tokens) else "none"
            self.ctx.decode(Batch.from_tokens(chunk, pos0=len(self.input_ids), seq_id=0, logits=last))
            self.input_ids.extend(chunk)

    def _prepare(self, tokens: Sequence[int]) -> np.ndarray:
        """Makes the cache hold tokens, reusing the longest cached prefix; returns the logits after
        the last."""
        if not tokens:
            raise ValueError("the prompt is empty")
        if len(tokens) > self.n_ctx:
            raise ValueError(f"the prompt has {len(tokens)} tokens; the context holds {self.n_ctx}")
        common = common_prefix_len(self.input_ids, tokens)
        saved = self._prompt_logits
        if saved is not None and common == len(tokens) == saved[0]:
            # The same prompt again, cached with the logits it gave: decoding its last token again
            # alone would round differently from the batch that decoded it first (products over 8
            # tokens or more sum differently, as in llama.cpp), and could continue differently.
            self.ctx.kv.seq_rm(0, common, -1)
            del self.input_ids[common:]
            return saved[1].copy()
        keep = min(common, len(tokens) - 1)
        self.ctx.kv.seq_rm(0, keep, -1)
        del self.input_ids[keep:]
        self.eval(tokens[keep:])
        logits = self.ctx.logits(-1)
        self._prompt_logits = (len(tokens), logits.copy())
        return logits

    def _sampler(self, params: SamplingParams, seed: int | None) -> Sampler:
        return Sampler(self.model, replace(params, seed=self.seed if seed is None else seed))

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0,
                 reset: bool = True, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logit_bias: dict[int, float] | None = None,
                 grammar: str | None = None, seed: int | None = None,
                 sampling: SamplingParams | None = None) -> Iterator[int]:
        """Yields sampled tokens, decoding each one, until the caller stops or the context is full.

        ``reset=False`` continues after the tokens already cached instead of reusing a prefix.
        """
        del penalize_nl  # llama.cpp's penalties sampler has no such switch any more
        params = sampling or SamplingParams(
            top_k=top_k, top_p=top_p, min_p=min_p, typ_p=typical_p, temp=temp, penalty_repeat=repeat_penalty,
            penalty_freq=frequency_penalty, penalty_present=presence_penalty, mirostat=mirostat_mode,
            mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, logit_bias=dict(logit_bias or {}),
            grammar=grammar or "")
        sampler = self._sampler(params, seed)
        if reset:
            logits = self._prepare(tokens)
        else:
            self.eval(tokens)
            logits = self.ctx.logits(-1)
        for t in self.input_ids:
            sampler.accept(t, accept_grammar=False)
        yield from self._sample_loop(sampler, None, logits)

    def _sample_loop(self, sampler: Sampler, on_logits: Callable[[np.ndarray, int], None] | None,
                     logits: np.ndarray) -> Iterator[int]:
        """Samples from logits (those after the last cached token), then decodes each sampled token
        (with a draft model, several at a time: ferrollama.speculative)."""
        if self.draft_model is not None:
            yield from self._speculative_loop(sampler, on_logits, logits)
            return
        while True:
            token = sampler.sample_logits(logits)
            sampler.accept(token)
            if on_logits is not None:
                on_logits(logits, token)
            yield token
            if len(self.input_ids) >= self.n_ctx:
                return
            self.eval([token])
            logits = self.ctx.logits(-1)

    def _speculative_loop(self, sampler: Sampler, on_logits: Callable[[np.ndarray, int], None] | None,
                          logits: np.ndarray) -> Iterator[int]:
        from .speculative import speculative_tokens

        def sample(row: np.ndarray) -> int:
            token = sampler.sample_logits(row)
            sampler.accept(token)
            return token

        yield from speculative_tokens(self.ctx, self.input_ids, logits, sample, self.draft_model, self.n_ctx,
                                      on_logits, self.speculative_stats)

    # --- completion ---
    def create_completion(self, prompt: str | Sequence[int] | list[str] | list[list[int]], suffix: str | None = None,
                          max_tokens: int | None = 16, temperature: float = 0.8, top_p: float = 0.95,
                          min_p: float = 0.05, typical_p: float = 1.0, logprobs: int | None = None,
                          echo: bool = False, stop: str | Sequence[str] | None = None,
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                          repeat_penalty: float = 1.0, top_k: int = 40, stream: bool = False,
                          seed: int | None = None, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                          mirostat_eta: float = 0.1, model: str | None = None,
                          logit_bias: dict[int, float] | None = None, grammar: str | None = None,
                          json_schema: Any = None, stop_tokens: Iterable[int] = ()) -> dict | Iterator[dict]:
        """A text completion as an OpenAI-shaped dict, or an iterator of chunks with stream=True.

        ``max_tokens`` None or <= 0: until an end of generation or the end of the context.
        ``stop_tokens`` end the completion as the model's end-of-generation tokens do.
        A list of prompts (texts or token lists) is decoded together, one sequence each (continuous
        batching, ferrollama.server.Scheduler): one choice per prompt, in order.
        """
        if suffix:
            raise ValueError("suffix (fill-in-the-middle) is not supported")
        params = SamplingParams(
            top_k=top_k, top_p=top_p, min_p=min_p, typ_p=typical_p, temp=temperature,
            penalty_repeat=repeat_penalty, penalty_freq=frequency_penalty, penalty_present=presence_penalty,
            mirostat=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
            logit_bias=dict(logit_bias or {}), grammar=grammar or "", json_schema=json_schema)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if _is_prompt_list(prompt):
            chunks = self._batched_chunks([self._prompt_tokens(p) for p in prompt], params, seed, max_tokens, stops,
                                          logprobs, model or self.model_path)
            return chunks if stream else _merge_choices(list(chunks))
        tokens = self._prompt_tokens(prompt)
        chunks = self._completion_chunks(tokens, params, seed, max_tokens, stops, logprobs, echo,
                                         model or self.model_path, frozenset(int(t) for t in stop_tokens))
        if stream:
            return chunks
        return _merge_completion(list(chunks))

    __call__ = create_completion

    def _prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, (str, bytes)):
            tokens = self.tokenize(prompt, add_bos=True, special=True)
            return tokens or ([self.model.bos] if self.add_bos else [])
        return [int(t) for t in prompt]

    def _completion_chunks(self, tokens: list[int], params: SamplingParams, seed: int | None,
                           max_tokens: int | None, stops: list[str], logprobs: int | None, echo: bool,
                           model_name: str, stop_tokens: frozenset[int] = frozenset()) -> Iterator[dict]:
        """Generates and yields completion chunks; the last carries finish_reason and usage."""
        cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())
        limit = self.n_ctx - len(tokens) if max_tokens is None or max_tokens <= 0 else max_tokens
        scanner, lp = StopScanner(stops), _LogprobsCollector(self, logprobs)
        sampler = self._sampler(params, seed)
        logits = self._prepare(tokens)
        for t in tokens:
            sampler.accept(t, accept_grammar=False)
        if echo:
            yield _chunk(cid, created, model_name, self.detokenize(tokens).decode("utf-8", "replace"), None, None)
        finish, n_out = "length", 0
        for token in self._sample_loop(sampler, lp.record if logprobs is not None else None, logits):
            if self.model.is_eog(token) or token in stop_tokens:
                finish = "stop"
                break
            n_out += 1
            text, stopped = scanner.push(self.model.token_to_piece(token, False))
            if text:
                yield _chunk(cid, created, model_name, text, lp.take(text), None)
            if stopped:
                finish = "stop"
                break
            if n_out >= limit:
                break
        tail = scanner.flush()
        usage = {"prompt_tokens": len(tokens), "completion_tokens": n_out, "total_tokens": len(tokens) + n_out}
        yield _chunk(cid, created, model_name, tail, lp.take(tail) if tail else None, finish, usage)

    def _batched_chunks(self, prompts: list[list[int]], params: SamplingParams, seed: int | None,
                        max_tokens: int | None, stops: list[str], logprobs: int | None, model_name: str) -> Iterator[dict]:
        """Completion chunks of several prompts decoded together, choice by choice."""
        from .server.scheduler import Request, completion_logprobs

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
        from .server.scheduler import Scheduler

        n_seq = min(max(n_prompts, 1), 16)
        if self._batcher is None or self._batcher.n_seq < n_seq:
            if self._batcher is not None:
                self._batcher.close()
            kw = self._context_kwargs
            self._batcher = Scheduler(self.model, n_ctx=kw["n_ctx"] * n_seq, n_seq=n_seq, n_batch=kw["n_batch"],
                                      n_threads=kw["n_threads"], queue_size=1 << 30, type_k=kw["type_k"],
                                      type_v=kw["type_v"])
        return self._batcher

    # --- chat ---
    @property
    def chat_template(self):
        """The model's chat template (ferrollama.chat.ChatTemplate)."""
        if self._chat_template is None:
            from .chat import ChatTemplate

            self._chat_template = ChatTemplate.from_model(self.model, self._chat_template_source)
        return self._chat_template

    def create_chat_completion(self, messages: list[dict], tools: list[dict] | None = None,
                               temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                               min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: str | Sequence[str] | None = None, seed: int | None = None,
                               response_format: dict | None = None, max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                               model: str | None = None, logit_bias: dict[int, float] | None = None,
                               grammar: str | None = None, **template_kwargs: Any) -> dict | Iterator[dict]:
        """A chat completion rendered with the model's template, shaped as OpenAI's API returns it.

        ``response_format={"type": "json_object", "schema": {...}}`` constrains the answer to JSON
        (of that schema when given). The answer ends at the model's end-of-generation tokens and at
        the template's turn markers (``max_tokens=None``: nothing else ends it but the context).
        """
        template = self.chat_template
        prompt = template.tokens(self.model, messages, add_generation_prompt=True, tools=tools, **template_kwargs)
        schema = _schema_of(response_format)
        stops = ([stop] if isinstance(stop, str) else list(stop or [])) + template.stop_strings()
        completion = self.create_completion(
            prompt, max_tokens=max_tokens, stop_tokens=template.stop_tokens(self.model), temperature=temperature, top_p=top_p, min_p=min_p,
            typical_p=typical_p, stop=stops, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            repeat_penalty=repeat_penalty, top_k=top_k, stream=stream, seed=seed, mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, model=model, logit_bias=logit_bias,
            grammar=grammar, json_schema=schema)
        if stream:
            return _chat_chunks(completion)  # type: ignore[arg-type]
        return _chat_response(completion)  # type: ignore[arg-type]

    # --- embeddings ---
    def _embedding_context(self) -> Context:
        if self._embed_ctx is None:
            self._embed_ctx = Context(self.model, embeddings=True, pooling=self.pooling, **self._context_kwargs)
        return self._embed_ctx

    def embed(self, input: str | Sequence[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False):
        """Embeddings of a text or of several (pooled as the context was made: mean by default)."""
        inputs = [input] if isinstance(input, str) else list(input)
        ctx = self._embedding_context()
        out, count = [], 0
        for text in inputs:
            tokens = self.tokenize(text, add_bos=True, special=True)
            if len(tokens) > ctx.n_batch:
                if not truncate:
                    raise ValueError(f"the input has {len(tokens)} tokens; the batch holds {ctx.n_batch}")
                tokens = tokens[:ctx.n_batch]
            ctx.kv.clear()
            ctx.decode(Batch.from_tokens(tokens, pos0=0, seq_id=0, logits="all"))
            vec = np.asarray(ctx.embeddings_seq(0), dtype=np.float32)
            if normalize:
                vec = vec / max(float(np.linalg.norm(vec)), 1e-12)
            out.append(vec.tolist())
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
        return LlamaState(list(self.input_ids), bytes(self.ctx.state_get()), self.seed)

    def load_state(self, state: LlamaState) -> None:
        self.ctx.state_set(state.llama_state)
        self.input_ids = list(state.input_ids)
        self._prompt_logits = None
        self.seed = state.seed


class _LogprobsCollector:
    """llama-cpp-python's logprobs: per token its text, offset, log-probability and the top ones."""

    def __init__(self, llama: Llama, n: int | None):
        self.llama, self.n = llama, n
        self.pending: list[tuple[str, float, dict[str, float]]] = []
        self.offset = 0

    def record(self, logits: np.ndarray, token: int) -> None:
        lp = log_softmax(logits)
        top = np.argsort(-lp, kind="stable")[: max(self.n or 0, 1)]
        piece = lambda t: self.llama.model.token_to_piece(int(t), False).decode("utf-8", "replace")  # noqa: E731
        self.pending.append((piece(token), float(lp[token]), {piece(t): float(lp[t]) for t in top}))

    def take(self, text: str) -> dict | None:
        if self.n is None:
            return None
        out: dict[str, list] = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
        for tok, lp, top in self.pending:
            out["tokens"].append(tok)
            out["text_offset"].append(self.offset)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append(top)
            self.offset += len(tok)
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


def _chat_response(completion: dict) -> dict:
    choice = completion["choices"][0]
    return {"id": "chat" + completion["id"], "object": "chat.completion", "created": completion["created"],
            "model": completion["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": choice["text"]},
                         "logprobs": choice["logprobs"], "finish_reason": choice["finish_reason"]}],
            "usage": completion["usage"]}


def _chat_chunks(chunks: Iterator[dict]) -> Iterator[dict]:
    first = True
    for c in chunks:
        base = {"id": "chat" + c["id"], "object": "chat.completion.chunk", "created": c["created"], "model": c["model"]}
        if first:
            yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]}
            first = False
        choice = c["choices"][0]
        if choice["text"]:
            yield {**base, "choices": [{"index": 0, "delta": {"content": choice["text"]},
                                        "logprobs": choice["logprobs"], "finish_reason": None}]}
        if choice["finish_reason"] is not None:
            yield {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": choice["finish_reason"]}]}


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
