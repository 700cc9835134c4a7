"""Load test: `ferrollama serve` beside llama-cpp-python's server (llama_cpp.server), same model,
same threads, in one run, alternating servers at each concurrency level.

Each of C clients (1, 4, 8, 16) sends streamed chat completions back to back for a fixed window
(requests started in the window finish); reported per server and level: aggregate generated
tokens/s (tokens over the wall time until the last request ends), p50/p95 time to first token,
and requests done. Loopback only; bounded in count (window) and time.

    python benches/serve_load.py [--llama-cpp-python /work/bench-venv/bin/python] [--window 20]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import model_path  # noqa: E402

TOPICS = ["a lighthouse keeper", "a lost robot", "the first snow", "a city under the sea", "an old clock",
          "a dragon who bakes", "a train at midnight", "a garden on Mars", "a silent violin", "a paper boat",
          "a library of maps", "a fox and a crow", "the last bus", "a kite in a storm", "a glass forest",
          "a whale's song", "a tiny volcano", "a secret tunnel", "a painter's cat", "a river of stars"]


@dataclass
class Level:
    server: str
    clients: int
    tokens: int = 0
    requests: int = 0
    errors: int = 0
    ttft: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def pct(self, q: float) -> float:
        if not self.ttft:
            return float("nan")
        xs = sorted(self.ttft)
        return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server at {url} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server at {url} did not start")


def start_ferrollama(model: Path, threads: int, slots: int, ctx_per_slot: int) -> tuple[str, subprocess.Popen]:
    port = free_port()
    cmd = [sys.executable, "-m", "ferrollama.cli", "serve", "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-np", str(slots), "-c", str(slots * ctx_per_slot), "-t", str(threads)]
    return f"http://127.0.0.1:{port}", subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_llama_cpp_python(python: str, model: Path, threads: int, n_ctx: int) -> tuple[str, subprocess.Popen]:
    port = free_port()
    cmd = [python, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
           "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx), "--verbose", "False",
           # its default lets a new request cut the running stream short; serve every request instead
           "--interrupt_requests", "False"]
    return f"http://127.0.0.1:{port}", subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def one_request(client: httpx.AsyncClient, url: str, k: int, max_tokens: int, level: Level) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": f"Write a long story about {TOPICS[k % len(TOPICS)]}."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first, tokens = None, 0
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                level.errors += 1
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    tokens += 1
                    first = first or time.perf_counter()
    except httpx.HTTPError:
        level.errors += 1
        return
    level.requests += 1
    level.tokens += tokens
    if first is not None:
        level.ttft.append(first - t0)


async def run_level(url: str, name: str, clients: int, window: float, max_tokens: int) -> Level:
    level = Level(name, clients)
    deadline = time.perf_counter() + window

    async def client_loop(c: int, client: httpx.AsyncClient) -> None:
        k = c
        while time.perf_counter() < deadline:
            await one_request(client, url, k, max_tokens, level)
            k += clients

    limits = httpx.Limits(max_connections=clients + 2)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(client_loop(c, client) for c in range(clients)))
        level.seconds = time.perf_counter() - t0
    return level


def table(levels: list[Level]) -> str:
    rows = ["| server | clients | requests | tokens | tokens/s | TTFT p50 (s) | TTFT p95 (s) | errors |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for lv in levels:
        rows.append(f"| {lv.server} | {lv.clients} | {lv.requests} | {lv.tokens} | {lv.tokens_per_second:.1f} | "
                    f"{lv.pct(0.5):.2f} | {lv.pct(0.95):.2f} | {lv.errors} |")
    return "\n".join(rows)


def ratios(levels: list[Level]) -> str:
    by = {(lv.server, lv.clients): lv.tokens_per_second for lv in levels}
    out = []
    for n in sorted({lv.clients for lv in levels}):
        fl, lcp = by.get(("ferrollama", n)), by.get(("llama-cpp-python", n))
        one = by.get(("ferrollama", 1))
        parts = [f"{n} clients:"]
        if fl and one:
            parts.append(f"ferrollama {fl / one:.2f}x its 1-client tokens/s")
        if fl and lcp:
            parts.append(f"{fl / lcp:.2f}x llama-cpp-python's server")
        out.append(" ".join(parts))
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--llama-cpp-python", default="/work/bench-venv/bin/python",
                    help="a Python with llama-cpp-python[server] ('' to skip it)")
    ap.add_argument("--clients", default="1,4,8,16")
    ap.add_argument("--window", type=float, default=30.0, help="seconds of new requests per level")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--out", default=None, help="also write the markdown here")
    args = ap.parse_args()

    model = model_path(args.model, args.model_dir)
    counts = [int(c) for c in args.clients.split(",")]
    servers = {"ferrollama": start_ferrollama(model, args.threads, args.slots, 1024)}
    if args.llama_cpp_python:
        servers["llama-cpp-python"] = start_llama_cpp_python(args.llama_cpp_python, model, args.threads, 2048)
    levels: list[Level] = []
    try:
        for url, proc in servers.values():
            wait_ready(url, proc)
        for name, (url, _) in servers.items():  # warm-up: load pages, fill caches
            asyncio.run(run_level(url, name, 1, 0.1, 4))
        for i, n in enumerate(counts):
            order = list(servers.items()) if i % 2 == 0 else list(reversed(servers.items()))
            for name, (url, _) in order:
                lv = asyncio.run(run_level(url, name, n, args.window, args.max_tokens))
                print(f"{name:17s} {n:2d} clients: {lv.tokens_per_second:6.1f} tok/s, TTFT p50 {lv.pct(0.5):.2f}s "
                      f"p95 {lv.pct(0.95):.2f}s, {lv.requests} requests, {lv.errors} errors", flush=True)
                levels.append(lv)
    finally:
        for _, proc in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    levels.sort(key=lambda lv: (lv.server != "ferrollama", lv.clients))
    head = (f"{args.model}, {args.threads} threads, {args.max_tokens} tokens per request, window {args.window:.0f} s, "
            f"ferrollama -np {args.slots}; {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    report = f"{head}\n\n{table(levels)}\n\n{ratios(levels)}\n"
    print("\n" + report)
    if args.out:
        Path(args.out).write_text(report)


if __name__ == "__main__":
    main()
