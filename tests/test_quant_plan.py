"""llama-quantize's per-tensor type choice (cli/quant_plan.py) against llama.cpp's own, recorded for every
preset, without and with an importance matrix, on the two real models as F16 models and on tiny
models whose shapes reach the other rules (benches/record_presets.py -> fixtures/quantize_presets.json)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import ferrollama as fl
from conftest import model_path
from ferrollama.cli.quant_plan import ModelFacts, Planner

DATA = Path(__file__).parent / "data"
RECORD = json.loads((DATA / "fixtures" / "quantize_presets.json").read_text())
CASES = [(model, preset) for model, entry in sorted(RECORD.items()) for preset in sorted(entry["plans"])]


def tensors_of(model: str) -> tuple[ModelFacts, list[tuple[str, tuple[int, ...], str]]]:
    entry = RECORD[model]
    m = fl.Model(str(model_path(entry["source"])), vocab_only=True)
    fields = {k: v for k, v in m.metadata.items() if k.startswith(m.arch + ".")}
    fields["general.architecture"] = m.arch
    as_f16 = entry["tensor_types"] == "F16 matrices, F32 vectors"
    tensors = []
    for t in m.tensors:
        shape = tuple(int(d) for d in t.shape)
        current = ("F16" if len(shape) >= 2 else "F32") if as_f16 else t.type
        tensors.append((t.name, shape, current))
    return ModelFacts.of_fields(fields), tensors


_TENSORS = {model: tensors_of(model) for model in RECORD}


@pytest.mark.parametrize("model, preset", CASES)
def test_plan_equals_llama_quantize(model, preset):
    facts, tensors = _TENSORS[model]
    recorded = RECORD[model]["plans"][preset]
    for variant, has_imatrix in (("plain", False), ("imatrix", True)):
        by_type = recorded.get(variant, recorded["plain"])
        want = {name: t for t, names in by_type.items() for name in names}
        got = Planner(facts, preset, has_imatrix=has_imatrix).plan(tensors)
        assert got == want, (variant, {n: (got[n], want.get(n)) for n in got if got[n] != want.get(n)})
