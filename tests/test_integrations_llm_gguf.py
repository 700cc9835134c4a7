"""llm-gguf 0.2 on ferrollama (tests/integrations/llm_gguf_calls.py): models registered with its
commands, prompts (with a system prompt), a conversation and an embedding through llm's Python
API, and a prompt through llm's command, as on llama-cpp-python 0.3.36. The plugin samples at
temperature 0.2 with a random seed: each prompt ran three times on both, and the recorded runs
agree with each other (the answers do not depend on the seed), so ferrollama's must equal them."""
import json

import numpy as np

from integrations_expect import on_ferrollama


def test_llm_gguf_through_the_alias_gives_llama_cpps_answers():
    got, expected = on_ferrollama("llm_gguf")
    for key in ("capital", "system", "conversation"):
        assert len({json.dumps(run) for run in expected[key]}) == 1, f"the recorded {key} runs differ"
        assert got[key] == expected[key], key
    assert got["cli"] == expected["cli"] and got["embedding_shape"] == expected["embedding_shape"]
    # the embedding within the float tolerance of tests/data/REFERENCE.md's encoders (as LangChain's)
    np.testing.assert_allclose(got["embedding_head"], expected["embedding_head"], atol=1e-3, rtol=0)
