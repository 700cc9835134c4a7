"""The Qwen VL projectors (qwen2vl_merger, qwen2.5vl_merger, qwen3vl_merger) against llama.cpp's
libmtmd, recorded by benches/record_vision_qwen.py on tests/data/make_tiny_vision_qwen.py's
projectors and make_tiny_qwenvl.py's text models: the image embeddings of a square image smart
resize keeps and of one it resizes (the projector's encoder and Python's preprocessing), the
number of image tokens and the markers around them, what the window attention and the deepstack
rows change, and the files refused. The prompts with images through the text models (M-RoPE
positions) are tests/test_vision_qwen_mrope.py's."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ferrollama as fl
from ferrollama._core import Projector as CoreProjector
from ferrollama.generation.media import load_image, preprocess_image
from ferrollama.generation.multimodal import FAMILIES, ImageChunk, Projector, TextChunk, vision_params
from test_vision import rewritten
from vision_pairs import TOL_EMBD, Pair, load_projectors

PAIRS = {ty: Pair(f"vision-{ty}-f32") for ty in ("qwen2vl", "qwen2.5vl", "qwen3vl")}
image = PAIRS["qwen2vl"].image


def mmproj(ty: str) -> Path:
    return PAIRS[ty].mmproj


@pytest.fixture(scope="module")
def projectors() -> dict[str, CoreProjector]:
    return {ty: CoreProjector(str(mmproj(ty)), n_threads=2) for ty in PAIRS}


@pytest.fixture(scope="module")
def pairs() -> dict[str, Projector]:
    return load_projectors(PAIRS)


def encode(core: CoreProjector, path: Path) -> np.ndarray:
    """What Projector.encode does for these projectors (one entry: no tiles)."""
    pre = preprocess_image(core.projector_type, load_image(path), vision_params(core))
    assert len(pre.entries) == 1 and pre.overview is None
    return core.encode_pixels(pre.entries[0])


#: image tokens: Qwen2(.5)-VL's 14-pixel patches merged 2x2 (224 -> 8x8; 300x170 -> 308x168: 11x6),
#: Qwen3-VL's 16-pixel ones (224 -> 7x7; 300x170 -> 288x160: 9x5); a row per token of the text
#: model's 256, Qwen3-VL's with its two deepstack mergers' rows after it
SHAPES = {"qwen2vl": {"square": (64, 256), "wide": (66, 256)}, "qwen2.5vl": {"square": (64, 256), "wide": (66, 256)},
          "qwen3vl": {"square": (49, 768), "wide": (45, 768)}}


@pytest.mark.parametrize("name", ["square", "wide"])
@pytest.mark.parametrize("ty", PAIRS)
def test_image_embeddings_match_mtmd(pairs: dict[str, Projector], ty: str, name: str) -> None:
    want = np.asarray(PAIRS[ty].scn["expected_embeddings"][name], np.float32)
    got = pairs[ty].encode(image(name))
    assert got.shape == want.shape == SHAPES[ty][name]
    assert np.abs(got - want).max() <= TOL_EMBD


@pytest.mark.parametrize("ty", PAIRS)
def test_image_tokens_and_markers_are_mtmds(projectors: dict[str, CoreProjector], ty: str) -> None:
    core = projectors[ty]
    assert core.projector_type == f"{ty}_merger"
    for ev in PAIRS[ty].scn["evals"]:
        recorded = [c["n_tokens"] for c in ev["expected_chunks"] if c["type"] == "image"]
        pre = [preprocess_image(core.projector_type, load_image(image(n)), vision_params(core)).entries[0] for n in ev["images"]]
        assert [core.n_output_tokens(p.shape[1], p.shape[0]) for p in pre] == recorded
        # mtmd puts <|vision_start|> (494 in the tiny vocabulary) before each image, <|vision_end|> (507) after
        chunks = ev["expected_chunks"]
        for i, c in enumerate(chunks):
            if c["type"] == "image":
                assert chunks[i - 1]["tokens"][-1] == 494 and chunks[i + 1]["tokens"][0] == 507
    family = FAMILIES[core.projector_type]
    assert (family.img_beg, family.img_end, family.non_causal) == ("<|vision_start|>", "<|vision_end|>", False)


@pytest.mark.parametrize("ty", PAIRS)
def test_tokenize_puts_the_markers_around_the_image_tokens(pairs: dict[str, Projector], ty: str) -> None:
    proj = pairs[ty]
    for ev in PAIRS[ty].scn["evals"]:
        chunks = proj.tokenize(ev["prompt"], [image(n) for n in ev["images"]])
        got = [{"type": "text", "tokens": c.tokens} if isinstance(c, TextChunk) else {"type": "image", "n_tokens": c.n_tokens}
               for c in chunks]
        assert got == [{k: v for k, v in c.items() if k != "n_pos"} for c in ev["expected_chunks"]]
        assert not any(c.non_causal for c in chunks if isinstance(c, ImageChunk))


def test_window_attention_is_qwen25s(projectors: dict[str, CoreProjector], tmp_path: Path) -> None:
    # n_wa_pattern 1: every block attends to the whole image
    want = np.asarray(PAIRS["qwen2.5vl"].scn["expected_embeddings"]["wide"], np.float32)
    full = CoreProjector(str(rewritten(tmp_path, {"clip.vision.n_wa_pattern": 1}, mmproj("qwen2.5vl"))), n_threads=2)
    assert np.abs(encode(full, image("wide")) - want).max() > 100 * TOL_EMBD


def test_deepstack_rows_follow_the_mergers(projectors: dict[str, CoreProjector]) -> None:
    # the three parts of a row differ (the main merger's, then blocks 0's and 1's)
    got = encode(projectors["qwen3vl"], image("square"))
    main, first, second = np.split(got, 3, axis=1)
    assert np.abs(main - first).max() > 100 * TOL_EMBD and np.abs(first - second).max() > 100 * TOL_EMBD


@pytest.mark.parametrize(("ty", "changes", "error", "match"), [
    ("qwen2.5vl", {"clip.vision.n_wa_pattern": None}, fl.GGUFError, "clip.vision.n_wa_pattern"),
    ("qwen2vl", {"clip.vision.n_wa_pattern": 2}, fl.UnsupportedError, "windows are Qwen2.5-VL's"),
    ("qwen2.5vl", {"clip.vision.window_size": 224}, fl.UnsupportedError, "windows of 112"),
    ("qwen2.5vl", {"clip.vision.wa_layer_indexes": [0, 2]}, fl.UnsupportedError, "wa_layer_indexes"),
    ("qwen2vl", {"clip.vision.spatial_merge_size": 3}, fl.UnsupportedError, "merge 2 x 2"),
    ("qwen3vl", {"clip.vision.is_deepstack_layers": [True, False, False]}, fl.GGUFError, "block 1"),
    ("qwen3vl", {"clip.vision.image_min_pixels": 1000}, fl.UnsupportedError, "image_min_pixels"),
])
def test_projector_files_refused(tmp_path: Path, ty: str, changes: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        CoreProjector(str(rewritten(tmp_path, changes, mmproj(ty))))


def test_images_of_partial_blocks_are_refused(projectors: dict[str, CoreProjector]) -> None:
    with pytest.raises(ValueError, match="whole blocks of 28x28"):
        projectors["qwen2vl"].encode_pixels(np.zeros((28, 42, 3), np.float32))
    assert projectors["qwen2vl"].encode_pixels(np.zeros((28, 56, 3), np.float32)).shape == (2, 256)
