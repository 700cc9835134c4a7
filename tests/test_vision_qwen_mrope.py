"""Prompts with images through the Qwen VL projectors into their text models (qwen2vl for the
qwen2vl_merger and qwen2.5vl_merger projectors, qwen3vl with DeepStack rows for qwen3vl_merger):
the chunks, n_past and the logits after the prompt against llama.cpp's libmtmd
(mtmd_helper_eval_chunks, recorded by benches/record_vision_qwen.py), where the image's tokens
take mtmd's 2-D M-RoPE positions and max(nx, ny) positions of the sequence."""
from __future__ import annotations

import json

import numpy as np
import pytest

import ferrollama as fl
from ferrollama.generation.multimodal import ImageChunk, Projector, TextChunk, prompt_keys
from scenario_runner import TOL_TINY_FLOAT_MAX
from vision_pairs import DATA, Pair, check_prompt_matches_mtmd, load_projectors, logits_off_with

TYPES = ("qwen2vl", "qwen2.5vl", "qwen3vl")
PAIRS = {ty: Pair(f"vision-{ty}-f32") for ty in TYPES}
CASES = [(ty, i) for ty in TYPES for i in range(len(PAIRS[ty].scn["evals"]))]


@pytest.fixture(scope="module")
def pairs() -> dict[str, Projector]:
    return load_projectors(PAIRS)


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("ty, case", CASES)
def test_prompt_with_images_matches_mtmd(pairs: dict[str, Projector], ty: str, case: int, cache_type: str) -> None:
    check_prompt_matches_mtmd(pairs[ty].model, pairs[ty], PAIRS[ty], case, cache_type, non_causal=False)


def test_image_tokens_take_2d_positions(pairs: dict[str, Projector]) -> None:
    # the wide image: 11 x 6 tokens after 5 positions (qwen2vl: 14-pixel patches merged 2 x 2)
    chunk = ImageChunk(np.zeros((66, 256), np.float32), "x", mrope=True, nx=11, ny=6)
    pos = chunk.positions(5)
    assert chunk.n_pos == 11 and pos.shape == (66, 4)
    assert pos[0].tolist() == [5, 5, 5, 0] and pos[12].tolist() == [5, 6, 6, 0] and pos[-1].tolist() == [5, 10, 15, 0]
    chunks = pairs["qwen2vl"].tokenize("a <__media__> b", [PAIRS["qwen2vl"].image("wide")])
    grid = [(c.nx, c.ny, c.mrope) for c in chunks if isinstance(c, ImageChunk)]
    assert grid == [(11, 6, True)]
    # the prompt's keys take the image's positions, not its tokens (the caches of Llama and the server)
    keys, images = prompt_keys(chunks)
    n_text = sum(len(c.tokens) for c in chunks if isinstance(c, TextChunk))
    assert len(keys) == n_text + 11 and len(images) == 1


def test_1d_positions_are_not_mtmds(pairs: dict[str, Projector]) -> None:
    # the same chunks at consecutive positions (as an image on a model without M-RoPE) end far off
    proj = pairs["qwen3vl"]
    off = logits_off_with(proj.model, proj, PAIRS["qwen3vl"], lambda c: setattr(c, "mrope", False))
    assert off > 4 * TOL_TINY_FLOAT_MAX


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


def conversation(url: str, follow_up: bool) -> list[dict]:
    """A user turn with an image; with ``follow_up`` an answer and a second question after it (a
    prompt whose cached prefix runs through the image)."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                             {"type": "image_url", "image_url": {"url": url}}]}]
    if follow_up:
        messages += [{"role": "assistant", "content": "Shapes."}, {"role": "user", "content": "Which colours?"}]
    return messages


def test_llama_reuses_a_cached_image_of_fewer_positions_than_tokens(pairs: dict[str, Projector]) -> None:
    """The Llama's prompt cache keys an image by its positions (max(nx, ny), not its tokens): a
    follow-up question reuses the image's cells and decodes as the whole prompt would."""
    from ferrollama.chat.media import with_media_markers
    from ferrollama.llama_chat_format import Qwen25VLChatHandler, _HandlerFormat
    from test_vision import assert_first_token, data_uri

    proj = pairs["qwen3vl"]
    img = PAIRS["qwen3vl"].image("wide")
    handler = Qwen25VLChatHandler(clip_model_path=str(proj.path))
    llm = fl.Llama(str(PAIRS["qwen3vl"].model_path), n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2,
                   chat_handler=handler, verbose=False)
    fmt = _HandlerFormat(handler.CHAT_FORMAT, bos_token="", eos_token="")
    for follow_up in (False, True):
        messages = conversation(data_uri(img), follow_up)
        r = llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0, logprobs=True, top_logprobs=1)
        system = [{"role": "system", "content": handler.DEFAULT_SYSTEM_MESSAGE}]
        text = fmt.render(with_media_markers(system + messages), add_generation_prompt=True)
        ctx = PAIRS["qwen3vl"].context(proj.model, "f16")
        n_past = proj.eval(ctx, text, [img])
        got = r["choices"][0]["logprobs"]["content"][0]
        assert_first_token(proj.model, ctx.logits(-1), got["token"], got["logprob"], 1e-3)
        assert r["usage"]["prompt_tokens"] == n_past


def test_server_reuses_a_cached_image_of_fewer_positions_than_tokens(pairs: dict[str, Projector]) -> None:
    """The server's slots key an image by its positions too: the follow-up reuses the first
    request's prefix through the image, and answers as the whole prompt decoded at once."""
    import openai
    from ferrollama.chat.templates import ChatTemplate
    from ferrollama.generation.multimodal import MEDIA_MARKER
    from serving import start_server
    from test_vision import assert_first_token, data_uri

    proj = pairs["qwen2.5vl"]
    img = PAIRS["qwen2.5vl"].image("wide")
    server, scheduler = start_server(proj.model, n_seq=1, n_ctx=512, projector=proj)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        template = ChatTemplate.from_model(proj.model)
        cached, n_pasts = [], []
        for follow_up in (False, True):
            messages = conversation(data_uri(img), follow_up)
            r = client.chat.completions.create(model="m", messages=messages, max_tokens=1, temperature=0, logprobs=True,
                                               top_logprobs=1)
            marked = [{**messages[0], "content": f"What is in this picture?{MEDIA_MARKER}"}] + messages[1:]
            ctx = PAIRS["qwen2.5vl"].context(proj.model, "f16")
            n_past = proj.eval(ctx, template.apply(marked), [img])
            lp = r.choices[0].logprobs.content[0]
            assert_first_token(proj.model, ctx.logits(-1), lp.token, lp.logprob, 1e-2)
            assert r.usage.prompt_tokens == n_past
            cached.append(r.usage.prompt_tokens_details.cached_tokens)
            n_pasts.append(n_past)
        # the first request's prompt, its image (11 positions for 66 tokens) included
        assert cached[0] == 0 and cached[1] >= n_pasts[0] - 1
    finally:
        server.stop()
        scheduler.close()
