"""Prompts with images through the Qwen VL projectors into their text models (qwen2vl for the
qwen2vl_merger and qwen2.5vl_merger projectors, qwen3vl with DeepStack rows for qwen3vl_merger):
the chunks, n_past and the logits after the prompt against llama.cpp's libmtmd
(mtmd_helper_eval_chunks, recorded by benches/record_vision_qwen.py), where the image's tokens
take mtmd's 2-D M-RoPE positions and max(nx, ny) positions of the sequence."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ferrollama as fl
from ferrollama.generation.multimodal import ImageChunk, Projector, TextChunk, eval_chunks, prompt_keys
from scenario_runner import TOL_TINY_FLOAT_MAX
from test_vision import chunk_record

DATA = Path(__file__).resolve().parent / "data"
TYPES = ("qwen2vl", "qwen2.5vl", "qwen3vl")
SCNS = {ty: json.loads((DATA / "scenarios" / f"vision-{ty}-f32.json").read_text()) for ty in TYPES}
CASES = [(ty, i) for ty in TYPES for i in range(len(SCNS[ty]["evals"]))]


def image(ty: str, name: str) -> Path:
    return DATA / SCNS[ty]["images"][name]


@pytest.fixture(scope="module")
def pairs() -> dict[str, Projector]:
    models = {}
    out = {}
    for ty in TYPES:
        path = str(DATA / "models" / SCNS[ty]["model"])
        model = models.setdefault(path, fl.Model(path))
        out[ty] = Projector(model, DATA / "models" / SCNS[ty]["mmproj"], n_threads=2)
    return out


def context(model: fl.Model, ty: str, cache_type: str = "f32") -> fl.Context:
    c = SCNS[ty]["context"]
    return fl.Context(model, n_ctx=c["n_ctx"], n_batch=c["n_batch"], n_ubatch=c["n_ubatch"], n_seq_max=c["n_seq_max"],
                      n_threads=2, type_k=cache_type, type_v=cache_type)


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("ty, case", CASES)
def test_prompt_with_images_matches_mtmd(pairs: dict[str, Projector], ty: str, case: int, cache_type: str) -> None:
    proj, ev = pairs[ty], SCNS[ty]["evals"][case]
    images = [image(ty, n) for n in ev["images"]]
    chunks = proj.tokenize(ev["prompt"], images)
    assert [chunk_record(c) for c in chunks] == ev["expected_chunks"]
    ctx = context(proj.model, ty, cache_type)
    assert eval_chunks(ctx, chunks, ev["n_past"], ev["seq_id"]) == ev["expected_n_past"]
    want = np.asarray(ev["expected_logits_last" if cache_type == "f32" else "expected_logits_last_kv_f16"])
    assert np.abs(ctx.logits(-1) - want).max() <= TOL_TINY_FLOAT_MAX


def test_image_tokens_take_2d_positions(pairs: dict[str, Projector]) -> None:
    # the wide image: 11 x 6 tokens after 5 positions (qwen2vl: 14-pixel patches merged 2 x 2)
    chunk = ImageChunk(np.zeros((66, 256), np.float32), "x", mrope=True, nx=11, ny=6)
    pos = chunk.positions(5)
    assert chunk.n_pos == 11 and pos.shape == (66, 4)
    assert pos[0].tolist() == [5, 5, 5, 0] and pos[12].tolist() == [5, 6, 6, 0] and pos[-1].tolist() == [5, 10, 15, 0]
    chunks = pairs["qwen2vl"].tokenize("a <__media__> b", [image("qwen2vl", "wide")])
    grid = [(c.nx, c.ny, c.mrope) for c in chunks if isinstance(c, ImageChunk)]
    assert grid == [(11, 6, True)]
    # the prompt's keys take the image's positions, not its tokens (the caches of Llama and the server)
    keys, images = prompt_keys(chunks)
    n_text = sum(len(c.tokens) for c in chunks if isinstance(c, TextChunk))
    assert len(keys) == n_text + 11 and len(images) == 1


def test_1d_positions_are_not_mtmds(pairs: dict[str, Projector]) -> None:
    # the same chunks at consecutive positions (as an image on a model without M-RoPE) end far off
    ty, ev = "qwen3vl", SCNS["qwen3vl"]["evals"][0]
    proj = pairs[ty]
    chunks = proj.tokenize(ev["prompt"], [image(ty, n) for n in ev["images"]])
    for c in chunks:
        if isinstance(c, ImageChunk):
            c.mrope = False
    ctx = context(proj.model, ty)
    eval_chunks(ctx, chunks)
    assert np.abs(ctx.logits(-1) - np.asarray(ev["expected_logits_last"])).max() > 4 * TOL_TINY_FLOAT_MAX


def test_qwen25vl_chat_handler_matches_llama_cpp_python() -> None:
    """llama-cpp-python's Qwen25VLChatHandler on the tiny pair (benches/record_qwenvl.py --chat):
    the same text (its format, the default system message, the image's URL as the marker), the
    same prompt positions and greedy first token; its log-probability within the tiny models'
    logit tolerance on both of its terms."""
    from ferrollama.llama_chat_format import Qwen25VLChatHandler
    from test_vision import assert_first_token, data_uri

    rec = json.loads((DATA / "scenarios" / "chat-qwen25vl.json").read_text())
    mmproj, img = DATA / "models" / rec["mmproj"], DATA / rec["image"]
    c = rec["context"]
    llm = fl.Llama(str(DATA / "models" / rec["model"]), n_ctx=c["n_ctx"], n_batch=c["n_batch"], n_ubatch=c["n_ubatch"],
                   n_threads=c["n_threads"], chat_handler=Qwen25VLChatHandler(clip_model_path=str(mmproj)), verbose=False)
    messages = [{"role": "user", "content": [{"type": "text", "text": rec["question"]},
                                             {"type": "image_url", "image_url": {"url": data_uri(img)}}]}]
    r = llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0, logprobs=True, top_logprobs=1)
    got = r["choices"][0]["logprobs"]["content"][0]
    assert got["token"] == rec["expected_token"]
    assert abs(got["logprob"] - rec["expected_logprob"]) <= 2 * TOL_TINY_FLOAT_MAX
    assert r["usage"]["prompt_tokens"] == rec["expected_prompt_tokens"]
    # the handler decoded llama-cpp-python's text with the image
    proj = Projector(llm.model, mmproj, n_threads=2)
    ctx = fl.Context(llm.model, n_ctx=c["n_ctx"], n_batch=c["n_batch"], n_ubatch=c["n_ubatch"], n_threads=2)
    assert proj.eval(ctx, rec["expected_text"], [img]) == rec["expected_prompt_tokens"]
    assert_first_token(llm.model, ctx.logits(-1), got["token"], got["logprob"], 1e-4)
