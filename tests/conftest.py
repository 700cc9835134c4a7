"""Shared fixtures: the tiny models in tests/data and the real models from PyPI."""
from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import ferrollama as fl  # noqa: E402
from ferrollama.models import fetch  # noqa: E402

DATA = Path(__file__).parent / "data"

REAL_MODELS = {
    "qwen2": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}


@lru_cache(maxsize=None)
def model_path(file_name: str) -> Path:
    """A model by file name: a tiny model from tests/data or a real one fetched from PyPI."""
    tiny = DATA / "models" / file_name
    if tiny.exists():
        return tiny
    return fetch(file_name)


@lru_cache(maxsize=None)
def load_model(file_name: str) -> fl.Model:
    return fl.Model(str(model_path(file_name)))


@pytest.fixture(scope="session")
def qwen_model() -> fl.Model:
    return load_model(REAL_MODELS["qwen2"])


@pytest.fixture(scope="session")
def gemma_model() -> fl.Model:
    return load_model(REAL_MODELS["gemma3"])


@pytest.fixture(scope="session")
def tiny_model() -> fl.Model:
    return load_model("tiny-llama-f32.gguf")
