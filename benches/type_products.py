#!/usr/bin/env python3
"""Per-type matrix products, ferrollama against ggml's own kernels, in one run, alternating (issue 27).

For each tensor type and shape (896x4864: ffn_up/gate, 4864 rows of 896; 4864x896: ffn_down, 896
rows of 4864; types of 256-value blocks, which cannot hold rows of 896, take 4864 rows of 1024) and 1 and 512 tokens, both engines multiply the same weight bytes by the same
activations with 2 threads:
- ggml: a graph of mul_mat ops computed by the CPU backend of llama-cpp-python 0.3.36's build
  (ggml_backend_graph_compute), the weights in llama.cpp's repacking buffer where llama.cpp puts them
  (the types its CPU backend repacks on this CPU, e.g. MXFP4 on AVX2), else in a plain CPU buffer;
- ferrollama: rust/tensor/examples/matmul_time.rs (the engine's `matmul`, with the repacked layouts it
  uses in a model).
Each measurement is its own process (a warm-up pass, then REPS passes), the two engines alternating
ROUNDS times; copies of the matrix (64 MiB in all) are multiplied in turn so that the weights come
from memory, as a model's do. The ratio of a round is ggml's median time over ferrollama's; the
table gives the median ratio over rounds; with --threads 1 it also gives the CPU-time ratio (each
engine's calling thread, the least of a round's passes, the median over rounds), which a loaded host
inflates far less than the wall times. Checksums of the two outputs are compared as a sanity check.

  /work/bench-venv/bin/python benches/type_products.py [--types MXFP4,IQ2_XXS] [--rounds 3] [--out DIR]

Needs the bench venv (benches/setup.sh): llama-cpp-python 0.3.36, gguf and numpy; builds the example
with cargo.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(4864, 896), (896, 4864)]  # (rows, cols): 896x4864 is ffn_up, 4864x896 ffn_down
#: rows of 896 values cannot be stored in 256-value blocks (llama-quantize gives such matrices another
#: type); those types take 1024 columns there instead (a model with n_embd 1024)
WIDE_FOR_256 = 1024
TOKENS = [1, 512]
THREADS = int(os.environ.get("TYPE_PRODUCTS_THREADS", "2"))  # the worker processes inherit --threads
COLD_BYTES = 64 << 20
#: the issue's types (and the references Q4_K, Q4_0, IQ4_NL: types of the engine before issue 27 that
#: llama.cpp also repacks, for scale), each with (ggml id, block elements, block bytes, offset of
#: an f16 scale to make sane in random blocks, or a function that does it)
TYPES = {
    "Q4_K": (12, 256, 144, [0, 2]),
    "Q4_0": (2, 32, 18, [0]),
    "Q6_K": (14, 256, 210, [208]),
    "IQ4_NL": (20, 32, 18, [0]),
    "MXFP4": (39, 32, 17, "e8m0"),
    "NVFP4": (40, 64, 36, "ue4m3"),
    "Q1_0": (41, 128, 18, [0]),
    "Q2_0": (42, 64, 18, [0]),
    "TQ1_0": (34, 256, 54, [52]),
    "TQ2_0": (35, 256, 66, [64]),
    "IQ1_S": (19, 256, 50, [0]),
    "IQ1_M": (29, 256, 56, "iq1_m"),
    "IQ2_XXS": (16, 256, 66, [0]),
    "IQ2_XS": (17, 256, 74, [0]),
    "IQ2_S": (22, 256, 82, [0]),
    "IQ3_XXS": (18, 256, 98, [0]),
    "IQ3_S": (21, 256, 110, [0]),
}
#: types llama.cpp's CPU backend repacks on an AVX2 CPU when the row count is a multiple of 8
#: (ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type)
GGML_REPACKS_ON_AVX2 = {"Q4_K", "Q4_0", "IQ4_NL", "MXFP4"}
#: the references, measured only when named in --types
REFERENCES = {"Q4_K", "Q4_0", "IQ4_NL", "Q6_K"}


def random_blocks(name: str, rows: int, cols: int, seed: int = 27) -> bytes:
    """Random blocks of the type with sane scales: every code value occurs, no scale is inf/NaN."""
    _, qk, size, scales = TYPES[name]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(rows * cols // qk, size), dtype=np.uint8)
    half = lambda n: (0x2000 + rng.integers(0, 0x2400, size=n)) | (rng.integers(0, 2, size=n) << 15)  # noqa: E731
    if scales == "e8m0":
        b[:, 0] = rng.integers(117, 138, size=len(b))
    elif scales == "ue4m3":
        b[:, :4] = rng.integers(0x20, 0x50, size=(len(b), 4))
    elif scales == "iq1_m":
        h = half(len(b))
        for k in range(4):
            b[:, 49 + 2 * k] = (b[:, 49 + 2 * k] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4)
    else:
        for off in scales:
            h = half(len(b))
            b[:, off], b[:, off + 1] = h & 0xFF, h >> 8
    return b.tobytes()


def copies_for(weight_bytes: int) -> int:
    return max(1, COLD_BYTES // weight_bytes)


# ---------------------------------------------------------------------------------------- ggml side

def ggml_time(name: str, rows: int, cols: int, tokens: int, reps: int, weights: Path, copies: int) -> dict:
    """Runs in a process of its own (see main): ggml's CPU backend on `copies` copies of the weights."""
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    vp, sz = ctypes.c_void_p, ctypes.c_size_t

    class InitParams(ctypes.Structure):
        _fields_ = [("mem_size", sz), ("mem_buffer", vp), ("no_alloc", ctypes.c_bool)]

    def fn(libh, fname, res, *args):
        f = getattr(libh, fname)
        f.restype, f.argtypes = res, list(args)
        return f

    init = fn(base, "ggml_init", vp, InitParams)
    new_2d = fn(base, "ggml_new_tensor_2d", vp, vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    mul_mat = fn(base, "ggml_mul_mat", vp, vp, vp, vp)
    new_graph = fn(base, "ggml_new_graph_custom", vp, vp, sz, ctypes.c_bool)
    expand = fn(base, "ggml_build_forward_expand", None, vp, vp)
    overhead = fn(base, "ggml_tensor_overhead", sz)
    graph_overhead = fn(base, "ggml_graph_overhead_custom", sz, sz, ctypes.c_bool)
    alloc_from_buft = fn(base, "ggml_backend_alloc_ctx_tensors_from_buft", vp, vp, vp)
    tensor_set = fn(base, "ggml_backend_tensor_set", None, vp, vp, sz, sz)
    tensor_get = fn(base, "ggml_backend_tensor_get", None, vp, vp, sz, sz)
    compute = fn(base, "ggml_backend_graph_compute", ctypes.c_int, vp, vp)
    buft_name = fn(base, "ggml_backend_buft_name", ctypes.c_char_p, vp)
    reg_dev_get = fn(base, "ggml_backend_reg_dev_get", vp, vp, sz)
    proc_address = fn(base, "ggml_backend_reg_get_proc_address", vp, vp, ctypes.c_char_p)
    cpu_init = fn(cpu, "ggml_backend_cpu_init", vp)
    set_threads = fn(cpu, "ggml_backend_cpu_set_n_threads", None, vp, ctypes.c_int)
    cpu_buft = fn(cpu, "ggml_backend_cpu_buffer_type", vp)
    cpu_reg = fn(cpu, "ggml_backend_cpu_reg", vp)

    backend = cpu_init()
    set_threads(backend, THREADS)
    buft, placed = cpu_buft(), "CPU"
    if name in GGML_REPACKS_ON_AVX2 and rows % 8 == 0:
        reg = cpu_reg()
        extra = ctypes.CFUNCTYPE(ctypes.POINTER(vp), vp)(proc_address(reg, b"ggml_backend_dev_get_extra_bufts"))
        bufts = extra(reg_dev_get(reg, 0))
        i = 0
        while bufts[i]:
            if buft_name(bufts[i]) == b"CPU_REPACK":
                buft, placed = bufts[i], "CPU_REPACK"
            i += 1
    tid = TYPES[name][0]
    n_tensors = 2 * copies + 1
    w_ctx = init(InitParams(overhead() * copies + 1024, None, True))
    ws = [new_2d(w_ctx, tid, cols, rows) for _ in range(copies)]
    a_ctx = init(InitParams(overhead() * (copies + 1) + 1024, None, True))
    x = new_2d(a_ctx, 0, cols, tokens)
    g_ctx = init(InitParams(graph_overhead(n_tensors + 16, False) + overhead() * n_tensors + 4096, None, True))
    ys = [mul_mat(g_ctx, w, x) for w in ws]
    assert alloc_from_buft(w_ctx, buft)
    assert alloc_from_buft(g_ctx, cpu_buft())
    assert alloc_from_buft(a_ctx, cpu_buft())
    data = weights.read_bytes()
    for w in ws:
        tensor_set(w, data, 0, len(data))
    xv = ((np.arange(tokens * cols) * 7919) % 1000).astype(np.float32) / np.float32(1000.0) - np.float32(0.5)
    tensor_set(x, xv.ctypes.data, 0, xv.nbytes)
    graph = new_graph(g_ctx, n_tensors + 16, False)
    for y in ys:
        expand(graph, y)

    import time

    def one_pass() -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.thread_time()
        assert compute(backend, graph) == 0
        return (time.perf_counter() - start) / copies, (time.thread_time() - cpu) / copies

    one_pass()
    seconds, cpu_seconds = zip(*(one_pass() for _ in range(reps)))
    out = np.zeros(tokens * rows, dtype=np.float32)
    tensor_get(ys[-1], out.ctypes.data, 0, out.nbytes)
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "checksum": float(out.astype(np.float64).sum()), "buffer": placed}


# ---------------------------------------------------------------------------------- the alternation

def example_binary() -> Path:
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "ferrollama-tensor", "--example", "matmul_time"], cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "release" / "examples" / "matmul_time"


def run_json(cmd: list[str]) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(binary: Path, name: str, rows: int, cols: int, tokens: int, rounds: int, tmp: Path) -> dict:
    weights = tmp / f"{name}-{rows}x{cols}.bin"
    if not weights.exists():
        weights.write_bytes(random_blocks(name, rows, cols))
    copies = copies_for(weights.stat().st_size) if tokens == 1 else 2
    reps = 20 if tokens == 1 else 3
    args = [name, str(rows), str(cols), str(tokens), str(reps), str(weights), str(copies)]
    ours, theirs, ratios, cpu_ours, cpu_theirs, cpu_ratios = [], [], [], [], [], []
    for _ in range(rounds):
        g = run_json([sys.executable, __file__, "--ggml-worker", *args])
        f = run_json([str(binary), name, str(rows), str(cols), str(tokens), os.environ["TYPE_PRODUCTS_THREADS"], str(reps), str(weights), str(copies)])
        theirs.append(statistics.median(g["seconds"]))
        ours.append(statistics.median(f["seconds"]))
        ratios.append(theirs[-1] / ours[-1])
        # The calling threads' CPU time, the least of the passes: the whole product with
        # --threads 1, and what other processes' load inflates least.
        cpu_theirs.append(min(g["cpu_seconds"]))
        cpu_ours.append(min(f["cpu_seconds"]))
        cpu_ratios.append(cpu_theirs[-1] / cpu_ours[-1])
    rel = abs(g["checksum"] - f["checksum"]) / max(1e-9, abs(g["checksum"]))
    return {"type": name, "rows": rows, "cols": cols, "tokens": tokens, "ggml_s": theirs, "ferrollama_s": ours,
            "ratio": statistics.median(ratios), "ratios": ratios, "ggml_cpu_s": cpu_theirs, "ferrollama_cpu_s": cpu_ours,
            "cpu_ratio": statistics.median(cpu_ratios), "cpu_ratios": cpu_ratios, "ggml_buffer": g["buffer"], "checksum_rel_diff": rel}


def table(results: list[dict]) -> str:
    lines = ["| type | shape (cols x rows) | tokens | ggml ms | ferrollama ms | ratio (median of rounds) | rounds | "
             "ggml CPU ms | ferrollama CPU ms | CPU ratio | ggml buffer |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['type']} | {r['cols']}x{r['rows']} | {r['tokens']} | {1e3 * statistics.median(r['ggml_s']):.3f} | "
                     f"{1e3 * statistics.median(r['ferrollama_s']):.3f} | {r['ratio']:.2f}x | "
                     f"{', '.join(f'{x:.2f}' for x in r['ratios'])} | {1e3 * min(r['ggml_cpu_s']):.3f} | "
                     f"{1e3 * min(r['ferrollama_cpu_s']):.3f} | {r['cpu_ratio']:.2f}x | {r['ggml_buffer']} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--ggml-worker":
        name, rows, cols, tokens, reps, weights, copies = sys.argv[2:9]
        print(json.dumps(ggml_time(name, int(rows), int(cols), int(tokens), int(reps), Path(weights), int(copies))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=",".join(t for t in TYPES if t not in REFERENCES))
    ap.add_argument("--tokens", default="1,512")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    os.environ["TYPE_PRODUCTS_THREADS"] = str(a.threads)
    binary = example_binary()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.types.split(","):
            for rows, cols in SHAPES:
                cols = cols if cols % TYPES[name][1] == 0 else WIDE_FOR_256
                for tokens in map(int, a.tokens.split(",")):
                    results.append(measure(binary, name, rows, cols, tokens, a.rounds, Path(tmp)))
                    print(table(results[-1:]).splitlines()[-1], flush=True)
    print(table(results))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "type_products.json").write_text(json.dumps(results, indent=1) + "\n")
        (a.out / "type_products.md").write_text(table(results) + "\n")


if __name__ == "__main__":
    main()
