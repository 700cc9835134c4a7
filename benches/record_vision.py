#!/usr/bin/env python3
"""Records llama.cpp's libmtmd on the tiny Gemma 3 and its projector (tests/data/make_tiny_vision.py)
into tests/data/scenarios/vision-gemma3-f32.json: the embeddings of each image, and for each prompt
the chunks mtmd cuts it into, the n_past and the last token's logits after
mtmd_helper_eval_chunks. Run it with the benchmark venv (llama-cpp-python 0.3.36's
llama_cpp.mtmd_cpp):

  /path/to/bench-venv/bin/python benches/record_vision.py

The text model loads as benches/recorder.py loads every tiny model (CPU, 2 threads, flash
attention off, without llama.cpp's extra buffer types); `expected_logits_last` is recorded with an
F32 KV cache and `expected_logits_last_kv_f16` with an F16 one. The projector gets
mtmd_context_params_default() with use_gpu off and the same 2 threads: flash_attn_type stays AUTO,
which mtmd's warmup (on by default) turns into flash attention on for a CPU (tools/mtmd/clip.cpp
warmup), as when a user runs it. An image's embeddings come from mtmd_encode_chunk on the image
chunks of a prompt of the image alone (mtmd_get_output_embd: n_tokens rows of n_embd per chunk,
the chunks one after the other: a tiled image's in the prompt's order).

Scenario keys: `images` (name -> file under tests/data), `expected_embeddings` (name -> rows),
`evals` ({prompt, images, n_past, seq_id, expected_chunks: [{type: "text", tokens} | {type:
"image", n_tokens, n_pos}], expected_n_past, expected_non_causal, expected_logits_last,
expected_logits_last_kv_f16}), `context`, `n_threads`, `recorded_with`.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recorder  # noqa: E402

L = recorder.L
import llama_cpp.mtmd_cpp as M  # noqa: E402

DATA = recorder.DATA
NAME = "vision-gemma3-f32"
TEXT_MODEL, MMPROJ = "tiny-gemma3-f32.gguf", "tiny-mmproj-gemma3-f16.gguf"
IMAGES = {"square": "images/square-64.png", "wide": "images/wide-100x37.png"}
CONTEXT = {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_seq_max": 1}
MARKER = M.mtmd_default_marker().decode()
#: (prompt, images): text on both sides of the image (the first prompt's text before the image
#: and the image reach past the sliding window of 32), and two images in one prompt
PROMPTS = [
    (f"You are looking at a small picture of colours and shapes.\n{MARKER}\nWhat do you see in it?", ["square"]),
    (f"You are looking at a small picture of colours and shapes.\n{MARKER}\nWhat do you see in it?", ["wide"]),
    (f"Compare the first image {MARKER} with the second {MARKER} and tell which one is brighter.", ["square", "wide"]),
]
#: the later pairs' prompts: PROMPTS with an image first in the second (BOS a chunk of its own)
PROMPTS_IMAGE_FIRST = [PROMPTS[0], (f"{MARKER}Describe this wide picture.", ["wide"]), PROMPTS[2]]
#: a prompt with a large image (tiled or sliced by the projectors that tile)
LARGE_IMAGE_PROMPT = (f"A large picture: {MARKER}\nWhat is in it?", ["large"])
DIGITS = 6
RECORDED_WITH = (f"llama-cpp-python {L.__version__} (llama.cpp vendored, libmtmd), CPU, {recorder.THREADS} threads; "
                 "text model: flash attention off, F32 KV cache (F16 for *_kv_f16), no extra buffer types; "
                 "projector: mtmd_context_params_default() with use_gpu off (flash_attn_type auto: "
                 "enabled on CPU by the warmup)")

M.mtmd_log_set(recorder._quiet, None)
M.mtmd_helper_log_set(recorder._quiet, None)


class Mtmd:
    """An mtmd context on a text model, with the images loaded as bitmaps."""

    def __init__(self, mmproj: Path, model, images: dict[str, Path]) -> None:  # noqa: ANN001
        params = M.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.n_threads = recorder.THREADS
        self.ctx = M.mtmd_init_from_file(os.fspath(mmproj).encode(), model, params)
        if not self.ctx:
            raise RuntimeError(f"mtmd could not load {mmproj}")
        self.n_embd = L.llama_model_n_embd_inp(model)
        self.bitmaps = {}
        for name, path in images.items():
            bitmap = M.mtmd_helper_bitmap_init_from_file(self.ctx, os.fspath(path).encode(), False)
            if not bitmap:
                self.close()
                raise RuntimeError(f"mtmd could not read {path}")
            self.bitmaps[name] = bitmap

    def __enter__(self) -> "Mtmd":
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        self.close()

    def close(self) -> None:
        for bitmap in self.bitmaps.values():
            M.mtmd_bitmap_free(bitmap)
        self.bitmaps = {}
        if self.ctx:
            M.mtmd_free(self.ctx)
            self.ctx = None

    def tokenize(self, prompt: str, images: list[str]):  # noqa: ANN201 - an mtmd_input_chunks pointer
        text = M.mtmd_input_text()
        raw = prompt.encode()
        text.text, text.text_len, text.add_special, text.parse_special = raw, len(raw), True, True
        bitmaps = (M.mtmd_bitmap_p_ctypes * len(images))(*(self.bitmaps[i] for i in images))
        chunks = M.mtmd_input_chunks_init()
        rc = M.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, len(images))
        if rc != 0:
            M.mtmd_input_chunks_free(chunks)
            raise RuntimeError(f"mtmd_tokenize returned {rc} on {prompt!r}")
        return chunks

    def embeddings(self, chunk) -> np.ndarray:  # noqa: ANN001
        """mtmd_encode_chunk's output for an image chunk: n_tokens x n_embd."""
        if M.mtmd_encode_chunk(self.ctx, chunk) != 0:
            raise RuntimeError("mtmd_encode_chunk failed")
        n_tokens = M.mtmd_input_chunk_get_n_tokens(chunk)
        ptr = M.mtmd_get_output_embd(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_tokens, self.n_embd)).copy()


def chunk_list(chunks) -> list:  # noqa: ANN001
    return [M.mtmd_input_chunks_get(chunks, i) for i in range(M.mtmd_input_chunks_size(chunks))]


def describe(chunk) -> dict:  # noqa: ANN001
    kind = M.mtmd_input_chunk_get_type(chunk)
    if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
        n = ctypes.c_size_t()
        tokens = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
        return {"type": "text", "tokens": [int(tokens[i]) for i in range(n.value)]}
    if kind in MEDIA_CHUNK_TYPES:
        return {"type": MEDIA_CHUNK_TYPES[kind], "n_tokens": int(M.mtmd_input_chunk_get_n_tokens(chunk)),
                "n_pos": int(M.mtmd_input_chunk_get_n_pos(chunk))}
    raise ValueError(f"unexpected chunk type {kind}")


#: mtmd's media chunk types and their names in the scenarios
MEDIA_CHUNK_TYPES = {M.MTMD_INPUT_CHUNK_TYPE_IMAGE: "image", M.MTMD_INPUT_CHUNK_TYPE_AUDIO: "audio"}


def image_chunks(chunks) -> list:  # noqa: ANN001
    """The media chunks (an audio projector's are audio chunks)."""
    return [c for c in chunk_list(chunks) if M.mtmd_input_chunk_get_type(c) in MEDIA_CHUNK_TYPES]


def rounded(values: np.ndarray) -> list:
    return np.round(values.astype(np.float64), DIGITS).tolist()


def eval_prompt(model: recorder.Model, mtmd: Mtmd, prompt: str, images: list[str], cache_type: int,
                context: dict = CONTEXT) -> dict:
    """mtmd_helper_eval_chunks on a fresh context from n_past 0 in sequence 0: the chunks, the new
    n_past, whether mtmd decodes the images non-causally, the last token's logits."""
    chunks = mtmd.tokenize(prompt, images)
    ctx = model.context(context, cache_type)
    try:
        new_n_past = L.llama_pos(0)
        rc = M.mtmd_helper_eval_chunks(mtmd.ctx, ctx, chunks, 0, 0, context["n_batch"], True, ctypes.byref(new_n_past))
        if rc != 0:
            raise RuntimeError(f"mtmd_helper_eval_chunks returned {rc} on {prompt!r}")
        ptr = L.llama_get_logits_ith(ctx, -1)
        logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(model.n_vocab,))
        return {"chunks": [describe(c) for c in chunk_list(chunks)], "n_past": int(new_n_past.value),
                "non_causal": [bool(M.mtmd_decode_use_non_causal(mtmd.ctx, c)) for c in image_chunks(chunks)],
                "logits": logits.copy()}
    finally:
        L.llama_free(ctx)
        M.mtmd_input_chunks_free(chunks)


def image_embeddings(mtmd: Mtmd) -> dict[str, np.ndarray]:
    """Each image's embeddings: the image alone in a prompt (its marker), every image chunk it
    gives (one, or a tiled image's slices and overview) in the prompt's order, one after the other."""
    out = {}
    for name in mtmd.bitmaps:
        chunks = mtmd.tokenize(MARKER, [name])
        try:
            out[name] = np.concatenate([mtmd.embeddings(c) for c in image_chunks(chunks)])
        finally:
            M.mtmd_input_chunks_free(chunks)
    return out


def record(text_model: Path = DATA / "models" / TEXT_MODEL, mmproj: Path = DATA / "models" / MMPROJ,
           images: dict[str, str] = IMAGES, prompts: list = PROMPTS, context: dict = CONTEXT) -> dict:
    """The raw records (numpy arrays): {"embeddings": {image: array}, "evals": [{prompt, images,
    chunks, n_past, non_causal, logits, logits_kv_f16}]}."""
    with recorder.Model(text_model, extra_bufts=False) as model, \
            Mtmd(mmproj, model.model, {k: DATA / f for k, f in images.items()}) as mtmd:
        evals = []
        for prompt, names in prompts:
            f32 = eval_prompt(model, mtmd, prompt, names, recorder.CACHE_TYPES["expected"], context)
            f16 = eval_prompt(model, mtmd, prompt, names, recorder.CACHE_TYPES["expected_kv_f16"], context)
            evals.append({"prompt": prompt, "images": names, **f32, "logits_kv_f16": f16["logits"]})
        return {"embeddings": image_embeddings(mtmd), "evals": evals}


def scenario(got: dict, name: str = NAME, text_model: str = TEXT_MODEL, mmproj: str = MMPROJ,
             images: dict[str, str] = IMAGES, context: dict = CONTEXT) -> dict:
    return {
        "name": name, "model": text_model, "mmproj": mmproj, "context": context, "n_threads": recorder.THREADS,
        "images": images,
        "expected_embeddings": {k: rounded(v) for k, v in got["embeddings"].items()},
        "evals": [{"prompt": e["prompt"], "images": e["images"], "n_past": 0, "seq_id": 0,
                   "expected_chunks": e["chunks"], "expected_n_past": e["n_past"],
                   "expected_non_causal": all(e["non_causal"]),
                   "expected_logits_last": rounded(e["logits"]),
                   "expected_logits_last_kv_f16": rounded(e["logits_kv_f16"])} for e in got["evals"]],
        "recorded_with": RECORDED_WITH,
    }


def record_pair(name: str, text_model: str, mmproj: str, images: dict[str, str] = IMAGES, prompts: list = PROMPTS,
                context: dict = CONTEXT, finish: Callable[[dict], None] | None = None) -> None:
    """Records a text model and its projector (files under tests/data/models) into
    tests/data/scenarios/<name>.json: `record`, then `scenario`, which `finish` completes before it
    is written (an audio pair's keys)."""
    models = DATA / "models"
    got = record(models / text_model, models / mmproj, images, prompts, context)
    scn = scenario(got, name, text_model, mmproj, images, context)
    if finish is not None:
        finish(scn)
    out = DATA / "scenarios" / f"{name}.json"
    out.write_text(json.dumps(scn))
    media = "audio" if "audio" in scn else "image"
    print("recorded", out.name, {k: len(v) for k, v in scn["expected_embeddings"].items()}, f"{media} tokens,",
          len(scn["evals"]), "evals", "non-causal:", [e["expected_non_causal"] for e in scn["evals"]])


def main() -> None:
    record_pair(NAME, TEXT_MODEL, MMPROJ)


if __name__ == "__main__":
    main()
