"""The pixtral projector (Pixtral 12B; Mistral Small 3.1's patch merger) against llama.cpp's libmtmd,
recorded by benches/record_vision_pixtral.py on tests/data/make_tiny_vision_pixtral.py's pairs: the
image embeddings (rows of tokens with the [IMG_BREAK] embedding between them, images of any size:
a non-square grid for the resized one), the chunks of a prompt ([IMG_END] after each image, causal),
the logits after decoding it, the files and images refused, and MTMDChatHandler with Mistral Small
3.2's chat template through Llama."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import ferrollama as fl
from ferrollama.generation.multimodal import MEDIA_MARKER, ImageChunk, Projector
from scenario_runner import TOL_TINY_FLOAT_MAX
from test_vision import chat_message, data_uri, rewritten
from vision_pairs import TOL_EMBD, Pair, check_prompt_matches_mtmd, logits_off_with

#: the projector's variant -> its records: Pixtral 12B's (8x8 patches, no merge) on a llama,
#: Mistral Small 3.1's (4x4 patches merged 2x2) on a mistral3
PAIRS = {name: Pair(f"vision-{name}-f32") for name in ("pixtral", "mistral3")}
#: each image's grid of tokens (columns, rows): the square one is 64x64, the wide one resized to 104x40
GRIDS = {"square": (8, 8), "wide": (13, 5)}


@pytest.fixture(scope="module")
def pairs() -> dict[str, tuple[fl.Model, Projector]]:
    out = {}
    for variant, pair in PAIRS.items():
        model = pair.model()
        out[variant] = (model, pair.projector(model))
    return out


def img_break(pair: Pair) -> np.ndarray:
    t = next(t for t in gguf.GGUFReader(pair.mmproj).tensors if t.name == "v.token_embd.img_break")
    return np.asarray(t.data, np.float32)


def break_rows(cols: int, rows: int) -> list[int]:
    """The rows of an image's embeddings that are [IMG_BREAK]: after each row of tokens but the last."""
    return [(r + 1) * (cols + 1) - 1 for r in range(rows - 1)]


@pytest.mark.parametrize("name", sorted(GRIDS))
@pytest.mark.parametrize("variant", PAIRS)
def test_image_embeddings_match_mtmd(pairs: dict, variant: str, name: str) -> None:
    pair = PAIRS[variant]
    cols, rows = GRIDS[name]
    want = np.asarray(pair.scn["expected_embeddings"][name], np.float32)
    got = pairs[variant][1].encode(pair.image(name))
    assert got.shape == want.shape == (cols * rows + rows - 1, 256)
    assert np.abs(got - want).max() <= TOL_EMBD


@pytest.mark.parametrize("name", sorted(GRIDS))
@pytest.mark.parametrize("variant", PAIRS)
def test_img_break_ends_every_row_but_the_last(pairs: dict, variant: str, name: str) -> None:
    # mtmd's rows hold the file's [IMG_BREAK] embedding at those places (to its 6 recorded digits),
    # and the engine's hold it exactly; no other row is it
    pair = PAIRS[variant]
    cols, rows = GRIDS[name]
    brk = img_break(pair)
    want = np.asarray(pair.scn["expected_embeddings"][name], np.float32)
    got = pairs[variant][1].encode(pair.image(name))
    at = break_rows(cols, rows)
    assert np.abs(want[at] - brk).max() <= 1e-6
    assert np.array_equal(got[at], np.broadcast_to(brk, (len(at), brk.size)))
    others = np.delete(got, at, axis=0)
    assert np.abs(others - brk).max(axis=1).min() > 0.1


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("variant", PAIRS)
def test_prompt_with_images_matches_mtmd(pairs: dict, variant: str, case: int, cache_type: str) -> None:
    pair = PAIRS[variant]
    model, proj = pairs[variant]
    check_prompt_matches_mtmd(model, proj, pair, case, cache_type, non_causal=False)


def test_an_image_is_its_rows_then_img_end(pairs: dict) -> None:
    # mtmd sets img_end "[IMG_END]" (one CONTROL token) and no img_beg for pixtral: the text before the
    # marker is all, the break rows are inside the image chunk (no tokens)
    model, proj = pairs["pixtral"]
    ev = PAIRS["pixtral"].scn["evals"][0]
    before, after = ev["prompt"].split(MEDIA_MARKER)
    img_end = model.tokenize("[IMG_END]", add_special=False, parse_special=True)
    assert len(img_end) == 1
    text_before, img, text_after = ev["expected_chunks"]
    assert text_before["tokens"] == [model.bos] + model.tokenize(before, add_special=False, parse_special=True)
    assert img["n_tokens"] == img["n_pos"] == 8 * 8 + 7
    assert text_after["tokens"] == img_end + model.tokenize(after, add_special=False, parse_special=True)


@pytest.mark.parametrize("variant", PAIRS)
def test_pixtral_images_are_decoded_causally(pairs: dict, variant: str) -> None:
    # mtmd_decode_use_non_causal is false for pixtral: decoded non-causally the logits move beyond the tolerance
    pair = PAIRS[variant]
    model, proj = pairs[variant]
    # non-causal attention takes an image in one micro-batch: 128 rows at once
    ctx = fl.Context(model, n_ctx=pair.scn["context"]["n_ctx"], n_batch=128, n_ubatch=128, n_seq_max=1, n_threads=2)
    off = logits_off_with(model, proj, pair, lambda c: setattr(c, "non_causal", True), ctx, n_batch=128)
    # (measured: 0.073 for Pixtral's, 0.21 for Mistral Small's)
    assert off > TOL_TINY_FLOAT_MAX


@pytest.mark.parametrize("variant", PAIRS)
def test_img_break_rows_matter(pairs: dict, variant: str) -> None:
    # the break rows zeroed, the last logits move beyond the tolerance
    pair = PAIRS[variant]
    model, proj = pairs[variant]
    cols, rows = GRIDS[pair.scn["evals"][0]["images"][0]]

    def zero_break_rows(c: ImageChunk) -> None:
        c.embd = c.embd.copy()
        c.embd[break_rows(cols, rows)] = 0

    assert logits_off_with(model, proj, pair, zero_break_rows) > 2 * TOL_TINY_FLOAT_MAX


@pytest.mark.parametrize(("variant", "nx", "ny", "n"), [("pixtral", 104, 40, 13 * 5 + 4), ("pixtral", 8, 24, 1 * 3 + 2),
                                                        ("mistral3", 104, 40, 13 * 5 + 4), ("mistral3", 64, 8, 8)])
def test_token_counts(pairs: dict, variant: str, nx: int, ny: int, n: int) -> None:
    proj = pairs[variant][1]
    assert proj.core.n_output_tokens(nx, ny) == n
    assert proj.core.encode_pixels(np.zeros((ny, nx, 3), np.float32)).shape == (n, 256)


@pytest.mark.parametrize(("variant", "shape", "block"), [("pixtral", (36, 64, 3), 8), ("pixtral", (0, 64, 3), 8),
                                                         ("mistral3", (64, 60, 3), 8)])
def test_images_not_in_whole_blocks_are_refused(pairs: dict, variant: str, shape: tuple, block: int) -> None:
    with pytest.raises(ValueError, match=f"whole {block}x{block}-pixel blocks"):
        pairs[variant][1].core.encode_pixels(np.zeros(shape, np.float32))


def test_a_merge_size_without_the_patch_merger_is_refused(pairs: dict, tmp_path: Path) -> None:
    model = pairs["pixtral"][0]
    with pytest.raises(fl.UnsupportedError, match="no patch merger"):
        Projector(model, rewritten(tmp_path, {"clip.vision.spatial_merge_size": 2}, PAIRS["pixtral"].mmproj))


def test_the_merge_size_comes_from_the_file(pairs: dict) -> None:
    assert pairs["pixtral"][1].core.n_merge == 1
    assert pairs["mistral3"][1].core.n_merge == 2


def test_llama_chat_with_mistral_template_decodes_its_text_with_the_images(pairs: dict) -> None:
    # the model's template (Mistral Small 3.2's, typed content parts) renders each image part as
    # the media marker, which becomes the image's rows and [IMG_END]; a system message of our own
    # in place of the template's long default. (The tiny model's greedy answer is a lone UTF-8
    # byte, which a chat message holds back: the logits after the prompt are compared instead.)
    from ferrollama.chat.media import with_media_markers
    from ferrollama.llama_chat_format import MTMDChatHandler

    pair = PAIRS["pixtral"]
    model, proj = pairs["pixtral"]
    handler = MTMDChatHandler(clip_model_path=str(pair.mmproj))
    llm = fl.Llama(str(pair.model_path), n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2,
                   chat_handler=handler, logits_all=True, verbose=False)
    for name in ("wide", "square"):
        messages = [{"role": "system", "content": "You see pictures."}, *chat_message(data_uri(pair.image(name)))]
        r = llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0)
        text = llm.chat_template.apply(with_media_markers(messages), add_generation_prompt=True)
        assert text.endswith("[SYSTEM_PROMPT]You see pictures.[/SYSTEM_PROMPT][INST]What is in this picture?"
                             + MEDIA_MARKER + "[/INST]")
        ctx = fl.Context(model, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, type_k="f16", type_v="f16")
        n_past = proj.eval(ctx, text, [pair.image(name)])
        assert r["usage"]["prompt_tokens"] == n_past
        assert np.abs(llm.scores[n_past - 1] - ctx.logits(-1)).max() < 1e-4
