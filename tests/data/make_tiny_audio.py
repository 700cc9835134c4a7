#!/usr/bin/env python3
"""Writes a tiny random Whisper encoder with Ultravox's projector, and the audio it is recorded on
(benches/record_audio.py records llama.cpp's libmtmd on them, paired with the tiny llama
tests/data/models/tiny-llama-f32.gguf, into tests/data/scenarios/audio-ultravox-f32.json):

- tests/data/models/tiny-mmproj-ultravox.gguf: a `clip` file with an audio encoder of
  projector type ultravox under clip.cpp's tensor names (tools/mtmd/clip.cpp, models/whisper-enc.cpp):
  32 mel bins, two conv1d (kernel 3, the second of stride 2: 3000 mel frames -> 1500 positions)
  with GELU, learned positions (1500), width 64, 4 heads, 2 pre-LN blocks (FFN 128, GELU (erf)),
  the post-LN, then Ultravox's head: frames stacked by 12 (clip.audio.projector.stack_factor: 125 audio tokens), RMS
  norm (mm.a.norm_pre), mm.a.mlp.1 to 2 x 128, SwiGLU with the second half through SiLU, RMS norm
  (mm.a.norm_mid), mm.a.mlp.2 to the text model's 256. The conv kernels are F16 (as
  convert_hf_to_gguf.py writes them; ggml_conv_1d's im2col is F16 anyway), the other tensors F32.
  Weights scaled so that the audio matters (the blocks change the residual stream about as much as
  it holds).
- tests/data/audio/tone-1s.wav: 1.2 s of 16 kHz mono 16-bit PCM (two gliding tones over a little
  noise); tests/data/audio/stereo-8bit.wav: 0.4 s of 16 kHz stereo 8-bit PCM (mixed down to mono).

  python tests/data/make_tiny_audio.py            # writes them all (deterministic)
"""
from __future__ import annotations

import sys
import wave
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_archs as mk  # noqa: E402

DATA = mk.DATA
MMPROJ = "tiny-mmproj-ultravox.gguf"
AUDIO = {"tone": "audio/tone-1s.wav", "stereo": "audio/stereo-8bit.wav"}
SAMPLE_RATE = 16000


@dataclass(frozen=True)
class AudioDims:
    n_mel: int = 32
    n_pos: int = 1500  # Whisper's positions: 3000 mel frames halved by the second conv
    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 2
    n_ff: int = 128
    #: 12 divides Whisper's 1500 positions: with Ultravox's 8 (1500 / 8 = 187.5) libmtmd 0.3.36 aborts
    #: (clip.cpp pads the stacked rows to 188 but counts 3000 / 8 / 2 = 187 output tokens)
    stack: int = 12
    n_hidden: int = 128  # Ultravox's SwiGLU width (mm.a.mlp.1 gives twice that)
    n_embd_out: int = mk.N_EMBD


AUDIO_DIMS = AudioDims()


def add_audio_metadata(w: gguf.GGUFWriter, a: AudioDims, projector: str = "ultravox") -> None:
    """The keys clip.cpp reads for a Whisper-encoder audio projector (clip-impl.h)."""
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name(f"tiny random {projector} projector")
    w.add_string("clip.projector_type", projector)
    w.add_bool("clip.has_audio_encoder", True)
    w.add_uint32("clip.audio.num_mel_bins", a.n_mel)
    w.add_uint32("clip.audio.embedding_length", a.n_embd)
    w.add_uint32("clip.audio.feed_forward_length", a.n_ff)
    w.add_uint32("clip.audio.block_count", a.n_layer)
    w.add_uint32("clip.audio.attention.head_count", a.n_head)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    w.add_uint32("clip.audio.projection_dim", a.n_embd_out)
    w.add_uint32("clip.audio.projector.stack_factor", a.stack)


def add_whisper_weights(wt: mk.Weights, a: AudioDims) -> None:
    """The Whisper encoder: conv1d kernels (numpy (out, in, k), F16) and biases ((out, 1) as
    convert_hf_to_gguf.py unsqueezes them), positions, blocks (attn_k without bias), post-LN."""
    rng = wt.rng
    for i, n_in in ((1, a.n_mel), (2, a.n_embd)):
        kernel = rng.standard_normal((a.n_embd, n_in, 3)) * (0.6 / np.sqrt(3 * n_in))
        wt.w.add_tensor(f"a.conv1d.{i}.weight", kernel.astype(np.float16))
        wt.vector(f"a.conv1d.{i}.bias", rng.standard_normal((a.n_embd, 1)) * 0.1)
    wt.vector("a.position_embd.weight", rng.standard_normal((a.n_pos, a.n_embd)) * 0.2)
    for il in range(a.n_layer):
        p = f"a.blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            wt.matrix(p + name + ".weight", a.n_embd, a.n_embd, std=0.15)
            if name != "attn_k":
                wt.bias(p + name + ".bias", a.n_embd)
        for name in ("ln1", "ln2"):
            wt.norm(p + name + ".weight", a.n_embd)
            wt.bias(p + name + ".bias", a.n_embd)
        wt.matrix(p + "ffn_up.weight", a.n_ff, a.n_embd, std=0.15)
        wt.bias(p + "ffn_up.bias", a.n_ff)
        wt.matrix(p + "ffn_down.weight", a.n_embd, a.n_ff, std=0.12)
        wt.bias(p + "ffn_down.bias", a.n_embd)
    wt.norm("a.post_ln.weight", a.n_embd)
    wt.bias("a.post_ln.bias", a.n_embd)


def add_ultravox_weights(wt: mk.Weights, a: AudioDims) -> None:
    add_whisper_weights(wt, a)
    n_stacked = a.stack * a.n_embd
    wt.norm("mm.a.norm_pre.weight", n_stacked)
    wt.matrix("mm.a.mlp.1.weight", 2 * a.n_hidden, n_stacked, std=0.08)
    wt.norm("mm.a.norm_mid.weight", a.n_hidden)
    wt.matrix("mm.a.mlp.2.weight", a.n_embd_out, a.n_hidden, std=0.15)


def write_mmproj(path: Path, a: AudioDims = AUDIO_DIMS) -> None:
    w = gguf.GGUFWriter(str(path), "clip")
    add_audio_metadata(w, a)
    add_ultravox_weights(mk.Weights(w, np.random.default_rng(38), "f32"), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gliding_tones(seconds: float, seed: int) -> np.ndarray:
    """Two tones gliding in pitch over a little noise, with a fade in and out: float64 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    f0, f1 = rng.uniform(200, 600), rng.uniform(1500, 3000)
    phase0 = 2 * np.pi * (f0 * t + 150 * t * t)
    phase1 = 2 * np.pi * (f1 * t - 400 * t * t)
    envelope = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.05)
    signal = 0.5 * np.sin(phase0) + 0.25 * np.sin(phase1) * (t > seconds / 3) + rng.normal(0, 0.02, t.size)
    return np.clip(signal * envelope, -1, 1)


def write_wav(path: Path, samples: np.ndarray, width: int) -> None:
    """PCM samples (n,) or (n, channels) in [-1, 1] as 8-bit unsigned or 16-bit signed PCM."""
    frames = samples.reshape(samples.shape[0], -1)
    if width == 1:
        data = np.round(frames * 127 + 128).astype(np.uint8)
    else:
        data = np.round(frames * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(frames.shape[1])
        out.setsampwidth(width)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(data.tobytes())


def write_audio() -> None:
    (DATA / "audio").mkdir(exist_ok=True)
    write_wav(DATA / AUDIO["tone"], gliding_tones(1.2, 1), 2)
    stereo = np.stack([gliding_tones(0.4, 2), gliding_tones(0.4, 3)], axis=1)
    write_wav(DATA / AUDIO["stereo"], stereo, 1)


def main() -> None:
    write_mmproj(DATA / "models" / MMPROJ)
    write_audio()
    print("wrote", MMPROJ, *AUDIO.values())


if __name__ == "__main__":
    main()
