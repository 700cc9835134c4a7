"""The input rows and positions of the scenario steps that decode embeddings (tests/data/
make_tiny_qwenvl.py writes such steps; benches/recorder.py and tests/scenario_runner.py both
make their rows here, with NumPy alone)."""
from __future__ import annotations

import numpy as np


def embedding_rows(spec: dict, n_embd: int, width: int) -> np.ndarray:
    """The rows a step names by ``{"seed": s, "n": n}``: n rows of ``width`` float32 values,
    the main embedding of n_embd values of std 1 (as the tiny models' token embeddings), the
    DeepStack parts after it of std 0.5. NumPy's legacy RandomState, whose stream never changes
    across versions."""
    rows = np.random.RandomState(spec["seed"]).standard_normal((spec["n"], width)).astype(np.float32)
    rows[:, n_embd:] *= 0.5
    return rows


def image_positions(t: int, nx: int, ny: int) -> list[list[int]]:
    """mtmd's M-RoPE positions of an image of nx x ny tokens after t positions
    (mtmd_image_tokens_get_decoder_pos): (t, t + row, t + column, 0) in raster order."""
    return [[t, t + i // nx, t + i % nx, 0] for i in range(nx * ny)]
