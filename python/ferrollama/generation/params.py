"""Sampling parameters: llama.cpp's common_params_sampling (its defaults, its sampler names)."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_SEED", "SAMPLER_NAMES", "SAMPLER_CHARS", "DEFAULT_SAMPLERS", "SamplingParams", "resolve_seed"]


#: llama.cpp's LLAMA_DEFAULT_SEED: "pick a random seed".
DEFAULT_SEED = 0xFFFFFFFF

#: Sampler names of llama.cpp's --samplers (canonical and alternative spellings) and the letters
#: of --sampling-seq.
SAMPLER_NAMES = {
    "penalties": "penalties", "dry": "dry", "top_n_sigma": "top_n_sigma", "top_k": "top_k",
    "typ_p": "typ_p", "top_p": "top_p", "min_p": "min_p", "xtc": "xtc", "temperature": "temperature",
    "top-k": "top_k", "top-p": "top_p", "top-n-sigma": "top_n_sigma", "nucleus": "top_p",
    "typical-p": "typ_p", "typical": "typ_p", "typ-p": "typ_p", "typ": "typ_p", "min-p": "min_p",
    "temp": "temperature",
}
SAMPLER_CHARS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p",
                 "p": "top_p", "m": "min_p", "x": "xtc", "t": "temperature"}

DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")


@dataclass
class SamplingParams:
    """llama.cpp's common_params_sampling, with its defaults."""

    seed: int = DEFAULT_SEED
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    typ_p: float = 1.0
    temp: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    penalty_last_n: int = 64
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: list[str] = field(default_factory=lambda: ["\n", ":", "\"", "*"])
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    top_n_sigma: float = -1.0
    min_keep: int = 0
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    logit_bias: dict[int, float] = field(default_factory=dict)
    #: a GBNF grammar ("" for none)
    grammar: str = ""
    #: a JSON schema (a JSON text or a dict) turned into a grammar by the engine
    json_schema: Any = None

    def validate(self) -> None:
        """ValueError for values llama.cpp would reject."""
        if self.mirostat not in (0, 1, 2):
            raise ValueError(f"mirostat must be 0, 1 or 2, not {self.mirostat}")
        unknown = [s for s in self.samplers if s not in DEFAULT_SAMPLERS]
        if unknown:
            raise ValueError(f"unknown sampler {unknown[0]!r}; known: {', '.join(DEFAULT_SAMPLERS)}")
        if self.grammar and self.json_schema is not None:
            raise ValueError("give a grammar or a JSON schema, not both")
        if not 0 <= self.seed <= 0xFFFFFFFF:
            raise ValueError(f"seed must be in 0..4294967295, not {self.seed}")


def resolve_seed(seed: int | None) -> int:
    """llama.cpp's rule: LLAMA_DEFAULT_SEED (or None) means a random seed."""
    if seed is None or seed == DEFAULT_SEED:
        return random.SystemRandom().randrange(0, DEFAULT_SEED)
    return int(seed)
