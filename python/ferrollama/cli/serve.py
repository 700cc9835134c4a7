"""``ferrollama serve``: the OpenAI-compatible server (llama-server's flag names).

Parses the flags, loads the model, makes the scheduler and runs the ASGI app with uvicorn.
Needs ``pip install 'ferrollama[server]'``. With ``--ray`` the same app is deployed with Ray Serve,
``--replicas`` copies each with its own model and context (``pip install 'ferrollama[ray]'``).
"""
from __future__ import annotations

import argparse
import os

from .common import (CLIError, add_context_args, add_model_args, float_value, int_value, load_model, log, positive_int,
                     warmup)


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
    g.add_argument("--lookup", type=int_value, default=0, metavar="N",
                   help="speculative decoding: each slot drafts up to N tokens by prompt lookup (n-gram match in its "
                        "prompt and output), verified in the slots' shared batch")
    g.add_argument("--lookup-ngram", type=int_value, default=2, metavar="N",
                   help="longest n-gram prompt lookup matches (default: 2)")
    g.add_argument("-md", "--model-draft", metavar="FNAME", default=None,
                   help="speculative decoding with a draft model of the same vocabulary, a sequence per slot")
    g.add_argument("--draft-max", "--draft", "--draft-n", type=int_value, default=16, metavar="N",
                   help="tokens the draft model drafts at most (default: 16)")
    g.add_argument("--draft-min", type=int_value, default=0, metavar="N", help="shortest draft worth verifying (default: 0)")
    g.add_argument("--draft-p-min", type=float_value, default=0.75, metavar="P",
                   help="the draft stops below this probability of its top token (default: 0.75)")
    r = p.add_argument_group("ray (pip install 'ferrollama[ray]')")
    r.add_argument("--ray", action="store_true", help="deploy the server with Ray Serve, --replicas copies")
    r.add_argument("--replicas", type=positive_int, default=None, metavar="R",
                   help="replicas, each with its own model and context (default: 1)")
    r.add_argument("--address", default=None, metavar="ADDR",
                   help="the Ray cluster to join (default: start a local Ray instance)")


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
    drafter = _drafter(args, model, n_ctx)
    scheduler = Scheduler(model, n_ctx=n_ctx, n_seq=args.parallel, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
                          n_threads=args.threads, n_threads_batch=args.threads_batch, queue_size=args.queue_size,
                          type_k=args.cache_type_k, type_v=args.cache_type_v, drafter=drafter,
                          loras=args.lora_adapters)
    if not args.no_warmup:
        warmup(scheduler.ctx, model)
    return create_app(scheduler, model_name=args.alias, api_key=args.api_key)


def _drafter(args: argparse.Namespace, model, n_ctx: int):  # noqa: ANN001
    """The slots' drafter: prompt lookup (--lookup), a draft model (-md) or none."""
    from ..speculative import DraftModel, PromptLookupDecoding

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


def run(args: argparse.Namespace) -> int:
    if not args.ray and (args.replicas is not None or args.address is not None):
        raise CLIError("--replicas and --address need --ray")
    if args.ray:
        return run_on_ray(args)
    app = build_app(args)
    import uvicorn

    log(f"ferrollama serve: http://{args.host}:{args.port}/v1 ({args.parallel} slots)")
    uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    return 0


def run_on_ray(args: argparse.Namespace) -> int:
    """Serves the app with Ray Serve on --host:--port until Ctrl-C, then removes it from the cluster."""
    from ..ray import RayMissing, import_ray, serve_app

    try:
        ray = import_ray("serve")
    except RayMissing as e:
        raise CLIError(str(e)) from None
    # a missing or malformed model fails here, not in every replica; -m is read at the same path on
    # every node, and without -m each replica finds the default model
    load_model(args, vocab_only=True)
    args.model = os.path.abspath(args.model) if args.model else None
    replicas = args.replicas or 1
    ray.init(address=args.address, include_dashboard=False, log_to_driver=args.verbose,
             logging_level="info" if args.verbose else "error")
    try:
        ray.serve.start(http_options={"host": args.host, "port": args.port})
        ray.serve.run(serve_app(args, replicas), name="ferrollama", route_prefix="/")
        log(f"ferrollama serve: http://{args.host}:{args.port}/v1 on Ray Serve "
            f"({replicas} replicas, {args.parallel} slots each)")
        _wait_forever()
    except KeyboardInterrupt:
        return 0
    finally:
        ray.serve.shutdown()
        ray.shutdown()
    return 0


def _wait_forever() -> None:
    import threading

    threading.Event().wait()
