"""A streaming chat: the model's own chat template, the answer printed as it is generated.

    python examples/streaming_chat.py [-m MODEL] [MESSAGE ...]

Each MESSAGE is one user turn; the conversation (and the KV cache) carries over between turns.
"""
import argparse
import sys

from ferrollama.llama import Llama


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", default=None, help="a GGUF model (default: Qwen2.5-Coder-0.5B-Instruct)")
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("messages", nargs="*", default=["Write a haiku about Rust.", "Now one about Python."])
    args = ap.parse_args()

    llm = Llama(args.model, n_ctx=2048)
    history = [{"role": "system", "content": "You are a helpful assistant."}]
    for message in args.messages:
        history.append({"role": "user", "content": message})
        print(f"> {message}")
        answer = []
        for chunk in llm.create_chat_completion(history, stream=True, temperature=0.0, max_tokens=args.max_tokens):
            delta = chunk["choices"][0]["delta"]
            if "content" in delta:
                answer.append(delta["content"])
                sys.stdout.write(delta["content"])
                sys.stdout.flush()
        print()
        history.append({"role": "assistant", "content": "".join(answer)})


if __name__ == "__main__":
    main()
