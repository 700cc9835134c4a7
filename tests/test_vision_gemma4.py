"""The gemma4v projector (Gemma 4's vision) against llama.cpp's libmtmd, recorded by
benches/record_vision_gemma4.py on tests/data/make_tiny_vision_gemma4.py's pair: the image
embeddings (a square image as it is, a wide one resized), the chunks of a prompt (Gemma 4's
markers), the logits after decoding it on a text model with per-layer embeddings (an image's
rows take the padding token's), the images' attention (non-causal but for E2B and E4B's
widths), the images refused, and Gemma4ChatHandler through Llama."""
from __future__ import annotations

import numpy as np
import pytest

import ferrollama as fl
from ferrollama.generation.multimodal import FAMILIES, Projector
from scenario_runner import TOL_TINY_FLOAT_MAX
from test_vision import assert_first_token, chat_message, data_uri
from vision_pairs import Pair, check_embeddings_match_mtmd, check_prompt_matches_mtmd, logits_off_with, pair_fixtures

PAIR = Pair("vision-gemma4-f32")
SCN, MMPROJ = PAIR.scn, PAIR.mmproj
#: image tokens: 216x216 pixels as they are (27x27 patches pooled 3x3), 100x37 resized to 336x144
N_TOKENS = {"square": 81, "wide": 84}

image, context = PAIR.image, PAIR.context

model, proj = pair_fixtures(PAIR)


@pytest.mark.parametrize("name", sorted(SCN["images"]))
def test_image_embeddings_match_mtmd(proj: Projector, name: str) -> None:
    check_embeddings_match_mtmd(proj, PAIR, name, [N_TOKENS[name]], 256)


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("case", range(len(SCN["evals"])))
def test_prompt_with_images_matches_mtmd(model: fl.Model, proj: Projector, case: int, cache_type: str) -> None:
    check_prompt_matches_mtmd(model, proj, PAIR, case, cache_type, non_causal=True)


def test_images_are_between_gemma4s_markers(model: fl.Model) -> None:
    # mtmd's img_beg / img_end for gemma4v, each one CONTROL token of the tiny vocabulary
    ev = SCN["evals"][0]
    text_before, img, text_after = ev["expected_chunks"]
    start, end = (model.tokenize(m, add_special=False, parse_special=True) for m in ("<|image>", "<image|>"))
    assert len(start) == len(end) == 1
    assert text_before["tokens"][-1:] == start and text_after["tokens"][:1] == end
    assert img["n_tokens"] == img["n_pos"] == N_TOKENS["square"]


def test_causal_decoding_of_the_images_changes_the_logits(model: fl.Model, proj: Projector) -> None:
    # mtmd decodes the tiny model's images non-causally (its width is neither E2B's nor E4B's):
    # causally, the logits after the image move by more than twice the tolerance
    assert logits_off_with(model, proj, PAIR, lambda c: setattr(c, "non_causal", False)) > 2 * TOL_TINY_FLOAT_MAX


def test_e2b_and_e4b_decode_their_images_causally() -> None:
    # mtmd_decode_use_non_causal: false for text widths 1536 (E2B) and 2560 (E4B) only
    family = FAMILIES["gemma4v"]
    assert [family.for_text_width(n).non_causal for n in (1536, 2560, 256, 5376)] == [False, False, True, True]


@pytest.mark.parametrize("nx, ny", [(216, 200), (408, 24)])
def test_images_not_of_whole_blocks_or_beyond_the_position_tables_are_refused(proj: Projector, nx: int, ny: int) -> None:
    # 200 pixels are 25 patches of 8, which do not pool by 3; 408 pixels are 51 patches: past the
    # 48 rows of the position tables
    with pytest.raises(ValueError, match="gemma4v"):
        proj.core.encode_pixels(np.zeros((ny, nx, 3), np.float32))


def test_gemma4_chat_handler_decodes_the_template_text_with_the_images(model: fl.Model, proj: Projector) -> None:
    from ferrollama.chat.media import with_media_markers
    from ferrollama.llama_chat_format import Gemma4ChatHandler

    c = SCN["context"]
    llm = fl.Llama(str(PAIR.model_path), n_ctx=c["n_ctx"], n_batch=c["n_batch"], n_ubatch=c["n_ubatch"],
                   n_threads=2, chat_handler=Gemma4ChatHandler(clip_model_path=str(MMPROJ)), verbose=False)
    for name, url in (("square", data_uri(image("square"))), ("wide", str(image("wide")))):
        messages = chat_message(url)
        r = llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0, logprobs=True, top_logprobs=1)
        text = llm.chat_template.apply(with_media_markers(messages), add_generation_prompt=True)
        ctx = context(model, "f16")  # Llama's default KV cache
        n_past = proj.eval(ctx, text, [image(name)])
        got = r["choices"][0]["logprobs"]["content"][0]
        assert_first_token(model, ctx.logits(-1), got["token"], got["logprob"], 1e-4)
        assert r["usage"]["prompt_tokens"] == n_past
