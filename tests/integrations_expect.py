"""The records tests/test_integrations_*.py compare with: what each library gave on llama-cpp-python
0.3.36 (benches/record_integrations.py), and a scenario's run on ferrollama."""
from __future__ import annotations

import json
from pathlib import Path

from ferrollama.models import default_model_path
from integrations_run import run_scenario

RECORDS = json.loads((Path(__file__).parent / "data" / "integrations.json").read_text())


def on_ferrollama(name: str, mode: str = "alias") -> tuple[dict, dict]:
    """(the scenario's results on ferrollama in ``mode``, llama-cpp-python's record of it)."""
    return run_scenario(name, mode, str(default_model_path())), RECORDS[name]
