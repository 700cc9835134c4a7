"""Images in (issue 38), the idefics3 projector (SmolVLM): the tiny pair of
tests/data/make_tiny_vision_idefics3.py against llama.cpp's libmtmd (benches/record_vision_idefics3.py):
each image tiled into 32x32 slices plus an overview, each its own chunk, with Idefics3's tokens
between them (mtmd's slice template); the embeddings, the chunks and the logits after the prompt."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ferrollama as fl
from ferrollama.generation.multimodal import (MEDIA_MARKER, EncodedImage, ImageChunk, Projector, TextChunk, key_runs,
                                              prompt_keys)
from test_vision import assert_first_token, chat_message, check_cli_answers_as_the_projector_api, rewritten
from vision_pairs import DATA, Pair, check_embeddings_match_mtmd, check_prompt_matches_mtmd, chunk_record, pair_fixtures

PAIR = Pair("vision-idefics3-f32")
SCN, MMPROJ = PAIR.scn, PAIR.mmproj
#: tiles per image (the slices and the overview) and image tokens per tile
TILES = {"square": 3 * 3 + 1, "wide": 3 * 2 + 1}
TILE_TOKENS = 16

image, context = PAIR.image, PAIR.context

model, proj = pair_fixtures(PAIR)


def test_projector_reads_the_idefics3_keys(proj: Projector) -> None:
    core = proj.core
    assert (core.projector_type, core.image_size, core.patch_size, core.n_merge, core.image_longest_edge) == \
        ("idefics3", 32, 4, 2, 96)
    assert core.n_output_tokens(32, 32) == TILE_TOKENS


@pytest.mark.parametrize("name", sorted(SCN["images"]))
def test_image_embeddings_match_mtmd(proj: Projector, name: str) -> None:
    # every chunk of the image (slices row by row, then the overview), one after the other
    check_embeddings_match_mtmd(proj, PAIR, name, [TILE_TOKENS] * TILES[name], 256)


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("case", range(len(SCN["evals"])))
def test_prompt_with_tiled_images_matches_mtmd(model: fl.Model, proj: Projector, case: int, cache_type: str) -> None:
    chunks, _ = check_prompt_matches_mtmd(model, proj, PAIR, case, cache_type, non_causal=False)
    ev = SCN["evals"][case]
    assert sum(isinstance(c, ImageChunk) for c in chunks) == sum(TILES[n] for n in ev["images"])


def test_slice_template_tokens(model: fl.Model, proj: Projector) -> None:
    # mtmd: "<fake_token_around_image><row_R_col_C>" before each slice, "\n" between rows (not
    # after the last), then "\n\n<fake_token_around_image><global-img>" (overview) "<fake_token_around_image>"
    def one(piece: str) -> int:
        """The first token of that piece (mtmd's lookup_token)."""
        return next(t for t in range(model.n_vocab) if model.token_to_piece(t, True) == piece.encode())

    fake, glob = one("<fake_token_around_image>"), one("<global-img>")
    encoded = proj.encode_image(image("wide"))
    texts = [p for p in encoded.parts if not isinstance(p, ImageChunk) and p]
    rows = [[fake, one(f"<row_{r}_col_{c}>")] for r in (1, 2) for c in (1, 2, 3)]
    assert texts == rows[:3] + [[one("\n")]] + rows[3:] + [[one("\n\n"), fake, glob], [fake]]
    assert [c.n_tokens for c in encoded.chunks] == [TILE_TOKENS] * TILES["wide"]


def test_each_tile_has_its_own_prompt_key(proj: Projector) -> None:
    chunks = proj.tokenize(f"a {MEDIA_MARKER} b", [image("square")])
    keys, images = prompt_keys(chunks)
    assert len(images) == TILES["square"]
    image_runs = [(s, e) for s, e in key_runs(keys) if keys[s] < 0]
    assert [e - s for s, e in image_runs] == [TILE_TOKENS] * TILES["square"]
    # the same image again (bytes this time) gives the same keys: a cached prefix is reused
    again, _ = prompt_keys(proj.tokenize(f"a {MEDIA_MARKER} b", [image("square").read_bytes()]))
    assert again == keys


def test_an_encoded_image_is_taken_as_it_is(proj: Projector) -> None:
    encoded = proj.encode_image(image("wide"))
    assert isinstance(encoded, EncodedImage)
    prompt = f"see {MEDIA_MARKER}"
    by_path, by_encoded = proj.tokenize(prompt, [image("wide")]), proj.tokenize(prompt, [encoded])
    assert [chunk_record(c) for c in by_path] == [chunk_record(c) for c in by_encoded]
    images = [c for c in by_encoded if isinstance(c, ImageChunk)]
    assert len(images) == len(encoded.chunks) and all(a is b for a, b in zip(images, encoded.chunks))
    assert isinstance(by_encoded[0], TextChunk)


def test_idefics3_files_and_models_that_do_not_fit(model: fl.Model, tmp_path: Path) -> None:
    for changes, match in (({"clip.vision.projector.scale_factor": None}, "scale_factor 1"),
                           ({"clip.vision.projector.scale_factor": 3}, "scale_factor 3")):
        with pytest.raises(fl.GGUFError, match=match):
            Projector(model, rewritten(tmp_path, changes, MMPROJ))
    # the tiny llama lacks Idefics3's image tokens (mtmd would put LLAMA_TOKEN_NULL in the prompt)
    with pytest.raises(ValueError, match="no token for '\\\\n\\\\n', '<fake_token_around_image>', '<global-img>'"):
        Projector(fl.Model(str(DATA / "models" / "tiny-llama-f32.gguf")), MMPROJ)


def test_tiles_of_the_wrong_size_are_refused(proj: Projector) -> None:
    with pytest.raises(ValueError, match="32x32"):
        proj.core.encode_pixels(np.zeros((64, 32, 3), np.float32))


def png_uri(rgb: np.ndarray) -> str:
    import base64
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(rgb).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_llama_chat_with_tiled_images_decodes_each_tile(model: fl.Model, proj: Projector) -> None:
    from PIL import Image

    from ferrollama.chat.media import with_media_markers
    from ferrollama.llama_chat_format import MTMDChatHandler

    handler = MTMDChatHandler(clip_model_path=str(MMPROJ))
    llm = fl.Llama(str(PAIR.model_path), n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2,
                   chat_handler=handler, verbose=False)
    wide = np.asarray(Image.open(image("wide")).convert("RGB"))
    tall = np.ascontiguousarray(wide.transpose(1, 0, 2))  # 37x100: 2x3 tiles
    # (the square's first token is a lone UTF-8 byte, which has no logprobs entry)
    # wide, then tall (the text before the image is reused), then wide again (all of it)
    for rgb in (wide, tall, wide):
        messages = chat_message(png_uri(rgb))
        r = llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0, logprobs=True, top_logprobs=1)
        text = llm.chat_template.apply(with_media_markers(messages), add_generation_prompt=True)
        ctx = context(model)
        n_past = proj.eval(ctx, text, [rgb])
        got = r["choices"][0]["logprobs"]["content"][0]
        assert_first_token(model, ctx.logits(-1), got["token"], got["logprob"], 1e-4)
        assert r["usage"]["prompt_tokens"] == n_past


def test_server_chat_with_tiled_images_reuses_every_tile(model: fl.Model, proj: Projector) -> None:
    import openai
    from PIL import Image
    from serving import start_server

    from ferrollama.chat.templates import ChatTemplate

    server, scheduler = start_server(model, n_seq=1, n_ctx=512, projector=proj)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        template = ChatTemplate.from_model(model)
        wide = np.asarray(Image.open(image("wide")).convert("RGB"))
        tall = np.ascontiguousarray(wide.transpose(1, 0, 2))
        for rgb, cached_at_least in ((wide, 0), (tall, 1), (tall, TILES["wide"] * TILE_TOKENS)):
            r = client.chat.completions.create(model="m", messages=chat_message(png_uri(rgb)), max_tokens=1,
                                               temperature=0, logprobs=True, top_logprobs=1)
            text = template.apply([{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                                                {"type": "text", "text": MEDIA_MARKER}]}])
            ctx = context(model, "f16")
            n_past = proj.eval(ctx, text, [rgb])
            lp = r.choices[0].logprobs.content[0]
            assert_first_token(model, ctx.logits(-1), lp.token, lp.logprob, 1e-2)
            assert r.usage.prompt_tokens == n_past
            # the same tiled image again: the slot's cache is reused through all of its tiles
            assert r.usage.prompt_tokens_details.cached_tokens >= cached_at_least
    finally:
        server.stop()
        scheduler.close()


def test_smolvlm_template_gets_string_contents_as_text_parts(model: fl.Model) -> None:
    # SmolVLM's template writes only typed parts; llama.cpp's chat normalizer wraps a string
    # content in one text part (common/chat.cpp), without which the text would vanish
    from ferrollama.chat.templates import BUILTIN_TEMPLATES, ChatTemplate

    template = ChatTemplate.from_model(model)
    assert template.typed_content_only
    messages = [{"role": "user", "content": "hello"}]
    assert template.apply(messages) == "<|im_start|>User: hello<end_of_utterance>\nAssistant:"
    assert template.apply([{"role": "user", "content": [{"type": "text", "text": "hello"}]}]) == template.apply(messages)
    assert not any(ChatTemplate(source).typed_content_only for source in BUILTIN_TEMPLATES.values())


def test_cli_chat_with_a_tiled_image_answers_as_the_projector_api(model: fl.Model, proj: Projector) -> None:
    check_cli_answers_as_the_projector_api(model, proj, PAIR, "--image", image("wide"), n_ctx=512)
