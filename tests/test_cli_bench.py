"""`ferrollama bench`: llama-bench's tests, table and JSON."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).parent / "data"
TINY = DATA / "models" / "tiny-llama-q8_0.gguf"


def ferrollama(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferrollama.cli", *map(str, args)], capture_output=True, text=True)


def test_json_results():
    r = ferrollama("bench", "-m", TINY, "-p", "32,64", "-n", 8, "-pg", "16,4", "-r", 3, "-o", "json", "-t", 1)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["n_prompt"], x["n_gen"]) for x in rows] == [(32, 0), (64, 0), (0, 8), (16, 4)]
    for x in rows:
        assert len(x["samples_ns"]) == len(x["samples_ts"]) == 3
        ts = [1e9 * (x["n_prompt"] + x["n_gen"]) / ns for ns in x["samples_ns"]]
        assert x["samples_ts"] == ts
        assert abs(x["avg_ts"] - statistics.fmean(ts)) < 1e-6 * x["avg_ts"]
        assert abs(x["stddev_ts"] - statistics.stdev(ts)) < 1e-6 * max(x["avg_ts"], 1)
        assert x["n_threads"] == 1 and x["type_k"] == "f16" and x["model_type"].startswith("llama ")


def test_markdown_table():
    r = ferrollama("bench", "-m", TINY, "-p", 32, "-n", 4, "-r", 2, "-ctk", "f32", "-ub", "16")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["model", "size", "params", "backend", "threads", "n_ubatch", "type_k", "test", "t/s"]
    assert set(lines[1]) <= set("|-: ")
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:]]
    assert [row[7] for row in rows] == ["pp32", "tg4"]
    for row in rows:
        mean, sd = row[8].split(" ± ")
        assert float(mean) > 0 and float(sd) >= 0
        assert row[1].endswith("MiB") and row[2].endswith(" M") and row[3] == "CPU"
        assert row[5] == "16" and row[6] == "f32"


def test_bad_values():
    r = ferrollama("bench", "-m", TINY, "-p", "1,x")
    assert r.returncode == 1 and "comma-separated integers" in r.stderr and r.stderr.count("\n") == 1
    r = ferrollama("bench", "-m", TINY, "-p", 0, "-n", 0)
    assert r.returncode == 1 and "nothing to run" in r.stderr


def test_progress_bar_on_a_terminal_only():
    from test_cli_generate import read_until, spawn, wait

    piped = ferrollama("bench", "-m", TINY, "-p", 16, "-n", 0, "-r", 3)
    assert piped.returncode == 0 and "run/s" not in piped.stderr and "%|" not in piped.stderr
    pid, fd = spawn(["bench", "-m", TINY, "-p", 16, "-n", 0, "-r", 3])
    try:
        out = read_until(fd, r"pp16 \|")
        assert "bench:" in out and "run" in out
        assert wait(pid, fd) == 0
    finally:
        import os

        os.close(fd)


def test_depth_runs_each_test_after_that_many_tokens():
    r = ferrollama("bench", "-m", TINY, "-p", 16, "-n", 4, "-d", "0,24", "-r", 2, "-o", "json", "-t", 1)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["n_depth"], x["n_prompt"], x["n_gen"]) for x in rows] == [(0, 16, 0), (0, 0, 4), (24, 16, 0), (24, 0, 4)]
    md = ferrollama("bench", "-m", TINY, "-p", 16, "-n", 0, "-d", 24, "-r", 1)
    assert md.returncode == 0, md.stderr
    assert "pp16 @ d24" in md.stdout


def test_depth_is_filled_once_then_restored_from_the_sequence_state():
    import random

    import ferrollama as fl
    from ferrollama.cli.bench import Bench, Instance

    model = fl.Model(str(TINY))
    bench = Bench(model, random.Random(1))
    inst = Instance(n_batch=64, n_ubatch=32, n_threads=1, type_k="f16", type_v="f16", n_depth=40)
    ctx = fl.Context(model, n_ctx=64, n_batch=64, n_ubatch=32)
    bench.fill_depth(ctx, inst)
    assert ctx.kv.seq_pos_max(0) == 39
    saved = bench.depth_state
    ctx.kv.clear()
    bench.fill_depth(ctx, inst)
    assert ctx.kv.seq_pos_max(0) == 39 and bench.depth_state is saved  # restored, not decoded again
    bench.prompt(ctx, 16, inst.n_batch)
    assert ctx.kv.seq_pos_max(0) == 55
