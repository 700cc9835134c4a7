#!/usr/bin/env python3
"""Records llama.cpp's libmtmd on the tiny Ultravox projector (tests/data/make_tiny_audio.py) paired
with the tiny llama into tests/data/scenarios/audio-ultravox-f32.json, as benches/record_vision.py
records the image pairs (the same settings and scenario keys, its Mtmd class: in 0.3.36
mtmd_helper_bitmap_init_from_file reads audio files into audio bitmaps): each audio's samples as
miniaudio decodes them (`expected_samples_f32le_base64`: the audio bitmap's floats, mono at 16 kHz), its
embeddings (mtmd_encode_chunk on the audio chunk of a prompt of the marker alone), and for each
prompt mtmd's chunks, the n_past and the last logits after mtmd_helper_eval_chunks (F32 and F16 KV
caches). Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_audio.py
"""
from __future__ import annotations

import base64
import ctypes
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_vision as rv  # noqa: E402

M = rv.M
NAME = "audio-ultravox-f32"
TEXT_MODEL, MMPROJ = "tiny-llama-f32.gguf", "tiny-mmproj-ultravox.gguf"
AUDIO = {"tone": "audio/tone-1s.wav", "stereo": "audio/stereo-8bit.wav"}
CONTEXT = rv.CONTEXT
MARKER = rv.MARKER
#: text on both sides of the audio (Ultravox has no audio markers of its own), audio first
PROMPTS = [
    (f"Listen to this sound:\n{MARKER}\nWhat is it?", ["tone"]),
    (f"{MARKER} Describe it.", ["stereo"]),
]


def bitmap_samples(bitmap) -> np.ndarray:  # noqa: ANN001
    """An audio bitmap's float samples."""
    n = M.mtmd_bitmap_get_nx(bitmap)
    data = M.mtmd_bitmap_get_data(bitmap)
    return np.ctypeslib.as_array(ctypes.cast(data, ctypes.POINTER(ctypes.c_float)), shape=(n,)).copy()


def record_samples() -> dict[str, np.ndarray]:
    with rv.recorder.Model(rv.DATA / "models" / TEXT_MODEL, extra_bufts=False) as model, \
            rv.Mtmd(rv.DATA / "models" / MMPROJ, model.model, {k: rv.DATA / f for k, f in AUDIO.items()}) as mtmd:
        for name, bitmap in mtmd.bitmaps.items():
            if not M.mtmd_bitmap_is_audio(bitmap):
                raise RuntimeError(f"mtmd did not read {name} as audio")
        return {name: bitmap_samples(b) for name, b in mtmd.bitmaps.items()}


def as_audio(scn: dict) -> None:
    """The image pairs' scenario keys renamed for audio, and the samples mtmd decoded."""
    scn["audio"] = scn.pop("images")
    for e in scn["evals"]:
        e["audio"] = e.pop("images")
    # the float32 samples bit for bit: little-endian bytes in base64
    scn["expected_samples_f32le_base64"] = {k: base64.b64encode(v.astype("<f4").tobytes()).decode()
                                            for k, v in record_samples().items()}


def main() -> None:
    rv.record_pair(NAME, TEXT_MODEL, MMPROJ, AUDIO, PROMPTS, CONTEXT, finish=as_audio)


if __name__ == "__main__":
    main()
