"""ferrollama.Llama as a drop-in for llama_cpp.Llama: the suite of llama-cpp-python API uses in
tests/llama_api_cases.py, run here with ferrollama and compared with llama-cpp-python 0.3.36's
recorded results (benches/record_llama_api.py). Differences that remain by design are listed
in the README ("Llama, as llama-cpp-python's") and are not cases here."""
from __future__ import annotations

import json

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
