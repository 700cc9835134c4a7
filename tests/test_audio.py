"""Audio in (issue 38): loading and the Whisper log-mel spectrogram (ferrollama.generation.audio)
against llama.cpp's libmtmd records of the tiny Ultravox projector
(tests/data/scenarios/audio-ultravox-f32.json, benches/record_audio.py).

libmtmd does not expose its spectrogram, so the spectrogram is checked end to end: through a
float64 reference of the projector's graph (models/whisper-enc.cpp with the ultravox head, the
conv1d im2col and the attention's K/V rounded to f16 where ggml rounds them) written here, whose
embeddings must match mtmd_encode_chunk's within the embeddings tolerance. (The engine's own
encoder, rust/engine/src/vision/whisper.rs, is checked against the same records.)
"""
from __future__ import annotations

import base64
import io
import math
import wave
from pathlib import Path

import gguf
import numpy as np
import pytest

import ferrollama as fl
from ferrollama import _core
from ferrollama.generation.audio import (FRAMES_PER_CHUNK, WHISPER, decode_audio, is_audio, load_audio,
                                         whisper_mel_chunks)
from ferrollama.generation.media import MediaError
from ferrollama.generation.multimodal import MEDIA_MARKER, Projector
from test_vision import check_cli_answers_as_the_projector_api, cli_chat_args, ferrollama_cli
from vision_pairs import DATA, TOL_EMBD, Pair, check_prompt_matches_mtmd, pair_fixtures

PAIR = Pair("audio-ultravox-f32")
SCENARIO = PAIR.scn
SAMPLE_RATE = 16000


audio_file = PAIR.media_file


def mtmd_samples(name: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(SCENARIO["expected_samples_f32le_base64"][name]), "<f4")


@pytest.mark.parametrize("name", sorted(SCENARIO["audio"]))
def test_wav_samples_are_miniaudios(name: str) -> None:
    """16-bit mono and 8-bit stereo (averaged) WAV: mtmd's audio bitmap bit for bit."""
    got = load_audio(audio_file(name), SAMPLE_RATE)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, mtmd_samples(name))
    np.testing.assert_array_equal(load_audio(audio_file(name).read_bytes(), SAMPLE_RATE), got)


def wav_bytes(rate: int, samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()


@pytest.mark.parametrize(("data", "message"), [
    (b"fLaC" + bytes(40), "FLAC audio is not supported"),
    (b"ID3" + bytes(40), "MP3 audio is not supported"),
    (bytes([0xFF, 0xFB]) + bytes(40), "MP3 audio is not supported"),
    (b"RIFF" + bytes(4) + b"WAVE" + bytes(8), "cannot decode WAV audio"),
    (b"not audio at all", "not an audio file"),
    (wav_bytes(44100, np.zeros(100)), "WAV audio at 44100 Hz"),
    (wav_bytes(16000, np.zeros(0)), "WAV audio has no samples"),
])
def test_unsupported_audio_is_a_clear_error(data: bytes, message: str) -> None:
    with pytest.raises(MediaError, match=message):
        decode_audio(data, SAMPLE_RATE)


def test_sources_other_than_files_and_float_arrays_are_refused(tmp_path: Path) -> None:
    with pytest.raises(MediaError, match="cannot read audio file"):
        load_audio(tmp_path / "missing.wav", SAMPLE_RATE)
    with pytest.raises(MediaError, match="1-D float array"):
        load_audio(np.zeros((2, 3), np.float32), SAMPLE_RATE)
    with pytest.raises(MediaError, match="1-D float array"):
        load_audio(np.zeros(3, np.int16), SAMPLE_RATE)
    with pytest.raises(MediaError, match="cannot load audio from a list"):
        load_audio([0.0], SAMPLE_RATE)  # type: ignore[arg-type]


def test_is_audio_is_mtmds_header_check() -> None:
    assert is_audio(wav_bytes(16000, np.zeros(4)))
    assert not is_audio(b"\x89PNG\r\n\x1a\n" + bytes(8))
    assert not is_audio(b"RIFF")  # under 12 bytes


@pytest.mark.parametrize(("seconds", "chunks"), [(0.001, 1), (1.2, 1), (29.98, 1), (29.99, 2), (45.0, 2)])
def test_chunks_of_30_seconds(seconds: float, chunks: int) -> None:
    """mtmd pads 30 s of zeros behind the audio and drops the last incomplete chunk of 3000 frames:
    (n + 480000 + 400 - 400) / 160 + 1 frames, whole chunks of them (29.99 s makes 6000 frames:
    two chunks, the second almost all padding)."""
    n = max(1, round(seconds * SAMPLE_RATE))
    mel = whisper_mel_chunks(np.full(n, 0.1, np.float32), WHISPER(32))
    assert len(mel) == chunks == ((max(n, 201) + 480000) // 160 + 1) // FRAMES_PER_CHUNK
    assert all(m.shape == (32, FRAMES_PER_CHUNK) and m.dtype == np.float32 for m in mel)


# ---------------------------------------------------------------------------------------------
# end to end: the spectrogram through a reference of the projector's graph
# ---------------------------------------------------------------------------------------------


def tensors(path: Path = PAIR.mmproj) -> dict[str, np.ndarray]:
    reader = gguf.GGUFReader(path)
    return {t.name: np.array(t.data, dtype=np.float64).reshape(tuple(reversed(t.shape.tolist())))
            for t in reader.tensors}


def fields(path: Path = PAIR.mmproj) -> dict:
    reader = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if k.startswith("clip.")}


def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


def conv1d(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """ggml_conv_1d_ph: padding k / 2, the im2col and the kernel in f16. x: (channels, frames)."""
    k = kernel.shape[2]
    padded = np.pad(f16(x), ((0, 0), (k // 2, k // 2)))
    n_out = (padded.shape[1] - k) // stride + 1
    cols = np.stack([padded[:, i * stride:i * stride + k] for i in range(n_out)])  # (n_out, in, k)
    return np.einsum("oik,nik->on", f16(kernel), cols) + bias


def gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * g + b


def rms_norm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_head: int) -> np.ndarray:
    """Full attention with K and V rounded to f16 (ggml's flash attention)."""
    n, d = q.shape
    hd = d // n_head
    out = np.empty_like(q)
    for h in range(n_head):
        s = slice(h * hd, (h + 1) * hd)
        scores = q[:, s] @ f16(k[:, s]).T / math.sqrt(hd)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        out[:, s] = (p / p.sum(-1, keepdims=True)) @ f16(v[:, s])
    return out


def average_pairs(x: np.ndarray) -> np.ndarray:
    """ggml_pool_1d (average, kernel and stride 2) over the positions: an odd last one dropped."""
    n = x.shape[0] // 2 * 2
    return (x[0:n:2] + x[1:n:2]) / 2


def encoder_reference(mel: np.ndarray, w: dict[str, np.ndarray], kv: dict, *, pool: bool = False,
                      pool_after_post_ln: bool = False) -> np.ndarray:
    """models/whisper-enc.cpp's encoder in float64: the convolutions, the blocks, for Qwen2-Audio
    and Voxtral (`pool`) the average pool of two positions, which clip.cpp's build_vit puts before
    the post-LN (`pool_after_post_ln` moves it behind, for the contrast)."""
    eps, n_head = float(kv["clip.audio.attention.layer_norm_epsilon"]), int(kv["clip.audio.attention.head_count"])
    x = gelu_erf(conv1d(mel, w["a.conv1d.1.weight"], w["a.conv1d.1.bias"], 1))
    x = gelu_erf(conv1d(x, w["a.conv1d.2.weight"], w["a.conv1d.2.bias"], 2)).T
    x = x + w["a.position_embd.weight"][:x.shape[0]]
    for il in range(int(kv["clip.audio.block_count"])):
        p = f"a.blk.{il}."
        h = layer_norm(x, w[p + "ln1.weight"], w[p + "ln1.bias"], eps)
        q = h @ w[p + "attn_q.weight"].T + w[p + "attn_q.bias"]
        k = h @ w[p + "attn_k.weight"].T
        v = h @ w[p + "attn_v.weight"].T + w[p + "attn_v.bias"]
        x = x + attention(q, k, v, n_head) @ w[p + "attn_out.weight"].T + w[p + "attn_out.bias"]
        h = layer_norm(x, w[p + "ln2.weight"], w[p + "ln2.bias"], eps)
        u = gelu_erf(h @ w[p + "ffn_up.weight"].T + w[p + "ffn_up.bias"])
        x = x + u @ w[p + "ffn_down.weight"].T + w[p + "ffn_down.bias"]
    if pool and not pool_after_post_ln:
        x = average_pairs(x)
    x = layer_norm(x, w["a.post_ln.weight"], w["a.post_ln.bias"], eps)
    return average_pairs(x) if pool and pool_after_post_ln else x


def stack_frames(x: np.ndarray, stack: int) -> np.ndarray:
    """build_stack: the rows laid end to end in rows of `stack` frames, the last padded with zeros."""
    flat = x.reshape(-1)
    stride = stack * x.shape[1]
    return np.pad(flat, (0, -flat.size % stride)).reshape(-1, stride)


def ultravox_reference(mel: np.ndarray, w: dict[str, np.ndarray], kv: dict) -> np.ndarray:
    """models/whisper-enc.cpp's graph with the ultravox head, in float64."""
    x = stack_frames(encoder_reference(mel, w, kv), int(kv["clip.audio.projector.stack_factor"]))
    x = rms_norm(x, w["mm.a.norm_pre.weight"]) @ w["mm.a.mlp.1.weight"].T
    half = x.shape[1] // 2
    gate = x[:, half:]
    x = x[:, :half] * gate / (1 + np.exp(-gate))  # SwiGLU, the second half through SiLU
    return rms_norm(x, w["mm.a.norm_mid.weight"]) @ w["mm.a.mlp.2.weight"].T


@pytest.mark.parametrize("name", sorted(SCENARIO["audio"]))
def test_spectrogram_gives_mtmds_embeddings(name: str) -> None:
    kv = fields()
    (mel,) = whisper_mel_chunks(load_audio(audio_file(name), SAMPLE_RATE), WHISPER(int(kv["clip.audio.num_mel_bins"])))
    got = ultravox_reference(mel.astype(np.float64), tensors(), kv)
    want = np.array(SCENARIO["expected_embeddings"][name])
    assert got.shape == want.shape
    assert np.abs(got - want).max() < TOL_EMBD


# ---------------------------------------------------------------------------------------------
# the engine's encoder (rust/engine/src/vision/whisper.rs)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def audio_projector() -> _core.AudioProjector:
    return _core.AudioProjector(PAIR.mmproj, n_threads=2)


def test_audio_projector_reads_the_ultravox_keys(audio_projector: _core.AudioProjector) -> None:
    p = audio_projector
    assert (p.projector_type, p.n_mel, p.sample_rate, p.stack_factor, p.n_embd, p.n_embd_out) == ("ultravox", 32, 16000, 12, 64, 256)
    # clip_n_output_tokens: 3000 frames aligned to 12, stacked, halved
    assert p.n_output_tokens(FRAMES_PER_CHUNK) == len(SCENARIO["expected_embeddings"]["tone"]) == 125


@pytest.mark.parametrize("name", sorted(SCENARIO["audio"]))
def test_engine_embeddings_match_mtmd(audio_projector: _core.AudioProjector, name: str) -> None:
    (mel,) = whisper_mel_chunks(load_audio(audio_file(name), SAMPLE_RATE), WHISPER(audio_projector.n_mel))
    got = audio_projector.encode_mel(mel)
    want = np.array(SCENARIO["expected_embeddings"][name])
    assert got.shape == want.shape
    assert np.abs(got - want).max() < TOL_EMBD


def test_bad_spectrograms_and_files_are_clear_errors(audio_projector: _core.AudioProjector) -> None:
    with pytest.raises(ValueError, match=r"mel must have shape \(32, n_frames\)"):
        audio_projector.encode_mel(np.zeros((80, 3000), np.float32))
    with pytest.raises(ValueError, match="over the encoder's 1500"):
        audio_projector.encode_mel(np.zeros((32, 3002), np.float32))
    with pytest.raises(fl.Error, match="audio encoder: load it as an audio projector"):
        _core.Projector(PAIR.mmproj)
    with pytest.raises(fl.Error, match="no audio encoder"):
        _core.AudioProjector(DATA / "models" / "tiny-mmproj-gemma3-f16.gguf")


# ---------------------------------------------------------------------------------------------
# through ferrollama.generation.multimodal.Projector: mtmd's chunks and mtmd_helper_eval_chunks
# ---------------------------------------------------------------------------------------------


model, proj = pair_fixtures(PAIR)


def test_projector_encodes_paths_bytes_and_samples(proj: Projector) -> None:
    want = np.array(SCENARIO["expected_embeddings"]["tone"])
    for source in (audio_file("tone"), str(audio_file("tone")), audio_file("tone").read_bytes(), mtmd_samples("tone")):
        assert np.abs(proj.encode(source) - want).max() < TOL_EMBD


def test_media_of_the_other_kind_is_a_clear_error(model: fl.Model, proj: Projector) -> None:
    with pytest.raises(MediaError, match="not an audio file"):
        proj.encode(DATA / "images" / "square-64.png")
    with pytest.raises(MediaError, match="an image given to the ultravox projector"):
        proj.encode(np.zeros((8, 8, 3), np.uint8))
    vision = Projector(model, DATA / "models" / "tiny-mmproj-llava-f16.gguf", n_threads=1)
    with pytest.raises(MediaError, match="audio given to the mlp projector"):
        vision.encode(audio_file("tone").read_bytes())


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("case", range(len(SCENARIO["evals"])))
def test_prompt_with_audio_matches_mtmd(model: fl.Model, proj: Projector, case: int, cache_type: str) -> None:
    check_prompt_matches_mtmd(model, proj, PAIR, case, cache_type, non_causal=False)


#: ChatML over list contents (the tiny llama has no template of its own; the builtin ChatML takes strings)
LIST_CONTENT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}"
                         "{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_llama_chat_with_input_audio_decodes_the_template_text_with_the_audio(model: fl.Model, proj: Projector) -> None:
    from ferrollama.chat.media import with_media_markers
    from ferrollama.llama_chat_format import MTMDChatHandler

    llm = fl.Llama(str(PAIR.model_path), n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2,
                   chat_template=LIST_CONTENT_TEMPLATE,
                   chat_handler=MTMDChatHandler(clip_model_path=str(PAIR.mmproj)), verbose=False)
    data = base64.b64encode(audio_file("tone").read_bytes()).decode()
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this sound?"},
                                             {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}]
    r = llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0, logprobs=True, top_logprobs=1)
    text = llm.chat_template.apply(with_media_markers(messages), add_generation_prompt=True)
    ctx = fl.Context(model, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
    n_past = proj.eval(ctx, text, [audio_file("tone")])
    logits = np.asarray(ctx.logits(-1), np.float64)
    got = r["choices"][0]["logprobs"]["content"][0]
    assert got["token"] == model.token_to_piece(int(np.argmax(logits)), True).decode()
    assert abs(got["logprob"] - (logits.max() - logits.max() - np.log(np.exp(logits - logits.max()).sum()))) < 1e-4
    assert r["usage"]["prompt_tokens"] == n_past
    bad = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "%%", "format": "wav"}}]}]
    with pytest.raises(ValueError, match="not base64"):
        llm.create_chat_completion(messages=bad, max_tokens=1)


def test_cli_chat_with_audio_answers_as_the_projector_api(model: fl.Model, proj: Projector) -> None:
    check_cli_answers_as_the_projector_api(model, proj, PAIR, "--audio", audio_file("tone"))
    base = cli_chat_args(PAIR)
    # /audio in a conversation, then the message it goes with
    r = ferrollama_cli(*base, stdin=f"/audio {audio_file('stereo')}\nTell me\n")
    assert r.returncode == 0 and "audio loaded" in r.stderr, r.stderr
    r = ferrollama_cli(*base, "--audio", str(DATA / "images" / "square-64.png"), "-p", "Tell me")
    assert r.returncode != 0 and "not an audio file" in r.stderr, r.stderr


def test_server_chat_with_input_audio_decodes_it_in_the_slot(model: fl.Model, proj: Projector) -> None:
    import openai
    from ferrollama.chat.templates import ChatTemplate
    from serving import start_server

    server, scheduler = start_server(model, n_seq=2, n_ctx=512, projector=proj)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        data = base64.b64encode(audio_file("tone").read_bytes()).decode()
        messages = [{"role": "user", "content": [{"type": "text", "text": "What is this sound?"},
                                                 {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}]
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=1, temperature=0, logprobs=True,
                                           top_logprobs=1)
        text = ChatTemplate.from_model(model).apply([{"role": "user", "content": f"What is this sound?{MEDIA_MARKER}"}])
        ctx = fl.Context(model, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, type_k="f16", type_v="f16")
        n_past = proj.eval(ctx, text, [audio_file("tone")])
        logits = np.asarray(ctx.logits(-1), np.float64)
        lp = r.choices[0].logprobs.content[0]
        assert lp.token == model.token_to_piece(int(np.argmax(logits)), True).decode()
        assert r.usage.prompt_tokens == n_past
        bad = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "%%", "format": "wav"}}]}]
        with pytest.raises(openai.BadRequestError, match="not base64"):
            client.chat.completions.create(model="m", messages=bad, max_tokens=1)
    finally:
        server.stop()
        scheduler.close()
