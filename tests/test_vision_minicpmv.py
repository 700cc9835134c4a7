"""Images in (issue 38), the resampler projector (MiniCPM-V 2.6): the tiny pair of
tests/data/make_tiny_vision_minicpmv.py against llama.cpp's libmtmd (benches/record_vision_minicpmv.py):
SigLIP at each slice's own size (its position table bucketed), the resampler's 64 queries per
overview and slice, llava-uhd slicing without pinpoints with MiniCPM-V's tokens between the
slices, decoded into a qwen2; and llama-cpp-python's MiniCPMv26ChatHandler on the pair."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ferrollama as fl
from ferrollama.generation.multimodal import Projector
from test_vision import assert_first_token, chat_message, data_uri, rewritten
from vision_pairs import Pair, check_embeddings_match_mtmd, check_prompt_matches_mtmd, pair_fixtures

PAIR = Pair("vision-minicpmv-f32")
SCN, MMPROJ = PAIR.scn, PAIR.mmproj
#: image chunks per image, 64 rows each: square-64.png its overview alone, the wide one an
#: overview and 2x1 slices, pre-large.png an overview and 4x2 slices
CHUNKS = {"square": 1, "wide": 3, "large": 9}

image, context = PAIR.image, PAIR.context

model, proj = pair_fixtures(PAIR)


def test_projector_reads_the_minicpmv_keys(proj: Projector) -> None:
    core = proj.core
    assert (core.projector_type, core.minicpmv_version, core.image_size, core.patch_size, core.n_embd_out) == (
        "resampler", 3, 64, 4, 256)
    # the resampler's queries, whatever the slice's size
    assert core.n_output_tokens(64, 64) == core.n_output_tokens(100, 36) == 64


@pytest.mark.parametrize("name", sorted(SCN["images"]))
def test_image_embeddings_match_mtmd(proj: Projector, name: str) -> None:
    # every chunk of the image (the overview, then the slices row by row), one after the other
    check_embeddings_match_mtmd(proj, PAIR, name, [64] * CHUNKS[name], 256)


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("case", range(len(SCN["evals"])))
def test_prompt_with_images_matches_mtmd(model: fl.Model, proj: Projector, case: int, cache_type: str) -> None:
    check_prompt_matches_mtmd(model, proj, PAIR, case, cache_type, non_causal=False)


def test_slice_tokens(model: fl.Model, proj: Projector) -> None:
    # mtmd (MiniCPM-V 2.6): <image> overview </image>, each slice between <slice> and </slice>,
    # "\n" between rows, none after the last
    def one(piece: str) -> int:
        return next(t for t in range(model.n_vocab) if model.token_to_piece(t, True) == piece.encode())

    image_start, image_end, start, end, newline = (one(p) for p in ("<image>", "</image>", "<slice>", "</slice>", "\n"))
    parts = [p if isinstance(p, list) else "image" for p in proj.encode_image(image("large")).parts if p != []]
    row = ["image", [end], [start]] * 3 + ["image", [end]]
    assert parts == [[image_start], "image", [image_end], [start], *row, [newline], [start], *row]
    parts = [p if isinstance(p, list) else "image" for p in proj.encode_image(image("square")).parts if p != []]
    assert parts == [[image_start], "image", [image_end]]


def test_minicpmv_files_that_do_not_fit(model: fl.Model, tmp_path: Path) -> None:
    with pytest.raises(fl.UnsupportedError, match="MiniCPM-V version 7"):
        Projector(model, rewritten(tmp_path, {"clip.minicpmv_version": 7}, MMPROJ))
    # the query count the file says must be the queries it has (clip.cpp's reshape asserts)
    with pytest.raises(fl.GGUFError, match=r"'resampler.query' has shape \[256, 64\], expected \[256, 96\]"):
        Projector(model, rewritten(tmp_path, {"clip.minicpmv_query_num": 96}, MMPROJ))
    with pytest.raises(ValueError, match="whole patches of 4"):
        Projector(model, MMPROJ).core.encode_pixels(np.zeros((40, 30, 3), np.float32))


def test_minicpmv_2_5_files_take_96_queries_and_its_slice_tokens(model: fl.Model, tmp_path: Path) -> None:
    # version 2 (MiniCPM-V 2.5) without a query count: 96 queries (this file has 64)
    with pytest.raises(fl.GGUFError, match=r"expected \[256, 96\]"):
        Projector(model, rewritten(tmp_path, {"clip.minicpmv_version": 2, "clip.minicpmv_query_num": None}, MMPROJ))
    proj = Projector(model, rewritten(tmp_path, {"clip.minicpmv_version": 2}, MMPROJ))
    assert proj.family.tiles.slices_start == ("<slice>",) and proj.family.tiles.slice_start == ("<image>",)


#: llama-cpp-python 0.3.36's MiniCPMv26ChatHandler's text for chat_message(url), rendered by it:
#: its CHAT_FORMAT with the default system message, the image's URL first in the user turn,
#: replaced by the marker
MINICPMV26_TEXT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                   "<__media__>What is in this picture?<|im_end|>\n<|im_start|>assistant\n")


def test_minicpmv26_chat_handler_decodes_its_format_with_the_images(model: fl.Model, proj: Projector) -> None:
    from ferrollama.llama_chat_format import MiniCPMv26ChatHandler

    handler = MiniCPMv26ChatHandler(clip_model_path=str(MMPROJ), verbose=False)
    llm = fl.Llama(str(PAIR.model_path), n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=2,
                   chat_handler=handler, verbose=False)
    for name in ("square", "wide"):
        r = llm.create_chat_completion(messages=chat_message(data_uri(image(name))), max_tokens=1, temperature=0,
                                       logprobs=True, top_logprobs=1)
        ctx = context(model, "f16")  # Llama's default KV cache
        n_past = proj.eval(ctx, MINICPMV26_TEXT, [image(name)])
        got = r["choices"][0]["logprobs"]["content"][0]
        assert_first_token(model, ctx.logits(-1), got["token"], got["logprob"], 1e-4)
        assert r["usage"]["prompt_tokens"] == n_past
