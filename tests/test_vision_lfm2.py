"""Images in (issue 38), the lfm2 projector (LFM2-VL) on a recurrent text model: the tiny pair of
tests/data/make_tiny_vision_lfm2.py against llama.cpp's libmtmd (benches/record_vision_lfm2.py):
images at their own size (the position embeddings resized to the patch grid), a large image tiled
with LFM2's tokens between the tiles, decoded into LFM2's short convolutions and attention; then
the prefix reuse of `Llama` and of the server's slots, which resume a recurrent state only from
a checkpoint."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ferrollama as fl
from ferrollama.generation.multimodal import ImageChunk, Projector
from test_vision import (assert_first_token, chat_message, check_cli_answers_as_the_projector_api, data_uri,
                         rewritten)
from vision_pairs import Pair, check_embeddings_match_mtmd, check_prompt_matches_mtmd, pair_fixtures

PAIR = Pair("vision-lfm2-f32")
SCN, MMPROJ = PAIR.scn, PAIR.mmproj
#: image tokens per image: square-64.png at 256x256 (16x16 patches, the learned grid), the wide
#: one at 448x160 (28x10 patches), pre-large.png as 3x2 tiles of 512x512 and a 640x384 thumbnail
TOKENS = {"square": [64], "wide": [70], "large": [256] * 6 + [240]}

image, context = PAIR.image, PAIR.context

model, proj = pair_fixtures(PAIR)


def test_projector_reads_the_lfm2_keys(model: fl.Model, proj: Projector) -> None:
    core = proj.core
    assert model.is_recurrent
    assert (core.projector_type, core.image_size, core.patch_size, core.n_merge, core.n_embd_out) == ("lfm2", 256, 16, 2, 64)
    assert core.n_output_tokens(256, 256) == 64
    # clip_n_output_tokens counts a partial block of patches (the grid is padded to whole ones)
    assert core.n_output_tokens(48, 32) == 2


@pytest.mark.parametrize("name", sorted(SCN["images"]))
def test_image_embeddings_match_mtmd(proj: Projector, name: str) -> None:
    # every chunk of the image (tiles row by row, then the thumbnail), one after the other
    check_embeddings_match_mtmd(proj, PAIR, name, TOKENS[name], 64)


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("case", range(len(SCN["evals"])))
def test_prompt_with_images_matches_mtmd(model: fl.Model, proj: Projector, case: int, cache_type: str) -> None:
    check_prompt_matches_mtmd(model, proj, PAIR, case, cache_type, non_causal=False)


def test_tile_tokens(model: fl.Model, proj: Projector) -> None:
    # mtmd: <|image_start|>, "<|img_row_R_col_C|>" before each tile, "<|img_thumbnail|>" before
    # the thumbnail, <|image_end|>; an image that does not tile has neither
    def one(piece: str) -> int:
        return next(t for t in range(model.n_vocab) if model.token_to_piece(t, True) == piece.encode())

    start, end = one("<|image_start|>"), one("<|image_end|>")
    tiles = [[one(f"<|img_row_{r}_col_{c}|>")] for r in (1, 2) for c in (1, 2, 3)]
    texts = [p for p in proj.encode_image(image("large")).parts if not isinstance(p, ImageChunk) and p]
    assert texts == [[start], *tiles, [one("<|img_thumbnail|>")], [end]]
    texts = [p for p in proj.encode_image(image("wide")).parts if not isinstance(p, ImageChunk) and p]
    assert texts == [[start], [end]]


def test_lfm2_files_that_do_not_fit(model: fl.Model, tmp_path: Path) -> None:
    # clip.cpp's pixel unshuffle asserts a factor above 1, its default being 1
    with pytest.raises(fl.GGUFError, match="scale_factor 1 does not unshuffle"):
        Projector(model, rewritten(tmp_path, {"clip.vision.projector.scale_factor": None}, MMPROJ))
    with pytest.raises(ValueError, match="whole patches of 16"):
        Projector(model, MMPROJ).core.encode_pixels(np.zeros((40, 32, 3), np.float32))


def llama(**kw) -> fl.Llama:  # noqa: ANN003
    from ferrollama.llama_chat_format import MTMDChatHandler

    return fl.Llama(str(PAIR.model_path), n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2,
                    chat_handler=MTMDChatHandler(clip_model_path=str(MMPROJ)), verbose=False, **kw)


def answer(llm: fl.Llama, messages: list[dict]) -> list[tuple[str, float]]:
    r = llm.create_chat_completion(messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=1)
    return [(t["token"], t["logprob"]) for t in r["choices"][0]["logprobs"]["content"]]


def test_llama_chat_with_an_image_twice_resumes_the_recurrent_state(model: fl.Model, proj: Projector) -> None:
    from ferrollama.chat.media import with_media_markers

    llm = llama()
    images: list[int] = []
    real = llm._eval_image
    llm._eval_image = lambda key, n: (images.append(n), real(key, n))  # type: ignore[method-assign]
    messages = chat_message(data_uri(image("wide")))
    first = answer(llm, messages)
    # the first token is the one after the projector's own decode of the template's text
    text = llm.chat_template.apply(with_media_markers(messages), add_generation_prompt=True)
    ctx = context(model)
    proj.eval(ctx, text, [image("wide")])
    assert_first_token(model, ctx.logits(-1), *first[0], 1e-4)
    assert images == [70]
    # the same chat again: the cache holds the answer's tokens after the prompt, which a
    # recurrent state cannot drop; it resumes from the checkpoint after the prompt, image and all
    assert llm._checkpoints.count(0) >= 1
    again = answer(llm, messages)
    assert images == [70]
    assert again == first == answer(llama(), messages)


def test_server_chat_with_an_image_on_a_recurrent_model_resumes_from_a_checkpoint(model: fl.Model, proj: Projector) -> None:
    import openai
    from serving import start_server

    from ferrollama.chat.templates import ChatTemplate

    server, scheduler = start_server(model, n_seq=1, n_ctx=512, projector=proj)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        text = ChatTemplate.from_model(model).apply(
            [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                          {"type": "text", "text": "<__media__>"}]}])
        ctx = context(model, "f16")
        n_past = proj.eval(ctx, text, [image("wide")])
        for cached in (0, n_past - 1):
            r = client.chat.completions.create(model="m", messages=chat_message(data_uri(image("wide"))), max_tokens=3,
                                               temperature=0, logprobs=True, top_logprobs=1)
            lp = r.choices[0].logprobs.content[0]
            assert_first_token(model, ctx.logits(-1), lp.token, lp.logprob, 1e-2)
            assert r.usage.prompt_tokens == n_past
            # again: the slot's state went on through the answer; it resumes from the checkpoint
            # before the prompt's last token, the image in it
            assert r.usage.prompt_tokens_details.cached_tokens == cached
    finally:
        server.stop()
        scheduler.close()


def test_scheduler_resumes_and_copies_an_image_prompt_through_checkpoints(model: fl.Model, proj: Projector) -> None:
    # the image alone: one token (<|image_end|>) after it, the checkpoint taken right after the
    # image's decode
    from ferrollama.generation.multimodal import MEDIA_MARKER, prompt_keys
    from ferrollama.llama import SamplingParams
    from ferrollama.server import Request, Scheduler

    chunks = proj.tokenize(MEDIA_MARKER, [image("wide")])
    keys, media = prompt_keys(chunks)
    assert keys[-2] < 0 <= keys[-1]
    ctx = context(model)
    proj.eval(ctx, MEDIA_MARKER, [image("wide")])
    greedy = int(np.argmax(ctx.logits(-1)))

    def request() -> Request:
        return Request(list(keys), SamplingParams(temp=0), 3, media=media)

    with Scheduler(model, n_ctx=1024, n_seq=2, n_threads=2) as sched:
        _, first = sched.submit(request()).result()
        assert first[0].token == greedy and first[-1].usage["cached_tokens"] == 0
        _, again = sched.submit(request()).result()
        assert again[-1].usage["cached_tokens"] == len(keys) - 1
        # two at once: one resumes its slot, the other copies that slot's prefix and cuts the
        # copied state back through the copied checkpoint
        both = [job.result()[1] for job in sched.submit_many([request(), request()])]
        assert sorted(r[-1].usage["cached_tokens"] for r in both) == [len(keys) - 1] * 2
        assert [[o.token for o in r] for r in both] == [[o.token for o in first]] * 2


def test_llama_takes_a_prompt_whose_image_is_followed_by_one_token(model: fl.Model, proj: Projector) -> None:
    # a recurrent model's checkpoint goes before the prompt's last token: here right after the
    # image (the part decoded first ends with it)
    from ferrollama.generation.multimodal import MEDIA_MARKER

    llm = llama()
    keys = llm._register_media(proj.tokenize(MEDIA_MARKER, [image("wide")]))
    assert keys[-2] < 0 <= keys[-1]
    ctx = context(model)
    proj.eval(ctx, MEDIA_MARKER, [image("wide")])
    runs = []
    for _ in range(2):  # again: from the checkpoint after the prompt (the answer's state dropped)
        got: list[int] = []
        for token in llm.generate(keys, temp=0):
            got.append(token)
            if len(got) == 3:
                break
        runs.append(got)
    assert runs[0][0] == int(np.argmax(ctx.logits(-1)))
    assert runs[1] == runs[0]
    assert llm._checkpoints.count(0) >= 1


def test_cli_chat_with_an_image_answers_as_the_projector_api(model: fl.Model, proj: Projector) -> None:
    check_cli_answers_as_the_projector_api(model, proj, PAIR, "--image", image("wide"))
