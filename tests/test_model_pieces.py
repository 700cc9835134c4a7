"""A model read in place from its pieces (as the PyPI packages of the default model carry it):
a list of the pieces opens as the GGUF file, mapped side by side, with the same bytes; fetch
lists installed pieces instead of copying them, so the model is on disk once."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ferrollama as fl
from ferrollama import models
from ferrollama.models import ModelNotAvailable, Recipe, write_pieces_list

TINY = Path(__file__).parent / "data" / "models" / "tiny-llama-f32.gguf"


def split(path: Path, piece_size: int, into: Path) -> list[Path]:
    data = path.read_bytes()
    into.mkdir(parents=True, exist_ok=True)
    pieces = []
    for i in range(0, len(data), piece_size):
        pieces.append(into / f"model.gguf.part{i // piece_size:02d}")
        pieces[-1].write_bytes(data[i:i + piece_size])
    return pieces


def table(model: fl.Model) -> list[tuple]:
    return [(t.name, t.type, tuple(t.shape), t.offset, t.nbytes) for t in model.tensors]


def last_logits(model: fl.Model) -> np.ndarray:
    ctx = fl.Context(model, n_ctx=256, type_k="f32", type_v="f32")
    ctx.decode(fl.Batch.from_tokens(model.tokenize("Once upon a time"), logits="last"))
    return ctx.logits(-1)


@pytest.mark.parametrize("piece_size", [1 << 20, 1_000_003], ids=["whole pages: mapped", "uneven: read"])
def test_a_list_of_pieces_is_the_model(tmp_path, piece_size):
    pieces = split(TINY, piece_size, tmp_path / "site-packages")
    assert len(pieces) > 2
    listed = write_pieces_list(tmp_path / "tiny.gguf.pieces", pieces)
    whole, in_pieces = fl.Model(str(TINY)), fl.Model(str(listed))
    assert in_pieces.metadata == whole.metadata and table(in_pieces) == table(whole)
    mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()}
    assert all(str(p) in mapped for p in pieces) == (piece_size % 4096 == 0)
    assert np.array_equal(last_logits(in_pieces), last_logits(whole))


def test_a_list_whose_piece_changed_is_refused(tmp_path):
    pieces = split(TINY, 1 << 20, tmp_path)
    listed = write_pieces_list(tmp_path / "tiny.gguf.pieces", pieces)
    pieces[1].write_bytes(b"short")
    with pytest.raises(fl.GGUFError, match=f"piece {pieces[1]} has 5 bytes, the list says {1 << 20}"):
        fl.Model(str(listed))


def test_inspect_reads_a_list_as_the_file(tmp_path):
    listed = write_pieces_list(tmp_path / "tiny.gguf.pieces", split(TINY, 1 << 20, tmp_path / "p"))
    run = lambda path: subprocess.run([sys.executable, "-m", "ferrollama.cli", "inspect", str(path)],  # noqa: E731
                                      capture_output=True, text=True)
    whole, in_pieces = run(TINY), run(listed)
    assert in_pieces.returncode == 0, in_pieces.stderr
    assert in_pieces.stdout == whole.stdout.replace(str(TINY), str(listed))


@pytest.fixture
def installed_tiny(tmp_path, monkeypatch):
    """The tiny model as a known model whose packages are installed (pieces in a fake site-packages)."""
    pieces = split(TINY, 1 << 20, tmp_path / "site-packages")
    sha = hashlib.sha256(TINY.read_bytes()).hexdigest()
    monkeypatch.setitem(models.KNOWN_MODELS, "tiny.gguf", Recipe(sha, ("tiny-part1==1",), r"part\d\d$"))
    monkeypatch.setattr(models, "_installed_pieces", lambda recipe: pieces)
    monkeypatch.setenv("FERROLLAMA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FERROLLAMA_MODELS_DIR", raising=False)
    return pieces


def test_fetch_lists_installed_pieces_instead_of_copying_them(installed_tiny, tmp_path):
    path = models.fetch("tiny.gguf", download=False)
    assert path == tmp_path / "cache" / "tiny.gguf.pieces"
    cache_bytes = sum(p.stat().st_size for p in (tmp_path / "cache").iterdir())
    assert cache_bytes < 1000                               # the list and its stamp: no copy
    assert fl.Model(str(path)).metadata == fl.Model(str(TINY)).metadata
    assert models.fetch("tiny.gguf", download=False) == path
    whole = models.fetch("tiny.gguf", download=False, whole_file=True)   # for llama.cpp
    assert whole.read_bytes() == TINY.read_bytes()


def test_fetch_refuses_installed_pieces_of_another_file(installed_tiny):
    installed_tiny[0].write_bytes(b"GGUF" + installed_tiny[0].read_bytes()[4:-1] + b"!")
    with pytest.raises(ModelNotAvailable, match="the installed pieces do not have sha256"):
        models.fetch("tiny.gguf", download=False)
