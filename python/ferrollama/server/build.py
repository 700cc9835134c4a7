"""The server's app from ``ferrollama serve``'s flags: the model, the slots' scheduler (with its
drafter for speculative decoding) and the ASGI app. The command line serves it with uvicorn, and
each Ray Serve replica builds its own (ferrollama.ray.ServeReplica).
"""
from __future__ import annotations

import argparse

from ..generation.scheduler import Scheduler
from ..generation.speculative import DraftModel, PromptLookupDecoding
from ..loading import CLIError, load_model, load_projector, warmup

__all__ = ["build_app"]


def build_app(args: argparse.Namespace):
    """The ASGI app for the flags (tests start it with uvicorn themselves)."""
    try:
        from .app import create_app
    except ImportError as e:
        raise CLIError(f"the server needs its extra: pip install 'ferrollama[server]' ({e.name} is missing)") from None

    model = load_model(args)
    n_ctx = args.ctx_size if args.ctx_size > 0 else model.n_ctx_train
    if n_ctx < args.parallel:
        raise CLIError(f"--ctx-size {n_ctx} is smaller than --parallel {args.parallel}")
    drafter = _drafter(args, model, n_ctx)
    scheduler = Scheduler(model, n_ctx=n_ctx, n_seq=args.parallel, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
                          n_threads=args.threads, n_threads_batch=args.threads_batch, queue_size=args.queue_size,
                          type_k=args.cache_type_k, type_v=args.cache_type_v, drafter=drafter,
                          loras=args.lora_adapters, ctx_checkpoints=args.ctx_checkpoints,
                          batch_invariant=args.batch_invariant)
    if not args.no_warmup:
        warmup(scheduler.ctx, model)
    return create_app(scheduler, model_name=args.alias, api_key=args.api_key, projector=load_projector(args, model))


def _drafter(args: argparse.Namespace, model, n_ctx: int):  # noqa: ANN001
    """The slots' drafter: prompt lookup (--lookup), a draft model (-md) or none."""
    if args.lookup < 0 or args.lookup_ngram < 1:
        raise CLIError("--lookup must be at least 0 and --lookup-ngram at least 1")
    if args.lookup and args.model_draft:
        raise CLIError("give --lookup or -md, not both")
    if args.lookup:
        return PromptLookupDecoding(max_ngram_size=args.lookup_ngram, num_pred_tokens=args.lookup)
    if args.model_draft is None:
        return None
    try:
        draft = DraftModel(args.model_draft, draft_max=args.draft_max, draft_min=args.draft_min,
                           draft_p_min=args.draft_p_min, n_ctx=n_ctx, n_threads=args.threads, n_seq=args.parallel)
        draft.check_vocab(model)
    except ValueError as e:
        raise CLIError(f"-md {args.model_draft}: {e}") from None
    return draft
