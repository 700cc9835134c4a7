"""The mlp projector (LLaVA 1.5; Yi-VL's mlp_norm head; LLaVA 1.6's encoder) against llama.cpp's
libmtmd, recorded by benches/record_vision_llava.py on the tiny llama and
tests/data/make_tiny_vision_llava.py's projectors: the image embeddings, the chunks of a prompt
(no image markers, causal), the logits after decoding it, the feature layer, the files refused,
and Llava15ChatHandler through Llama."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import ferrollama as fl
from ferrollama.generation.multimodal import Projector
from scenario_runner import TOL_TINY_FLOAT_MAX
from test_vision import assert_first_token, chat_message, data_uri
from test_vision import rewritten as rewritten_projector
from vision_pairs import TOL_EMBD, Pair, check_prompt_matches_mtmd, logits_off_with

PAIR = Pair("vision-llava-f32")
SCN, MMPROJ = PAIR.scn, PAIR.mmproj
#: the projector's head -> its records: LLaVA 1.5's mm.0, GELU, mm.2; Yi-VL's with LayerNorms
HEADS = {"mlp": PAIR, "mlp_norm": Pair("vision-llava-yi-f32")}
image, context = PAIR.image, PAIR.context


@pytest.fixture(scope="module")
def model() -> fl.Model:
    return PAIR.model()


@pytest.fixture(scope="module")
def projectors(model: fl.Model) -> dict[str, Projector]:
    return {head: pair.projector(model) for head, pair in HEADS.items()}


@pytest.fixture(scope="module")
def proj(projectors: dict[str, Projector]) -> Projector:
    return projectors["mlp"]


@pytest.mark.parametrize("name", sorted(SCN["images"]))
@pytest.mark.parametrize("head", HEADS)
def test_image_embeddings_match_mtmd(projectors: dict[str, Projector], head: str, name: str) -> None:
    # one row per patch (8x8), the output width the last layer's (not clip.vision.projection_dim's 32)
    want = np.asarray(HEADS[head].scn["expected_embeddings"][name], np.float32)
    got = projectors[head].encode(image(name))
    assert got.shape == want.shape == (64, 256)
    assert np.abs(got - want).max() <= TOL_EMBD


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("case", range(len(SCN["evals"])))
@pytest.mark.parametrize("head", HEADS)
def test_prompt_with_images_matches_mtmd(model: fl.Model, projectors: dict[str, Projector], head: str, case: int,
                                         cache_type: str) -> None:
    check_prompt_matches_mtmd(model, projectors[head], HEADS[head], case, cache_type, non_causal=False)


def test_llava_images_are_decoded_causally(model: fl.Model, proj: Projector) -> None:
    # mtmd_decode_use_non_causal is false for mlp: the image decoded non-causally ends 0.16 away
    assert logits_off_with(model, proj, PAIR, lambda c: setattr(c, "non_causal", True)) > 2 * TOL_TINY_FLOAT_MAX


def test_llava_images_have_no_markers(model: fl.Model, proj: Projector) -> None:
    # mtmd sets no img_beg / img_end for PROJECTOR_TYPE_MLP: the text around the marker is all
    ev = SCN["evals"][0]
    before, after = ev["prompt"].split("<__media__>")
    text_before, img, text_after = ev["expected_chunks"]
    assert text_before["tokens"] == [model.bos] + model.tokenize(before, add_special=False, parse_special=True)
    assert img["n_tokens"] == img["n_pos"] == 64
    assert text_after["tokens"] == model.tokenize(after, add_special=False, parse_special=True)


def test_the_feature_layer_is_the_second_to_last(model: fl.Model, proj: Projector, tmp_path: Path) -> None:
    want = np.asarray(SCN["expected_embeddings"]["square"], np.float32)
    n_layer = int(gguf.GGUFReader(MMPROJ).fields["clip.vision.block_count"].contents())
    same = Projector(model, rewritten(tmp_path, {"clip.vision.feature_layer": [n_layer - 1]}), n_threads=2)
    assert np.array_equal(same.encode(image("square")), proj.encode(image("square")))
    last = Projector(model, rewritten(tmp_path, {"clip.vision.feature_layer": [n_layer]}), n_threads=2)
    assert np.abs(last.encode(image("square")) - want).max() > 100 * TOL_EMBD


def test_stacked_feature_layers_are_refused(model: fl.Model, tmp_path: Path) -> None:
    with pytest.raises(fl.UnsupportedError, match="stacked feature layers"):
        Projector(model, rewritten(tmp_path, {"clip.vision.feature_layer": [1, 2]}))


#: LLaVA 1.6 (image_grid_pinpoints): libmtmd encodes the overview and each anyres tile on its own,
#: one image chunk each
PAIR16 = Pair("vision-llava16-f32")
SCN16 = PAIR16.scn


@pytest.mark.parametrize("name", sorted(SCN16["images"]))
def test_llava16_first_chunk_embeddings_match_mtmd(name: str) -> None:
    from ferrollama._core import Projector as CoreProjector
    from ferrollama.generation.media import VisionParams, load_image, preprocess_image

    core = CoreProjector(str(PAIR16.mmproj), n_threads=2)
    assert core.grid_pinpoints == [(64, 128), (128, 64), (128, 128)]
    vision = VisionParams(image_size=core.image_size, patch_size=core.patch_size, image_mean=tuple(core.image_mean),
                          image_std=tuple(core.image_std), n_merge=core.n_merge, grid_pinpoints=tuple(core.grid_pinpoints))
    pre = preprocess_image("mlp", load_image(PAIR16.image(name)), vision)
    # the image's chunks in the first prompt that shows it alone: the tiles, then the overview
    # (mtmd's ov_img_first is false for llava); the square is the overview alone, the wide one 2 tiles
    ev = next(e for e in SCN16["evals"] if e["images"] == [name])
    assert [c["n_tokens"] for c in ev["expected_chunks"] if c["type"] == "image"] == [64] * (1 + len(pre.entries))
    want = np.asarray(SCN16["expected_embeddings"][name], np.float32)
    got = core.encode_pixels(pre.entries[0] if pre.entries else pre.overview)
    assert got.shape == want.shape == (64, 256)
    assert np.abs(got - want).max() <= TOL_EMBD


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("case", range(len(SCN16["evals"])))
def test_llava16_prompts_with_tiled_images_match_mtmd(model: fl.Model, case: int, cache_type: str) -> None:
    # each anyres tile and then the overview its own chunk, with no tokens between (mtmd's
    # llava-uhd layout with an empty template)
    check_prompt_matches_mtmd(model, PAIR16.projector(model), PAIR16, case, cache_type, non_causal=False)


#: llama-cpp-python 0.3.36's Llava16ChatHandler's text for chat_message(url), rendered by it
LLAVA16_TEXT = ("A chat between a curious human and an artificial intelligence assistant. The assistant gives helpful, "
                "detailed, and polite answers to the human's questions. <__media__>\nWhat is in this picture?Answer:")


def test_llava16_chat_handler_decodes_its_format_with_the_tiles(model: fl.Model) -> None:
    from ferrollama.llama_chat_format import Llava16ChatHandler

    proj16 = PAIR16.projector(model)
    llm = fl.Llama(str(PAIR16.model_path), n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2,
                   chat_handler=Llava16ChatHandler(clip_model_path=str(PAIR16.mmproj)),
                   verbose=False)
    r = llm.create_chat_completion(messages=chat_message(data_uri(PAIR16.image("wide"))), max_tokens=1,
                                   temperature=0, logprobs=True, top_logprobs=1)
    ctx = PAIR16.context(model, "f16")
    n_past = proj16.eval(ctx, LLAVA16_TEXT, [PAIR16.image("wide")])
    got = r["choices"][0]["logprobs"]["content"][0]
    assert_first_token(model, ctx.logits(-1), got["token"], got["logprob"], 1e-4)
    assert r["usage"]["prompt_tokens"] == n_past


def test_a_feature_layer_past_the_encoder_is_an_error(model: fl.Model, tmp_path: Path) -> None:
    with pytest.raises(fl.GGUFError, match="feature_layer"):
        Projector(model, rewritten(tmp_path, {"clip.vision.feature_layer": [4]}))


def rewritten(tmp_path: Path, changes: dict) -> Path:
    """The tiny llava projector with metadata values added or replaced."""
    return rewritten_projector(tmp_path, changes, MMPROJ)


#: llama-cpp-python 0.3.36's Llava15ChatHandler's text for chat_message(url), rendered by it: its
#: CHAT_FORMAT with the default system message, the image's URL first in the user turn, replaced by
#: the marker (the format's newlines follow block tags, which trim_blocks removes)
LLAVA15_TEXT = ("A chat between a curious human and an artificial intelligence assistant. The assistant gives helpful, "
                "detailed, and polite answers to the human's questions.USER: <__media__>What is in this picture?"
                "ASSISTANT: ")


def test_llava15_chat_handler_decodes_its_format_with_the_images(model: fl.Model, proj: Projector) -> None:
    from ferrollama.llama_chat_format import Llava15ChatHandler

    handler = Llava15ChatHandler(clip_model_path=str(MMPROJ), verbose=False)
    llm = fl.Llama(str(PAIR.model_path), n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2,
                   chat_handler=handler, verbose=False)
    for name, url in (("square", data_uri(image("square"))), ("wide", data_uri(image("wide")))):
        r = llm.create_chat_completion(messages=chat_message(url), max_tokens=1, temperature=0, logprobs=True,
                                       top_logprobs=1)
        ctx = context(model, "f16")  # Llama's default KV cache
        n_past = proj.eval(ctx, LLAVA15_TEXT, [image(name)])
        got = r["choices"][0]["logprobs"]["content"][0]
        assert_first_token(model, ctx.logits(-1), got["token"], got["logprob"], 1e-4)
        assert r["usage"]["prompt_tokens"] == n_past
