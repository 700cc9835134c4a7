"""llama.cpp's samplers (llama_sampler_init_*) and the sampler chain.

``Chain([...]).apply(logits)`` does what llama_sampler_apply does to an unsorted array with
ids 0..n-1; ``Chain.sample(ctx, i)`` selects and accepts a token from ``ctx.logits(i)``,
checking grammars on the chosen token first as llama.cpp's common sampler does.
"""
from ._core import samplers as _s  # a submodule of the extension, not importable by path

DRY = _s.DRY
XTC = _s.XTC
Candidates = _s.Candidates
Chain = _s.Chain
Dist = _s.Dist
Grammar = _s.Grammar
Greedy = _s.Greedy
Infill = _s.Infill
LogitBias = _s.LogitBias
MinP = _s.MinP
MirostatV1 = _s.MirostatV1
MirostatV2 = _s.MirostatV2
Penalties = _s.Penalties
Sampler = _s.Sampler
Temp = _s.Temp
TempExt = _s.TempExt
TopK = _s.TopK
TopNSigma = _s.TopNSigma
TopP = _s.TopP
Typical = _s.Typical
apply_guidance = _s.apply_guidance

__all__ = [
    "DRY", "XTC", "Candidates", "Chain", "Dist", "Grammar", "Greedy", "Infill", "LogitBias", "MinP",
    "MirostatV1", "MirostatV2", "Penalties", "Sampler", "Temp", "TempExt", "TopK", "TopNSigma", "TopP",
    "Typical", "apply_guidance",
]
