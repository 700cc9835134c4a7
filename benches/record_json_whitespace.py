"""Records what llama.cpp generates on Gemma 3 270M under the JSON-schema grammar ferrollama makes
(whose ``space`` rule is llama.cpp's SPACE_RULE): the whitespace after the closing brace.

    /path/to/bench-venv/bin/python benches/record_json_whitespace.py GBNF_FILE MODEL > tests/data/fixtures/json_whitespace_gemma-3-270m.json
"""
import json
import sys

import llama_cpp

gbnf_path, model_path = sys.argv[1], sys.argv[2]
gbnf = open(gbnf_path).read()
prompt = "A JSON object describing a cat:"
llm = llama_cpp.Llama(model_path, n_ctx=512, n_threads=1, verbose=False)
grammar = llama_cpp.LlamaGrammar.from_string(gbnf, verbose=False)
r = llm(prompt, grammar=grammar, temperature=0, max_tokens=80)
json.dump({"recorded_with": "llama-cpp-python 0.3.36 (llama.cpp 0c1e570), greedy, n_ctx 512",
           "model": "gemma-3-270m-q4_k_m.gguf",
           "schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
           "gbnf": gbnf, "prompt": prompt, "max_tokens": 80,
           "text": r["choices"][0]["text"], "finish_reason": r["choices"][0]["finish_reason"]}, sys.stdout, indent=1)
print()
