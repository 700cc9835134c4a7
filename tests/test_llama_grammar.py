"""ferrollama.llama_grammar: llama-cpp-python's LlamaGrammar and json_schema_to_gbnf."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import ferrollama
from ferrollama import llama_grammar as lg
from ferrollama import samplers

GRAMMARS = json.loads((Path(__file__).parent / "data" / "fixtures" / "chat_formats.json").read_text())["grammars"]


@pytest.mark.parametrize("name", list(GRAMMARS["constants"]))
def test_example_grammars_are_llama_cpp_pythons_and_parse(name, qwen_model):
    text = getattr(lg, name)
    assert text == GRAMMARS["constants"][name]
    g = lg.LlamaGrammar.from_string(text)
    samplers.Grammar(qwen_model, g._grammar, root=g._root)  # raises GrammarError if the engine refuses it


@pytest.mark.parametrize("name", list(GRAMMARS["schemas"]))
def test_schema_grammar_is_llama_cpps(name, qwen_model):
    # The engine's converter is llama.cpp's C++ one (recorded from it in the fixture); llama-cpp-python
    # 0.3.36's Python port is older and writes other GBNF for every schema here (also recorded).
    rec = GRAMMARS["schemas"][name]
    g = lg.LlamaGrammar.from_json_schema(json.dumps(rec["schema"]))
    assert g._grammar == rec["engine"] and g._root == "root"
    assert lg.json_schema_to_gbnf(json.dumps(rec["schema"])) == rec["engine"]
    samplers.Grammar(qwen_model, g._grammar, root=g._root)


def root_rule(gbnf: str) -> str:
    return next(line for line in gbnf.splitlines() if line.startswith("root ::="))


@pytest.mark.parametrize("name", list(GRAMMARS["prop_order"]))
def test_prop_order_orders_the_properties_as_llama_cpp_python(name):
    rec = GRAMMARS["prop_order"][name]
    got = lg.json_schema_to_gbnf(json.dumps(rec["schema"]), prop_order=rec["prop_order"])
    assert root_rule(got) == root_rule(rec["python"])


def test_prop_order_moves_a_property_within_its_group():
    # Required properties come first whatever the order (so "days", optional, stays after "city");
    # among required ones prop_order decides.
    schema = json.dumps(GRAMMARS["prop_order"]["answer_score_first"]["schema"])
    assert root_rule(lg.json_schema_to_gbnf(schema)) == (
        'root ::= "{" space answer-kv "," space score-kv "}" space')
    assert root_rule(lg.json_schema_to_gbnf(schema, prop_order=["score"])) == (
        'root ::= "{" space score-kv "," space answer-kv "}" space')


def test_from_string_holds_the_text_and_root():
    g = lg.LlamaGrammar.from_string('root ::= "a"', verbose=False)
    assert (g._grammar, g._root) == ('root ::= "a"', lg.LLAMA_GRAMMAR_DEFAULT_ROOT) == ('root ::= "a"', "root")
    with pytest.raises(ValueError, match="empty"):
        lg.LlamaGrammar.from_string("  \n")
    with pytest.raises(TypeError):
        lg.LlamaGrammar.from_string(b'root ::= "a"')


def test_from_file(tmp_path):
    path = tmp_path / "g.gbnf"
    path.write_text(lg.ARITHMETIC_GBNF)
    assert lg.LlamaGrammar.from_file(path)._grammar == lg.ARITHMETIC_GBNF
    assert lg.LlamaGrammar.from_file(str(path))._grammar == lg.ARITHMETIC_GBNF
    with pytest.raises(ValueError, match="error reading grammar file"):
        lg.LlamaGrammar.from_file(tmp_path / "missing.gbnf")
    (tmp_path / "empty.gbnf").write_text("")
    with pytest.raises(ValueError, match="params_grammer is empty"):
        lg.LlamaGrammar.from_file(tmp_path / "empty.gbnf")


def test_a_malformed_grammar_is_a_grammar_error_when_used(qwen_model):
    g = lg.LlamaGrammar.from_string('root ::= "a" | (')
    with pytest.raises(ferrollama.GrammarError):
        samplers.Grammar(qwen_model, g._grammar, root=g._root)


@pytest.mark.parametrize("schema,error,message", [
    ("[1,2", ValueError, "not valid JSON"),
    ('{"type": "bogus"}', ferrollama.GrammarError, "Unrecognized schema"),
    ('{"properties": {"a": {"$ref": "#/nope"}}}', ferrollama.GrammarError, "Error resolving ref"),
    ('{"type": "string", "pattern": "("}', ferrollama.GrammarError, "Pattern must start with"),
])
def test_a_bad_schema_is_a_clear_error(schema, error, message):
    with pytest.raises(error, match=message):
        lg.LlamaGrammar.from_json_schema(schema)
    with pytest.raises(error, match=message):
        lg.json_schema_to_gbnf(schema, prop_order=["a"])
    with pytest.raises(TypeError):
        lg.json_schema_to_gbnf({"type": "string"})
