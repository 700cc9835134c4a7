"""llama-index-llms-llama-cpp 0.7.0 on ferrollama (tests/integrations/llama_index_calls.py):
complete, stream_complete and chat as on llama-cpp-python 0.3.36."""
from integrations_expect import on_ferrollama


def test_llama_index_through_the_alias_gives_llama_cpps_answers():
    got, expected = on_ferrollama("llama_index")
    assert got == expected
