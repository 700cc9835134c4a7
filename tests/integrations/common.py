"""What the scenario scripts of tests/test_integrations_*.py share: the llama_cpp they run on and
their output. Each script runs one library's documented calls in a fresh process, as

    python tests/integrations/<library>_calls.py MODE MODEL_PATH

MODE "llama_cpp": llama-cpp-python itself (benches/record_integrations.py records that run);
"alias": ferrollama.install_as_llama_cpp() before the library is imported, so that the library's
``llama_cpp`` is ferrollama; "instance": a ferrollama.Llama handed to the library (without the
alias: for libraries that take an instance and never import llama_cpp). The script prints one
JSON object: the results by call name."""
from __future__ import annotations

import json
import sys

MODES = ("llama_cpp", "alias", "instance")


def setup() -> tuple[str, str]:
    """The mode and the model's path of the command line, with llama_cpp set up for the mode."""
    mode, model_path = sys.argv[1], sys.argv[2]
    if mode not in MODES:
        raise SystemExit(f"mode must be one of {MODES}, not {mode!r}")
    if mode == "alias":
        import ferrollama

        ferrollama.install_as_llama_cpp()
    return mode, model_path


def llama_class(mode: str):
    """The Llama class the mode hands to libraries: llama-cpp-python's or ferrollama's."""
    if mode == "llama_cpp":
        import llama_cpp

        assert "ferrollama" not in llama_cpp.__file__, "the llama_cpp mode needs llama-cpp-python itself"
        return llama_cpp.Llama
    import ferrollama

    return ferrollama.Llama


def emit(results: dict) -> None:
    print("RESULTS " + json.dumps(results, sort_keys=True))
