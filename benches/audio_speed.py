#!/usr/bin/env python3
"""How fast audio goes through a tiny audio projector (Ultravox's by default, tests/data/make_tiny_audio.py;
--projector qwen2a / voxtral / qwen2.5o: make_tiny_audio_heads.py's; each a Whisper encoder of width
64 over a 30 s chunk's 1500 positions): ferrollama against llama.cpp's
libmtmd, alternating, in one run, 2 threads each. Two steps are timed: the spectrogram with the
chunking (libmtmd: mtmd_tokenize of the audio marker alone, which computes it; ferrollama:
generation.audio.whisper_mel_chunks) and the encoder (mtmd_encode_chunk; _core.AudioProjector.encode_mel).
The audio is tests/data/audio/tone-1s.wav.

  PYTHONPATH=python:.venv/lib/python3.11/site-packages .bench-venv/bin/python benches/audio_speed.py [--reps 5] [--projector ultravox]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import record_audio as ra  # noqa: E402

rv, M = ra.rv, ra.M


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--projector", choices=sorted(ra.PAIRS), default="ultravox")
    args = ap.parse_args()
    pair = ra.PAIRS[args.projector]

    from ferrollama import _core
    from ferrollama.generation.audio import WHISPER, load_audio, whisper_mel_chunks

    models = rv.DATA / "models"
    ours = _core.AudioProjector(models / pair.mmproj, n_threads=rv.recorder.THREADS)
    samples = load_audio(rv.DATA / ra.AUDIO["tone"], ours.sample_rate)
    params = WHISPER(ours.n_mel)
    ms = {k: benchlib.Samples() for k in ("llama.cpp mel", "ferrollama mel", "llama.cpp encode", "ferrollama encode")}
    with rv.recorder.Model(models / pair.text_model, extra_bufts=False) as model, \
            rv.Mtmd(models / pair.mmproj, model.model, {"tone": rv.DATA / ra.AUDIO["tone"]}) as mtmd:
        (mel,) = whisper_mel_chunks(samples, params)
        chunks = mtmd.tokenize(rv.MARKER, ["tone"])
        try:
            (chunk,) = rv.image_chunks(chunks)
            want = mtmd.embeddings(chunk)  # warm-up of both
            got = ours.encode_mel(mel)
            print(f"max |ferrollama - llama.cpp| = {np.abs(got - want).max():.3g}")
            for _ in range(args.reps):
                t0 = time.perf_counter()
                M.mtmd_input_chunks_free(mtmd.tokenize(rv.MARKER, ["tone"]))
                t1 = time.perf_counter()
                whisper_mel_chunks(samples, params)
                t2 = time.perf_counter()
                M.mtmd_encode_chunk(mtmd.ctx, chunk)
                t3 = time.perf_counter()
                ours.encode_mel(mel)
                t4 = time.perf_counter()
                for key, dt in zip(ms, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                    ms[key].values.append(dt * 1e3)
        finally:
            M.mtmd_input_chunks_free(chunks)
    info = benchlib.machine_info()
    print(f"CPU: {info.get('cpu')}, {rv.recorder.THREADS} threads, {args.reps} alternating reps, one 30 s chunk, {args.projector}")
    print(benchlib.markdown_table(["step", "ms (median ± sd)"], [[k, v.cell()] for k, v in ms.items()]))
    for step in ("mel", "encode"):
        ratio, sd = benchlib.paired_ratio(ms[f"ferrollama {step}"], ms[f"llama.cpp {step}"])
        print(f"{step}: ferrollama / llama.cpp time: {ratio:.2f} ± {sd:.2f}")


if __name__ == "__main__":
    main()
