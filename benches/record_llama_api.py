#!/usr/bin/env python3
"""Runs tests/llama_api_cases.py with llama-cpp-python and records its results in
tests/data/fixtures/llama_cpp_api.json; with ferrollama installed in the same venv it runs the
cases with ferrollama too and prints where the two differ.

  /path/to/bench-venv/bin/python benches/record_llama_api.py [--compare-only] [CASE ...]
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import llama_api_cases as C  # noqa: E402

FIXTURE = ROOT / "tests" / "data" / "fixtures" / "llama_cpp_api.json"


def models() -> dict:
    cache = Path(os.environ.get("FERROLLAMA_CACHE", Path.home() / ".cache" / "ferrollama"))
    return {"qwen": str(cache / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
            "tiny": str(ROOT / "tests" / "data" / "models" / "tiny-llama-f32.gguf")}


def main(args: list[str]) -> None:
    compare_only = "--compare-only" in args
    names = [a for a in args if not a.startswith("--")] or list(C.CASES)
    recorded = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {"cases": {}}
    if not compare_only:
        import llama_cpp

        for name in names:
            recorded["cases"][name] = C.run_case(llama_cpp, name, models())
            print("recorded", name, file=sys.stderr)
        recorded["recorded_with"] = f"llama-cpp-python {llama_cpp.__version__}, CPU, 2 threads"
        FIXTURE.write_text(json.dumps(recorded, indent=1) + "\n")
    try:
        import ferrollama
    except ImportError:
        return
    same = 0
    for name in names:
        problems = C.compare(name, C.run_case(ferrollama, name, models()), recorded["cases"][name])
        same += not problems
        print(f"{name:40s} {'same' if not problems else 'DIFFERS: ' + '; '.join(problems)[:300]}")
    print(f"{same}/{len(names)} cases give llama-cpp-python's results")


if __name__ == "__main__":
    main(sys.argv[1:])
