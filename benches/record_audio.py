#!/usr/bin/env python3
"""Records llama.cpp's libmtmd on the tiny audio pairs into tests/data/scenarios/audio-<type>-f32.json:
the Ultravox projector (tests/data/make_tiny_audio.py) with the tiny llama, and the Qwen2-Audio,
Voxtral and Qwen2.5-Omni ones with their text models (tests/data/make_tiny_audio_heads.py; Omni's
file takes an image too, recorded beside the audio), as benches/record_vision.py
records the image pairs (the same settings and scenario keys, its Mtmd class: in 0.3.36
mtmd_helper_bitmap_init_from_file reads audio files into audio bitmaps): each audio's samples as
miniaudio decodes them (`expected_samples_f32le_base64`: the audio bitmap's floats, mono at 16 kHz), its
embeddings (mtmd_encode_chunk on the audio chunk of a prompt of the marker alone), and for each
prompt mtmd's chunks, the n_past and the last logits after mtmd_helper_eval_chunks (F32 and F16 KV
caches). Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_audio.py [ultravox qwen2a voxtral qwen2.5o]   # all by default
"""
from __future__ import annotations

import base64
import ctypes
import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_vision as rv  # noqa: E402

M = rv.M
AUDIO = {"tone": "audio/tone-1s.wav", "stereo": "audio/stereo-8bit.wav"}
CONTEXT = rv.CONTEXT
MARKER = rv.MARKER
#: text on both sides of the audio (mtmd adds the family's audio markers, if any), audio first
PROMPTS = [
    (f"Listen to this sound:\n{MARKER}\nWhat is it?", ["tone"]),
    (f"{MARKER} Describe it.", ["stereo"]),
]


@dataclass(frozen=True)
class AudioPair:
    text_model: str
    mmproj: str
    prompts: list
    context: dict = field(default_factory=lambda: CONTEXT)
    #: the media by name (a projector with both encoders takes images too)
    media: dict = field(default_factory=lambda: AUDIO)


QWEN_CONTEXT = {"n_ctx": 1024, "n_batch": 256, "n_ubatch": 256, "n_seq_max": 1}


#: by projector type; Qwen2-Audio's chunks are 750 tokens: a context of 1024, batches of 256, and
#: one audio (the records' size). Qwen2.5-Omni's file takes an image and audio in one prompt
#: (M-RoPE: the image at 2-D positions, the audio at 1-D ones)
PAIRS = {
    "ultravox": AudioPair("tiny-llama-f32.gguf", "tiny-mmproj-ultravox.gguf", PROMPTS),
    "qwen2a": AudioPair("tiny-qwen2a-f32.gguf", "tiny-mmproj-qwen2a-f16.gguf", [
        (f"<|im_start|>user\nAudio 1: {MARKER}\nWhat is it?<|im_end|>\n", ["tone"]),
        (f"{MARKER} Describe it.", ["tone"]),
    ], QWEN_CONTEXT, {"tone": AUDIO["tone"]}),
    "voxtral": AudioPair("tiny-voxtral-f32.gguf", "tiny-mmproj-voxtral-f16.gguf", [
        (f"[INST]{MARKER}What is this sound?[/INST]", ["tone"]),
        (f"Listen:\n{MARKER} Describe it.", ["stereo"]),
    ]),
    "qwen2.5o": AudioPair("tiny-qwen25omni-f32.gguf", "tiny-mmproj-qwen2.5o-f16.gguf", [
        (f"<|im_start|>user\n{MARKER}What is in the picture?\n{MARKER}And this sound?<|im_end|>\n", ["square", "tone"]),
        (f"{MARKER} Describe it.", ["tone"]),
    ], QWEN_CONTEXT, {"square": "images/square-224.png", "tone": AUDIO["tone"]}),
}


def bitmap_samples(bitmap) -> np.ndarray:  # noqa: ANN001
    """An audio bitmap's float samples."""
    n = M.mtmd_bitmap_get_nx(bitmap)
    data = M.mtmd_bitmap_get_data(bitmap)
    return np.ctypeslib.as_array(ctypes.cast(data, ctypes.POINTER(ctypes.c_float)), shape=(n,)).copy()


def record_samples(pair: AudioPair) -> dict[str, np.ndarray]:
    with rv.recorder.Model(rv.DATA / "models" / pair.text_model, extra_bufts=False) as model, \
            rv.Mtmd(rv.DATA / "models" / pair.mmproj, model.model,
                    {k: rv.DATA / f for k, f in pair.media.items() if k in AUDIO}) as mtmd:
        for name, bitmap in mtmd.bitmaps.items():
            if not M.mtmd_bitmap_is_audio(bitmap):
                raise RuntimeError(f"mtmd did not read {name} as audio")
        return {name: bitmap_samples(b) for name, b in mtmd.bitmaps.items()}


def as_audio(pair: AudioPair, scn: dict) -> None:
    """The image pairs' scenario keys renamed for audio (not for a pair that takes images too),
    and the samples mtmd decoded."""
    if all(name in AUDIO for name in pair.media):
        scn["audio"] = scn.pop("images")
        for e in scn["evals"]:
            e["audio"] = e.pop("images")
    # the float32 samples bit for bit: little-endian bytes in base64
    scn["expected_samples_f32le_base64"] = {k: base64.b64encode(v.astype("<f4").tobytes()).decode()
                                            for k, v in record_samples(pair).items()}


def main() -> None:
    for projector in sys.argv[1:] or PAIRS:
        pair = PAIRS[projector]
        rv.record_pair(f"audio-{projector}-f32", pair.text_model, pair.mmproj, pair.media, pair.prompts, pair.context,
                       finish=functools.partial(as_audio, pair))


if __name__ == "__main__":
    main()
