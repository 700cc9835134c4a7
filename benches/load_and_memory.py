#!/usr/bin/env python3
"""Load time, peak memory and long-context generation: ferrollama vs llama.cpp.

1. Load to first decode, and peak RSS. Every measurement runs in a fresh subprocess
   (one engine, one model), so the RSS is that engine's alone. The child imports the
   engine, then times: load the model (mmap) + create a context (n_ctx --n-ctx, f16 cache)
   + decode one token; then (ferrollama) waits for the repacking thread and decodes 8 more
   tokens. It reports VmHWM (peak RSS) at the end and, at the end, RssAnon
   (heap: KV cache, compute buffers, weights copied out of the mapping) and RssFile (touched pages of the
   mmap'd GGUF and of the shared libraries). A warm-up round (not counted) puts the GGUF
   in the page cache; the engines then alternate round by round.
2. Long-context generation: tg128 on an empty cache vs tg128 after --depth tokens
   (llama-bench ``-n 128 -d 4096``: n_ctx = depth + 128, the depth prompt decoded once,
   each rep removes the previous rep's tokens). In this process, engines alternating rep
   by rep, as in compare.py.

  python benches/load_and_memory.py [--models ...] [--reps 5] [--threads 2] [--depth 4096]
         [--parts load,longctx] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchlib as B  # noqa: E402
import compare as C  # noqa: E402


# --------------------------------------------------------------------------- child


def proc_status() -> dict:
    """VmRSS, VmHWM, RssAnon, RssFile of this process, in MiB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(rest.split()[0]) / 1024.0
    return out


def child(engine_name: str, path: str, n_ctx: int, threads: int) -> dict:
    t0 = time.perf_counter()
    engine = B.ENGINES[engine_name]()
    t_import = time.perf_counter() - t0
    before = proc_status()
    t0 = time.perf_counter()
    model = engine.load(Path(path), settled=False)
    ctx = model.context(n_ctx=n_ctx, n_batch=min(n_ctx, 2048), n_ubatch=512, n_seq_max=1,
                        n_threads=threads, kv_unified=True)
    batch = ctx.batch(1, 1)
    batch.fill_one(model.bos if model.add_bos else 0, 0, 0, True)
    ctx.decode(batch)
    t_first = time.perf_counter() - t0
    first = proc_status()
    # Steady state: ferrollama repacks its weights on a thread after loading (llama.cpp
    # inside the load); the peak counts once that is done and a few more tokens ran.
    if hasattr(model, "settle"):
        model.settle()
    for pos in range(1, 9):
        batch.fill_one(0, pos, 0, True)
        ctx.decode(batch)
    after = proc_status()
    # The KV cache's bytes (ferrollama reports them; llama.cpp's cache has the same cells).
    kv = getattr(getattr(ctx, "ctx", None), "kv", None)
    kv_mib = kv.nbytes / 2**20 if kv is not None else None
    return {"engine": engine_name, "kv_mib": kv_mib, "import_s": t_import, "load_to_first_decode_s": t_first,
            "rss_after_import_mib": before.get("VmRSS"), "peak_rss_mib": after.get("VmHWM"),
            "peak_rss_first_decode_mib": first.get("VmHWM"),
            "rss_anon_mib": after.get("RssAnon"), "rss_file_mib": after.get("RssFile"),
            "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def run_child(engine: str, path: Path, args) -> dict:  # noqa: ANN001
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", engine, str(path),
           "--n-ctx", str(args.n_ctx), "--threads", str(args.threads)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"engine": engine, "error": (r.stderr or r.stdout).strip().splitlines()[-1:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- parts


def part_load(models, engines: list[str], args) -> tuple[str, list]:  # noqa: ANN001
    rows, raw = [], []
    for short, path in models:
        runs = {e: [] for e in engines}
        errors = {}
        for e in engines:  # warm-up: page cache, not counted
            res = run_child(e, path, args)
            if "error" in res:
                errors[e] = " ".join(res["error"])
        live = [e for e in engines if e not in errors]
        if args.wait_quiet:
            B.wait_until_quiet(args.wait_quiet)
        foreign = B.ForeignLoad()
        for rep in range(args.reps):
            for e in (live if rep % 2 == 0 else live[::-1]):
                res = run_child(e, path, args)
                if "error" in res:
                    errors[e] = " ".join(res["error"])
                    continue
                runs[e].append(res)
        raw.append({"model": short, "runs": runs, "errors": errors, "foreign_load_cores": foreign.cores()})
        kv = [x["kv_mib"] for rs in runs.values() for x in rs if x.get("kv_mib") is not None]
        # The goal's budget: peak RSS <= model file + KV cache + 15 %.
        budget = f"{(Path(path).stat().st_size / 2**20 + kv[0]) * 1.15:.0f}" if kv else "?"
        for e in engines:
            if e in errors and not runs[e]:
                rows.append([short, e, f"error: {errors[e][:80]}", "", "", "", "", ""])
                continue
            r = runs[e]
            med = lambda k: statistics.median(x[k] for x in r)  # noqa: E731
            spread = lambda k: statistics.stdev(x[k] for x in r) if len(r) > 1 else 0.0  # noqa: E731
            rows.append([short, e,
                         f"{med('load_to_first_decode_s') * 1000:.0f} ± {spread('load_to_first_decode_s') * 1000:.0f}",
                         f"{med('peak_rss_mib'):.0f}", budget, f"{med('rss_anon_mib'):.0f}", f"{med('rss_file_mib'):.0f}",
                         f"{med('rss_after_import_mib'):.0f}"])
    table = B.markdown_table(
        ["model", "engine", "load → first decode (ms)", "peak RSS (MiB)", "budget (MiB)", "RssAnon (MiB)", "RssFile (MiB)",
         "RSS after import (MiB)"], rows)
    note = (f"n_ctx {args.n_ctx}, f16 cache, mmap, {args.threads} threads; median ± stdev of {args.reps} fresh "
            "processes per engine (warm page cache). Budget: the goal's model file + KV cache + 15 %. "
            "Peak RSS, RssAnon and RssFile are read after the weights' "
            "repacking finished (ferrollama repacks on a thread after loading) and 8 more tokens were decoded. "
            "CPU used by other processes (cores): " + ", ".join(f"{r['model']} {r['foreign_load_cores']:.2f}" for r in raw))
    return table + "\n\n" + note, raw


def part_longctx(models, engine_objs: list, args) -> tuple[str, list]:  # noqa: ANN001
    ns = argparse.Namespace(reps=args.reps, threads=args.threads, seed=args.seed, kv_unified=True,
                            verbose=args.verbose, wait_quiet=args.wait_quiet)
    rows: list[C.Row] = []
    info: dict = {}
    for short, path in models:
        loaded = {e.name: e.load(path) for e in engine_objs}
        for test in (C.GenTest(128, 0), C.GenTest(128, args.depth)):
            print(f"{short}: {test.name} ...", file=sys.stderr)
            rows += C.run_test(test, loaded, ns, short, info)
        for m in loaded.values():
            m.close()
    names = [e.name for e in engine_objs]
    header = ["model", "test"] + [f"{e} t/s" for e in names]
    both = set(names) == set(C.ENGINE_ORDER)
    if both:
        header.append("ferrollama / llama.cpp")
    body = []
    for r in rows:
        line = [r.model, r.test] + [r.samples[e].cell() for e in names]
        if both:
            line.append(C.fmt_ratio(r.samples["ferrollama"], r.samples["llama.cpp"]))
        body.append(line)
    # slowdown at depth, per engine
    slow = []
    for i in range(0, len(rows) - 1, 2):
        for e in names:
            a, b = rows[i].samples[e], rows[i + 1].samples[e]
            if a.values and b.values:
                slow.append(f"{rows[i].model} {e}: {b.median / a.median:.2f}")
    text = B.markdown_table(header, body) + "\n\n" + (
        f"median ± stdev of {args.reps} reps, engines alternating; tg at depth {args.depth} / tg at depth 0: " + "; ".join(slow)
        + "\nCPU used by other processes (cores): " + ", ".join(f"{k} {v:.2f}" for k, v in info.get("foreign_load_cores", {}).items()))
    return text, [{"model": r.model, "test": r.test, "engines": {e: s.as_dict() for e, s in r.samples.items()}} for r in rows]


def main(argv=None) -> int:  # noqa: ANN001
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        p = argparse.ArgumentParser()
        p.add_argument("--child", nargs=2)
        p.add_argument("--n-ctx", type=int, default=4096)
        p.add_argument("--threads", type=int, default=2)
        a = p.parse_args(argv)
        print(json.dumps(child(a.child[0], a.child[1], a.n_ctx, a.threads)))
        return 0

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(B.MODELS))
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096, help="context size of the load test")
    ap.add_argument("--depth", type=int, default=4096, help="tokens already in the cache for the long-context tg")
    ap.add_argument("--parts", default="load,longctx")
    ap.add_argument("--engines", default="llama.cpp,ferrollama")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--prio", type=int, choices=[0, 1, 2, 3], default=0,
                    help="llama-bench's --prio: 0 normal, 1/2/3 nice -5/-10/-20 for this process and its threads")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                    help="before each measurement, wait up to SECONDS for other processes to go below 0.2 cores")
    ap.add_argument("--json", default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)

    parts = set(args.parts.split(","))
    nice = B.set_priority(args.prio)  # the children inherit it
    engine_objs, missing = B.open_engines([e.strip() for e in args.engines.split(",") if e.strip()])
    if not engine_objs:
        raise SystemExit("no engine available: " + "; ".join(missing.values()))
    names = [e.name for e in engine_objs]
    models = B.resolve_models(args.models, args.model_dir)
    doc = {"settings": {k: v for k, v in vars(args).items() if k != "json"}, "machine": B.machine_info(),
           "missing_engines": missing, "nice": nice}
    out = []
    if "load" in parts:
        text, raw = part_load(models, names, args)
        out += ["## Load to first decode, peak RSS", "", text, ""]
        doc["load"] = raw
    if "longctx" in parts:
        text, raw = part_longctx(models, engine_objs, args)
        out += [f"## tg128 at depth 0 vs {args.depth}", "", text, ""]
        doc["longctx"] = raw
    doc["machine"]["loadavg_end"] = os.getloadavg()
    doc["markdown"] = "\n".join(out)
    print(doc["markdown"])
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
