"""guidance 0.3.1 on ferrollama (tests/integrations/guidance_calls.py): gen, select and json drive the
engine through llama_cpp's C API (batches, llama_decode, logits, memory; llguidance's tokenizer over
the C llama_tokenize) and give what they give on llama-cpp-python 0.3.36."""
from integrations_expect import on_ferrollama


def test_guidance_through_the_alias_gives_llama_cpps_answers():
    got, expected = on_ferrollama("guidance")
    assert got == expected
