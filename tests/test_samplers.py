"""llama.cpp's samplers through ferrollama.samplers: every case of samplers.json (candidate ids
in order, logits, p where the chain ends with dist, the selected token), and grammar-
constrained generation on a real model."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ferrollama as fl
from ferrollama import samplers as S

CASES = json.loads((Path(__file__).parent / "data" / "samplers.json").read_text())


def build(spec: dict) -> S.Sampler:
    t = spec["type"]
    if t == "greedy":
        return S.Greedy()
    if t == "dist":
        return S.Dist(spec["seed"])
    if t == "top_k":
        return S.TopK(spec["k"])
    if t == "top_p":
        return S.TopP(spec["p"], spec["min_keep"])
    if t == "min_p":
        return S.MinP(spec["p"], spec["min_keep"])
    if t == "typical":
        return S.Typical(spec["p"], spec["min_keep"])
    if t == "temp":
        return S.Temp(spec["t"])
    if t == "temp_ext":
        return S.TempExt(spec["t"], spec["delta"], spec["exponent"])
    if t == "xtc":
        return S.XTC(spec["p"], spec["threshold"], spec["min_keep"], spec["seed"])
    if t == "top_n_sigma":
        return S.TopNSigma(spec["n"])
    if t == "penalties":
        return S.Penalties(spec["last_n"], spec["repeat"], spec["freq"], spec["present"])
    if t == "logit_bias":
        return S.LogitBias([tuple(b) for b in spec["bias"]], n_vocab=spec["n_vocab"])
    if t == "mirostat_v2":
        return S.MirostatV2(spec["seed"], spec["tau"], spec["eta"])
    raise AssertionError(f"unknown sampler {t}")


def close(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    same_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    finite = np.isfinite(a) & np.isfinite(b)
    a, b = np.where(finite, a, 0.0), np.where(finite, b, 0.0)
    tol = 1e-4 * np.maximum(1.0, np.abs(b))
    return bool(np.all(same_inf | (finite & (np.abs(a - b) <= tol))))


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_samplers_json(case: dict) -> None:
    chain = S.Chain([build(s) for s in case["chain"]])
    for t in case["accept"]:
        chain.accept(t)
    logits = np.asarray(case["logits"], dtype=np.float32)
    ends_with_dist = case["chain"][-1]["type"] == "dist"
    for r, exp in enumerate(case["expected"]):
        c = chain.apply(logits)
        want = np.asarray(exp["candidates"], dtype=np.float64)
        n = len(want)
        assert len(c) == exp.get("n_candidates", n), f"round {r}: candidate count"
        assert c.ids[:n].tolist() == want[:, 0].astype(int).tolist(), f"round {r}: order"
        assert close(c.logits[:n], want[:, 1]), f"round {r}: logits"
        if ends_with_dist:
            assert close(c.p[:n], want[:, 2]), f"round {r}: p"
        token = -1 if c.token is None else c.token
        assert c.selected == exp["selected"] and token == exp["token"], f"round {r}: selected"
        if token >= 0:
            chain.accept(token)


def test_bad_parameters_raise_value_error() -> None:
    with pytest.raises(ValueError):
        S.TopP(float("nan"))
    with pytest.raises(ValueError):
        S.LogitBias({5: 1.0}, n_vocab=3)


def test_malformed_grammar_names_the_place(qwen_model: fl.Model) -> None:
    with pytest.raises(fl.GrammarError, match=r"line|col"):
        S.Grammar(qwen_model, 'root ::= "a" (')


def test_grammar_constrained_generation(qwen_model: fl.Model) -> None:
    gbnf = 'root ::= "answer: " ("yes" | "no") "."'
    chain = S.Chain([S.Grammar(qwen_model, gbnf), S.TopK(40), S.Temp(0.8), S.Dist(7)])
    ctx = fl.Context(qwen_model, n_ctx=256)
    prompt = qwen_model.tokenize("Is water wet? Reply with answer: yes or no.\n")
    ctx.decode(fl.Batch.from_tokens(prompt))
    out, pos = [], len(prompt)
    for _ in range(16):
        tok = chain.sample(ctx)
        if qwen_model.is_eog(tok):
            break
        out.append(tok)
        ctx.decode(fl.Batch.from_tokens([tok], pos0=pos))
        pos += 1
    assert qwen_model.detokenize(out) in ("answer: yes.", "answer: no.")


def test_json_schema_generation_parses(qwen_model: fl.Model) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    chain = S.Chain([S.Grammar.from_json_schema(qwen_model, schema), S.Greedy()])
    ctx = fl.Context(qwen_model, n_ctx=512)
    prompt = qwen_model.tokenize("A JSON object describing a person named Ann, aged 31:\n")
    ctx.decode(fl.Batch.from_tokens(prompt))
    out, pos = [], len(prompt)
    for _ in range(48):
        tok = chain.sample(ctx)
        if qwen_model.is_eog(tok):
            break
        out.append(tok)
        ctx.decode(fl.Batch.from_tokens([tok], pos0=pos))
        pos += 1
    value = json.loads(qwen_model.detokenize(out))
    assert set(value) == {"name", "age"} and isinstance(value["age"], int) and 0 <= value["age"] <= 120
    assert isinstance(value["name"], str) and len(value["name"]) <= 8
