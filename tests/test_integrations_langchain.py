"""langchain-community 0.4.2 on ferrollama (tests/integrations/langchain_calls.py): LlamaCpp,
ChatLlamaCpp (text, a bound tool, structured output) and LlamaCppEmbeddings as on llama-cpp-python
0.3.36 (the embedding within the float tolerance of tests/data/REFERENCE.md's encoders)."""
import numpy as np

from integrations_expect import on_ferrollama


def test_langchain_through_the_alias_gives_llama_cpps_answers():
    got, expected = on_ferrollama("langchain")
    embedding, expected_embedding = got.pop("embed_query"), expected.pop("embed_query")
    assert got == expected
    np.testing.assert_allclose(embedding, expected_embedding, atol=1e-3, rtol=0)
