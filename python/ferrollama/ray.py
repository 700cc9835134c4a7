"""ferrollama on a Ray cluster: batch generation with Ray Data, the server with Ray Serve.

Needs ``pip install 'ferrollama[ray]'``; nothing else in ferrollama imports Ray.

Batch generation::

    import ray, ferrollama.ray as flray
    ds = ray.data.from_items([{"prompt": "def fib(n):"}, {"prompt": "SELECT"}])
    out = flray.batch(ds, max_tokens=32, workers=2)   # a Dataset with "text", "finish_reason", ...
    print(out.take_all())

Each of the ``workers`` actors loads the model once (memory-mapped) and answers the batches it
is given with :class:`ferrollama.batch.BatchGenerator`, the code ``ferrollama batch`` runs in
process. A worker that dies is restarted by Ray and its batch is run again (Ray Data's actor
retries), so every row is answered once.

The server: :func:`serve_app` is the ``ferrollama serve`` app as a Ray Serve application of
``replicas`` copies, each a :class:`ServeReplica` with its own model and context.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from .batch import BatchGenerator, BatchInputError, BatchOptions
from .generation.params import SamplingParams

__all__ = ["RayMissing", "import_ray", "BatchWorker", "batch", "batch_groups", "ServeReplica", "serve_app", "REPLICA_HEADER"]

INSTALL_HINT = "pip install 'ferrollama[ray]'"

#: the response header naming the Ray Serve replica that answered
REPLICA_HEADER = "x-ferrollama-replica"


class RayMissing(ImportError):
    """Ray (with its Data and Serve libraries) is not installed."""


def import_ray(*parts: str) -> Any:
    """``ray`` (and ``ray.data``/``ray.serve`` when named), or RayMissing saying how to install them."""
    import importlib

    try:
        ray = importlib.import_module("ray")
        for part in parts:
            importlib.import_module(f"ray.{part}")
    except ImportError as e:
        raise RayMissing(f"this needs Ray: {INSTALL_HINT} ({e.name or 'ray'} is missing)") from None
    return ray


# --- batch generation on Ray Data ----------------------------------------------------------------

def _column_values(column: Any) -> list:
    return column.tolist() if isinstance(column, np.ndarray) else list(column)


def _messages_of(value: Any) -> list[dict]:
    """A row's messages: a list of {role, content} (as Arrow gives them back) or its JSON text."""
    if isinstance(value, str):
        return json.loads(value)
    return [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in dict(m).items() if v is not None}
            for m in _column_values(value)]


class BatchWorker:
    """The Ray Data actor: loads the model once, answers each batch of rows it is given as one
    group (``grouped``: each row is a group, its "rows" the JSON list of its rows)."""

    def __init__(self, model_path: str | None, options: BatchOptions, grouped: bool = False):
        self.generator = BatchGenerator(model_path, options)
        self.key = "messages" if options.chat else "prompt"
        self.grouped = grouped

    def _row(self, row_id: Any, value: Any) -> dict:
        return {"id": row_id, self.key: _messages_of(value) if self.key == "messages" else str(value)}

    def _group(self, rows: list[dict]) -> tuple[str, str]:
        """(the JSON list of the group's answers, "") or ("[]", why the group cannot be answered)."""
        try:
            return json.dumps(self.generator.run([self._row(r["id"], r[self.key]) for r in rows])), ""
        except BatchInputError as e:  # a prompt that does not fit: the driver reports it, naming the row
            return "[]", str(e)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        out = dict(batch)
        if self.grouped:
            results = [self._group(json.loads(text)) for text in _column_values(batch["rows"])]
            out["answers"] = np.array([answers for answers, _ in results], dtype=object)
            out["error"] = np.array([error for _, error in results], dtype=object)
            return out
        values = _column_values(batch[self.key])
        # errors name a row by its "id" column when there is one, else by its place in the batch
        ids = _column_values(batch["id"]) if "id" in batch else [f"{k} of this batch" for k in range(len(values))]
        rows = [self._row(row_id, v) for row_id, v in zip(ids, values)]
        answers = self.generator.run(rows)
        out["text"] = np.array([a["text"] for a in answers], dtype=object)
        out["finish_reason"] = np.array([a["finish_reason"] for a in answers], dtype=object)
        for k in ("prompt_tokens", "completion_tokens"):
            out[k] = np.array([a["usage"][k] for a in answers], dtype=np.int64)
        return out


def _map(dataset: Any, model_path: str | None, opts: BatchOptions, grouped: bool, batch_size: int, workers: int,
         num_cpus: float) -> Any:
    ray = import_ray("data")
    opts.sampling.validate()
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    # one batch at a time per actor: a batch is seconds of decoding, and one queued behind a busy
    # actor would wait there while another actor idles (when it was still loading the model)
    pool = ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1)
    return dataset.map_batches(
        BatchWorker, fn_constructor_args=(model_path, opts, grouped), batch_size=batch_size, batch_format="numpy",
        # Ray Data's actors are restarted when they die and their batches run again
        # (max_restarts=-1, max_task_retries=-1 by default): test_ray kills one
        compute=pool, num_cpus=num_cpus)


def batch(dataset: Any, model_path: str | None = None, *, max_tokens: int | None = 128,
          sampling: SamplingParams | None = None, chat: bool = False, workers: int = 1,
          rows_per_batch: int | None = None, n_seq: int = 8, n_ctx: int = 2048, n_threads: int | None = 1,
          num_cpus: float = 1, **options: Any) -> Any:
    """The dataset with each row answered: columns "text", "finish_reason", "prompt_tokens" and
    "completion_tokens" added to the row's own.

    Rows need "prompt" (a string), or with ``chat=True`` "messages" (a list of messages, or its
    JSON text). ``workers`` actors (``num_cpus`` each, ``n_threads`` engine threads) are given
    batches of ``rows_per_batch`` rows (default: 4 * n_seq) and decode up to ``n_seq`` of them
    together. A row's answer depends on the rows decoded with it (the engine's sums round with
    the number of tokens decoded together), so on where Ray cuts the batches; for answers that
    do not, give the groups yourself (:func:`batch_groups`, what ``ferrollama batch`` does).
    Further ``options`` are :class:`~ferrollama.batch.BatchOptions` fields. Lazy, as Ray
    Datasets are: nothing runs until the result is consumed.
    """
    opts = BatchOptions(max_tokens=max_tokens, sampling=sampling or SamplingParams(), chat=chat, n_seq=n_seq,
                        n_ctx=n_ctx, n_threads=n_threads, **options)
    return _map(dataset, model_path, opts, False, rows_per_batch or 4 * n_seq, workers, num_cpus)


def batch_groups(dataset: Any, model_path: str | None = None, *, max_tokens: int | None = 128,
                 sampling: SamplingParams | None = None, chat: bool = False, workers: int = 1, n_seq: int = 8,
                 n_ctx: int = 2048, n_threads: int | None = 1, num_cpus: float = 1, **options: Any) -> Any:
    """Like :func:`batch` for a dataset whose rows are groups: "rows" holds the JSON list of a
    group's rows (``{"id", "prompt"}``, or ``{"id", "messages"}`` with ``chat``), decoded together
    (``n_seq`` at a time) and apart from the other groups; "answers" is added, the JSON list of
    their answers ``{"id", "text", "finish_reason", "usage"}``, and "error": "" or why the group
    was not answered (a prompt longer than a sequence's context, naming its row). Answers depend
    on the group only, so they are those of ``BatchGenerator.run`` on the same group anywhere.
    """
    opts = BatchOptions(max_tokens=max_tokens, sampling=sampling or SamplingParams(), chat=chat, n_seq=n_seq,
                        n_ctx=n_ctx, n_threads=n_threads, **options)
    return _map(dataset, model_path, opts, True, 1, workers, num_cpus)


# --- the server on Ray Serve ---------------------------------------------------------------------

class _ReplicaHeader:
    """ASGI middleware naming the replica in every response (to see where requests land)."""

    def __init__(self, app: Any, replica: str):
        self.app, self.replica = app, replica.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + [(REPLICA_HEADER.encode(), self.replica)]}
            await send(message)

        return await self.app(scope, receive, send_named)


class ServeReplica:
    """One Ray Serve replica: the ``ferrollama serve`` app for the flags, with its own model,
    scheduler and context (built on the replica, when Ray Serve asks for the app)."""

    def __init__(self, serve_args: dict[str, Any]):
        self.serve_args = serve_args

    def __serve_build_asgi_app__(self):
        from .server.build import build_app

        ray = import_ray("serve")
        replica = ray.serve.get_replica_context().replica_id.unique_id
        return _ReplicaHeader(build_app(argparse.Namespace(**self.serve_args)), replica)


def serve_app(serve_args: argparse.Namespace | dict[str, Any], replicas: int = 1, num_cpus: float = 1,
              max_ongoing_requests: int | None = None) -> Any:
    """The Ray Serve application of ``replicas`` :class:`ServeReplica` built from ``ferrollama
    serve``'s flags (``serve.run(serve_app(...))``). A replica takes up to ``max_ongoing_requests``
    requests at once (default: its slots plus its queue), Ray Serve queues the rest."""
    ray = import_ray("serve")
    args = dict(vars(serve_args) if isinstance(serve_args, argparse.Namespace) else serve_args)
    args = {k: v for k, v in args.items() if not k.startswith("_")}
    ongoing = max_ongoing_requests or args.get("parallel", 4) + args.get("queue_size", 64)
    ingress = ray.serve.ingress()(ServeReplica)
    deployment = ray.serve.deployment(ingress, name="ferrollama", num_replicas=replicas,
                                      ray_actor_options={"num_cpus": num_cpus}, max_ongoing_requests=ongoing)
    return deployment.bind(args)
