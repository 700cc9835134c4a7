"""``ferrollama batch``: answer every row of a JSONL file, in process or on a Ray cluster.

Input rows are ``{"id": ..., "prompt": "..."}`` (``{"id": ..., "messages": [...]}`` with
``--chat``); the output has one row ``{"id", "text", "finish_reason", "usage"}`` per input row,
in input order. A run resumes after the rows an earlier run's output already holds. In process,
``-np`` prompts are decoded together; with ``--ray`` the rows go through Ray Data to
``--workers`` actors, each loading the model once (ferrollama.ray).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Iterator

from ..batch import BatchGenerator, BatchInputError, BatchOptions, read_rows, resume_point
from .common import (CLIError, add_context_args, add_model_args, add_sampling_args, load_model, log,
                     n_predict_value, positive_int, progress, sampling_params)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_context_args(p, n_ctx=2048)
    for action in p._actions:
        if action.dest == "ctx_size":
            action.help = "tokens each sequence holds, prompt and answer (default: 2048, 0 = from the model)"
    add_sampling_args(p)
    g = p.add_argument_group("batch")
    g.add_argument("-i", "--input", required=True, metavar="FNAME",
                   help='JSONL rows {"id": ..., "prompt": ...} ({"id": ..., "messages": [...]} with --chat)')
    g.add_argument("-o", "--output", required=True, metavar="FNAME",
                   help="JSONL answers, one per row in input order; a run resumes after the rows it holds")
    g.add_argument("-n", "--n-predict", type=n_predict_value, default=128, metavar="N",
                   help="tokens per answer at most (default: 128, -1 = until the sequence's context is full)")
    g.add_argument("--chat", action="store_true", help="rows hold messages, rendered with the model's chat template")
    g.add_argument("-np", "--parallel", type=positive_int, default=8, metavar="N",
                   help="prompts decoded together, in process and on each worker (default: 8)")
    g.add_argument("--group-size", type=positive_int, default=None, metavar="N",
                   help="rows answered as one group, -np at a time, in process and on Ray alike: a row's answer "
                        "depends on its group only; a Ray task answers one group (default: 4 * -np)")
    r = p.add_argument_group("ray (pip install 'ferrollama[ray]')")
    r.add_argument("--ray", action="store_true", help="run on Ray: the rows go through Ray Data to --workers actors")
    r.add_argument("--address", default=None, metavar="ADDR",
                   help="the Ray cluster to join (default: start a local Ray instance)")
    r.add_argument("--workers", type=positive_int, default=None, metavar="W",
                   help="actors answering rows, each loading the model once (default: 1)")


def _check_flags(args: argparse.Namespace) -> None:
    if not args.ray and (args.address is not None or args.workers is not None):
        raise CLIError("--address and --workers need --ray")
    if args.n_predict == -2:
        raise CLIError("-n -2 (until the context is full) is the same as -1 here: give -1")
    if args.ctx_size < 0:
        raise CLIError(f"--ctx-size must be 0 or positive, not {args.ctx_size}")
    if os.path.abspath(args.input) == os.path.abspath(args.output):
        raise CLIError("--output must not be the input file")


def _options(args: argparse.Namespace, n_ctx_train: int) -> BatchOptions:
    return BatchOptions(max_tokens=None if args.n_predict < 0 else args.n_predict, chat=args.chat,
                        n_seq=args.parallel, n_ctx=args.ctx_size or n_ctx_train, n_batch=args.batch_size,
                        n_ubatch=args.ubatch_size, n_threads=args.threads, n_threads_batch=args.threads_batch,
                        type_k=args.cache_type_k, type_v=args.cache_type_v, use_mmap=not args.no_mmap)


def run(args: argparse.Namespace) -> int:
    _check_flags(args)
    group_size = args.group_size or 4 * args.parallel
    try:
        rows = read_rows(args.input, args.chat)
        done = resume_point(args.output, rows, group_size)
    except FileNotFoundError:
        raise CLIError(f"{args.input}: no such input file") from None
    except UnicodeDecodeError as e:
        raise CLIError(f"{args.input}: not UTF-8 text (byte {e.start})") from None
    except BatchInputError as e:
        raise CLIError(str(e)) from None
    if done:
        log(f"ferrollama batch: {args.output} already answers {done} of {len(rows)} rows; resuming")
    todo = rows[done:]
    model = load_model(args, vocab_only=args.ray)  # on Ray only the workers load the weights
    options = _options(args, model.n_ctx_train)
    options.sampling = sampling_params(args, model)
    if args.ray:
        # -m's absolute path (each node reads it there); without -m each worker finds the default model
        answers = _on_ray(args, os.path.abspath(args.model) if args.model else None, options, todo, group_size)
    else:
        answers = _in_process(model, options, todo, group_size)
    _write(args.output, answers, len(rows), done)
    return 0


def _in_process(model, options: BatchOptions, rows: list[dict], group_size: int) -> Iterator[dict]:
    if not rows:
        return
    try:
        yield from BatchGenerator(options=options, model=model).run_groups(rows, group_size)
    except BatchInputError as e:
        raise CLIError(str(e)) from None


def _on_ray(args: argparse.Namespace, path: str | None, options: BatchOptions, rows: list[dict],
            group_size: int) -> Iterator[dict]:
    """Answers from Ray Data, in input order: a Ray task answers a group of rows as in process
    (rows[0] is at a group's start); the ids stay here."""
    if not rows:
        return
    from ..ray import RayMissing, batch_groups, import_ray

    try:
        ray = import_ray("data")
    except RayMissing as e:
        raise CLIError(str(e)) from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=args.address, log_to_driver=args.verbose, include_dashboard=False,
                 logging_level="info" if args.verbose else "error")
    if not args.verbose:
        logging.getLogger("ray.data").setLevel(logging.ERROR)
    try:
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        context.enable_progress_bars = args.verbose
        starts = range(0, len(rows), group_size)
        groups = [{"start": s, "rows": json.dumps(rows[s:s + group_size])} for s in starts]
        answered = batch_groups(ray.data.from_items(groups), path, max_tokens=options.max_tokens,
                                sampling=options.sampling, chat=options.chat, workers=args.workers or 1,
                                n_seq=options.n_seq, n_ctx=options.n_ctx, n_threads=options.n_threads,
                                n_batch=options.n_batch, n_ubatch=options.n_ubatch,
                                n_threads_batch=options.n_threads_batch, type_k=options.type_k,
                                type_v=options.type_v, use_mmap=options.use_mmap)
        for expected, group in zip(starts, answered.iter_rows()):
            if int(group["start"]) != expected:
                raise RuntimeError(f"Ray returned the group of row {group['start']} where row {expected}'s was due")
            if group["error"]:
                raise CLIError(group["error"])
            yield from json.loads(group["answers"])
    finally:
        if started:
            ray.shutdown()


def _write(path: str, answers: Iterator[dict], total: int, done: int) -> None:
    """Appends each answer as it comes (a run cut short leaves complete rows to resume from)."""
    with open(path, "a", encoding="utf-8") as out, progress(total, "batch", unit="row") as bar:
        bar.update(done)
        for answer in answers:
            out.write(json.dumps(answer, ensure_ascii=False) + "\n")
            out.flush()
            bar.update(1)
