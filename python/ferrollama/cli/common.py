"""What the commands share: the argument table (llama.cpp's flag names), the sampler, errors a
person can act on, progress bars and timings; loading the model and the context is
ferrollama.loading's (the server loads through it too), its names importable from here as well."""
from __future__ import annotations

import argparse
import math
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

from .._core import Context, Model
from ..generation.params import DEFAULT_SEED, SAMPLER_CHARS, SAMPLER_NAMES, SamplingParams
from ..loading import (CLIError, float_value, load_lora_adapters, load_model, lora_files, make_context,  # noqa: F401
                       model_path, set_lora_adapters, warmup)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with llama.cpp's habits: no abbreviations, bad values are one line and status 1."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CLIError(f"{self.prog}: {message}")


# --- values -------------------------------------------------------------------------------------

def positive_int(text: str) -> int:
    value = int_value(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def int_value(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def n_predict_value(text: str) -> int:
    """llama.cpp's -n: N >= 0 tokens, -1 infinite, -2 until the context is full."""
    value = int_value(text)
    if value < -2:
        raise argparse.ArgumentTypeError(
            f"expected N >= 0, -1 (infinite) or -2 (until the context is full), got {text!r}")
    return value


def seed_value(text: str) -> int:
    value = int_value(text)
    if value == -1:
        return DEFAULT_SEED
    if not 0 <= value <= DEFAULT_SEED:
        raise argparse.ArgumentTypeError(f"the seed must be -1 or in 0..4294967295, got {text!r}")
    return value


CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def cache_type(text: str) -> str:
    if text.lower() not in CACHE_TYPES:
        raise argparse.ArgumentTypeError(f"unsupported cache type {text!r}; supported: {', '.join(CACHE_TYPES)}")
    return text.lower()


def logit_bias_value(text: str) -> tuple[int, float]:
    """llama.cpp's TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-inf."""
    for i, ch in enumerate(text):
        if i > 0 and ch in "+-":
            try:
                bias = float(text[i + 1:])
                return int(text[:i]), (-bias if ch == "-" else bias)
            except ValueError:
                break
    raise argparse.ArgumentTypeError(f"expected TOKEN_ID(+/-)BIAS such as 15043+1, got {text!r}")


ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def process_escapes(text: str) -> str:
    """llama.cpp's string_process_escapes: \\n \\r \\t \\' \\" \\\\ and \\xHH."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in ESCAPES:
                out.append(ESCAPES[nxt])
                i += 2
                continue
            digits = text[i + 2:i + 4]
            if nxt == "x" and len(digits) == 2 and all(c in "0123456789abcdefABCDEF" for c in digits):
                out.append(chr(int(digits, 16)))
                i += 4
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def read_text_file(path: str, what: str = "file") -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CLIError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise CLIError(f"{path}: is a directory, not a {what}") from None
    except OSError as e:
        raise CLIError(f"{path}: {e.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CLIError(f"{path}: not UTF-8 text (byte {e.start})") from None


# --- the argument table ------------------------------------------------------------------------

def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("-m", "--model", metavar="FNAME", help="the GGUF model (default: Qwen2.5-Coder-0.5B-Instruct, from PyPI)")
    g.add_argument("--no-mmap", action="store_true", help="read the model into memory instead of mapping it")
    g.add_argument("--lora", action="append", default=[], metavar="FNAME",
                   help="apply a LoRA adapter (comma-separated values or repeated: several)")
    g.add_argument("--lora-scaled", action="append", nargs="+", default=[], metavar="FNAME:SCALE",
                   help="apply a LoRA adapter with a scale: FNAME:SCALE[,...] as llama.cpp, or FNAME SCALE")
    g.add_argument("-v", "--verbose", action="store_true", help="print more, and tracebacks on errors")


def add_mmproj_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mmproj", metavar="FNAME", default=None,
                   help="the model's projector (a clip GGUF, mmproj-*.gguf): images in (Gemma 3's)")


def add_context_args(p: argparse.ArgumentParser, n_ctx: int = 4096) -> None:
    g = p.add_argument_group("context")
    g.add_argument("-c", "--ctx-size", type=int_value, default=n_ctx, metavar="N",
                   help=f"size of the prompt context (default: {n_ctx}, 0 = from the model)")
    g.add_argument("-b", "--batch-size", type=positive_int, default=2048, metavar="N",
                   help="logical maximum batch size (default: 2048)")
    g.add_argument("-ub", "--ubatch-size", type=positive_int, default=512, metavar="N",
                   help="physical maximum batch size (default: 512)")
    g.add_argument("-t", "--threads", type=positive_int, default=None, metavar="N",
                   help="threads for generation (default: the physical cores)")
    g.add_argument("-tb", "--threads-batch", type=positive_int, default=None, metavar="N",
                   help="threads for batches and prompts (default: same as --threads)")
    g.add_argument("-ctk", "--ctk", "--cache-type-k", dest="cache_type_k", type=cache_type, default="f16",
                   metavar="TYPE", help="KV cache type for K: " + ", ".join(CACHE_TYPES) + " (default: f16)")
    g.add_argument("-ctv", "--ctv", "--cache-type-v", dest="cache_type_v", type=cache_type, default="f16",
                   metavar="TYPE", help="KV cache type for V: " + ", ".join(CACHE_TYPES) + " (default: f16)")
    g.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=False,
                   help="a token's logits do not depend on how it is batched, threaded or placed in the cache "
                        "(seeded requests repeat, speculative decoding keeps the greedy text; slower, see the README; "
                        "default: off, llama.cpp's arithmetic, which changes with the batch)")
    g.add_argument("--no-warmup", action="store_true", help="skip warming up the model with an empty run")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    d = SamplingParams()
    g = p.add_argument_group("sampling")
    g.add_argument("-s", "--seed", type=seed_value, default=DEFAULT_SEED, metavar="SEED",
                   help="RNG seed (default: -1, a random seed)")
    g.add_argument("--temp", type=float_value, default=d.temp, metavar="N", help=f"temperature (default: {d.temp})")
    g.add_argument("--top-k", type=int_value, default=d.top_k, metavar="N", help=f"top-k (default: {d.top_k}, 0 = off)")
    g.add_argument("--top-p", type=float_value, default=d.top_p, metavar="N", help=f"top-p (default: {d.top_p})")
    g.add_argument("--min-p", type=float_value, default=d.min_p, metavar="N", help=f"min-p (default: {d.min_p})")
    g.add_argument("--top-nsigma", type=float_value, default=d.top_n_sigma, metavar="N", help="top-n-sigma (default: -1, off)")
    g.add_argument("--typical", type=float_value, default=d.typ_p, metavar="N", help="locally typical sampling p (default: 1.0, off)")
    g.add_argument("--min-keep", type=int_value, default=d.min_keep, metavar="N", help="minimum candidates samplers keep (default: 0)")
    g.add_argument("--repeat-last-n", type=int_value, default=d.penalty_last_n, metavar="N",
                   help="last n tokens to penalize (default: 64, 0 = off, -1 = context size)")
    g.add_argument("--repeat-penalty", type=float_value, default=d.penalty_repeat, metavar="N", help="repeat penalty (default: 1.0, off)")
    g.add_argument("--presence-penalty", type=float_value, default=d.penalty_present, metavar="N", help="presence penalty (default: 0.0)")
    g.add_argument("--frequency-penalty", type=float_value, default=d.penalty_freq, metavar="N", help="frequency penalty (default: 0.0)")
    g.add_argument("--dry-multiplier", type=float_value, default=d.dry_multiplier, metavar="N", help="DRY multiplier (default: 0.0, off)")
    g.add_argument("--dry-base", type=float_value, default=d.dry_base, metavar="N", help="DRY base (default: 1.75)")
    g.add_argument("--dry-allowed-length", type=int_value, default=d.dry_allowed_length, metavar="N", help="DRY allowed length (default: 2)")
    g.add_argument("--dry-penalty-last-n", type=int_value, default=d.dry_penalty_last_n, metavar="N",
                   help="DRY: tokens to scan (default: -1, the context size)")
    g.add_argument("--dry-sequence-breaker", action="append", default=None, metavar="STR",
                   help="DRY sequence breaker (repeatable; 'none' for none; default: \\n : \" *)")
    g.add_argument("--xtc-probability", type=float_value, default=d.xtc_probability, metavar="N", help="XTC probability (default: 0.0, off)")
    g.add_argument("--xtc-threshold", type=float_value, default=d.xtc_threshold, metavar="N", help="XTC threshold (default: 0.1)")
    g.add_argument("--dynatemp-range", type=float_value, default=d.dynatemp_range, metavar="N", help="dynamic temperature range (default: 0.0)")
    g.add_argument("--dynatemp-exp", type=float_value, default=d.dynatemp_exponent, metavar="N", help="dynamic temperature exponent (default: 1.0)")
    g.add_argument("--mirostat", type=int_value, default=d.mirostat, choices=(0, 1, 2), metavar="N",
                   help="Mirostat: 0 off, 1 Mirostat, 2 Mirostat 2.0 (default: 0)")
    g.add_argument("--mirostat-lr", type=float_value, default=d.mirostat_eta, metavar="N", help="Mirostat learning rate, eta (default: 0.1)")
    g.add_argument("--mirostat-ent", type=float_value, default=d.mirostat_tau, metavar="N", help="Mirostat target entropy, tau (default: 5.0)")
    g.add_argument("--samplers", metavar="SAMPLERS", default=None,
                   help="samplers in order, separated by ';' (default: " + ";".join(d.samplers) + ")")
    g.add_argument("--sampling-seq", "--sampler-seq", metavar="SEQ", default=None,
                   help="samplers in order as letters (default: edskypmxt)")
    g.add_argument("-l", "--logit-bias", type=logit_bias_value, action="append", default=[], metavar="TOKEN_ID(+/-)BIAS",
                   help="change the likelihood of a token, e.g. 15043+1")
    g.add_argument("--ignore-eos", action="store_true", help="never end the generation (bias the end tokens to -inf)")
    g.add_argument("--grammar", metavar="GRAMMAR", default="", help="a GBNF grammar constraining the output")
    g.add_argument("--grammar-file", metavar="FNAME", default=None, help="a file holding a GBNF grammar")
    g.add_argument("-j", "--json-schema", metavar="SCHEMA", default=None,
                   help="a JSON schema constraining the output, e.g. '{}' for any JSON object")
    g.add_argument("--json-schema-file", metavar="FNAME", default=None, help="a file holding a JSON schema")


def _sampler_order(args: argparse.Namespace) -> tuple[str, ...] | None:
    if args.sampling_seq is not None:
        unknown = [c for c in args.sampling_seq if c not in SAMPLER_CHARS]
        if unknown:
            raise CLIError(f"--sampling-seq: unknown sampler letter {unknown[0]!r}; known: {''.join(SAMPLER_CHARS)}")
        return tuple(SAMPLER_CHARS[c] for c in args.sampling_seq)
    if args.samplers is not None:
        names = [n for n in args.samplers.replace(",", ";").split(";") if n]
        unknown = [n for n in names if n not in SAMPLER_NAMES]
        if unknown:
            raise CLIError(f"--samplers: unknown sampler {unknown[0]!r}; known: {', '.join(sorted(set(SAMPLER_NAMES.values())))}")
        return tuple(SAMPLER_NAMES[n] for n in names)
    return None


def _grammar_text(args: argparse.Namespace) -> tuple[str, Any]:
    """(GBNF, JSON schema text) from the flags; at most one of them."""
    grammar = args.grammar
    if args.grammar_file:
        grammar = read_text_file(args.grammar_file, "grammar file")
    schema = args.json_schema
    if args.json_schema_file:
        schema = read_text_file(args.json_schema_file, "JSON schema file")
    if schema is not None:
        import json

        try:
            json.loads(schema)
        except json.JSONDecodeError as e:
            raise CLIError(f"--json-schema: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        if grammar:
            raise CLIError("give --grammar or --json-schema, not both")
    return grammar, schema


def sampling_params(args: argparse.Namespace, model: Model) -> SamplingParams:
    """SamplingParams from the sampling flags (llama.cpp's common_params_sampling)."""
    bias: dict[int, float] = {}
    for token, value in args.logit_bias:
        if not 0 <= token < model.n_vocab:
            raise CLIError(f"--logit-bias: token {token} is outside the vocabulary (0..{model.n_vocab - 1})")
        bias[token] = bias.get(token, 0.0) + value
    if args.ignore_eos:
        for token in range(model.n_vocab):
            if model.is_eog(token):
                bias[token] = -math.inf
    breakers = args.dry_sequence_breaker
    if breakers is not None:
        breakers = [] if breakers == ["none"] else [process_escapes(b) for b in breakers]
    grammar, schema = _grammar_text(args)
    params = SamplingParams(
        seed=args.seed, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, xtc_probability=args.xtc_probability,
        xtc_threshold=args.xtc_threshold, typ_p=args.typical, temp=args.temp, dynatemp_range=args.dynatemp_range,
        dynatemp_exponent=args.dynatemp_exp, penalty_last_n=args.repeat_last_n, penalty_repeat=args.repeat_penalty,
        penalty_freq=args.frequency_penalty, penalty_present=args.presence_penalty,
        dry_multiplier=args.dry_multiplier, dry_base=args.dry_base, dry_allowed_length=args.dry_allowed_length,
        dry_penalty_last_n=args.dry_penalty_last_n, mirostat=args.mirostat, mirostat_tau=args.mirostat_ent,
        mirostat_eta=args.mirostat_lr, top_n_sigma=args.top_nsigma, min_keep=args.min_keep,
        logit_bias=bias, grammar=grammar, json_schema=schema)
    if breakers is not None:
        params.dry_sequence_breakers = breakers
    order = _sampler_order(args)
    if order is not None:
        params.samplers = order
    return params


# --- output -------------------------------------------------------------------------------------

def is_terminal(stream=None) -> bool:
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def progress(total: int, desc: str, unit: str = "tok"):
    """A tqdm bar on stderr when it is a terminal, silent otherwise."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not is_terminal(sys.stderr),
                leave=False, dynamic_ncols=True)


def log(msg: str = "") -> None:
    print(msg, file=sys.stderr, flush=True)


def print_timings(ctx: Context, base: dict[str, float] | None = None, t_start: float | None = None,
                  t_sample_ms: float | None = None, n_sample: int = 0, t_load_ms: float | None = None) -> None:
    """llama.cpp's llama_perf_*_print lines on stderr."""
    perf = dict(ctx.perf)
    for key in ("n_p_eval", "t_p_eval_ms", "n_eval", "t_eval_ms"):
        perf[key] = perf.get(key, 0) - (base or {}).get(key, 0)
    n_p, t_p, n_e, t_e = int(perf["n_p_eval"]), perf["t_p_eval_ms"], int(perf["n_eval"]), perf["t_eval_ms"]
    rate = lambda n, t: (t / n if n else 0.0, 1e3 * n / t if t > 0 else 0.0)  # noqa: E731
    name = "llama_perf_sampler_print"
    if t_sample_ms is not None:
        ms, tps = rate(n_sample, t_sample_ms)
        log(f"{name}:    sampling time = {t_sample_ms:10.2f} ms / {n_sample:5d} runs   ({ms:8.2f} ms per token, {tps:8.2f} tokens per second)")
    name = "llama_perf_context_print"
    load = t_load_ms if t_load_ms is not None else perf.get("t_load_ms", 0.0)
    log(f"{name}:        load time = {load:10.2f} ms")
    ms, tps = rate(n_p, t_p)
    log(f"{name}: prompt eval time = {t_p:10.2f} ms / {n_p:5d} tokens ({ms:8.2f} ms per token, {tps:8.2f} tokens per second)")
    ms, tps = rate(n_e, t_e)
    log(f"{name}:        eval time = {t_e:10.2f} ms / {n_e:5d} runs   ({ms:8.2f} ms per token, {tps:8.2f} tokens per second)")
    if t_start is not None:
        total = (time.perf_counter() - t_start) * 1e3
        log(f"{name}:       total time = {total:10.2f} ms / {n_p + n_e:5d} tokens")


@contextmanager
def binary_stdout() -> Iterator[Any]:
    """stdout as bytes, flushed after use (pieces may not be valid UTF-8 on their own)."""
    sys.stdout.flush()
    yield sys.stdout.buffer
    sys.stdout.buffer.flush()


# --- model description (llama_model_desc) ------------------------------------------------------

#: llama.cpp's llama_ftype names (general.file_type)
FILE_TYPES = {
    0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K - Medium",
    11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small", 15: "Q4_K - Medium",
    16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K", 19: "IQ2_XXS - 2.0625 bpw", 20: "IQ2_XS - 2.3125 bpw",
    21: "Q2_K - Small", 22: "IQ3_XS - 3.3 bpw", 23: "IQ3_XXS - 3.0625 bpw", 24: "IQ1_S - 1.5625 bpw",
    25: "IQ4_NL - 4.5 bpw", 26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw", 28: "IQ2_S - 2.5 bpw",
    29: "IQ2_M - 2.7 bpw", 30: "IQ4_XS - 4.25 bpw", 31: "IQ1_M - 1.75 bpw", 32: "BF16", 36: "TQ1_0 - 1.69 bpw",
    37: "TQ2_0 - 2.06 bpw", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}


def _size_label(n_params: int) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n_params >= scale:
            return f"{n_params / scale:.3g}{unit}"
    return str(n_params)


def model_description(model: Model) -> str:
    """Like llama_model_desc: architecture, size and file type, e.g. 'qwen2 0.5B Q4_K - Medium'."""
    md = model.metadata
    size = md.get("general.size_label") or _size_label(model.n_params)
    ftype = md.get("general.file_type")
    if ftype is None:
        counts: dict[str, int] = {}
        for t in model.tensors:
            if len(t.shape) >= 2:
                counts[t.type] = counts.get(t.type, 0) + 1
        kind = f"{max(counts, key=counts.get)} (guessed)" if counts else "?"
    else:
        kind = FILE_TYPES.get(int(ftype), f"file type {ftype}")
    return f"{model.arch} {size} {kind}"


def format_size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes < 2**30 else f"{nbytes / 2**30:.2f} GiB"


def format_params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"
