"""ferrollama.Llama as a drop-in for llama_cpp.Llama: the suite of llama-cpp-python API uses in
tests/llama_api_cases.py, run here with ferrollama and compared with llama-cpp-python 0.3.36's
recorded results (benches/record_llama_api.py). Differences that remain by design are listed
in the README ("Llama, as llama-cpp-python's") and are not cases here."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import ferrollama
import llama_api_cases as C
from conftest import DATA, REAL_MODELS, model_path

RECORDED = json.loads((DATA / "fixtures" / "llama_cpp_api.json").read_text())["cases"]


@pytest.fixture(scope="module")
def models() -> dict:
    return {"qwen": str(model_path(REAL_MODELS["qwen2"])), "tiny": str(DATA / "models" / "tiny-llama-f32.gguf")}


def test_every_case_is_recorded() -> None:
    assert sorted(RECORDED) == sorted(C.CASES)


@pytest.mark.parametrize("name", sorted(C.CASES))
def test_case_gives_llama_cpp_python_s_result(name: str, models: dict) -> None:
    ours = C.run_case(ferrollama, name, models)
    problems = C.compare(name, ours, RECORDED[name])
    assert not problems, "\n".join(problems)


INSTALLED = textwrap.dedent("""
    import importlib, json, sys
    import ferrollama

    before = "llama_cpp" in sys.modules
    ferrollama.install_as_llama_cpp()
    import llama_cpp
    from llama_cpp import Llama                      # as a library imports it
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = ferrollama.Llama(sys.argv[1], n_ctx=128, verbose=False)
    wrapped = Llama(model_path=sys.argv[1], n_ctx=128, n_parts=-1, f16_kv=True, verbose=False)
    out = {"before": before, "root": llama_cpp is ferrollama,
           "modules": {m: importlib.import_module("llama_cpp." + m) is importlib.import_module("ferrollama." + m)
                       for m in ferrollama.LLAMA_CPP_MODULES},
           "isinstance": [isinstance(llm, llama_cpp.Llama), isinstance(llm, llama_cpp.llama.Llama)],
           "formatter": Jinja2ChatFormatter is ferrollama.llama_chat_format.Jinja2ChatFormatter,
           "n_ctx": wrapped.context_params.n_ctx, "missing": []}
    for name in ("llama_cpp.mtmd_cpp", "llama_cpp.server"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            out["missing"].append(e.name)
    print(json.dumps(out))
""")


def test_install_as_llama_cpp_makes_llama_cpp_ferrollama(models: dict) -> None:
    run = subprocess.run([sys.executable, "-c", INSTALLED, models["tiny"]], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {
        "before": False, "root": True, "modules": {m: True for m in ferrollama.LLAMA_CPP_MODULES},
        "isinstance": [True, True], "formatter": True, "n_ctx": 128,
        "missing": ["llama_cpp.mtmd_cpp", "llama_cpp.server"]}
    assert ferrollama.LLAMA_CPP_MODULES == ("llama", "llama_cache", "llama_chat_format", "llama_cpp", "llama_grammar",
                                            "llama_speculative", "llama_tokenizer", "llama_types")
    assert "llama_cpp" not in sys.modules
