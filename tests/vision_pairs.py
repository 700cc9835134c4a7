"""What the tests of a projector and its text model against llama.cpp's libmtmd records share
(tests/data/scenarios/vision-*.json and audio-*.json, written by benches/record_vision*.py and
benches/record_audio.py): the pair as recorded (its scenario, files, model, projector and contexts),
and the check of a recorded prompt with media (mtmd_tokenize's chunks, then
mtmd_helper_eval_chunks' n_past and last logits)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import ferrollama as fl
from ferrollama.generation.multimodal import ImageChunk, Projector, TextChunk, eval_chunks
from scenario_runner import TOL_TINY_FLOAT_MAX

DATA = Path(__file__).resolve().parent / "data"
#: llama.cpp rounds the patch convolution, the products' activations and GELU through f16
#: (REFERENCE.md): an exact float64 implementation is 2.2e-3 from its embeddings (RMS ~2)
TOL_EMBD = 5e-3


def chunk_record(chunk) -> dict:  # noqa: ANN001
    """A chunk as the scenarios record it (a media chunk's type is "image" or "audio")."""
    if isinstance(chunk, TextChunk):
        return {"type": "text", "tokens": chunk.tokens}
    return {"type": "audio" if chunk.audio else "image", "n_tokens": chunk.n_tokens, "n_pos": chunk.n_pos}


class Pair:
    """A recorded text model and projector: the scenario tests/data/scenarios/<name>.json."""

    def __init__(self, name: str) -> None:
        self.scn = json.loads((DATA / "scenarios" / f"{name}.json").read_text())
        self.model_path = DATA / "models" / self.scn["model"]
        self.mmproj = DATA / "models" / self.scn["mmproj"]
        #: the kind of media recorded (its chunks' type) and the scenario's key for the files of it
        self.media_kind = "audio" if "audio" in self.scn else "image"
        self.media_key = "audio" if self.media_kind == "audio" else "images"
        self.media = self.scn[self.media_key]

    def media_file(self, name: str) -> Path:
        """A recorded media file (an image, or an audio pair's audio) by its name in the scenario."""
        return DATA / self.media[name]

    image = media_file

    def model(self) -> fl.Model:
        return fl.Model(str(self.model_path))

    def projector(self, model: fl.Model) -> Projector:
        return Projector(model, self.mmproj, n_threads=2)

    def context(self, model: fl.Model, cache_type: str = "f32", **kw) -> fl.Context:  # noqa: ANN003
        """A context as recorded (the scenario's sizes, `kw` replacing some), with a KV cache of `cache_type`."""
        c = {**self.scn["context"], **kw}
        return fl.Context(model, n_ctx=c["n_ctx"], n_batch=c["n_batch"], n_ubatch=c["n_ubatch"],
                          n_seq_max=c["n_seq_max"], n_threads=2, type_k=cache_type, type_v=cache_type)

    chunk_record = staticmethod(chunk_record)


def pair_fixtures(pair: Pair) -> tuple:
    """A test module's module-scoped `model` and `proj` fixtures on `pair`: `model, proj = pair_fixtures(PAIR)`."""

    @pytest.fixture(scope="module")
    def model() -> fl.Model:
        return pair.model()

    @pytest.fixture(scope="module")
    def proj(model: fl.Model) -> Projector:
        return pair.projector(model)

    return model, proj


def check_embeddings_match_mtmd(proj: Projector, pair: Pair, name: str, chunk_tokens: list[int], width: int) -> None:
    """Image `name`'s embeddings: chunks of `chunk_tokens` tokens (a tiled image's in a prompt's
    order), one after the other as mtmd_encode_chunk's rows, `width` wide, within the tolerance."""
    want = np.asarray(pair.scn["expected_embeddings"][name], np.float32)
    encoded = proj.encode_image(pair.image(name))
    assert [c.n_tokens for c in encoded.chunks] == chunk_tokens
    assert encoded.embd.shape == want.shape == (sum(chunk_tokens), width)
    assert np.abs(encoded.embd - want).max() <= TOL_EMBD


def check_prompt_matches_mtmd(model: fl.Model, proj: Projector, pair: Pair, case: int, cache_type: str, *,
                              non_causal: bool) -> tuple[list, fl.Context]:
    """The pair's recorded prompt `case`: mtmd's chunks, its media decoded causally or not as mtmd
    decodes them (`non_causal`, also recorded), mtmd_helper_eval_chunks' n_past, and the last logits
    within the tolerance with an F32 or F16 KV cache. Returns the chunks and the context."""
    ev = pair.scn["evals"][case]
    media = [pair.media_file(n) for n in ev[pair.media_key]]
    chunks = proj.tokenize(ev["prompt"], media)
    assert [pair.chunk_record(c) for c in chunks] == ev["expected_chunks"]
    assert ev["expected_non_causal"] == non_causal
    assert all(c.non_causal == non_causal for c in chunks if isinstance(c, ImageChunk))
    ctx = pair.context(model, cache_type)
    assert proj.eval(ctx, ev["prompt"], media, n_past=ev["n_past"], seq_id=ev["seq_id"]) == ev["expected_n_past"]
    want = np.asarray(ev["expected_logits_last" if cache_type == "f32" else "expected_logits_last_kv_f16"])
    assert np.abs(ctx.logits(-1) - want).max() <= TOL_TINY_FLOAT_MAX
    return chunks, ctx


def load_projectors(pairs: dict[str, Pair]) -> dict[str, Projector]:
    """Each pair's projector (by the pair's key) on its text model, loaded once for the pairs that share it."""
    models: dict[Path, fl.Model] = {}
    for pair in pairs.values():
        if pair.model_path not in models:
            models[pair.model_path] = pair.model()
    return {key: pair.projector(models[pair.model_path]) for key, pair in pairs.items()}


def logits_off_with(model: fl.Model, proj: Projector, pair: Pair, change: Callable[[ImageChunk], None],
                    ctx: fl.Context | None = None, n_batch: int | None = None) -> float:
    """How far from mtmd's the last logits of the pair's first recorded prompt end when each of
    its image chunks is changed by `change` first (beyond the tolerance where what is changed
    matters); decoded into `ctx` (a context as recorded by default) by batches of `n_batch`."""
    ev = pair.scn["evals"][0]
    chunks = proj.tokenize(ev["prompt"], [pair.media_file(n) for n in ev[pair.media_key]])
    for c in chunks:
        if isinstance(c, ImageChunk):
            change(c)
    if ctx is None:
        ctx = pair.context(model)
    eval_chunks(ctx, chunks, n_batch=n_batch)
    return float(np.abs(ctx.logits(-1) - np.asarray(ev["expected_logits_last"])).max())
