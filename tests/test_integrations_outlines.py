"""outlines 1.3.3 on ferrollama (tests/integrations/outlines_calls.py): every mode gives what it gives
on llama-cpp-python 0.3.36 — plain text, a Literal choice, JSON by a pydantic model and a regex
(outlines_core, over llama_token_to_piece), a grammar (llguidance, over the C llama_tokenize)."""
from integrations_expect import on_ferrollama


def test_outlines_through_the_alias_gives_llama_cpps_answers():
    got, expected = on_ferrollama("outlines")
    assert got == expected
