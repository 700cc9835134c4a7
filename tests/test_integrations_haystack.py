"""llama-cpp-haystack 3.0.2 on ferrollama (tests/integrations/haystack_calls.py): LlamaCppGenerator
and LlamaCppChatGenerator as on llama-cpp-python 0.3.36."""
from integrations_expect import on_ferrollama


def test_haystack_through_the_alias_gives_llama_cpps_answers():
    got, expected = on_ferrollama("haystack")
    assert got == expected
