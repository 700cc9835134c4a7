"""A text completion with the high-level API (like llama-cpp-python's Llama.__call__).

    python examples/completion.py [-m MODEL] [-p PROMPT] [-n TOKENS]
"""
import argparse

from ferrollama.llama import Llama


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", default=None, help="a GGUF model (default: Qwen2.5-Coder-0.5B-Instruct)")
    ap.add_argument("-p", "--prompt", default="The capital of France is")
    ap.add_argument("-n", "--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    args = ap.parse_args()

    llm = Llama(args.model, n_ctx=512)
    out = llm(args.prompt, max_tokens=args.max_tokens, temperature=args.temperature, seed=42)
    choice = out["choices"][0]
    print(args.prompt + choice["text"])
    print(f"[{out['usage']['completion_tokens']} tokens, finish_reason={choice['finish_reason']}]")


if __name__ == "__main__":
    main()
