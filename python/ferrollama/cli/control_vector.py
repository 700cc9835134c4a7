"""Control vectors (--control-vector, --control-vector-scaled, --control-vector-layer-range).

A control-vector GGUF holds one F32 tensor ``direction.N`` of n_embd values per layer N (from 1).
Like llama.cpp's common_control_vector_load, the files are scaled and summed, then handed to the
context, which adds row N-1 to the output of layer N for N in the layer range.
"""
from __future__ import annotations

import argparse

import numpy as np

from .common import CLIError, float_value, int_value


def add_control_vector_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("control vectors")
    g.add_argument("--control-vector", action="append", default=[], metavar="FNAME",
                   help="add a control vector (repeatable)")
    g.add_argument("--control-vector-scaled", action="append", nargs=2, default=[], metavar=("FNAME", "SCALE"),
                   help="add a control vector with a scale (repeatable)")
    g.add_argument("--control-vector-layer-range", nargs=2, type=int_value, default=None, metavar=("START", "END"),
                   help="layers to apply the control vectors to, inclusive (default: all)")


def _scale(text: str) -> float:
    try:
        return float_value(text)
    except argparse.ArgumentTypeError as e:
        raise CLIError(f"--control-vector-scaled: {e}") from None


def _read_directions(path: str, n_embd: int) -> dict[int, np.ndarray]:
    try:
        from gguf import GGUFReader
    except ImportError:
        raise CLIError("control vectors are read with the gguf package: pip install gguf") from None
    try:
        reader = GGUFReader(path)
    except FileNotFoundError:
        raise CLIError(f"{path}: no such control vector file") from None
    except (ValueError, OSError) as e:
        raise CLIError(f"{path}: not a GGUF file ({e})") from None
    directions: dict[int, np.ndarray] = {}
    for t in reader.tensors:
        prefix, _, layer = t.name.partition(".")
        if prefix != "direction" or not layer.isdigit() or int(layer) < 1:
            raise CLIError(f"{path}: unexpected tensor {t.name!r} in a control vector")
        if t.tensor_type.name != "F32" or t.n_elements != n_embd:
            raise CLIError(f"{path}: {t.name} must be F32 with {n_embd} values (the model's n_embd)")
        directions[int(layer)] = np.asarray(t.data, dtype=np.float32).reshape(n_embd)
    if not directions:
        raise CLIError(f"{path}: no direction tensors")
    return directions


def load_control_vectors(args: argparse.Namespace, n_layer: int, n_embd: int) -> np.ndarray | None:
    """The scaled sum of the vectors, shape (n_layer, n_embd): row N is direction.N, added to the
    output of layer N (row 0 stays zero, directions past the last layer are ignored, as in
    llama.cpp). None when no vector is given."""
    files = [(f, 1.0) for f in args.control_vector] + [(f, _scale(s)) for f, s in args.control_vector_scaled]
    if not files:
        return None
    data = np.zeros((n_layer, n_embd), dtype=np.float32)
    for path, scale in files:
        for layer, vec in _read_directions(path, n_embd).items():
            if layer < n_layer:
                data[layer] += np.float32(scale) * vec
    return data


def apply_control_vectors(args: argparse.Namespace, model, ctx) -> None:
    data = load_control_vectors(args, model.n_layer, model.n_embd)
    if data is None:
        return
    start, end = args.control_vector_layer_range or (1, model.n_layer)
    if not 1 <= start <= end:
        raise CLIError(f"--control-vector-layer-range: need 1 <= START <= END, got {start} {end}")
    ctx.set_control_vector(data, start, end)
