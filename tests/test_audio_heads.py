"""Audio in (issue 38): the Whisper-encoder projector types beyond Ultravox, Qwen2-Audio (`qwen2a`),
Voxtral (`voxtral`) and Qwen2.5-Omni's file with both encoders (`qwen2.5o`), against llama.cpp's
libmtmd records of the tiny pairs (tests/data/make_tiny_audio_heads.py;
tests/data/scenarios/audio-qwen2a-f32.json, audio-voxtral-f32.json and audio-qwen2.5o-f32.json,
benches/record_audio.py): the engine's embeddings (rust/engine/src/vision/whisper.rs), a float64
reference of clip.cpp's graph (where the average pool sits), prompts with audio (and an image)
through mtmd's chunks (the family's audio markers) and mtmd_helper_eval_chunks' logits, and the
same through Llama and the server.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import ferrollama as fl
from ferrollama import _core
from ferrollama.generation.audio import FRAMES_PER_CHUNK, WHISPER, load_audio, whisper_mel_chunks
from ferrollama.generation.multimodal import ImageChunk, Projector
from scenario_runner import TOL_TINY_FLOAT_MAX
from test_audio import SAMPLE_RATE, encoder_reference, fields, gelu_erf, stack_frames, tensors
from vision_pairs import DATA, TOL_EMBD, Pair, check_prompt_matches_mtmd, load_projectors, logits_off_with

sys.path.insert(0, str(DATA))
import make_tiny_audio_heads as heads  # noqa: E402

PAIRS = {"qwen2a": Pair("audio-qwen2a-f32"), "voxtral": Pair("audio-voxtral-f32")}
CASES = [(key, case) for key, pair in PAIRS.items() for case in range(len(pair.scn["evals"]))]
MEDIA = [(key, name) for key, pair in PAIRS.items() for name in sorted(pair.media)]


@pytest.fixture(scope="module")
def projs() -> dict[str, Projector]:
    return load_projectors(PAIRS)


def mel_of(pair: Pair, name: str, n_mel: int) -> np.ndarray:
    (mel,) = whisper_mel_chunks(load_audio(pair.media_file(name), SAMPLE_RATE), WHISPER(n_mel))
    return mel


@pytest.mark.parametrize(("key", "stack", "n_tokens", "width"), [("qwen2a", 1, 750, 256), ("voxtral", 5, 150, 256)])
def test_audio_projector_reads_the_keys(projs: dict[str, Projector], key: str, stack: int, n_tokens: int,
                                        width: int) -> None:
    """clip_n_output_tokens: 3000 frames (stacked), halved by the convolution, halved by the pool."""
    core = projs[key].core
    assert (core.projector_type, core.n_mel, core.sample_rate, core.stack_factor, core.n_embd_out) == (key, 32, 16000, stack, width)
    assert core.n_output_tokens(FRAMES_PER_CHUNK) == n_tokens == len(PAIRS[key].scn["expected_embeddings"]["tone"])


@pytest.mark.parametrize(("key", "name"), MEDIA)
def test_engine_embeddings_match_mtmd(projs: dict[str, Projector], key: str, name: str) -> None:
    pair = PAIRS[key]
    got = projs[key].encode(pair.media_file(name))
    want = np.asarray(pair.scn["expected_embeddings"][name])
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= TOL_EMBD


def head_reference(key: str, x: np.ndarray, w: dict[str, np.ndarray], kv: dict) -> np.ndarray:
    """whisper-enc.cpp's heads in float64: Qwen2-Audio's fc with bias; Voxtral's stacked frames
    through mm.a.mlp.1, GELU (erf), mm.a.mlp.2."""
    if key == "qwen2a":
        return x @ w["mm.a.fc.weight"].T + w["mm.a.fc.bias"]
    x = stack_frames(x, int(kv["clip.audio.projector.stack_factor"]))
    return gelu_erf(x @ w["mm.a.mlp.1.weight"].T) @ w["mm.a.mlp.2.weight"].T


@pytest.mark.parametrize("key", sorted(PAIRS))
def test_reference_pools_before_the_post_ln_as_clip(key: str) -> None:
    """The graph's float64 reference on the spectrogram gives mtmd's embeddings; the pool moved
    behind the post-LN moves them beyond the tolerance (the pool's place is what is tested)."""
    pair = PAIRS[key]
    kv, w = fields(pair.mmproj), tensors(pair.mmproj)
    mel = mel_of(pair, "tone", int(kv["clip.audio.num_mel_bins"])).astype(np.float64)
    want = np.asarray(pair.scn["expected_embeddings"]["tone"])
    got = head_reference(key, encoder_reference(mel, w, kv, pool=True), w, kv)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= TOL_EMBD
    moved = head_reference(key, encoder_reference(mel, w, kv, pool=True, pool_after_post_ln=True), w, kv)
    assert np.abs(moved - want).max() > 10 * TOL_EMBD


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize(("key", "case"), CASES)
def test_prompt_with_audio_matches_mtmd(projs: dict[str, Projector], key: str, case: int, cache_type: str) -> None:
    """mtmd's chunks (Qwen2-Audio's <|audio_bos|> / <|audio_eos|>, Voxtral's [BEGIN_AUDIO]),
    the audio decoded causally, n_past and the last logits."""
    proj = projs[key]
    chunks, _ = check_prompt_matches_mtmd(proj.model, proj, PAIRS[key], case, cache_type, non_causal=False)
    markers = {"qwen2a": ("<|audio_bos|>", "<|audio_eos|>"), "voxtral": ("[BEGIN_AUDIO]", None)}[key]
    i = next(i for i, c in enumerate(chunks) if isinstance(c, ImageChunk))
    assert chunks[i - 1].tokens[-1] == proj.model.tokenize(markers[0], add_special=False, parse_special=True)[0]
    if markers[1] is not None:
        assert chunks[i + 1].tokens[0] == proj.model.tokenize(markers[1], add_special=False, parse_special=True)[0]


def other_audio(proj: Projector) -> Callable[[ImageChunk], None]:
    """A chunk change for logits_off_with: an audio chunk's rows replaced by the stereo file's."""
    rows = proj.encode(DATA / "audio" / "stereo-8bit.wav")

    def change(chunk: ImageChunk) -> None:
        if chunk.audio:
            chunk.embd = rows.copy()
    return change


@pytest.mark.parametrize("key", sorted(PAIRS))
def test_other_audio_in_its_place_moves_the_logits(projs: dict[str, Projector], key: str) -> None:
    """The contrast of the logits check: the first prompt with another audio's embeddings."""
    proj = projs[key]
    assert logits_off_with(proj.model, proj, PAIRS[key], other_audio(proj)) > 2 * TOL_TINY_FLOAT_MAX


def test_voxtrals_own_stack_factor_is_a_clear_error(tmp_path: Path) -> None:
    """Voxtral's stack factor of 4 stacks the 750 pooled positions into 188 rows where clip.cpp
    counts 187 tokens (3000 / 4 / 2 / 2): libmtmd 0.3.36 aborts; the engine raises."""
    path = tmp_path / "voxtral-stack4.gguf"
    heads.write_mmproj(replace(heads.VOXTRAL, audio=replace(heads.VOXTRAL.audio, stack=4)), path)
    core = _core.AudioProjector(path, n_threads=1)
    assert core.n_output_tokens(FRAMES_PER_CHUNK) == 187
    with pytest.raises(ValueError, match="give 188 stacked rows where clip.cpp counts 187 tokens"):
        core.encode_mel(np.zeros((32, FRAMES_PER_CHUNK), np.float32))



# ---------------------------------------------------------------------------------------------
# Qwen2.5-Omni: one file with both encoders (qwen2.5o), a text model with M-RoPE
# ---------------------------------------------------------------------------------------------

OMNI = Pair("audio-qwen2.5o-f32")


@pytest.fixture(scope="module")
def omni() -> Projector:
    return load_projectors({"omni": OMNI})["omni"]


def test_omni_file_loads_as_both_halves(omni: Projector) -> None:
    """clip.cpp corrects qwen2.5o by modality: the vision half runs as qwen2.5vl_merger, the audio
    half as qwen2a; each loader leaves the other half's keys and tensors alone."""
    assert (omni.core.projector_type, omni.audio_core.projector_type, omni.is_audio) == ("qwen2.5vl_merger", "qwen2a", False)
    assert omni.family.img_beg == "<|vision_start|>" and omni.audio_family.img_beg == "<|audio_bos|>"


@pytest.mark.parametrize("name", sorted(OMNI.media))
def test_omni_embeddings_match_mtmd(omni: Projector, name: str) -> None:
    """An image goes to the vision half and audio (a WAV file) to the audio half, as mtmd tells them apart."""
    got = omni.encode(OMNI.media_file(name))
    want = np.asarray(OMNI.scn["expected_embeddings"][name])
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= TOL_EMBD


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("case", range(len(OMNI.scn["evals"])))
def test_omni_prompt_with_image_and_audio_matches_mtmd(omni: Projector, case: int, cache_type: str) -> None:
    """An image at 2-D M-RoPE positions and audio at 1-D ones in one prompt: mtmd's chunks, n_past, logits."""
    check_prompt_matches_mtmd(omni.model, omni, OMNI, case, cache_type, non_causal=False)


def test_omni_contrasts_move_the_logits(omni: Projector) -> None:
    """The contrasts: the audio's tokens at an image row's 2-D positions instead of mtmd's 1-D
    ones, and another audio's embeddings in place of the tone's."""

    def as_image_row(chunk: ImageChunk) -> None:
        chunk.audio = False

    assert logits_off_with(omni.model, omni, OMNI, as_image_row) > 2 * TOL_TINY_FLOAT_MAX
    assert logits_off_with(omni.model, omni, OMNI, other_audio(omni)) > 2 * TOL_TINY_FLOAT_MAX


def test_other_audio_types_and_mixed_files_are_refused_by_name(tmp_path: Path) -> None:
    """An audio projector type the engine does not run (GLM-ASR's glma), and a file with both
    encoders of another type than Qwen2.5-Omni's, are refused naming what is not supported."""
    glma = tmp_path / "glma.gguf"
    heads.write_mmproj(replace(heads.VOXTRAL, projector="glma"), glma)
    with pytest.raises(fl.Error, match=r"audio projector type 'glma' is not supported \(supported: ultravox, qwen2a, voxtral\)"):
        _core.AudioProjector(glma)
    mixed = tmp_path / "mixed.gguf"
    heads.write_mmproj(replace(heads.OMNI, projector="qwen2.5vl_merger"), mixed)
    with pytest.raises(fl.Error, match="a projector of type 'qwen2.5vl_merger' with both vision and audio encoders"):
        _core.AudioProjector(mixed)
    with pytest.raises(fl.Error, match="has an audio encoder: load it as an audio projector"):
        _core.Projector(mixed)


def test_llama_chat_with_an_image_and_audio_decodes_both(omni: Projector) -> None:
    """Llama with Qwen2.5-Omni's file: an image_url part and an input_audio part in one message go
    to their halves; the first token and its logprob are the projector API's on the template text."""
    import base64

    from ferrollama.chat.media import with_media_markers
    from ferrollama.llama_chat_format import MTMDChatHandler
    from test_audio import LIST_CONTENT_TEMPLATE

    context = OMNI.scn["context"]
    llm = fl.Llama(str(OMNI.model_path), n_ctx=context["n_ctx"], n_batch=context["n_batch"], n_ubatch=context["n_ubatch"],
                   n_threads=2, chat_template=LIST_CONTENT_TEMPLATE,
                   chat_handler=MTMDChatHandler(clip_model_path=str(OMNI.mmproj)), verbose=False)
    image = "data:image/png;base64," + base64.b64encode(OMNI.media_file("square").read_bytes()).decode()
    audio = base64.b64encode(OMNI.media_file("tone").read_bytes()).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                             {"type": "text", "text": "and this sound?"},
                                             {"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}}]}]
    r = llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0, logprobs=True, top_logprobs=1)
    text = llm.chat_template.apply(with_media_markers(messages), add_generation_prompt=True)
    ctx = OMNI.context(omni.model)
    n_past = omni.eval(ctx, text, [OMNI.media_file("square"), OMNI.media_file("tone")])
    logits = np.asarray(ctx.logits(-1), np.float64)
    got = r["choices"][0]["logprobs"]["content"][0]
    assert got["token"] == omni.model.token_to_piece(int(np.argmax(logits)), True).decode()
    assert abs(got["logprob"] - (-np.log(np.exp(logits - logits.max()).sum()))) < 1e-4
    assert r["usage"]["prompt_tokens"] == n_past


def test_server_chat_with_an_image_and_audio_decodes_both(omni: Projector) -> None:
    """The server with Qwen2.5-Omni's file: an image_url part and an input_audio part in one message."""
    import base64

    import openai
    from ferrollama.chat.templates import ChatTemplate
    from ferrollama.generation.multimodal import MEDIA_MARKER
    from serving import start_server

    server, scheduler = start_server(omni.model, n_seq=2, n_ctx=2048, projector=omni)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        image = "data:image/png;base64," + base64.b64encode(OMNI.media_file("square").read_bytes()).decode()
        audio = base64.b64encode(OMNI.media_file("tone").read_bytes()).decode()
        messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                 {"type": "image_url", "image_url": {"url": image}},
                                                 {"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}}]}]
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=1, temperature=0, logprobs=True,
                                           top_logprobs=1)
        text = ChatTemplate.from_model(omni.model).apply(
            [{"role": "user", "content": f"What is this?{MEDIA_MARKER}{MEDIA_MARKER}"}])
        ctx = OMNI.context(omni.model, "f16")
        n_past = omni.eval(ctx, text, [OMNI.media_file("square"), OMNI.media_file("tone")])
        logits = np.asarray(ctx.logits(-1), np.float64)
        assert r.choices[0].logprobs.content[0].token == omni.model.token_to_piece(int(np.argmax(logits)), True).decode()
        assert r.usage.prompt_tokens == n_past
    finally:
        server.stop()
        scheduler.close()


def test_cli_chat_with_an_image_and_audio_answers_as_the_projector_api(omni: Projector) -> None:
    """`ferrollama chat --image PATH --audio PATH` with Qwen2.5-Omni's file: a marker before the
    prompt for each medium (llama-mtmd-cli), the greedy tokens after the projector's decode."""
    from ferrollama.chat.templates import ChatTemplate
    from ferrollama.generation.multimodal import MEDIA_MARKER
    from test_vision import cli_chat_args, ferrollama_cli

    media = [OMNI.media_file("square"), OMNI.media_file("tone")]
    r = ferrollama_cli(*cli_chat_args(OMNI, 2048), "--image", str(media[0]), "--audio", str(media[1]), "-p", "Tell me")
    assert r.returncode == 0, r.stderr
    text = ChatTemplate.from_model(omni.model).apply([{"role": "user", "content": 2 * MEDIA_MARKER + "Tell me"}])
    ctx = OMNI.context(omni.model, "f16", n_ctx=2048)
    n_past = omni.eval(ctx, text, media)
    out = []
    for _ in range(6):
        token = int(np.argmax(ctx.logits(-1)))
        if omni.model.is_eog(token):
            break
        out.append(omni.model.token_to_piece(token, False))
        ctx.decode(fl.Batch.from_tokens([token], n_past, 0))
        n_past += 1
    assert r.stdout.strip() and r.stdout.strip("\n") == b"".join(out).decode(errors="replace").strip("\n")
