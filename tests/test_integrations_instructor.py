"""instructor 1.17.0 on ferrollama (tests/integrations/instructor_calls.py): the extraction of its
llama-cpp-python documentation (JSON_SCHEMA mode over create_chat_completion_openai_v1), with a
ferrollama.Llama handed over and through the alias. instructor sends OpenAI's response_format
{"type": "json_schema"}: llama-cpp-python 0.3.36 takes it for no constraint (its answer is not
the schema's: the record), ferrollama constrains the answer to the schema."""
import pytest

from integrations_expect import on_ferrollama


@pytest.mark.parametrize("mode", ["instance", "alias"])
def test_instructor_extracts_the_schemas_object(mode):
    got, expected = on_ferrollama("instructor", mode)
    assert expected["error"] == "InstructorRetryException"
    assert got == {"extract": {"name": "Jason", "age": 25}}
