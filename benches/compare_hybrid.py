#!/usr/bin/env python3
"""ferrollama vs llama.cpp on recurrent and hybrid models (benches/make_hybrid_bench_models.py
writes them): pp512, tg128, the same at a depth of 8192 tokens, and the memory of the state of
one sequence.

Tests, per model file (both engines in this one process, alternating rep by rep, the same random
tokens, as benches/compare.py; its tests and runner are reused):

- ``pp512``, ``tg128``: compare.py's (llama-bench ``-p 512``, ``-n 128``).
- ``pp512 @ d8192``, ``tg128 @ d8192`` (llama-bench ``-d 8192``): a context of n_ctx = depth +
  512, n_batch 2048, n_ubatch 512. The depth (8192 random tokens, BOS first) is decoded once per
  engine and the sequence's state saved (llama_state_seq_get_data / Context.seq_state_get);
  each rep clears the memory and restores that state (untimed), times the decode of 512 tokens
  at positions 8192..8703 in one batch, restores again, and times 128 one-token decodes. This is
  llama-bench's way: a recurrent state cannot be rewound with seq_rm.
- state memory, one sequence: a context with n_seq_max 1 and n_ctx = depth + 512.
  llama.cpp: its logged "KV buffer size" and "RS buffer size" (attention K/V cells, recurrent
  states); ferrollama: ctx.kv.nbytes (both kinds) of that context and of one with n_ctx 256
  smaller, whose difference gives the K/V bytes per cell, hence the split. K/V bytes per token:
  those of one cell of the full-context cache (llama.cpp: its logged "llama_kv_cache: size = X MiB
  (N cells" of that cache, X / N). A model with interleaved sliding-window layers has a second,
  fixed-size cache for them (the window plus a ubatch of cells in both engines, swa_full off):
  llama.cpp's second such line, ferrollama's ctx.kv.sizes[1] cells and the bytes beside the full
  cache's. Also the size of the saved sequence state at depth (llama_state_seq_get_size /
  len(seq_state_get)), which holds the 8192 used cells rather than the allocation.

llama.cpp's buffer types: this CPU advertises AMX, and ggml's AMX buffer type (first among the
CPU's extra buffer types) takes Q4_K weights, whose first product then dies of an illegal
instruction: the virtual machine does not enable the tile instructions. `--llama-bufts repack`
(default) loads without the extra buffer types and puts every weight that ggml would repack on
this CPU (Q4_0, Q4_K, IQ4_NL, Q2_K matrices with rows a multiple of 8, and stacks of experts
of those types, token_embd excepted: it is read by get_rows) in the CPU_REPACK buffer type by tensor_buft_overrides: what llama.cpp picks on
a CPU without AMX. `none`: no extra buffer types (ggml's plain kernels); `default`: llama.cpp's
own choice (AMX here: crashes).

  .bench-venv/bin/python benches/compare_hybrid.py MODEL.gguf [MODEL.gguf ...] [--reps 5]
        [--threads 2] [--tests pp512,tg128,depth] [--depth 8192] [--json out.json] [--prio 3]
        [--wait-quiet 300] [-v]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as B  # noqa: E402
import compare as C  # noqa: E402

MiB = 1024 * 1024


# --------------------------------------------------------------------------- llama.cpp's buffers

#: ggml types repacked on an AVX-512 x86 CPU (ggml_repack_get_optimal_repack_type, this build):
#: Q4_0, Q2_K (AVX-512), Q4_K, IQ4_NL, MXFP4, each when ne[1] % 8 == 0
REPACKED_ON_X86 = {2: "Q4_0", 10: "Q2_K", 12: "Q4_K", 20: "IQ4_NL", 39: "MXFP4"}


class _Override(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _ggml_libs():
    """The libggml-base and libggml-cpu that llama_cpp loaded. The wheel holds copies, not links
    (libggml-cpu.so, .so.0, ...): opening another file would make a second ggml, whose buffer
    types llama.cpp's scheduler would not recognise."""
    import llama_cpp  # noqa: F401 - loads them
    maps = Path("/proc/self/maps").read_text().split()
    found = {}
    for key in ("libggml-base", "libggml-cpu"):
        paths = sorted({m for m in maps if "/" + key + ".so" in m})
        if not paths:
            raise RuntimeError(f"{key} is not loaded")
        found[key] = ctypes.CDLL(paths[0], mode=ctypes.RTLD_GLOBAL)
    return found["libggml-base"], found["libggml-cpu"]


def _fn(lib, name, res, *args):  # noqa: ANN001, ANN202
    f = getattr(lib, name)
    f.restype, f.argtypes = res, list(args)
    return f


def repacked_tensors(path: Path) -> dict[str, str]:
    """name -> type of the weights ggml's CPU_REPACK buffer would take (read with ggml's gguf)."""
    base, _ = _ggml_libs()
    vp = ctypes.c_void_p

    class InitParams(ctypes.Structure):
        _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(vp))]

    init = _fn(base, "gguf_init_from_file", vp, ctypes.c_char_p, InitParams)
    n_tensors = _fn(base, "gguf_get_n_tensors", ctypes.c_int64, vp)
    tname = _fn(base, "gguf_get_tensor_name", ctypes.c_char_p, vp, ctypes.c_int64)
    get_tensor = _fn(base, "ggml_get_tensor", vp, vp, ctypes.c_char_p)
    n_dims = _fn(base, "ggml_n_dims", ctypes.c_int, vp)
    gguf_free = _fn(base, "gguf_free", None, vp)
    ggml_free = _fn(base, "ggml_free", None, vp)
    ctx = vp()
    g = init(str(path).encode(), InitParams(True, ctypes.pointer(ctx)))
    if not g:
        raise RuntimeError(f"ggml cannot read {path}")
    out = {}
    try:
        for i in range(n_tensors(g)):
            name = tname(g, i)
            t = get_tensor(ctx, name)
            # struct ggml_tensor { enum ggml_type type; buffer *; int64_t ne[4]; ... }
            ttype = ctypes.c_int32.from_address(t).value
            ne1 = ctypes.c_int64.from_address(t + 16 + 8).value
            # 2-D matrices (MUL_MAT) and the expert stacks (MUL_MAT_ID on 3-D tensors): what
            # ggml's repack supports_op accepts; other 3-D weights (deepseek2's attn_k_b) are
            # multiplied by MUL_MAT, which it refuses for them
            dims = n_dims(t)
            if (ttype in REPACKED_ON_X86 and ne1 % 8 == 0 and name != b"token_embd.weight"
                    and (dims == 2 or (dims == 3 and name.endswith(b"_exps.weight")))):
                out[name.decode()] = REPACKED_ON_X86[ttype]
    finally:
        gguf_free(g)
        ggml_free(ctx)
    return out


def repack_patterns(names) -> list[str]:
    """Few regexes (llama.cpp compiles each for every tensor): blk.N.X grouped by X."""
    by_kind: dict[str, list[int]] = {}
    other = []
    for n in names:
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", n)
        if m:
            by_kind.setdefault(m[2], []).append(int(m[1]))
        else:
            other.append(n)
    pats = [rf"^blk\.({'|'.join(str(i) for i in sorted(ls))})\.{re.escape(kind)}$" for kind, ls in sorted(by_kind.items())]
    return pats + [f"^{re.escape(n)}$" for n in other]


def cpu_repack_buft() -> int:
    base, cpu = _ggml_libs()
    vp = ctypes.c_void_p
    reg = _fn(cpu, "ggml_backend_cpu_reg", vp)()
    dev = _fn(base, "ggml_backend_reg_dev_get", vp, vp, ctypes.c_size_t)(reg, 0)
    proc = _fn(base, "ggml_backend_reg_get_proc_address", vp, vp, ctypes.c_char_p)(reg, b"ggml_backend_dev_get_extra_bufts")
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(vp), vp)(proc)(dev)
    name = _fn(base, "ggml_backend_buft_name", ctypes.c_char_p, vp)
    i = 0
    while bufts[i]:
        if name(bufts[i]) == b"CPU_REPACK":
            return bufts[i]
        i += 1
    raise RuntimeError("this llama.cpp build has no CPU_REPACK buffer type")


def load_llama_cpp(engine: B.LlamaCppEngine, path: Path, bufts: str):  # noqa: ANN201
    """engine.load with the chosen extra buffer types (see the module's docstring)."""
    L = engine.L
    orig = L.llama_model_default_params
    keep = []

    def params():  # noqa: ANN202
        p = orig()
        if bufts in ("none", "repack"):
            p.use_extra_bufts = False
        if bufts == "repack":
            pats = repack_patterns(repacked_tensors(path))
            buft = cpu_repack_buft()
            arr = (_Override * (len(pats) + 1))(*[_Override(s.encode(), buft) for s in pats], _Override(None, None))
            keep.append(arr)
            p.tensor_buft_overrides = ctypes.addressof(arr)
        return p

    L.llama_model_default_params = params
    start = len(engine.log)
    try:
        model = engine.load(path)
    finally:
        L.llama_model_default_params = orig
    model.buffers = buffer_lines(engine.log[start:], "model buffer size")
    model._keep = keep  # the override array must outlive the load
    return model


def buffer_lines(log: list[str], what: str) -> dict[str, float]:
    """'name what = X MiB' lines of llama.cpp's log -> {name: MiB} (summed per name)."""
    out: dict[str, float] = {}
    for line in "".join(log).splitlines():
        m = re.search(rf"(\S+) {what} = +([\d.]+) MiB", line)
        if m:
            out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


# --------------------------------------------------------------------------- sequence state


def seq_state_get(ctx) -> bytes:  # noqa: ANN001
    if isinstance(ctx, B.LcContext):
        L = ctx.L
        n = L.llama_state_seq_get_size(ctx.ptr, 0)
        buf = (ctypes.c_uint8 * n)()
        got = L.llama_state_seq_get_data(ctx.ptr, buf, n, 0)
        if got != n:
            raise RuntimeError(f"llama_state_seq_get_data wrote {got} of {n} bytes")
        return bytes(buf)
    return ctx.ctx.seq_state_get(0)


def seq_state_set(ctx, blob: bytes) -> None:  # noqa: ANN001
    ctx.clear()
    if isinstance(ctx, B.LcContext):
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        if ctx.L.llama_state_seq_set_data(ctx.ptr, buf, len(blob), 0) != len(blob):
            raise RuntimeError("llama_state_seq_set_data failed")
    else:
        ctx.ctx.seq_state_set(blob, 0)


class _Blob:
    """A saved sequence state among a test's prepared objects (compare.run_test closes them)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def close(self) -> None:
        self.data = b""


class DepthTest:
    """pp and tg after `depth` cached tokens, the depth restored from a saved state each rep."""

    def __init__(self, depth: int, n_pp: int = 512, n_tg: int = 128) -> None:
        self.depth, self.n_pp, self.n_tg = depth, n_pp, n_tg
        self.name = f"d{depth}"
        self.state_bytes: dict[str, int] = {}

    def row_names(self) -> list[str]:
        return [f"pp{self.n_pp} @ d{self.depth}", f"tg{self.n_tg} @ d{self.depth}"]

    def context_params(self, args) -> dict:  # noqa: ANN001
        return dict(n_ctx=self.depth + max(self.n_pp, self.n_tg), n_batch=2048, n_ubatch=512, n_seq_max=1)

    def prepare(self, ctx, model) -> dict:  # noqa: ANN001
        rng = np.random.default_rng(1234)
        tokens = rng.integers(0, model.n_vocab, self.depth).tolist()
        if model.add_bos:
            tokens[0] = model.bos
        big = ctx.batch(2048, 1)
        ctx.clear()
        t0 = time.perf_counter()
        for start in range(0, self.depth, 2048):
            part = tokens[start:start + 2048]
            big.fill(part, list(range(start, start + len(part))), [0] * len(part), [False] * (len(part) - 1) + [True])
            ctx.decode(big)
        prefill_s = time.perf_counter() - t0
        big.close()
        blob = seq_state_get(ctx)
        engine = "llama.cpp" if isinstance(ctx, B.LcContext) else "ferrollama"
        self.state_bytes[engine] = len(blob)
        self.prefill_s = getattr(self, "prefill_s", {})
        self.prefill_s[engine] = prefill_s
        return {"blob": _Blob(blob), "pp": ctx.batch(self.n_pp, 1), "tg": ctx.batch(1, 1)}

    def run(self, ctx, model, state: dict, rng: np.random.Generator) -> list[float]:  # noqa: ANN001
        toks = rng.integers(0, model.n_vocab, self.n_pp + self.n_tg).tolist()
        pp, tg, d = state["pp"], state["tg"], self.depth
        seq_state_set(ctx, state["blob"].data)
        pp.fill(toks[:self.n_pp], list(range(d, d + self.n_pp)), [0] * self.n_pp, [False] * (self.n_pp - 1) + [True])
        t0 = time.perf_counter()
        ctx.decode(pp)
        pp_ts = self.n_pp / (time.perf_counter() - t0)
        seq_state_set(ctx, state["blob"].data)
        fill, decode = tg.fill_one, ctx.decode
        t0 = time.perf_counter()
        for i, tok in enumerate(toks[self.n_pp:]):
            fill(tok, d + i, 0, True)
            decode(tg)
        return [pp_ts, self.n_tg / (time.perf_counter() - t0)]


# --------------------------------------------------------------------------- state memory


def state_memory(name: str, model, n_ctx: int, threads: int) -> dict:  # noqa: ANN001
    """Bytes of the K/V cells and of the recurrent states of a one-sequence context of n_ctx."""
    kw = dict(n_batch=512, n_ubatch=512, n_seq_max=1, n_threads=threads, kv_unified=True)
    if name == "llama.cpp":
        log = model.engine.log
        start = len(log)
        ctx = model.context(n_ctx=n_ctx, **kw)
        lines = log[start:]
        ctx.close()
        kv = sum(buffer_lines(lines, "KV buffer size").values()) * MiB
        rs = sum(buffer_lines(lines, "RS buffer size").values()) * MiB
        full, swa = kv_cache_sizes(lines)
        per_token = full[0] * MiB / full[1] if full else 0.0
        return {"n_ctx": n_ctx, "kv_bytes": kv, "rs_bytes": rs, "kv_bytes_per_token": per_token,
                "swa_bytes": swa[0] * MiB if swa else 0.0, "swa_cells": swa[1] if swa else 0,
                "source": "llama.cpp's log (MiB, 2 decimals)"}
    sizes = {}
    for n in (n_ctx, n_ctx - 256):
        ctx = model.context(n_ctx=n, **kw)
        sizes[n] = (ctx.kv.nbytes, ctx.n_ctx, ctx.kv.sizes)
        ctx.close()
    (b1, c1, cells), (b2, c2, _) = sizes[n_ctx], sizes[n_ctx - 256]
    per_cell = (b1 - b2) / (c1 - c2) if c1 != c2 else 0.0
    kv = per_cell * c1
    # [full, sliding] caches: what is left beside the full cache's cells is the sliding window's
    swa = b1 - kv if len(cells) > 1 else 0.0
    return {"n_ctx": c1, "kv_bytes": kv + swa, "rs_bytes": b1 - kv - swa, "total_bytes": b1,
            "kv_bytes_per_token": per_cell, "swa_bytes": swa, "swa_cells": cells[1] if len(cells) > 1 else 0,
            "source": "ctx.kv.nbytes at n_ctx and n_ctx - 256, ctx.kv.sizes"}


def kv_cache_sizes(lines: list[str]) -> tuple[tuple[float, int] | None, tuple[float, int] | None]:
    """(MiB, cells) of llama.cpp's full-context K/V cache and of its sliding-window one (None when
    absent), from the 'llama_kv_cache: size = X MiB (N cells, ...' lines; an interleaved-SWA
    model's logs announce each ('creating non-SWA KV cache', 'creating     SWA KV cache')."""
    full = swa = None
    next_is_swa = False
    for line in "".join(lines).splitlines():
        if m := re.search(r"creating +(non-SWA|SWA) KV cache", line):
            next_is_swa = m[1] == "SWA"
        elif m := re.search(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells", line):
            size = (float(m[1]), int(m[2]))
            if next_is_swa:
                swa = size
            else:
                full = size
    return full, swa


def mib(x) -> str:  # noqa: ANN001
    return "n/a" if x is None else f"{x / MiB:.2f}"


def memory_table(mem: dict, depth_state: dict) -> str:
    header = ["model", "engine", "K/V cells MiB", "K/V bytes per token", "of which sliding window MiB (cells)",
              "recurrent states MiB", "total MiB", "seq state blob at depth MiB"]
    body = []
    for model, per in mem.items():
        for e, m in per.items():
            if "error" in m:
                body.append([model, e, m["error"][:60], "", "", "", "", ""])
                continue
            swa = f"{mib(m['swa_bytes'])} ({m['swa_cells']})" if m["swa_cells"] else "-"
            body.append([model, e, mib(m["kv_bytes"]), f"{m['kv_bytes_per_token']:.0f}", swa, mib(m["rs_bytes"]),
                         mib(m["kv_bytes"] + m["rs_bytes"]), mib(depth_state.get(model, {}).get(e))])
    return B.markdown_table(header, body)


# --------------------------------------------------------------------------- main


def parse_tests(spec: str, depth: int) -> list:
    tests = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        if item == "depth":
            tests.append(DepthTest(depth))
        elif m := re.fullmatch(r"pp(\d+)", item):
            tests.append(C.PromptTest(int(m[1])))
        elif m := re.fullmatch(r"tg(\d+)", item):
            tests.append(C.GenTest(int(m[1])))
        else:
            raise SystemExit(f"unknown test {item!r} (ppN, tgN, depth)")
    return tests


def main(argv=None) -> int:  # noqa: ANN001
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="GGUF files")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tests", default="pp512,tg128,depth")
    ap.add_argument("--depth", type=int, default=8192)
    ap.add_argument("--engines", default="llama.cpp,ferrollama")
    ap.add_argument("--llama-bufts", choices=["repack", "none", "default"], default="repack")
    ap.add_argument("--no-memory", action="store_true", help="skip the state-memory contexts")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--prio", type=int, choices=[0, 1, 2, 3], default=0)
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS")
    ap.add_argument("--json", default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    args.kv_unified = False   # compare.run_test reads it; one sequence either way

    tests = parse_tests(args.tests, args.depth)
    nice = B.set_priority(args.prio)
    engines, missing = B.open_engines([e.strip() for e in args.engines.split(",") if e.strip()])
    if not engines:
        raise SystemExit("no engine available: " + "; ".join(missing.values()))
    engine_names = [e.name for e in engines]
    info = {"machine": B.machine_info(), "engines": {e.name: e.version for e in engines},
            "missing_engines": missing, "system_info": {e.name: e.system_info() for e in engines}, "nice": nice,
            "llama_bufts": args.llama_bufts, "model_buffers": {}, "prefill_s": {}}
    rows: list[C.Row] = []
    mem: dict[str, dict] = {}
    depth_state: dict[str, dict] = {}
    for path in map(Path, args.models):
        short = path.name.removeprefix("bench-").removesuffix(".gguf")
        loaded, load_errors = {}, {}
        for e in engines:
            try:
                if e.name == "llama.cpp":
                    loaded[e.name] = load_llama_cpp(e, path, args.llama_bufts)
                    info["model_buffers"][short] = loaded[e.name].buffers
                else:
                    loaded[e.name] = e.load(path)
            except Exception as exc:  # noqa: BLE001
                load_errors[e.name] = f"cannot load: {type(exc).__name__}: {exc}"
                print(f"{e.name}: cannot load {path.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        if not args.no_memory:
            for n, m in loaded.items():
                try:
                    mem.setdefault(short, {})[n] = state_memory(n, m, args.depth + 512, args.threads)
                except Exception as exc:  # noqa: BLE001
                    mem.setdefault(short, {})[n] = {"error": f"{type(exc).__name__}: {exc}"}
        for test in tests:
            print(f"{short}: {test.name} ...", file=sys.stderr)
            new_rows = C.run_test(test, loaded, args, short, info)
            for r in new_rows:
                for e, err in load_errors.items():
                    r.samples[e] = B.Samples(error=err)
            rows += new_rows
            if isinstance(test, DepthTest):
                depth_state[short] = dict(test.state_bytes)
                info["prefill_s"][short] = getattr(test, "prefill_s", {})
                test.state_bytes = {}
                test.prefill_s = {}
        for m in loaded.values():
            m.close()
    info["machine"]["loadavg_end"] = os.getloadavg()

    text = C.report(rows, engine_names, info, args)
    if mem:
        text += ("\n\nState memory of one sequence (n_seq_max 1, n_ctx depth + 512 = "
                 f"{args.depth + 512}, K/V F16, recurrent states F32):\n\n" + memory_table(mem, depth_state))
    print(text)
    if args.json:
        both = set(engine_names) >= set(C.ENGINE_ORDER)
        doc = {"settings": {k: v for k, v in vars(args).items() if k != "json"}, "info": info,
               "results": [{"model": r.model, "test": r.test,
                            "engines": {e: s.as_dict() for e, s in r.samples.items()},
                            "ratio_ferrollama_over_llama_cpp": C.finite_or_none(
                                B.paired_ratio(r.samples["ferrollama"], r.samples["llama.cpp"])[0]) if both else None}
                           for r in rows],
               "state_memory": mem, "seq_state_bytes_at_depth": depth_state, "markdown": text}
        Path(args.json).write_text(json.dumps(doc, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
