#!/usr/bin/env python3
"""Writes the scenarios of model and context parameters that change results
(tests/data/scenarios/params-*.json), on tiny models that make_tiny_archs.py writes:

- ``params-rope-ctx``: a context's own RoPE (rope_freq_base, rope_freq_scale) on tiny-llama3;
- ``params-yarn-ctx``: YaRN turned on by the context (rope_scaling_type, yarn_orig_ctx,
  yarn_beta_fast) on tiny-mixtral, whose file says linear x2;
- ``params-none-ctx``: rope_scaling_type "none" on tiny-mixtral (the file's factor no longer scales);
- ``params-kv-overrides``: metadata overridden at load (llama.cpp's kv_overrides): another RoPE
  base and RMS epsilon for tiny-qwen3.

The steps are make_tiny_archs.py's; benches/record_archs.py records llama.cpp's logits with the
same parameters (llama_context_params fields, llama_model_kv_override).
"""
from __future__ import annotations

import json
from pathlib import Path

from make_tiny_archs import DATA, scenario

#: name -> (model file, context parameters, model kv_overrides)
PARAMS = {
    "params-rope-ctx": ("tiny-llama3-f32.gguf", {"rope_freq_base": 20000.0, "rope_freq_scale": 0.5}, {}),
    "params-yarn-ctx": ("tiny-mixtral-f32.gguf",
                        {"rope_scaling_type": "yarn", "yarn_orig_ctx": 32, "yarn_beta_fast": 16.0}, {}),
    "params-none-ctx": ("tiny-mixtral-f32.gguf", {"rope_scaling_type": "none"}, {}),
    "params-kv-overrides": ("tiny-qwen3-f32.gguf", {},
                            {"qwen3.rope.freq_base": 5000.0, "qwen3.attention.layer_norm_rms_epsilon": 0.01}),
}


def main() -> None:
    for name, (model_file, rope, overrides) in PARAMS.items():
        scn = scenario(model_file)
        scn["name"] = name
        scn["context"]["rope"] = rope
        scn["kv_overrides"] = overrides
        out = DATA / "scenarios" / f"{name}.json"
        old = json.loads(out.read_text()) if out.exists() else {}
        if all(old.get(k) == scn[k] for k in ("steps", "context", "kv_overrides")):
            scn.update({k: v for k, v in old.items() if k.startswith("expected") or k == "recorded_with"})
        out.write_text(json.dumps(scn))
        print("wrote", out.name)


if __name__ == "__main__":
    main()
