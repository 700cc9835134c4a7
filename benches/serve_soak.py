"""Soak: 500 mixed requests against `ferrollama serve` (loopback, 8 at a time): good completions,
chats (plain and streamed) and embeddings, malformed bodies, and clients that hang up mid-stream
or stop waiting. Afterwards the server must be healthy, every slot idle, and its resident memory
within 5 % of what it was after warm-up (the first 100 requests).

    python benches/serve_soak.py [--requests 500] [--concurrency 8]

Exit status 0 when every check holds; the figures are printed either way.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import model_path  # noqa: E402
from serve_load import start_ferrollama, wait_ready  # noqa: E402

MALFORMED = [
    ("/v1/chat/completions", b"{not json"),
    ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}).encode()),
    ("/v1/completions", json.dumps({"prompt": "hi " * 2000}).encode()),
    ("/v1/completions", json.dumps({"prompt": "hi", "grammar": "root ::= ("}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}], "response_format":
                                         {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}}).encode()),
    ("/v1/completions", json.dumps({"prompt": "hi", "unknown_field": 1}).encode()),
]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def good(client: httpx.AsyncClient, k: int) -> str:
    kind = k % 4
    if kind == 0:
        r = await client.post("/v1/completions", json={"prompt": f"Item {k}:", "max_tokens": 8})
    elif kind == 1:
        r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": f"Say {k}."}],
                                                            "max_tokens": 8})
    elif kind == 2:
        r = await client.post("/v1/embeddings", json={"input": [f"text {k}", "another"]})
    else:
        body = {"messages": [{"role": "user", "content": f"Count to {k}."}], "max_tokens": 8, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        return "ok" if r.status_code == 200 and lines[-1] == "data: [DONE]" else f"stream {r.status_code}"
    return "ok" if r.status_code == 200 else f"good {r.status_code}: {r.text[:200]}"


async def malformed(client: httpx.AsyncClient, k: int) -> str:
    path, body = MALFORMED[k % len(MALFORMED)]
    r = await client.post(path, content=body, headers={"Content-Type": "application/json"})
    shaped = r.headers.get("content-type", "").startswith("application/json") and set(r.json().get("error", {})) == {
        "message", "type", "code"}
    return "ok" if r.status_code == 400 and shaped else f"malformed {r.status_code}: {r.text[:200]}"


async def hang_up(client: httpx.AsyncClient, k: int) -> str:
    body = {"prompt": f"Story {k}:", "max_tokens": 300, "stream": k % 2 == 0}
    if body["stream"]:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break  # leave after the first token
        return "ok" if r.status_code == 200 else f"hang-up {r.status_code}"
    try:
        await client.post("/v1/completions", json=body, timeout=0.5)
    except httpx.ReadTimeout:
        return "ok"
    return "hang-up answered"


async def one(client: httpx.AsyncClient, k: int) -> str:
    kind = k % 10
    if kind < 6:
        return await good(client, k)
    if kind < 8:
        return await malformed(client, k)
    return await hang_up(client, k)


async def soak(url: str, pid: int, n: int, concurrency: int, warmup: int) -> tuple[list[str], list[int]]:
    results: list[str] = [""] * n
    rss: list[int] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for k in range(n):
        queue.put_nowait(k)
    done = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal done
        while not queue.empty():
            k = queue.get_nowait()
            try:
                results[k] = await one(client, k)
            except httpx.HTTPError as e:
                results[k] = f"transport {type(e).__name__}"
            done += 1
            if done == warmup or done % 50 == 0:
                rss.append(rss_kib(pid))

    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return results, rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()

    url, proc = start_ferrollama(model_path(args.model, args.model_dir), args.threads, 4, 1024)
    try:
        wait_ready(url, proc)
        t0 = time.perf_counter()
        results, rss = asyncio.run(soak(url, proc.pid, args.requests, args.concurrency, args.warmup))
        seconds = time.perf_counter() - t0
        time.sleep(1.0)  # the last hang-ups reach the scheduler at its next step
        health = httpx.get(url + "/health").json()
        slots = httpx.get(url + "/slots").json()
        metrics = httpx.get(url + "/metrics").text
        final_rss = rss_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    failures = [(k, r) for k, r in enumerate(results) if r != "ok"]
    base = rss[0]
    growth = (final_rss - base) / base
    print(f"{args.requests} requests in {seconds:.0f} s, {len(failures)} unexpected answers")
    for k, r in failures[:10]:
        print(f"  request {k}: {r}")
    print(f"RSS after warm-up {base / 1024:.1f} MiB, then every 50: "
          + ", ".join(f"{x / 1024:.1f}" for x in rss[1:]) + f"; at the end {final_rss / 1024:.1f} MiB ({growth:+.1%})")
    print(f"health {health}; slot states {[s['state'] for s in slots]}")
    print("\n".join(line for line in metrics.splitlines() if line.startswith(("ferrollama_jobs", "ferrollama_requests_waiting",
                                                                              "ferrollama_slots"))))
    ok = (not failures and health["status"] == "ok" and health["slots_processing"] == 0
          and all(s["state"] == "idle" for s in slots) and abs(growth) <= 0.05)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
