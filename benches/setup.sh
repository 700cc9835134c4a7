#!/usr/bin/env bash
# Creates the benchmark venv: llama-cpp-python 0.3.36 (the reference llama.cpp) built from
# source by pip, numpy, and ferrollama built from this repository (release wheel).
#
#   benches/setup.sh [--skip-llama-cpp] [--skip-ferrollama] [--rebuild-llama-cpp]
#
# Environment:
#   BENCH_VENV   where the venv goes (default: <repo>/.bench-venv)
#   PYTHON       interpreter that creates it (default: python3)
#   CMAKE_ARGS   passed to llama.cpp's CMake (default: -DGGML_NATIVE=ON, see below)
#
# About the llama.cpp build: PyPI has no wheel of llama-cpp-python 0.3.36, only the sdist, so
# pip compiles the vendored llama.cpp with CMake (scikit-build-core fetches cmake and ninja
# from PyPI when they are missing; gcc/g++ are needed). llama-cpp-python passes no CPU flags of
# its own on Linux, so llama.cpp's defaults apply: GGML_NATIVE=ON (-march=native) unless
# cross-compiling or SOURCE_DATE_EPOCH is set, OpenMP on, CPU weight repacking on. We pass
# -DGGML_NATIVE=ON explicitly so that a SOURCE_DATE_EPOCH in the environment cannot silently
# turn it off. The result is built for THIS machine's CPU: do not copy the venv elsewhere.
# pip caches the built wheel; --rebuild-llama-cpp rebuilds it (e.g. on a different CPU).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BENCH_VENV:-$REPO/.bench-venv}"
PYTHON="${PYTHON:-python3}"
LLAMA_CPP_PYTHON_VERSION="0.3.36"
WITH_LLAMA_CPP=1
WITH_FERROLLAMA=1
REBUILD=()

for arg in "$@"; do
    case "$arg" in
        --skip-llama-cpp) WITH_LLAMA_CPP=0 ;;
        --skip-ferrollama) WITH_FERROLLAMA=0 ;;
        --rebuild-llama-cpp) REBUILD=(--no-cache-dir --force-reinstall --no-deps) ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "unknown option: $arg" >&2; exit 2 ;;
    esac
done

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
"${PIP[@]}" install -q 'numpy>=1.23'

if [ "$WITH_LLAMA_CPP" = 1 ]; then
    echo "building llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION from source (takes 10-20 min on 2 cores)"
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON}" \
        "${PIP[@]}" install --no-binary llama-cpp-python ${REBUILD[@]+"${REBUILD[@]}"} \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    if [ ${#REBUILD[@]} -gt 0 ]; then
        "${PIP[@]}" install -q "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"  # its dependencies
    fi
    (cd / && "$VENV/bin/python" -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__); print(llama_cpp.llama_print_system_info().decode())")
fi

if [ "$WITH_FERROLLAMA" = 1 ]; then
    # a wheel, not `maturin develop`: an editable install would write the extension into the
    # repository's python/ferrollama/, which the development venv uses too.
    echo "building ferrollama (release wheel) and installing it into $VENV"
    "${PIP[@]}" install -q 'maturin>=1.7,<2'
    WHEELS="$(mktemp -d)"
    (cd "$REPO" && "$VENV/bin/maturin" build --release -q -i "$VENV/bin/python" -o "$WHEELS")
    "${PIP[@]}" install -q --force-reinstall "$WHEELS"/ferrollama-*.whl
    rm -rf "$WHEELS"
    (cd / && "$VENV/bin/python" -c "import ferrollama; print('ferrollama', ferrollama.__version__, ferrollama.__file__)")
fi

echo "done: $VENV/bin/python benches/compare.py"
