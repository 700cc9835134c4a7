"""Runs a scenario of tests/integrations/ (one library's documented calls) in a fresh Python and
returns its results; tests/test_integrations_*.py and benches/record_integrations.py use it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCENARIOS = Path(__file__).resolve().parent / "integrations"
#: the libraries, by the name of their scenario (tests/integrations/<name>_calls.py)
LIBRARIES = ("outlines", "guidance", "langchain", "llama_index", "haystack", "instructor", "autogen", "llm_gguf")


def run_scenario(name: str, mode: str, model_path: str, timeout: float = 900, **env: str) -> dict:
    """The results the scenario prints, run in ``mode`` (see tests/integrations/common.py)."""
    proc = subprocess.run([sys.executable, str(SCENARIOS / f"{name}_calls.py"), mode, model_path],
                          capture_output=True, text=True, timeout=timeout, cwd=SCENARIOS,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **env})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"{name} ({mode}) failed with code {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULTS "):])
