"""``ferrollama serve``: the OpenAI-compatible server (llama-server's flag names).

Parses the flags and runs the ASGI app the server builds for them (ferrollama.server.build_app:
the model, the scheduler, the app) with uvicorn. Needs ``pip install 'ferrollama[server]'``.
With ``--ray`` the same app is deployed with Ray Serve, ``--replicas`` copies each with its own
model and context (``pip install 'ferrollama[ray]'``).
"""
from __future__ import annotations

import argparse
import os

from .common import CLIError, add_context_args, add_mmproj_arg, add_model_args, float_value, int_value, load_model, log, positive_int
from ..generation.checkpoints import DEFAULT_CHECKPOINTS

__all__ = ["add_arguments", "build_app", "run", "run_on_ray"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_mmproj_arg(p)
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
    g.add_argument("-ctxcp", "--ctx-checkpoints", type=int_value, default=DEFAULT_CHECKPOINTS, metavar="N",
                   help="recurrent models: states kept per slot to resume a shared prompt prefix "
                        f"(default: {DEFAULT_CHECKPOINTS})")
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
    """The ASGI app for the flags: ferrollama.server.build_app (imported when asked for, so that
    the other commands do not load the server)."""
    from ..server.build import build_app as build

    return build(args)


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
