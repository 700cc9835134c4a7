"""Audio in, as llama.cpp's libmtmd takes it (issue 38): loading and the Whisper log-mel spectrogram.

Loading (:func:`load_audio`) turns what users pass (a path, the bytes of a file, a float array of
samples) into mtmd's audio bitmap: mono float32 samples at the projector's sample rate, as
``mtmd_helper_bitmap_init_from_buf`` (tools/mtmd/mtmd-helper.cpp) decodes with miniaudio asking for
f32 mono: integer PCM scaled as miniaudio scales it (s16 / 32768, u8 x * (2 / 255) - 1, s24 / 2^23,
s32 / 2^31), channels averaged. WAV decodes here (the standard library's ``wave`` for the header,
numpy for the samples); a WAV at another sample rate than the projector's, and MP3 / FLAC (which
mtmd also takes), raise :class:`~ferrollama.generation.media.MediaError` naming what is missing:
miniaudio's resampler and its MP3/FLAC decoders are not reproduced.

The spectrogram (:func:`whisper_mel_chunks`) is mtmd-audio.cpp's ``log_mel_spectrogram`` with the
parameters ``mtmd_audio_preprocessor_whisper`` gives it (llama.cpp as vendored by llama-cpp-python
0.3.36): the samples padded to at least n_fft / 2 + 1, 30 s of zeros appended, a reflection of
n_fft / 2 samples in front (and zeros behind), frames of n_fft every hop samples under a periodic
Hann window of float32 ``cosf`` values, mtmd's own float32 FFT (radix 2 down to an odd length,
then a direct DFT, over a sin/cos table of n_fft entries; the DFT's sums as a float32 product), the power spectrum, librosa's Slaney mel
filters (area-normalised, computed in double and stored float32), log10 of max(sum, 2^-24), then
Whisper's normalisation (clamped to the maximum - 8, then (x + 4) / 4) over the whole padded
spectrogram, cut into chunks of 3000 frames (an incomplete last chunk, all padding, dropped). The
mel sums are accumulated in double here as in mtmd, but not in its exact order (a few float32 ulps
before the log).

This module only imports numpy and the standard library.
"""

from __future__ import annotations

import io
import os
import wave
from dataclasses import dataclass
from typing import Union

import numpy as np

from .media import DEFAULT_LIMITS, MediaError, MediaLimits

__all__ = ["AudioParams", "WHISPER", "AudioSource", "is_audio", "load_audio", "decode_audio",
           "whisper_mel_chunks", "mel_filters"]

AudioSource = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, np.ndarray]

#: mtmd's mel frames per encoder call (clip.cpp's graph takes 30 s)
FRAMES_PER_CHUNK = 3000
#: mtmd's floor under the mel sums before log10 (2^-24)
MEL_FLOOR = 5.960464477539063e-08


@dataclass(frozen=True)
class AudioParams:
    """What clip.cpp sets for a Whisper-encoder projector (ultravox, qwen2a, voxtral, ...):
    the sample rate, the FFT / window / hop lengths, seconds per chunk, and the file's mel bins."""

    n_mel: int
    sample_rate: int = 16000
    n_fft: int = 400
    window_len: int = 400
    hop_len: int = 160
    chunk_seconds: int = 30


def WHISPER(n_mel: int) -> AudioParams:  # noqa: N802 - a preset, named as clip.cpp's preprocessor
    """The Whisper preprocessor's parameters for a file of ``n_mel`` mel bins."""
    return AudioParams(n_mel)


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------


def is_audio(data: bytes) -> bool:
    """mtmd-helper.cpp's ``is_audio_file``: a RIFF/WAVE, MP3 (ID3 tag or MPEG sync) or FLAC header."""
    if len(data) < 12:
        return False
    wav = data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    mp3 = data[:3] == b"ID3" or (data[0] == 0xFF and (data[1] & 0xE0) == 0xE0)
    return wav or mp3 or data[:4] == b"fLaC"


def load_audio(source: AudioSource, sample_rate: int, limits: MediaLimits = DEFAULT_LIMITS) -> np.ndarray:
    """Mono float32 samples at ``sample_rate`` for ``source``: a path (str or PathLike), the bytes
    of an audio file, or a 1-D float array of samples already at ``sample_rate`` (mtmd_bitmap_init_from_audio).
    Raises :class:`MediaError`."""
    if isinstance(source, (str, os.PathLike)):
        return decode_audio(_read_file(os.fspath(source), limits), sample_rate, limits)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return decode_audio(bytes(source), sample_rate, limits)
    if isinstance(source, np.ndarray):
        if source.ndim != 1 or source.dtype.kind != "f":
            raise MediaError(f"audio samples must be a 1-D float array, not {source.dtype} {source.shape}")
        if source.size == 0:
            raise MediaError("audio has no samples")
        return source.astype(np.float32)
    raise MediaError(f"cannot load audio from a {type(source).__name__}")


def decode_audio(data: bytes, sample_rate: int, limits: MediaLimits = DEFAULT_LIMITS) -> np.ndarray:
    """The samples of a WAV file's bytes, as mtmd's miniaudio decodes them to f32 mono."""
    if len(data) > limits.max_bytes:
        raise MediaError(f"audio is {len(data)} bytes, over the {limits.max_bytes}-byte limit")
    if not is_audio(data):
        raise MediaError("not an audio file mtmd reads (WAV, MP3 or FLAC)")
    if data[:4] == b"fLaC":
        raise MediaError("FLAC audio is not supported yet (mtmd decodes it with miniaudio): convert it to WAV")
    if data[:4] != b"RIFF":
        raise MediaError("MP3 audio is not supported yet (mtmd decodes it with miniaudio): convert it to WAV")
    try:
        with wave.open(io.BytesIO(data)) as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as error:
        raise MediaError(f"cannot decode WAV audio: {error}") from error
    if rate != sample_rate:
        raise MediaError(f"WAV audio at {rate} Hz: the projector takes {sample_rate} Hz and resampling "
                         "(miniaudio's, in mtmd) is not supported yet")
    samples = _pcm_to_float(frames, width).reshape(-1, channels)
    if samples.shape[0] == 0:
        raise MediaError("WAV audio has no samples")
    # miniaudio mixes down to mono by averaging the channels
    return samples.mean(axis=1, dtype=np.float32) if channels > 1 else samples[:, 0]


def _pcm_to_float(frames: bytes, width: int) -> np.ndarray:
    """Integer PCM to float32 with miniaudio's scales (ma_pcm_*_to_f32)."""
    if width == 1:
        return np.frombuffer(frames, np.uint8).astype(np.float32) * np.float32(2 / 255) - np.float32(1)
    if width == 2:
        return np.frombuffer(frames, "<i2").astype(np.float32) * np.float32(1 / 32768)
    if width == 3:
        raw = np.frombuffer(frames, np.uint8).reshape(-1, 3).astype(np.int32)
        value = (raw[:, 0] << 8 | raw[:, 1] << 16 | raw[:, 2] << 24) >> 8
        return value.astype(np.float32) * np.float32(1 / 8388608)
    if width == 4:
        return (np.frombuffer(frames, "<i4").astype(np.float64) / 2147483648.0).astype(np.float32)
    raise MediaError(f"WAV audio with {width}-byte samples is not supported")


def _read_file(path: str, limits: MediaLimits) -> bytes:
    try:
        size = os.path.getsize(path)
        if size > limits.max_bytes:
            raise MediaError(f"audio file {path} is {size} bytes, over the {limits.max_bytes}-byte limit")
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise MediaError(f"cannot read audio file {path}: {error.strerror or error}") from error


# ---------------------------------------------------------------------------------------------
# the log-mel spectrogram
# ---------------------------------------------------------------------------------------------


def mel_filters(p: AudioParams) -> np.ndarray:
    """mtmd's ``fill_mel_filterbank_matrix`` with its defaults (Slaney scale, area-normalised,
    0 Hz to sample_rate / 2): float32 (n_mel, n_fft / 2 + 1)."""
    min_log_hz, lin_slope = 1000.0, 3 / 200.0
    min_log_mel, log_step = min_log_hz * lin_slope, np.log(6.4) / 27.0

    def hz_to_mel(f: float) -> float:
        return f * lin_slope if f < min_log_hz else min_log_mel + np.log(f / min_log_hz) / log_step

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return np.where(m < min_log_mel, m / lin_slope, min_log_hz * np.exp((m - min_log_mel) * log_step))

    m_lo, m_hi = hz_to_mel(0.0), hz_to_mel(0.5 * p.sample_rate)
    hz = mel_to_hz(m_lo + (m_hi - m_lo) * (np.arange(p.n_mel + 2) / (p.n_mel + 1)))
    left, center, right = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    f = np.arange(p.n_fft // 2 + 1) * (p.sample_rate / p.n_fft)
    rising = (f - left) / np.maximum(1e-30, center - left)
    falling = (right - f) / np.maximum(1e-30, right - center)
    w = np.where((f >= left) & (f <= center), rising, np.where((f > center) & (f <= right), falling, 0.0))
    return (w * (2.0 / np.maximum(1e-30, right - left))).astype(np.float32)


def _sin_cos_table(n: int) -> tuple[np.ndarray, np.ndarray]:
    """sinf / cosf of 2 pi i / n (the angle in double, the functions in float32)."""
    theta = (2 * np.pi * np.arange(n) / n).astype(np.float32)
    return np.sin(theta), np.cos(theta)


def _hann(p: AudioParams) -> np.ndarray:
    """The periodic Hann window, padded with zeros on both sides to n_fft if shorter."""
    i = np.arange(p.window_len)
    cos = np.cos((2.0 * np.pi * i / p.window_len).astype(np.float32)).astype(np.float64)
    window = (0.5 * (1.0 - cos)).astype(np.float32)
    pad = (p.n_fft - p.window_len) // 2
    return np.pad(window, (pad, p.n_fft - p.window_len - pad)) if pad >= 0 and p.window_len < p.n_fft else window


def _fft(x: np.ndarray, sin: np.ndarray, cos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mtmd-audio.cpp's forward ``fft_impl`` on real rows (frames, N), in float32: the real and
    imaginary parts. Even lengths split into even and odd samples; odd ones take the direct DFT."""
    n = x.shape[1]
    table = sin.size
    if n == 1:
        return x.copy(), np.zeros_like(x)
    if n % 2 == 1:
        return _dft(x, sin, cos)
    even_re, even_im = _fft(x[:, 0::2], sin, cos)
    odd_re, odd_im = _fft(x[:, 1::2], sin, cos)
    idx = np.arange(n // 2) * (table // n)
    w_re, w_im = cos[idx], -sin[idx]
    t_re, t_im = w_re * odd_re, w_re * odd_im
    re = np.concatenate([(even_re + t_re) - w_im * odd_im, (even_re - t_re) + w_im * odd_im], axis=1)
    im = np.concatenate([(even_im + t_im) + w_im * odd_re, (even_im - t_im) - w_im * odd_re], axis=1)
    return re, im


def _dft(x: np.ndarray, sin: np.ndarray, cos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``dft_impl``: each output bin the sum over the samples of sample × the table's cos / -sin
    at (k n step) mod table, in float32 (as a product: summed in einsum's order, not mtmd's loop's)."""
    n = x.shape[1]
    table = sin.size
    idx = (np.arange(n)[:, None] * np.arange(n)[None, :] * (table // n)) % table
    x = np.ascontiguousarray(x)
    # einsum: numpy's own loops (BLAS threads cost more than these small products)
    return np.einsum("fj,jk->fk", x, cos[idx]), -np.einsum("fj,jk->fk", x, sin[idx])


def _padded(samples: np.ndarray, p: AudioParams) -> np.ndarray:
    """The short-audio pad to n_fft / 2 + 1, the reflection in front, 30 s of zeros (and n_fft / 2) behind."""
    half = p.n_fft // 2
    if samples.size < half + 1:
        samples = np.pad(samples, (0, half + 1 - samples.size))
    tail = p.sample_rate * p.chunk_seconds + half
    return np.concatenate([samples[half:0:-1], samples, np.zeros(tail, np.float32)]).astype(np.float32)


def whisper_log_mel(samples: np.ndarray, p: AudioParams) -> np.ndarray:
    """The whole normalised log-mel spectrogram (n_mel, n_frames) float32, before the chunking."""
    padded = _padded(np.asarray(samples, np.float32), p)
    n_frames = (padded.size - p.n_fft) // p.hop_len + 1
    starts = np.arange(n_frames) * p.hop_len
    frames = padded[starts[:, None] + np.arange(p.n_fft)] * _hann(p)
    sin, cos = _sin_cos_table(p.n_fft)
    re, im = _fft(frames, sin, cos)
    n_bins = p.n_fft // 2 + 1
    power = re[:, :n_bins] * re[:, :n_bins] + im[:, :n_bins] * im[:, :n_bins]
    sums = power.astype(np.float64) @ mel_filters(p).astype(np.float64).T
    mel = np.log10(np.maximum(sums, MEL_FLOOR)).astype(np.float32).T
    floor = float(mel.max()) - 8.0
    return ((np.maximum(mel.astype(np.float64), floor) + 4.0) / 4.0).astype(np.float32)


def whisper_mel_chunks(samples: np.ndarray, p: AudioParams) -> list[np.ndarray]:
    """What ``mtmd_audio_preprocessor_whisper::preprocess`` hands the encoder: (n_mel, 3000)
    float32 chunks, one per 30 s of audio (the trailing padding's incomplete chunk dropped)."""
    samples = np.asarray(samples, np.float32)
    if samples.ndim != 1 or samples.size == 0:
        raise MediaError("audio has no samples")
    mel = whisper_log_mel(samples, p)
    n_chunks = mel.shape[1] // FRAMES_PER_CHUNK
    return [np.ascontiguousarray(mel[:, i * FRAMES_PER_CHUNK:(i + 1) * FRAMES_PER_CHUNK]) for i in range(n_chunks)]
