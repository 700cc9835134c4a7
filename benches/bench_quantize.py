#!/usr/bin/env python3
"""`ferrollama quantize` against llama.cpp's llama_model_quantize on a real model: time and bytes.

The F16 model is Qwen2.5-Coder-0.5B-Instruct's Q4_K_M file brought to F16 by `ferrollama quantize
... F16 --allow-requantize`; the importance matrix is `ferrollama imatrix` over this repository's
README (-c 256). Each TYPE is quantized by both, alternating (ferrollama, llama.cpp, ferrollama,
llama.cpp, ...), llama.cpp with 2 threads (the machine's cores); the times are the medians, and
every tensor's bytes are compared.

  /path/to/bench-venv/bin/python benches/bench_quantize.py [--rounds 2] [TYPE ...]

(run with the bench venv, whose llama_cpp is llama-cpp-python 0.3.36; ferrollama is run from the
worktree's .venv as a command.)
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import llama_cpp as L
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FERRO = [str(ROOT / ".venv" / "bin" / "python"), "-m", "ferrollama.cli"]
SOURCE = Path.home() / ".cache" / "ferrollama" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
FTYPES = {"Q4_K_M": 15, "Q8_0": 7, "Q6_K": 18, "IQ4_XS": 30, "Q4_0": 2}

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_quantize import imatrix_param, load_imatrix  # noqa: E402


def ferrollama(*args) -> float:
    t0 = time.perf_counter()
    subprocess.run([*FERRO, *map(str, args)], check=True, capture_output=True)
    return time.perf_counter() - t0


def llama_quantize(src: Path, dst: Path, ftype: int, imatrix: dict | None) -> float:
    params = L.llama_model_quantize_default_params()
    params.nthread = 2
    params.ftype = ftype
    keep = None
    if imatrix is not None:
        entries, keep = imatrix_param(imatrix)
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(L.llama_model_imatrix_data))
    t0 = time.perf_counter()
    rc = L.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    elapsed = time.perf_counter() - t0
    del keep
    if rc != 0:
        raise RuntimeError("llama_model_quantize failed")
    return elapsed


def digests(path: Path) -> dict[str, tuple[str, str]]:
    return {t.name: (t.tensor_type.name, hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest())
            for t in gguf.GGUFReader(path).tensors}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("types", nargs="*", default=["Q4_K_M", "Q8_0"])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        f16 = tmp / "qwen-f16.gguf"
        ferrollama("quantize", SOURCE, f16, "F16", "--allow-requantize")
        imatrix_file = tmp / "imatrix.gguf"
        t_imatrix = ferrollama("imatrix", "-m", f16, "-f", ROOT / "README.md", "-o", imatrix_file, "-c", 256)
        print(f"ferrollama imatrix (README, -c 256): {t_imatrix:.1f} s")
        imatrix = load_imatrix(imatrix_file)
        for kind in args.types:
            for use_imatrix in (False, True):
                extra = ["--imatrix", imatrix_file] if use_imatrix else []
                times = {"ferrollama": [], "llama.cpp": []}
                ours, theirs = tmp / "ours.gguf", tmp / "theirs.gguf"
                for _ in range(args.rounds):
                    times["ferrollama"].append(ferrollama("quantize", f16, ours, kind, *extra))
                    times["llama.cpp"].append(llama_quantize(f16, theirs, FTYPES[kind], imatrix if use_imatrix else None))
                a, b = digests(ours), digests(theirs)
                same = sum(a[n] == b[n] for n in b)
                med = {k: statistics.median(v) for k, v in times.items()}
                print(f"{kind:7s} imatrix={'yes' if use_imatrix else 'no ':3s}  ferrollama {med['ferrollama']:6.1f} s  "
                      f"llama.cpp {med['llama.cpp']:6.1f} s  ratio {med['ferrollama'] / med['llama.cpp']:5.2f}  "
                      f"tensors equal {same}/{len(b)}  types equal {all(a[n][0] == b[n][0] for n in b)}")


if __name__ == "__main__":
    main()
