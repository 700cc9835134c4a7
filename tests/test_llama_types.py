"""ferrollama.llama_types: the same TypedDicts, keys and aliases as llama-cpp-python 0.3.36's."""
from __future__ import annotations

import json
from pathlib import Path

from ferrollama import llama_types as lt

RECORD = json.loads((Path(__file__).parent / "data" / "fixtures" / "chat_formats.json").read_text())["types"]


def test_the_same_names_are_exported():
    assert sorted(lt.__all__) == sorted([*RECORD["typeddicts"], *RECORD["aliases"], *RECORD["unions"]])


def test_every_typeddict_has_the_same_keys():
    got = {name: {"keys": list(getattr(lt, name).__annotations__),
                  "required": sorted(getattr(lt, name).__required_keys__)} for name in RECORD["typeddicts"]}
    assert got == RECORD["typeddicts"]


def test_aliases_name_the_same_types():
    assert {alias: getattr(lt, alias).__name__ for alias in RECORD["aliases"]} == RECORD["aliases"]
