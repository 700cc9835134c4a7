#!/usr/bin/env python3
"""Writes the synthetic Qwen3-VL text model of the M-RoPE speed benchmark: tests/data/
make_tiny_qwenvl.py's qwen3vl (interleaved M-RoPE, per-head Q/K norms, 2 DeepStack layers) scaled
to a small real model's shape (16 layers, n_embd 1024, 16 heads of 64 with 4 KV heads, FFN 2816,
sections [12, 10, 10, 0]: Qwen3-VL's [24, 20, 20, 0] for heads of 64), random weights written F16
by make_tiny_archs.py's writer, then quantized to Q4_K (`ferrollama quantize --pure`). The
vocabulary is the tiny models' (512 tokens): the test is of the blocks.

  python benches/make_qwenvl_bench_model.py [--out-dir DIR]   # writes DIR/synthetic-qwen3vl-q4_k.gguf

Then: python benches/compare.py --model-dir DIR --models qwen3vl-synthetic,qwen3-synthetic --tests pp512,tg128

It also writes DIR/synthetic-qwen3-q4_k.gguf, the same blocks as a `qwen3` (NEOX RoPE, no
DeepStack), the baseline that shows what M-RoPE costs each engine.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "data"))
import make_tiny_archs as mk  # noqa: E402
import make_tiny_qwenvl as mq  # noqa: E402

DIMS = mk.Dims(n_embd=1024, n_head=16, n_head_kv=4, n_layer=16, n_ff=2816, n_ctx=4096)
FILES = {"qwen3vl": "synthetic-qwen3vl-q4_k.gguf", "qwen3": "synthetic-qwen3-q4_k.gguf"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(Path.home() / ".cache" / "ferrollama" / "bench"))
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    qwen3vl = next(s for s, _ in mq.MODELS if s.name == "qwen3vl")
    metadata = {**qwen3vl.metadata, "attention.key_length": 64, "attention.value_length": 64,
                "rope.dimension_sections": [12, 10, 10, 0]}
    plain = {k: v for k, v in metadata.items() if k not in ("rope.dimension_sections", "n_deepstack_layers")}
    for arch, meta in (("qwen3vl", metadata), ("qwen3", plain)):
        # the same name: the same random weights
        spec = replace(qwen3vl, name="synthetic-qwen3vl", arch=arch, head_dim=64, metadata=meta)
        f16 = out / f"synthetic-{arch}-f16.gguf"
        mk.write_model(spec, "f16", f16, DIMS, vocab=mq.qwen_vocab)
        subprocess.run([sys.executable, "-m", "ferrollama.cli", "quantize", "--pure", str(f16), str(out / FILES[arch]), "Q4_K"],
                       check=True)
        print("wrote", out / FILES[arch])


if __name__ == "__main__":
    main()
