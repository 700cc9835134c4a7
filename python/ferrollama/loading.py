"""What llama.cpp's common flags load (its common_init_from_params): the model of ``-m`` (or the
default model), its LoRA adapters, contexts with the flags' sizes and cache types, the warmup; and
:class:`CLIError`, the error a flag's unusable value raises.

The command line (ferrollama.cli) and the server's ``build_app`` (ferrollama.server.build, also
run on each Ray Serve replica) load what their flags ask for through these.
"""
from __future__ import annotations

import argparse
import math
import os
import time
from typing import Any

from ._core import Batch, Context, Error, LoraAdapter, Model
from .models import default_model_path

__all__ = ["CLIError", "float_value", "model_path", "load_model", "lora_files", "load_lora_adapters", "load_projector",
           "make_context", "set_lora_adapters", "warmup"]


class CLIError(Exception):
    """An error reported as one line on stderr, exit status 1."""


def float_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError("expected a number, got nan")
    return value


def model_path(args: argparse.Namespace) -> str:
    if args.model:
        if not os.path.exists(args.model):
            raise CLIError(f"{args.model}: no such model file")
        if os.path.isdir(args.model):
            raise CLIError(f"{args.model}: is a directory, not a model file")
        return args.model
    return str(default_model_path())


def load_model(args: argparse.Namespace, vocab_only: bool = False) -> Model:
    """The model of -m (or the default one) and its LoRA adapters (args.lora_adapters, which
    make_context sets on every context); the load time goes to args.t_load_ms."""
    path = model_path(args)
    t0 = time.perf_counter()
    model = Model(path, use_mmap=not getattr(args, "no_mmap", False), vocab_only=vocab_only)
    args.lora_adapters = [] if vocab_only else load_lora_adapters(args, model)
    args.t_load_ms = (time.perf_counter() - t0) * 1e3
    return model


def lora_files(args: argparse.Namespace) -> list[tuple[str, float]]:
    """(file, scale) of each --lora and --lora-scaled, in order (llama.cpp's common_params)."""
    files = [(f, 1.0) for value in getattr(args, "lora", []) for f in value.split(",") if f]
    for values in getattr(args, "lora_scaled", []):
        if len(values) == 2:
            items = [tuple(values)]
        elif len(values) == 1:
            items = [item.rsplit(":", 1) for item in values[0].split(",") if item]
        else:
            raise CLIError(f"--lora-scaled takes FNAME:SCALE[,...] or FNAME SCALE, not {len(values)} values")
        for item in items:
            if len(item) != 2:
                raise CLIError(f"--lora-scaled format: FNAME:SCALE (got {':'.join(item)!r})")
            try:
                files.append((item[0], float_value(item[1])))
            except argparse.ArgumentTypeError as e:
                raise CLIError(f"--lora-scaled {item[0]}: {e}") from None
    return files


def load_lora_adapters(args: argparse.Namespace, model: Model) -> list[tuple[LoraAdapter, float]]:
    adapters = []
    for path, scale in lora_files(args):
        if not os.path.isfile(path):
            raise CLIError(f"{path}: no such LoRA adapter file")
        try:
            adapters.append((LoraAdapter(model, path), scale))
        except (Error, ValueError) as e:
            raise CLIError(f"failed to load LoRA adapter '{path}': {e}") from None
    return adapters


def load_projector(args: argparse.Namespace, model: Model) -> Any:
    """The projector of --mmproj for the model (generation.multimodal.Projector), or None."""
    path = getattr(args, "mmproj", None)
    if path is None:
        return None
    if not os.path.isfile(path):
        raise CLIError(f"--mmproj {path}: no such projector file")
    from .generation.multimodal import Projector

    try:
        return Projector(model, path, n_threads=getattr(args, "threads", None), use_mmap=not getattr(args, "no_mmap", False))
    except (Error, ValueError) as e:
        raise CLIError(f"--mmproj {path}: {e}") from None


def make_context(args: argparse.Namespace, model: Model, **overrides: Any) -> Context:
    kwargs = dict(n_ctx=args.ctx_size if args.ctx_size > 0 else model.n_ctx_train,
                  n_batch=args.batch_size, n_ubatch=args.ubatch_size, n_threads=args.threads,
                  n_threads_batch=args.threads_batch or args.threads,
                  type_k=args.cache_type_k, type_v=args.cache_type_v,
                  batch_invariant=getattr(args, "batch_invariant", False))
    draft = getattr(args, "lookup", 0) or (getattr(args, "draft_max", 0) if getattr(args, "model_draft", None) else 0)
    if model.is_recurrent and draft:
        # speculative decoding drops a rejected draft by rolling the recurrent state back to
        # the states the context keeps of its last decode
        kwargs["n_rs_seq"] = max(0, min(draft, 64, args.ubatch_size - 1))
    kwargs.update(overrides)
    if kwargs["n_ctx"] < 0:
        raise CLIError(f"--ctx-size must be 0 or positive, not {kwargs['n_ctx']}")
    ctx = Context(model, **kwargs)
    set_lora_adapters(args, ctx)
    return ctx


def set_lora_adapters(args: argparse.Namespace, ctx: Context) -> None:
    """Sets the adapters load_model loaded (--lora, --lora-scaled) on a context."""
    for adapter, scale in getattr(args, "lora_adapters", []):
        ctx.set_lora(adapter, scale)


def warmup(ctx: Context, model: Model) -> dict[str, float]:
    """llama.cpp's warmup (BOS and EOS through the model, then an empty cache); returns the perf
    counters to subtract from the final timings."""
    tokens = [t for t in (model.bos, model.eos) if t is not None] or [0]
    ctx.decode(Batch.from_tokens(tokens[: ctx.n_batch], pos0=0, seq_id=0, logits="last"))
    ctx.kv.clear()
    return dict(ctx.perf)
