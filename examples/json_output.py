"""JSON output constrained by a JSON schema (the engine turns the schema into a grammar).

    python examples/json_output.py [-m MODEL]
"""
import argparse
import json

from ferrollama.llama import Llama

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "year": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "year", "languages"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", default=None, help="a GGUF model (default: Qwen2.5-Coder-0.5B-Instruct)")
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    args = ap.parse_args()

    llm = Llama(args.model, n_ctx=1024)
    messages = [{"role": "user", "content": "Describe the Rust programming language as JSON: its name, "
                                            "the year it appeared and up to three languages that influenced it."}]
    out = llm.create_chat_completion(messages, temperature=0.0, max_tokens=args.max_tokens,
                                     response_format={"type": "json_object", "schema": SCHEMA})
    text = out["choices"][0]["message"]["content"]
    data = json.loads(text)
    print(json.dumps(data, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
