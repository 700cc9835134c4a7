"""``ferrollama serve``: the OpenAI-compatible server (llama-server's flag names).

Parses the flags, loads the model, makes the scheduler and runs the ASGI app with uvicorn.
Needs ``pip install 'ferrollama[server]'``.
"""
from __future__ import annotations

import argparse

from .common import CLIError, add_context_args, add_model_args, load_model, log, positive_int, warmup


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_context_args(p, n_ctx=8192)
    # a decode step holds every slot's next token and prompt chunks: smaller steps keep streams flowing
    p.set_defaults(batch_size=512)
    for action in p._actions:
        if action.dest == "batch_size":
            action.help = "tokens per decode step: every slot's next token, then prompt chunks (default: 512)"
        elif action.dest == "ctx_size":
            action.help = "the KV cache, shared by the slots: each holds N/np tokens (default: 8192, 0 = from the model)"
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    g.add_argument("--port", type=positive_int, default=8080, help="port to listen on (default: 8080)")
    g.add_argument("-np", "--parallel", type=positive_int, default=4, metavar="N",
                   help="slots: requests decoded together; each holds ctx-size/N tokens (default: 4)")
    g.add_argument("--queue-size", type=positive_int, default=64, metavar="N",
                   help="requests that may wait for a slot; more are answered 503 (default: 64)")
    g.add_argument("--api-key", default=None, metavar="KEY", help="require 'Authorization: Bearer KEY'")
    g.add_argument("-a", "--alias", default=None, metavar="NAME", help="the model's name in the API (default: the file name)")


def build_app(args: argparse.Namespace):
    """The ASGI app for the flags (tests start it with uvicorn themselves)."""
    try:
        from ..server.app import create_app
    except ImportError as e:
        raise CLIError(f"the server needs its extra: pip install 'ferrollama[server]' ({e.name} is missing)") from None
    from ..server.scheduler import Scheduler

    model = load_model(args)
    n_ctx = args.ctx_size if args.ctx_size > 0 else model.n_ctx_train
    if n_ctx < args.parallel:
        raise CLIError(f"--ctx-size {n_ctx} is smaller than --parallel {args.parallel}")
    scheduler = Scheduler(model, n_ctx=n_ctx, n_seq=args.parallel, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
                          n_threads=args.threads, n_threads_batch=args.threads_batch, queue_size=args.queue_size,
                          type_k=args.cache_type_k, type_v=args.cache_type_v, loras=args.lora_adapters)
    if not args.no_warmup:
        warmup(scheduler.ctx, model)
    return create_app(scheduler, model_name=args.alias, api_key=args.api_key)


def run(args: argparse.Namespace) -> int:
    app = build_app(args)
    import uvicorn

    log(f"ferrollama serve: http://{args.host}:{args.port}/v1 ({args.parallel} slots)")
    uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    return 0
