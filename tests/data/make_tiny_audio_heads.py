#!/usr/bin/env python3
"""Writes two tiny random audio pairs on make_tiny_audio.py's Whisper encoder, with the heads
clip.cpp's models/whisper-enc.cpp runs for Qwen2-Audio and Voxtral (benches/record_audio.py records
llama.cpp's libmtmd on them and make_tiny_audio.py's two WAV files into
tests/data/scenarios/audio-qwen2a-f32.json and audio-voxtral-f32.json):

- tests/data/models/tiny-qwen2a-f32.gguf: a tiny qwen2 (Qwen2-Audio's text architecture: biases on
  Q, K and V) trained to 1024 positions (an audio chunk is 750 tokens), on the tiny llama's vocabulary, where two merges no English prompt uses become
  Qwen's audio markers "<|audio_bos|>" and "<|audio_eos|>", CONTROL tokens (mtmd puts them around
  the audio).
- tests/data/models/tiny-mmproj-qwen2a-f16.gguf: a `clip` file with an audio encoder of projector
  type qwen2a as convert_hf_to_gguf.py writes Qwen2-Audio's (conversion/ultravox.py): the encoder
  (32 mel bins, width 64, 4 heads, 2 blocks, 1500 positions), the average pool of two positions
  clip.cpp's build_vit applies before the post-LN (1500 -> 750 audio tokens), then `mm.a.fc`
  (64 -> 256, with bias). No stack factor (Qwen2-Audio's conversion writes none).
- tests/data/models/tiny-voxtral-f32.gguf: a tiny llama (Voxtral's text architecture) on the same
  vocabulary with "[BEGIN_AUDIO]" (Mistral's audio marker, which mtmd puts before the audio) in
  place of a merge.
- tests/data/models/tiny-mmproj-voxtral-f16.gguf: projector type voxtral (conversion/ultravox.py):
  the encoder, the same pool, frames stacked by clip.audio.projector.stack_factor, `mm.a.mlp.1`
  (stacked width -> 128), GELU (erf), `mm.a.mlp.2` (128 -> 256), no biases. The stack factor is 5
  (150 audio tokens): Voxtral's own 4 makes libmtmd 0.3.36 abort (clip.cpp stacks the 750 pooled
  positions into 188 rows but counts 3000 / 4 / 2 / 2 = 187 output tokens), as Ultravox's 8 does.
- tests/data/models/tiny-qwen25omni-f32.gguf: a tiny qwen2vl (Qwen2.5-Omni's thinker: M-RoPE,
  make_tiny_qwenvl.py's) trained to 1024 positions, on the same vocabulary
  with Qwen's image markers "<|vision_start|>" / "<|vision_end|>" and audio markers
  "<|audio_bos|>" / "<|audio_eos|>" in place of the four Cyrillic merges.
- tests/data/models/tiny-mmproj-qwen2.5o-f16.gguf: Qwen2.5-Omni's file, both encoders in one
  (conversion/qwenvl.py's Qwen25OmniModel: clip.projector_type qwen2.5o, clip.has_vision_encoder
  and clip.has_audio_encoder): make_tiny_vision_qwen.py's Qwen2.5-VL encoder (window attention,
  merger) and the Qwen2-Audio encoder and fc above, both to the text model's 256. clip.cpp runs the
  vision half as qwen2.5vl_merger and the audio half as qwen2a.
F16 matrices and conv kernels, F32 vectors and positions, as an f16 mmproj conversion writes them.
Weights scaled so that the audio embeddings have an RMS of about 2 (the order of real ones).

  python tests/data/make_tiny_audio_heads.py      # deterministic
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_archs as mk  # noqa: E402
import make_tiny_audio as ta  # noqa: E402
import make_tiny_vision_qwen as tvq  # noqa: E402

DATA = mk.DATA
_CONTROL = gguf.TokenType.CONTROL

QWEN2_TEXT = mk.Spec("qwen2a", "qwen2", {"rope.freq_base": 1000000.0}, qkv_bias=True)
#: the tiny models' sizes, trained to 1024 positions
QWEN2_DIMS = mk.Dims(n_ctx=1024)
VOXTRAL_TEXT = mk.Spec("voxtral", "llama")


@dataclass(frozen=True)
class Pair:
    text_model: str
    text_spec: mk.Spec
    text_dims: mk.Dims
    #: token id -> the audio marker it becomes (in place of a Cyrillic merge of the tiny llama's vocabulary)
    markers: dict
    mmproj: str
    projector: str
    #: stack 0: no stacked frames, Qwen2-Audio's fc head (else Voxtral's MLP)
    audio: ta.AudioDims
    #: a vision encoder beside the audio one (Qwen2.5-Omni's file)
    vision: bool = False


QWEN2A = Pair("tiny-qwen2a-f32.gguf", QWEN2_TEXT, QWEN2_DIMS, {494: ("<|audio_bos|>", _CONTROL), 507: ("<|audio_eos|>", _CONTROL)},
              "tiny-mmproj-qwen2a-f16.gguf", "qwen2a", replace(ta.AUDIO_DIMS, stack=0))
VOXTRAL = Pair("tiny-voxtral-f32.gguf", VOXTRAL_TEXT, mk.TINY, {494: ("[BEGIN_AUDIO]", _CONTROL)},
               "tiny-mmproj-voxtral-f16.gguf", "voxtral", replace(ta.AUDIO_DIMS, stack=5))
OMNI_TEXT = mk.Spec("qwen25omni", "qwen2vl", {"rope.freq_base": 1000000.0, "rope.dimension_sections": [8, 12, 12, 0]},
                    qkv_bias=True)
OMNI = Pair("tiny-qwen25omni-f32.gguf", OMNI_TEXT, QWEN2_DIMS,
            {494: ("<|vision_start|>", _CONTROL), 507: ("<|vision_end|>", _CONTROL),
             464: ("<|audio_bos|>", _CONTROL), 477: ("<|audio_eos|>", _CONTROL)},
            "tiny-mmproj-qwen2.5o-f16.gguf", "qwen2.5o", QWEN2A.audio, vision=True)
#: Qwen2.5-Omni's vision half: make_tiny_vision_qwen's Qwen2.5-VL encoder
OMNI_VISION = tvq.QWEN25VL
PAIRS = (QWEN2A, VOXTRAL, OMNI)


def add_metadata(w: gguf.GGUFWriter, pair: Pair) -> None:
    """make_tiny_audio's keys, without the stack factor where the projector takes none."""
    ta.add_audio_metadata(w, pair.audio, pair.projector)
    if not pair.audio.stack:
        del w.kv_data[0]["clip.audio.projector.stack_factor"]


def add_omni_metadata(w: gguf.GGUFWriter, pair: Pair) -> None:
    """The Qwen2.5-VL keys with the type qwen2.5o, then the audio encoder's (no stack factor)."""
    tvq.add_qwen_metadata(w, OMNI_VISION)
    keys = w.kv_data[0]
    keys["clip.projector_type"].value = pair.projector
    w.add_bool("clip.has_audio_encoder", True)
    for key, value in (("num_mel_bins", pair.audio.n_mel), ("embedding_length", pair.audio.n_embd),
                       ("feed_forward_length", pair.audio.n_ff), ("block_count", pair.audio.n_layer),
                       ("attention.head_count", pair.audio.n_head), ("projection_dim", pair.audio.n_embd_out)):
        w.add_uint32(f"clip.audio.{key}", value)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)


def add_head_weights(wt: mk.Weights, pair: Pair) -> None:
    a = pair.audio
    if not a.stack:
        wt.matrix("mm.a.fc.weight", a.n_embd_out, a.n_embd, std=0.25)
        wt.bias("mm.a.fc.bias", a.n_embd_out)
    else:
        wt.matrix("mm.a.mlp.1.weight", a.n_hidden, a.n_embd * a.stack, std=0.1)
        wt.matrix("mm.a.mlp.2.weight", a.n_embd_out, a.n_hidden, std=0.15)


def write_mmproj(pair: Pair, path: Path | None = None) -> None:
    """The pair's projector, at tests/data/models/<pair.mmproj> unless `path` is given."""
    w = gguf.GGUFWriter(str(path or DATA / "models" / pair.mmproj), "clip")
    (add_omni_metadata if pair.vision else add_metadata)(w, pair)
    wt = mk.Weights(w, np.random.default_rng(3839), "f16")
    if pair.vision:
        tvq.add_qwen_weights(wt, OMNI_VISION)
    ta.add_whisper_weights(wt, pair.audio)
    add_head_weights(wt, pair)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    for pair in PAIRS:
        mk.write_model(pair.text_spec, "f32", DATA / "models" / pair.text_model, dims=pair.text_dims,
                       vocab=lambda w, markers=pair.markers: mk.copy_vocab(w, markers))
        write_mmproj(pair)
        print("wrote", pair.text_model, pair.mmproj)


if __name__ == "__main__":
    main()
