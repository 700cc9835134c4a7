"""ferrollama on a local Ray instance (2 CPUs, one for the module's tests): `batch --ray` answers
every row once, in order, with the in-process run's greedy texts, also when a worker is killed
mid-run; ferrollama.ray.batch composes with a user's Dataset; `serve --ray --replicas 2` answers
the openai client, and concurrent requests land on both replicas."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import ray

from conftest import model_path
from test_batch import batch, read_jsonl, write_jsonl
from test_cli_generate import QWEN

import ferrollama.ray as flray

with warnings.catch_warnings():  # Ray Serve's models use pydantic's deprecated Field keywords
    warnings.simplefilter("ignore", DeprecationWarning)
    from ray import serve
from ferrollama.llama import SamplingParams

PROMPTS = ["def add(a, b):", "SELECT name FROM", "# Sort a list in Python\n", "fn main() {",
           "<!DOCTYPE html>", "import numpy as np\n", "The three primary colors are", "class Stack:"]


@pytest.fixture(scope="module")
def cluster():
    """One local Ray instance for the module; its address for the subprocesses that join it."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def ferrollama_cli(*args) -> list[str]:
    return [sys.executable, "-m", "ferrollama.cli", *map(str, args)]


@pytest.fixture(scope="module")
def rows_in_process(tmp_path_factory):
    """The rows and their answers from an in-process run (greedy, 16 tokens, groups of 2 rows)."""
    tmp = tmp_path_factory.mktemp("in-process")
    rows = [{"id": f"p{k}", "prompt": p} for k, p in enumerate(PROMPTS)]
    src, out = write_jsonl(tmp / "in.jsonl", rows), tmp / "out.jsonl"
    assert batch("-i", src, "-o", out, "-n", 16, "-np", 2, "--group-size", 2) == 0
    return src, read_jsonl(out)


def test_batch_on_two_workers_answers_every_row_once_as_in_process(cluster, rows_in_process, tmp_path):
    src, expected = rows_in_process
    out = tmp_path / "out.jsonl"
    assert batch("-i", src, "-o", out, "-n", 16, "-np", 2, "-t", 1, "--group-size", 2, "--ray", "--workers", 2) == 0
    assert read_jsonl(out) == expected
    assert [a["id"] for a in expected] == [f"p{k}" for k in range(len(PROMPTS))]
    assert all(a["usage"]["completion_tokens"] > 0 for a in expected)


def ray_processes(title: bytes = b"ray::") -> list[int]:
    """The pids of the live processes whose title holds title (Ray titles actors after their class)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and title in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return found


def map_workers() -> list[int]:
    """The pids of the live Ray Data actors."""
    return ray_processes(b"MapWorker")


def test_a_worker_killed_mid_run_has_its_rows_retried(cluster, rows_in_process, tmp_path):
    """`batch --ray --address` joins the cluster; one of its two workers is killed (SIGKILL) once
    the first answers are written: Ray restarts it and runs its rows again, and the output is
    the in-process run's, each id once, in order."""
    src, expected = rows_in_process
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(ferrollama_cli("batch", "-m", model_path(QWEN), "--temp", 0, "-t", 1, "-c", 512,
                                           "-i", src, "-o", out, "-n", 16, "-np", 2, "--ray", "--address", cluster,
                                           "--workers", 2, "--group-size", 2),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and out.read_text().count("\n") >= 1):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        victims = map_workers()
        assert len(victims) == 2
        n_written = out.read_text().count("\n")
        os.kill(victims[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert n_written < len(PROMPTS)     # the kill came while rows were still being answered
    assert read_jsonl(out) == expected


def test_the_python_api_composes_with_a_dataset(cluster):
    """ferrollama.ray.batch on a user's Dataset of chat messages (as Arrow gives them back) keeps
    the rows' own columns and adds the answers, as the in-process BatchGenerator gives them for
    the same batch (one block of two rows, one batch)."""
    from ferrollama.batch import BatchGenerator, BatchOptions

    conversations = [[{"role": "user", "content": "Name a fruit."}],
                     [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Sky color?"}]]
    greedy = SamplingParams(temp=0.0)
    ds = ray.data.from_items([{"row": k, "messages": m} for k, m in enumerate(conversations)], override_num_blocks=1)
    got = flray.batch(ds, str(model_path(QWEN)), max_tokens=8, sampling=greedy, chat=True, workers=1, n_seq=2,
                      n_ctx=512, rows_per_batch=2).take_all()
    options = BatchOptions(max_tokens=8, sampling=greedy, chat=True, n_seq=2, n_ctx=512, n_threads=1)
    want = BatchGenerator(model_path(QWEN), options).run([{"id": k, "messages": m} for k, m in enumerate(conversations)])
    got.sort(key=lambda r: r["row"])
    assert [r["text"] for r in got] == [w["text"] for w in want]
    assert [int(r["completion_tokens"]) for r in got] == [w["usage"]["completion_tokens"] for w in want]
    assert [r["finish_reason"] for r in got] == [w["finish_reason"] for w in want]


def test_a_prompt_too_long_on_a_worker_is_named(cluster, tmp_path, capsys):
    """A prompt longer than a sequence's context, found on a Ray worker: one line naming the row."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "short", "prompt": "hi"}, {"id": "long", "prompt": "word " * 400}])
    assert batch("-i", src, "-o", tmp_path / "out.jsonl", "-n", 4, "-c", 256, "--ray", "--workers", 1) == 1
    err = capsys.readouterr().err
    assert 'error: row "long": the prompt has 401 tokens; a slot\'s context holds 256' in err, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(cluster):
    """`serve --ray --replicas 2 --address` joined to the cluster; its URL. Ctrl-C at the end
    removes the app from the cluster (the process exits 0). Its replicas hold both CPUs: the
    tests using it come last."""
    port = free_port()
    # Ctrl-C as a terminal sends it: the child starts with SIGINT's default action even if an
    # earlier test of this process left it ignored (an ignored SIGINT is inherited across exec,
    # and Python then installs no KeyboardInterrupt handler)
    proc = subprocess.Popen(ferrollama_cli("serve", "-m", model_path(QWEN), "--ray", "--replicas", 2, "--address",
                                           cluster, "--port", port, "-t", 1, "-c", 1024, "-np", 2, "-a", "qwen"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            # Ray Serve's shutdown gives each replica up to its 20 s of graceful shutdown, and a
            # loaded machine stretched the whole past 60 s once (the replacement replica of the
            # last test): a bound for a hang, not a timing
            _, err = proc.communicate(timeout=180)
        finally:
            proc.kill()
            serve.shutdown()
    assert proc.returncode == 0, err


def ask(url: str, k: int, max_tokens: int = 8) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=120,
                      json={"model": "qwen", "prompt": PROMPTS[k % len(PROMPTS)], "max_tokens": max_tokens,
                            "temperature": 0})


def test_serve_on_two_replicas(served):
    """The openai client is answered as by `ferrollama serve`, and concurrent requests land on
    both replicas."""
    client = openai.OpenAI(base_url=served + "/v1", api_key="none", max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "Say hi."}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].message.content and chat.usage.completion_tokens <= 8
    assert [m.id for m in client.models.list().data] == ["qwen"]

    def replica_of(k: int) -> str:
        raw = client.completions.with_raw_response.create(model="qwen", prompt=PROMPTS[k % len(PROMPTS)],
                                                          max_tokens=8, temperature=0)
        assert raw.parse().usage.completion_tokens == 8
        return raw.headers[flray.REPLICA_HEADER]

    with ThreadPoolExecutor(8) as pool:
        replicas = set(pool.map(replica_of, range(16)))
    assert len(replicas) == 2


def cpu_ticks(pid: int) -> int:
    """A process's CPU time so far (user + system clock ticks, /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def serve_replicas() -> list[int]:
    """The pids of the live Ray Serve replicas (titled ray::ServeReplica:APP:DEPLOYMENT)."""
    return ray_processes(b"ServeReplica:ferrollama")


def test_a_killed_replica_is_replaced_and_the_others_go_on(served):
    """A replica killed (SIGKILL) while 8 requests run: those it held fail with 5xx, the others are
    answered; Ray Serve starts a new replica, and requests are answered by two replicas again."""
    before = {ask(served, k).headers[flray.REPLICA_HEADER] for k in range(4)}
    replicas = serve_replicas()
    assert len(replicas) == 2
    cpu_before = {pid: cpu_ticks(pid) for pid in replicas}
    with ThreadPoolExecutor(8) as pool:
        running = [pool.submit(ask, served, k, 48) for k in range(8)]
        time.sleep(2)
        # the replica that has worked most since: it holds requests (a loaded machine may route
        # them all to one)
        victim = max(replicas, key=lambda pid: cpu_ticks(pid) - cpu_before[pid])
        os.kill(victim, signal.SIGKILL)
        statuses = [f.result().status_code for f in running]
    assert all(s == 200 or s >= 500 for s in statuses), statuses
    assert 200 in statuses and any(s >= 500 for s in statuses), statuses
    deadline = time.monotonic() + 120
    while True:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda k: ask(served, k), range(8)))
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
        seen = {a.headers[flray.REPLICA_HEADER] for a in answers}
        if len(seen) == 2 and seen - before:
            break
        assert time.monotonic() < deadline, f"no new replica answered: {seen}"
        time.sleep(0.5)


def wait_healthy(url: str, proc: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError("the Ray Serve app did not become healthy")
