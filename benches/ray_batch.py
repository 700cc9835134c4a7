"""Batch generation throughput: `ferrollama batch` in process against `--ray` with 1 and 2 workers.

64 prompts (short code and text openings), greedy, -n N tokens each, -np 8 sequences in groups of
16 rows (4 Ray tasks), one engine thread per process/worker. Each configuration runs `ferrollama batch` as a
user would (a subprocess; the Ray runs join one local Ray instance started here with 2 CPUs, so
its start-up is not counted), rounds alternating between configurations. Reported: wall time,
rows/s, generated tokens/s, and the steady per-worker rate (rows/s of the in-process run after
its model is loaded) and the CPU seconds the decoding processes used (the CLI in process, the
Ray workers sampled from /proc): rows per CPU second is what a worker with a core of its own
does, whatever else the shared machine runs, and what the 1M-prompt estimate scales.

    python benches/ray_batch.py [--rounds 2] [--n-predict 32] [--out benches/results/DATE-ray]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import machine_info, markdown_table, model_path  # noqa: E402

STARTS = ["def fibonacci(n):", "SELECT customer_id, SUM(amount) FROM", "# Parse a CSV file in Python\n",
          "fn main() {", "<!DOCTYPE html>\n<html>", "import numpy as np\n", "The three primary colors are",
          "class LinkedList:", "Write a haiku about autumn:", "The capital of Japan is", "#include <stdio.h>\n",
          "Translate to French: good morning", "async function fetchUser(id) {", "The opposite of hot is",
          "Label the sentiment (positive/negative): I loved this film.", "git commit -m \""]
N_ROWS = 64


def prompts() -> list[dict]:
    return [{"id": k, "prompt": STARTS[k % len(STARTS)] + ("" if k < len(STARTS) else f" # {k}")}
            for k in range(N_ROWS)]


def worker_cpu_seconds() -> dict[int, float]:
    """CPU seconds so far of each live Ray Data actor process (titled after MapWorker)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"MapWorker" in (entry / "cmdline").read_bytes():
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return found


def run_batch(src: Path, out: Path, n_predict: int, extra: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process that decoded: the CLI in process, else the Ray
    workers, sampled until they end) of one `ferrollama batch` run (a fresh output file)."""
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "ferrollama.cli", "batch", "-m", str(model_path("qwen2.5-coder-0.5b", None)),
           "-i", str(src), "-o", str(out), "-n", str(n_predict), "--temp", "0", "-t", "1", "-c", "512",
           "-np", "8", "--group-size", "16", *extra]
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = worker_cpu_seconds()  # actors of an earlier run that Ray has not stopped yet
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    workers: dict[int, float] = {}
    while proc.poll() is None:
        workers.update(worker_cpu_seconds())
        time.sleep(0.2)
    seconds = time.perf_counter() - t0
    err = proc.stderr.read()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cli_cpu = children.ru_utime + children.ru_stime - children0.ru_utime - children0.ru_stime
    ray_cpu = sum(cpu - before.get(pid, 0.0) for pid, cpu in workers.items())
    return seconds, ray_cpu if "--ray" in extra else cli_cpu


def steady_rate(rows: list[dict], n_predict: int) -> tuple[float, float]:
    """Rows/s and generated tokens/s of one worker (one thread) once its model is loaded."""
    from ferrollama.batch import BatchGenerator, BatchOptions
    from ferrollama.llama import SamplingParams

    opts = BatchOptions(max_tokens=n_predict, sampling=SamplingParams(temp=0.0), n_seq=8, n_ctx=512, n_threads=1)
    gen = BatchGenerator(model_path("qwen2.5-coder-0.5b", None), opts)
    t0 = time.perf_counter()
    answers = list(gen.run_groups(rows, 16))
    seconds = time.perf_counter() - t0
    return len(rows) / seconds, sum(a["usage"]["completion_tokens"] for a in answers) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / f"{time.strftime('%Y-%m-%d')}-ray"))
    args = ap.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error")
    address = ray.get_runtime_context().gcs_address
    configs = {"in process": [], "ray, 1 worker": ["--ray", "--address", address, "--workers", "1"],
               "ray, 2 workers": ["--ray", "--address", address, "--workers", "2"]}
    rows = prompts()
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    loads: dict[str, list[float]] = {name: [] for name in configs}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in configs}  # the machine's 1-minute load after each run
    steady: list[tuple[float, float]] = []
    tokens = None
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
        texts: dict[str, list[str]] = {}
        for r in range(args.rounds):
            for name, extra in configs.items():
                out = Path(tmp) / "out.jsonl"
                wall, cpu = run_batch(src, out, args.n_predict, extra)
                seconds[name].append(wall)
                cpu_seconds[name].append(cpu)
                loads[name].append(os.getloadavg()[0])
                answers = [json.loads(line) for line in out.read_text().splitlines()]
                texts.setdefault(name, [a["text"] for a in answers])
                tokens = sum(a["usage"]["completion_tokens"] for a in answers)
                print(f"round {r + 1} {name}: {wall:.1f} s, {cpu:.1f} CPU s", flush=True)
            steady.append(steady_rate(rows, args.n_predict))
            print(f"round {r + 1} steady in-process worker: {steady[-1][0]:.2f} rows/s", flush=True)
    ray.shutdown()
    same = all(t == texts["in process"] for t in texts.values())
    report(args, seconds, cpu_seconds, loads, steady, tokens or 0, same)


def report(args: argparse.Namespace, seconds: dict[str, list[float]], cpu_seconds: dict[str, list[float]],
           loads: dict[str, list[float]],
           steady: list[tuple[float, float]],
           tokens: int, same: bool) -> None:
    best = {name: min(s) for name, s in seconds.items()}
    base = best["in process"]
    table = [[name, f"{best[name]:.1f}", f"{N_ROWS / best[name]:.2f}", f"{tokens / best[name]:.1f}",
              f"{base / best[name]:.2f}x", " / ".join(f"{s:.1f}" for s in seconds[name]),
              " / ".join(f"{x:.1f}" for x in loads[name]), f"{min(cpu_seconds[name]):.1f}",
              f"{N_ROWS / min(cpu_seconds[name]):.2f}"] for name in seconds]
    rate = max(r for r, _ in steady)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"machine": machine_info(), "rows": N_ROWS, "n_predict": args.n_predict, "generated_tokens": tokens,
              "seconds": seconds, "cpu_seconds": cpu_seconds, "loadavg_1min_after": loads, "steady_rows_per_s_per_worker": [r for r, _ in steady],
              "steady_tokens_per_s_per_worker": [t for _, t in steady], "greedy_texts_equal": same}
    (out / "ray_batch.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown_table(["configuration", "wall s (best)", "rows/s", "gen tok/s", "vs in process", "each round s",
                         "machine load after each", "CPU s (decoding processes)", "rows per CPU s"],
                        table)
    md += (f"\n\nsteady rate of one worker (1 thread, model loaded): {rate:.2f} rows/s "
           f"({max(t for _, t in steady):.1f} generated tok/s); greedy texts equal across configurations: {same}\n")
    (out / "ray_batch.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
