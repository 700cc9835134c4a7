"""Records what the libraries of tests/test_integrations_*.py give on llama-cpp-python 0.3.36 (the
.bench-venv's, -march=native), their documented calls on the default model, greedy: each
scenario of tests/integrations/ in "llama_cpp" mode, into tests/data/integrations.json.

Run with a Python that has the libraries (the Makefile's integration packages) and llama-cpp-python
0.3.36 first on the path, e.g.

    PYTHONPATH=<dir holding the .bench-venv's llama_cpp> python benches/record_integrations.py [library ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from integrations_run import LIBRARIES, run_scenario  # noqa: E402

RECORD = ROOT / "tests" / "data" / "integrations.json"


def main(names: list[str]) -> None:
    import llama_cpp

    from ferrollama.models import default_model_path

    records = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    records["_llama_cpp_python"] = llama_cpp.__version__
    for name in names or LIBRARIES:
        records[name] = run_scenario(name, "llama_cpp", str(default_model_path()))
        print(name, json.dumps(records[name])[:300])
        RECORD.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
