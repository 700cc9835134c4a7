#!/usr/bin/env python3
"""Records llama.cpp's libmtmd on the tiny llama and the tiny LLaVA 1.5 projector
(tests/data/make_tiny_vision_llava.py) into tests/data/scenarios/vision-llava-f32.json, with
record_vision.py's prompts, images, settings and format (see there). Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_vision_llava.py [--llava16 | --yi] [--sensitivity]

``--llava16`` records the LLaVA 1.6 projector (image_grid_pinpoints: an overview and anyres tiles,
each encoded on its own) into tests/data/scenarios/vision-llava16-f32.json instead, ``--yi`` the
Yi-VL one (mlp_norm) into vision-llava-yi-f32.json.

``--sensitivity`` records nothing: it prints how far the records are from what would be wrong
(the other image; the encoder's last layer instead of llava's second-to-last, by writing
clip.vision.feature_layer = [n_layer] into a copy of the projector).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_vision as rv  # noqa: E402

DATA = rv.DATA
TEXT_MODEL = "tiny-llama-f32.gguf"
#: the option given -> (scenario name, projector)
VARIANTS = {None: ("vision-llava-f32", "tiny-mmproj-llava-f16.gguf"),
            "--llava16": ("vision-llava16-f32", "tiny-mmproj-llava16-f16.gguf"),
            "--yi": ("vision-llava-yi-f32", "tiny-mmproj-yi-f16.gguf")}
NAME, MMPROJ = VARIANTS[next((a for a in sys.argv[1:] if a in VARIANTS), None)]
if NAME == "vision-llava16-f32":
    # the wide image takes 3 chunks of 64 (2 tiles and the overview): two images need more room
    rv.CONTEXT = {**rv.CONTEXT, "n_ctx": 512}


def record(mmproj: Path = DATA / "models" / MMPROJ) -> dict:
    return rv.record(DATA / "models" / TEXT_MODEL, mmproj)


def scenario(got: dict) -> dict:
    return {**rv.scenario(got), "name": NAME, "model": TEXT_MODEL, "mmproj": MMPROJ}


def with_feature_layer(src: Path, out: Path, layer: int) -> None:
    """A copy of the projector with clip.vision.feature_layer = [layer]."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(out), "clip")
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(key, f.contents())
        else:
            w.add_key_value(key, f.contents(), f.types[0])
    w.add_array("clip.vision.feature_layer", [layer])
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed([int(n) for n in t.shape])), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sensitivity() -> None:
    got = record()
    embd, evals = got["embeddings"], got["evals"]
    rms = {k: float(np.sqrt((v.astype(np.float64) ** 2).mean())) for k, v in embd.items()}
    print("embeddings RMS:", rms)
    print("square vs wide: embeddings max |diff|", float(np.abs(embd["square"] - embd["wide"]).max()),
          "last logits max |diff|", float(np.abs(evals[0]["logits"] - evals[1]["logits"]).max()))
    n_layer = gguf.GGUFReader(DATA / "models" / MMPROJ).fields["clip.vision.block_count"].contents()
    with tempfile.TemporaryDirectory() as tmp:
        last = Path(tmp) / "last-layer.gguf"
        with_feature_layer(DATA / "models" / MMPROJ, last, n_layer)
        other = record(last)
    for name in embd:
        d = np.abs(embd[name] - other["embeddings"][name])
        print(f"{name}: the last layer instead of the second-to-last moves the embeddings by max {d.max():.4g}, "
              f"RMS {np.sqrt((d.astype(np.float64) ** 2).mean()):.4g}")
    for e, o in zip(evals, other["evals"]):
        print(e["images"], "last logits max |diff|", float(np.abs(e["logits"] - o["logits"]).max()))


def main() -> None:
    if "--sensitivity" in sys.argv[1:]:
        sensitivity()
        return
    out = DATA / "scenarios" / f"{NAME}.json"
    scn = scenario(record())
    out.write_text(json.dumps(scn))
    print("recorded", out.name, {k: len(v) for k, v in scn["expected_embeddings"].items()}, "image tokens,",
          len(scn["evals"]), "evals")


if __name__ == "__main__":
    main()
