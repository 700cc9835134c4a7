"""Batch-invariant logits (issue 40) at every kernel level: the guarantees of
test_batch_invariance.py, which this process checks with the best kernels this CPU has,
re-checked in a process whose kernels are capped by FERROLLAMA_ISA at each level below it:
AVX2 on an AVX-512 CPU, and the portable specification. The portable kernels take minutes per
real-model decode (the file took 15 minutes on a quiet 2-core Cascade Lake), so that case is
marked slow (``pytest -m slow tests/test_batch_invariance_isa.py``), as the GGUF fuzzer is."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ferrollama as fl

TESTS = Path(__file__).parent
LEVELS = ["scalar", "avx2", "avx512"]
#: the levels below this process's (which checks its own in the files themselves); the portable
#: kernels again where this process already runs them (FERROLLAMA_ISA=scalar in its environment)
BELOW = [pytest.param(isa, marks=pytest.mark.slow) if isa == "scalar" else isa
         for isa in LEVELS[:LEVELS.index(fl.KERNEL_ISA)] or ["scalar"]]
#: the logits' guarantees (micro-batch sizes, threads, placement, both real models, F16 and F32
#: caches); test_batch_invariance_text.py's (server, speculative decoding, saved states) follow
#: from them and take minutes more a level, so CI runs them at the CPU's own level only
FILES = ["test_batch_invariance.py"]


def capped_env(isa: str) -> dict[str, str]:
    env = dict(os.environ, FERROLLAMA_ISA=isa)
    env.pop("FERROLLAMA_FORCE_SCALAR", None)
    return env


@pytest.mark.parametrize("isa", BELOW)
def test_the_guarantees_hold_with_the_kernels_of(isa):
    level = subprocess.run([sys.executable, "-c", "import ferrollama; print(ferrollama.KERNEL_ISA)"],
                           env=capped_env(isa), capture_output=True, text=True, check=True).stdout.strip()
    assert level == isa
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *FILES],
                         cwd=TESTS, env=capped_env(isa), capture_output=True, text=True, timeout=3 * 3600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout
