#!/usr/bin/env python3
"""Image encoding speed (issue 38): ferrollama's vision encoder against llama.cpp's libmtmd on a
projector of SigLIP-400M's dimensions (Gemma 3's: 896 px images, patches of 14 -> 4096 patches,
width 1152, 16 heads, 27 blocks, FFN 4304, F16 matrices; random weights from
tests/data/make_tiny_vision.py's write_mmproj, pooled 4x4 to 256 rows of the text model's width),
paired with the default text model (qwen2.5-coder-0.5b, width 896).

Two measurements, each engine in turn within a round, the order alternating from round to round
(the first round warms up and is not counted); ratios are per-round ratios, medians over rounds:

- **encode**: one image's embeddings from its preprocessed pixels: ferrollama's
  ``Projector.encode_pixels`` (the core) against ``mtmd_encode_chunk`` on the image chunk
  (mtmd preprocesses at tokenize time);
- **first token**: a one-image chat, ``"<__media__>Describe this image."``, from the decoded image
  to the first token (greedy): ``ferrollama.generation.multimodal.Projector.eval`` (tokenize,
  preprocess, encode, decode) + argmax of the logits, against ``mtmd_tokenize`` +
  ``mtmd_helper_eval_chunks`` + argmax, each into a cleared context (n_ctx 512, batch 512, f16
  KV cache, llama.cpp's default flash attention).

Both engines use the same threads (2 by default); mtmd gets mtmd_context_params_default() as
benches/record_vision.py gives it (flash attention on for the projector after the warmup).
Run with the test venv's python and the bench venv's packages (llama_cpp) on the path:

  PYTHONPATH=python:.bench-venv/lib/python3.11/site-packages .venv/bin/python \\
      benches/vision_speed.py [--rounds 3] [--threads 2] [--mmproj FILE] [--image PNG] \\
      [--work-dir DIR] [--json out.json] [--markdown out.md]

The projector (800 MB) and the image are written to --work-dir unless they exist.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "data"))
import benchlib as B  # noqa: E402

PROMPT = "<__media__>Describe this image."
#: SigLIP-400M's (Gemma 3's) vision tower; n_embd_out is set to the text model's width.
SIGLIP_400M = dict(image_size=896, patch_size=14, n_embd=1152, n_head=16, n_layer=27, n_ff=4304, merge=4)


def write_inputs(work: Path, n_embd_out: int) -> tuple[Path, Path]:
    """The SigLIP-400M-sized projector and an 896 x 896 test image, written once."""
    import make_tiny_vision as mtv
    from PIL import Image

    work.mkdir(parents=True, exist_ok=True)
    mmproj = work / f"mmproj-siglip400m-f16-{n_embd_out}.gguf"
    if not mmproj.is_file():
        print(f"writing {mmproj} ...", flush=True)
        tmp = mmproj.with_suffix(".tmp")
        mtv.write_mmproj(tmp, mtv.VisionDims(**SIGLIP_400M, n_embd_out=n_embd_out))
        tmp.rename(mmproj)
    image = work / "image-896.png"
    if not image.is_file():
        y, x = np.mgrid[0:896, 0:896]
        rgb = np.stack([(x * 255) // 895, (y * 255) // 895, ((x ^ y) & 255)], axis=-1).astype(np.uint8)
        Image.fromarray(rgb).save(image)
    return mmproj, image


class Ours:
    name = "ferrollama"

    def __init__(self, model_path: Path, mmproj: Path, image: Path, threads: int) -> None:
        import ferrollama as fl
        from ferrollama.generation.media import load_image, preprocess_image
        from ferrollama.generation.multimodal import Projector

        self.fl = fl
        self.model = fl.Model(str(model_path))
        self.proj = Projector(self.model, mmproj, n_threads=threads)
        self.rgb = load_image(str(image))
        self.pixels = preprocess_image(self.proj.projector_type, self.rgb, self.proj.vision).entries[0]
        self.ctx = fl.Context(self.model, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=threads,
                              n_threads_batch=threads, type_k="f16", type_v="f16")

    def encode(self) -> float:
        t0 = time.perf_counter()
        self.proj.core.encode_pixels(self.pixels)
        return time.perf_counter() - t0

    def first_token(self) -> tuple[float, int]:
        self.ctx.kv.clear()
        t0 = time.perf_counter()
        self.proj.eval(self.ctx, PROMPT, [self.rgb])
        token = int(np.argmax(self.ctx.logits(-1)))
        return time.perf_counter() - t0, token


class Theirs:
    name = "mtmd"

    def __init__(self, model_path: Path, mmproj: Path, image: Path, threads: int) -> None:
        import recorder
        import record_vision as rv

        recorder.THREADS = threads
        self.rv, self.M = rv, rv.M
        self.engine = B.LlamaCppEngine()
        self.L = self.engine.L
        self.model = self.engine.load(model_path)
        self.mtmd = rv.Mtmd(mmproj, self.model.ptr, {"img": image})
        self.ctx = self.model.context(n_ctx=512, n_batch=512, n_ubatch=512, n_threads=threads)
        self.n_vocab = self.model.n_vocab

    def encode(self) -> float:
        chunks = self.mtmd.tokenize(PROMPT, ["img"])
        try:
            chunk = self.rv.image_chunks(chunks)[0]
            t0 = time.perf_counter()
            if self.M.mtmd_encode_chunk(self.mtmd.ctx, chunk) != 0:
                raise RuntimeError("mtmd_encode_chunk failed")
            return time.perf_counter() - t0
        finally:
            self.M.mtmd_input_chunks_free(chunks)

    def first_token(self) -> tuple[float, int]:
        self.ctx.clear()
        t0 = time.perf_counter()
        chunks = self.mtmd.tokenize(PROMPT, ["img"])
        try:
            n_past = self.L.llama_pos(0)
            rc = self.M.mtmd_helper_eval_chunks(self.mtmd.ctx, self.ctx.ptr, chunks, 0, 0, 512, True, ctypes.byref(n_past))
            if rc != 0:
                raise RuntimeError(f"mtmd_helper_eval_chunks returned {rc}")
            ptr = self.L.llama_get_logits_ith(self.ctx.ptr, -1)
            logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
            token = int(np.argmax(logits))
            return time.perf_counter() - t0, token
        finally:
            self.M.mtmd_input_chunks_free(chunks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--mmproj", type=Path, default=None, help="a projector to use instead of writing one")
    ap.add_argument("--image", type=Path, default=None)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/ferrollama-vision-bench"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tests", default="encode,first_token")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args()

    [(name, model_path)] = B.resolve_models(args.model, args.model_dir)
    import ferrollama as fl

    mmproj, image = args.mmproj, args.image
    if mmproj is None or image is None:
        written = write_inputs(args.work_dir, fl.Model(str(model_path)).n_embd)
        mmproj, image = mmproj or written[0], image or written[1]
    engines = [Ours(model_path, mmproj, image, args.threads), Theirs(model_path, mmproj, image, args.threads)]
    tests = args.tests.split(",")
    times = {(t, e.name): [] for t in tests for e in engines}
    tokens = {}
    for rnd in range(args.rounds + 1):          # round 0 warms up
        order = engines if rnd % 2 == 0 else engines[::-1]
        for test in tests:
            for e in order:
                load = B.ForeignLoad()
                if test == "encode":
                    s = e.encode()
                else:
                    s, tokens[e.name] = e.first_token()
                print(f"round {rnd} {test:11s} {e.name:10s} {s:7.2f} s (others used {load.cores():.2f} cores)", flush=True)
                if rnd > 0:
                    times[(test, e.name)].append(s)

    info = B.machine_info()
    rows = []
    for test in tests:
        ours, theirs = times[(test, "ferrollama")], times[(test, "mtmd")]
        ratios = [t / o for o, t in zip(ours, theirs)]
        rows.append([test, f"{statistics.median(ours):.2f}", f"{statistics.median(theirs):.2f}",
                     f"{statistics.median(ratios):.2f}x", " / ".join(f"{r:.2f}" for r in ratios)])
    table = B.markdown_table(["test", "ferrollama (s)", "mtmd (s)", "speed-up (mtmd / ours, median)", "per round"], rows)
    head = (f"{info.get('cpu', '?')}, {args.threads} threads, {args.rounds} rounds after a warm-up, engines "
            f"alternating; SigLIP-400M-sized F16 projector ({mmproj.name}), text model {name}; medians of "
            f"per-round times. First tokens: {tokens}.")
    print(head + "\n\n" + table)
    if args.markdown:
        Path(args.markdown).write_text(f"{head}\n\n{table}\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "threads": args.threads, "mmproj": str(mmproj),
                                                "model": name, "first_tokens": tokens,
                                                "times": {f"{t}/{e}": v for (t, e), v in times.items()}}, indent=1))


if __name__ == "__main__":
    main()
