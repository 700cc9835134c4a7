"""llama-cpp-python's ``llama_cpp.llama_grammar``: a GBNF grammar held as text, and JSON schema -> GBNF.

A ``LlamaGrammar`` only holds the text (``_grammar``) and the root rule's name (``_root``); the
Llama turns it into the engine's sampler, ``ferrollama.samplers.Grammar(model, g._grammar,
root=g._root)``, which parses it and raises ``ferrollama.GrammarError`` (with line and column) on a
malformed grammar. JSON schemas are converted by the engine's converter, which follows llama.cpp's
C++ json-schema-to-grammar (llama-cpp-python ships a Python port of it; see
tests/data/fixtures/chat_formats.json for where the two differ).
"""
from __future__ import annotations

import json
import os
from typing import Any, List, Optional, Union

from ._core import samplers as _samplers

__all__ = [
    "LLAMA_GRAMMAR_DEFAULT_ROOT", "LlamaGrammar", "json_schema_to_gbnf",
    "ARITHMETIC_GBNF", "C_GBNF", "CHESS_GBNF", "JAPANESE_GBNF", "JSON_ARR_GBNF", "JSON_GBNF", "LIST_GBNF",
]

LLAMA_GRAMMAR_DEFAULT_ROOT = "root"


class LlamaGrammar:
    """A GBNF grammar: its text and the name of its root rule."""

    def __init__(self, *, _grammar: str, _root: str = LLAMA_GRAMMAR_DEFAULT_ROOT):
        if not isinstance(_grammar, str):
            raise TypeError(f"a grammar is GBNF text (str), not {type(_grammar).__name__}")
        if not _grammar.strip():
            raise ValueError("the grammar is empty")
        self._grammar = _grammar
        self._root = _root

    def __repr__(self) -> str:
        return f"LlamaGrammar(root={self._root!r}, {len(self._grammar)} characters of GBNF)"

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> "LlamaGrammar":
        return cls(_grammar=grammar)

    @classmethod
    def from_file(cls, file: Union[str, os.PathLike], verbose: bool = True) -> "LlamaGrammar":
        try:
            with open(file, encoding="utf-8") as f:
                grammar = f.read()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"from_file: error reading grammar file: {err}") from err
        if not grammar:
            raise ValueError("from_file: error parsing grammar file: params_grammer is empty")
        return cls.from_string(grammar, verbose=verbose)

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> "LlamaGrammar":
        return cls.from_string(json_schema_to_gbnf(json_schema), verbose=verbose)


def json_schema_to_gbnf(schema: str, prop_order: Optional[List[str]] = None) -> str:
    """The GBNF grammar of a JSON schema given as JSON text.

    ``prop_order`` lists property names to emit first, in that order (the rest keep the schema's
    order), as llama.cpp's converter's --prop-order does. A schema that is not valid JSON raises
    ValueError; one the converter cannot handle raises ferrollama.GrammarError.
    """
    if not isinstance(schema, str):
        raise TypeError(f"the schema is JSON text (str), not {type(schema).__name__}")
    if prop_order:
        schema = json.dumps(_reorder_properties(_parse_json(schema), {n: i for i, n in enumerate(prop_order)}))
    return _samplers.Grammar.json_schema_to_gbnf(schema)


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"the schema is not valid JSON: {e}") from e


def _reorder_properties(node: Any, rank: dict) -> Any:
    """The schema with every ``properties`` object sorted by ``rank`` (unranked names last, stable)."""
    if isinstance(node, list):
        return [_reorder_properties(item, rank) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _reorder_properties(value, rank) for key, value in node.items()}
    props = out.get("properties")
    if isinstance(props, dict):
        ordered = sorted(props.items(), key=lambda kv: rank.get(kv[0], len(rank)))  # sorted() is stable
        out["properties"] = dict(ordered)
    return out


# --- llama.cpp's example grammars (vendor/llama.cpp/grammars), as llama-cpp-python exports them ---

ARITHMETIC_GBNF = r"""
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"""

C_GBNF = r"""
root ::= (declaration)*

declaration ::= dataType identifier "(" parameter? ")" "{" statement* "}"

dataType  ::= "int" ws | "float" ws | "char" ws
identifier ::= [a-zA-Z_] [a-zA-Z_0-9]*

parameter ::= dataType identifier

statement ::=
    ( dataType identifier ws "=" ws expression ";" ) |
    ( identifier ws "=" ws expression ";" ) |
    ( identifier ws "(" argList? ")" ";" ) |
    ( "return" ws expression ";" ) |
    ( "while" "(" condition ")" "{" statement* "}" ) |
    ( "for" "(" forInit ";" ws condition ";" ws forUpdate ")" "{" statement* "}" ) |
    ( "if" "(" condition ")" "{" statement* "}" ("else" "{" statement* "}")? ) |
    ( singleLineComment ) |
    ( multiLineComment )

forInit ::= dataType identifier ws "=" ws expression | identifier ws "=" ws expression
forUpdate ::= identifier ws "=" ws expression

condition ::= expression relationOperator expression
relationOperator ::= ("<=" | "<" | "==" | "!=" | ">=" | ">")

expression ::= term (("+" | "-") term)*
term ::= factor(("*" | "/") factor)*

factor ::= identifier | number | unaryTerm | funcCall | parenExpression
unaryTerm ::= "-" factor
funcCall ::= identifier "(" argList? ")"
parenExpression ::= "(" ws expression ws ")"

argList ::= expression ("," ws expression)*

number ::= [0-9]+

singleLineComment ::= "//" [^\n]* "\n"
multiLineComment ::= "/*" ( [^*] | ("*" [^/]) )* "*/"

ws ::= ([ \t\n]+)
"""

CHESS_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]*)) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= ([ \t\n] ws)?
"""

JAPANESE_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]*)) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= ([ \t\n] ws)?
"""

JSON_ARR_GBNF = r"""
# This is the same as json.gbnf but we restrict whitespaces at the end of the root array
# Useful for generating JSON arrays

root   ::= arr
value  ::= object | array | string | number | ("true" | "false" | "null") ws

arr  ::=
  "[\n" ws (
            value
    (",\n" ws value)*
  )? "]"

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]*)) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= ([ \t\n] ws)?
"""

JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""

LIST_GBNF = r"""
root ::= item+

# Excludes various line break characters
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
"""
