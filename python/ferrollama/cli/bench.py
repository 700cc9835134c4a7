"""``ferrollama bench``: llama-bench's tests on random tokens.

pp N decodes an N-token prompt in batches of n_batch; tg N decodes N tokens one at a time;
pg pp,tg does both. With -d D each test runs after D tokens already in the context (filled
once, untimed, then restored from the sequence's saved state before each repetition, as
llama-bench does). Each test is repeated -r times after a warmup; the result is the mean ± the
sample standard deviation of the tokens per second, printed as llama-bench's markdown table or
as its JSON. List options take comma-separated values and every combination is run.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

from .._core import Batch, Context, Model, StateError
from ..generation.tokens import add_bos_of
from .common import (CLIError, cache_type, format_params, format_size, int_value, load_model, model_description,
                     progress)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected values >= 0, got {text!r}")
    return values


def _positive_list(text: str) -> list[int]:
    values = _int_list(text)
    if any(v == 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive values, got {text!r}")
    return values


def _pg_list(text: str) -> list[tuple[int, int]]:
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"-pg takes PP,TG, got {text!r}")
    pp, tg = _int_list(text)
    return [(pp, tg)]


def _cache_types(text: str) -> list[str]:
    return [cache_type(v) for v in text.split(",") if v]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", metavar="FNAME", help="the GGUF model (default: Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("-p", "--n-prompt", type=_int_list, action="append", metavar="N", help="prompt lengths (default: 512)")
    p.add_argument("-n", "--n-gen", type=_int_list, action="append", metavar="N", help="generation lengths (default: 128)")
    p.add_argument("-pg", type=_pg_list, action="append", metavar="PP,TG", help="prompt then generation (default: none)")
    p.add_argument("-d", "--n-depth", type=_int_list, action="append", metavar="N",
                   help="tokens already in the context before each test (default: 0)")
    p.add_argument("-r", "--repetitions", type=int_value, default=5, metavar="N", help="repetitions of each test (default: 5)")
    p.add_argument("-t", "--threads", type=_positive_list, action="append", metavar="N", help="threads (default: the physical cores)")
    p.add_argument("-b", "--batch-size", type=_positive_list, action="append", metavar="N", help="batch sizes (default: 2048)")
    p.add_argument("-ub", "--ubatch-size", type=_positive_list, action="append", metavar="N", help="micro-batch sizes (default: 512)")
    p.add_argument("-ctk", "--cache-type-k", type=_cache_types, action="append", metavar="T", help="K cache types (default: f16)")
    p.add_argument("-ctv", "--cache-type-v", type=_cache_types, action="append", metavar="T", help="V cache types (default: f16)")
    p.add_argument("-o", "--output", choices=("md", "json", "jsonl", "csv"), default="md", help="output format (default: md)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warmup runs")
    p.add_argument("--no-mmap", action="store_true", help="read the model into memory")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")


def _flat(values, default):
    return [v for chunk in values for v in chunk] if values else list(default)


@dataclass
class Instance:
    n_batch: int
    n_ubatch: int
    n_threads: int | None
    type_k: str
    type_v: str
    n_depth: int = 0


@dataclass
class Result:
    inst: Instance
    n_threads: int
    n_prompt: int
    n_gen: int
    samples_ns: list[int] = field(default_factory=list)
    test_time: str = ""

    @property
    def name(self) -> str:
        if self.n_prompt and self.n_gen:
            test = f"pp{self.n_prompt}+tg{self.n_gen}"
        else:
            test = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        return f"{test} @ d{self.inst.n_depth}" if self.inst.n_depth else test

    @property
    def samples_ts(self) -> list[float]:
        n = self.n_prompt + self.n_gen
        return [1e9 * n / t for t in self.samples_ns]


def _stdev(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


class Bench:
    def __init__(self, model: Model, rng: random.Random):
        self.model, self.rng = model, rng
        self.add_bos = add_bos_of(model)
        # sequence 0's state after the last depth filled: (depth, blob)
        self.depth_state: tuple[int, bytes] | None = None

    def _token(self, first: bool) -> int:
        if first and self.add_bos:
            return self.model.bos
        return self.rng.randrange(self.model.n_vocab)

    def prompt(self, ctx: Context, n_prompt: int, n_batch: int) -> None:
        done = 0
        while done < n_prompt:
            n = min(n_prompt - done, n_batch)
            tokens = [self._token(done == 0)] + [self._token(False) for _ in range(n - 1)]
            pos0 = ctx.kv.seq_pos_max(0) + 1
            ctx.decode(Batch.from_tokens(tokens, pos0=pos0, seq_id=0, logits="last"))
            done += n

    def gen(self, ctx: Context, n_gen: int) -> None:
        token = self._token(True)
        for _ in range(n_gen):
            ctx.decode(Batch.from_tokens([token], pos0=ctx.kv.seq_pos_max(0) + 1, seq_id=0, logits="last"))
            token = self._token(False)

    def run(self, ctx: Context, r: Result, reps: int, warmup: bool, bar) -> None:
        if warmup:
            if r.n_prompt:
                self.prompt(ctx, min(r.inst.n_batch, r.n_prompt, 32), r.inst.n_batch)
            if r.n_gen:
                self.gen(ctx, 1)
        r.test_time = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        for _ in range(reps):
            ctx.kv.clear()
            self.fill_depth(ctx, r.inst)
            t0 = time.perf_counter_ns()
            if r.n_prompt:
                self.prompt(ctx, r.n_prompt, r.inst.n_batch)
            if r.n_gen:
                self.gen(ctx, r.n_gen)
            r.samples_ns.append(time.perf_counter_ns() - t0)
            bar.update(1)


    def fill_depth(self, ctx: Context, inst: Instance) -> None:
        """Puts inst.n_depth tokens in the (cleared) context: the saved state of that depth if
        there is one, else a prompt, whose state is then saved."""
        if not inst.n_depth:
            return
        if self.depth_state and self.depth_state[0] == inst.n_depth:
            try:
                ctx.seq_state_set(self.depth_state[1], 0)
                return
            except StateError:  # a state this context cannot take: fill again, as llama-bench does
                ctx.kv.clear()
        self.prompt(ctx, inst.n_depth, inst.n_batch)
        self.depth_state = (inst.n_depth, ctx.seq_state_get(0))


def _tests(args: argparse.Namespace) -> list[tuple[int, int]]:
    tests = [(n, 0) for n in _flat(args.n_prompt, [512]) if n > 0]
    tests += [(0, n) for n in _flat(args.n_gen, [128]) if n > 0]
    tests += [pg for pg in _flat(args.pg, []) if pg[0] > 0 or pg[1] > 0]
    return tests


def _instances(args: argparse.Namespace) -> list[Instance]:
    combos = itertools.product(_flat(args.batch_size, [2048]), _flat(args.ubatch_size, [512]),
                               _flat(args.threads, [None]), _flat(args.cache_type_k, ["f16"]),
                               _flat(args.cache_type_v, ["f16"]), _flat(args.n_depth, [0]))
    return [Instance(*c) for c in combos]


# --- output -------------------------------------------------------------------------------------

def _columns(results: list[Result]) -> list[str]:
    """llama-bench shows the parameters that are not at their default values."""
    cols = ["model", "size", "params", "backend", "threads"]
    defaults = {"n_batch": 2048, "n_ubatch": 512, "type_k": "f16", "type_v": "f16"}
    cols += [k for k, d in defaults.items() if any(getattr(r.inst, k) != d for r in results)]
    return cols + ["test", "t/s"]


WIDTHS = {"model": -30, "size": 10, "params": 10, "backend": -10, "threads": 7, "type_k": -6, "type_v": -6,
          "test": 15, "t/s": 20}


def _cell(col: str, r: Result, model: Model, desc: str) -> str:
    ts = r.samples_ts
    return {
        "model": desc, "size": format_size(model.size), "params": format_params(model.n_params), "backend": "CPU",
        "threads": str(r.n_threads), "n_batch": str(r.inst.n_batch), "n_ubatch": str(r.inst.n_ubatch),
        "type_k": r.inst.type_k, "type_v": r.inst.type_v, "test": r.name,
        "t/s": f"{statistics.fmean(ts):.2f} ± {_stdev(ts):.2f}",
    }[col]


def print_markdown(results: list[Result], model: Model, out) -> None:
    desc, cols = model_description(model), _columns(results)
    width = lambda c: WIDTHS.get(c, -max(len(c), 10) if c.startswith("type") else max(len(c), 10))  # noqa: E731
    fmt = lambda c, v: v.ljust(-width(c)) if width(c) < 0 else v.rjust(width(c))  # noqa: E731
    print("| " + " | ".join(fmt(c, c) for c in cols) + " |", file=out)
    print("| " + " | ".join("-" * abs(width(c)) if width(c) < 0 else "-" * (abs(width(c)) - 1) + ":" for c in cols) + " |",
          file=out)
    for r in results:
        print("| " + " | ".join(fmt(c, _cell(c, r, model, desc)) for c in cols) + " |", file=out, flush=True)


def as_record(r: Result, model: Model, desc: str) -> dict:
    from .._core import __version__

    ts, ns = r.samples_ts, r.samples_ns
    return {
        "build_commit": f"ferrollama-{__version__}", "build_number": 0, "cpu_info": platform.processor() or platform.machine(),
        "gpu_info": "", "backends": "CPU", "model_filename": model.path, "model_type": desc, "model_size": model.size,
        "model_n_params": model.n_params, "n_batch": r.inst.n_batch, "n_ubatch": r.inst.n_ubatch,
        "n_threads": r.n_threads, "type_k": r.inst.type_k, "type_v": r.inst.type_v, "n_gpu_layers": 0,
        "use_mmap": True, "embeddings": False, "n_prompt": r.n_prompt, "n_gen": r.n_gen, "n_depth": r.inst.n_depth,
        "test_time": r.test_time, "avg_ns": int(statistics.fmean(ns)), "stddev_ns": int(_stdev([float(x) for x in ns])),
        "avg_ts": statistics.fmean(ts), "stddev_ts": _stdev(ts), "samples_ns": ns, "samples_ts": ts,
    }


def run(args: argparse.Namespace) -> int:
    if args.repetitions < 1:
        raise CLIError(f"-r must be at least 1, not {args.repetitions}")
    tests, instances = _tests(args), _instances(args)
    if not tests:
        raise CLIError("nothing to run: give -p, -n or -pg with a positive value")
    model = load_model(args)
    # The weights are repacked on a thread after loading (llama-bench's llama.cpp does it
    # inside the load): measure the steady state.
    model.wait_repacked()
    bench = Bench(model, random.Random(1))
    results: list[Result] = []
    total = len(tests) * len(instances) * args.repetitions
    with progress(total, "bench", unit="run") as bar:
        for inst in instances:
            for n_prompt, n_gen in tests:
                ctx = Context(model, n_ctx=inst.n_depth + n_prompt + n_gen, n_batch=inst.n_batch, n_ubatch=inst.n_ubatch,
                              n_threads=inst.n_threads, n_threads_batch=inst.n_threads,
                              type_k=inst.type_k, type_v=inst.type_v)
                r = Result(inst, ctx.n_threads, n_prompt, n_gen)
                bench.run(ctx, r, args.repetitions, not args.no_warmup, bar)
                results.append(r)
                if args.output == "jsonl":
                    print(json.dumps(as_record(r, model, model_description(model))), flush=True)
    _print(args.output, results, model)
    return 0


def _print(kind: str, results: list[Result], model: Model) -> None:
    out = sys.stdout
    if kind == "md":
        print_markdown(results, model, out)
    elif kind == "json":
        desc = model_description(model)
        json.dump([as_record(r, model, desc) for r in results], out, indent=2)
        print(file=out)
    elif kind == "csv":
        desc = model_description(model)
        records = [as_record(r, model, desc) for r in results]
        keys = [k for k in records[0] if k not in ("samples_ns", "samples_ts")]
        print(",".join(keys), file=out)
        for rec in records:
            print(",".join(_csv(rec[k]) for k in keys), file=out)


def _csv(value) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n') else text

