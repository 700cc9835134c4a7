#!/usr/bin/env python3
"""Writes the synthetic mixture-of-experts model of the MoE speed benchmark: qwen3moe's graph
shaped like OLMoE-1B-7B / Qwen3-30B-A3B scaled to fit this machine (16 layers, 64 experts of
which 8 are used per token, n_embd 1024, experts 512 wide, 16 heads of 64 with 4 KV heads),
random weights written F16 by tests/data/make_tiny_archs.py's writer, then quantized to Q4_K
(every weight matrix, `ferrollama quantize --pure`). The vocabulary is the tiny models'
(512 tokens), so the output head is negligible: the test is of the experts.

  python benches/make_moe_model.py [--out-dir DIR]     # writes DIR/synthetic-moe-q4_k.gguf

Then: python benches/compare.py --model-dir DIR --models moe-synthetic --tests pp512,tg128
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

DIMS = mk.Dims(n_embd=1024, n_head=16, n_head_kv=4, n_layer=16, n_ff=512, n_ctx=4096)
FILE = "synthetic-moe-q4_k.gguf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(Path.home() / ".cache" / "ferrollama" / "bench"))
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = replace(next(s for s in mk.specs() if s.name == "qwen3moe"), name="synthetic-moe", head_dim=64,
                   metadata={"expert_feed_forward_length": 512}, experts=64, experts_used=8, n_ff_exp=512)
    f16 = out / "synthetic-moe-f16.gguf"
    mk.write_model(spec, "f16", f16, DIMS)
    subprocess.run([sys.executable, "-m", "ferrollama.cli", "quantize", "--pure", str(f16), str(out / FILE), "Q4_K"],
                   check=True)
    f16.unlink()
    print("wrote", out / FILE)


if __name__ == "__main__":
    main()
