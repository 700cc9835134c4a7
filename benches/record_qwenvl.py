#!/usr/bin/env python3
"""Records llama.cpp's logits on the M-RoPE scenarios of the tiny Qwen-VL text models
(tests/data/scenarios/mrope-*.json, written with their models by tests/data/make_tiny_qwenvl.py):
batches of embedding rows (stand-ins for an image's, DeepStack-wide for qwen3vl/qwen3vlmoe) at
mtmd's 2-D M-RoPE positions, given to llama_decode as llama.cpp's batches of embeddings carry
them (llama_batch_init(n, n_embd_inp, ...) with 4 * n positions, section by section), text
tokens around them, and a sequence's state saved and restored in the middle of an image.
`expected` with an F32 KV cache, `expected_kv_f16` with F16, through benches/recorder.py
(flash attention off, 2 threads). The text-only scenarios of the same models (arch-qwen*vl*)
are recorded by benches/record_archs.py.

`--chat` records llama-cpp-python's Qwen25VLChatHandler instead, on the tiny qwen2vl model with
the tiny qwen2.5vl_merger projector (tests/data/make_tiny_vision_qwen.py), into
tests/data/scenarios/chat-qwen25vl.json: the text its CHAT_FORMAT renders for a user message of
text and an image (the image's URL as the media marker), and the first token of a greedy chat
completion with its log-probability and the prompt's positions (usage.prompt_tokens).

Run it with the benchmark venv:

  /path/to/bench-venv/bin/python benches/record_qwenvl.py [NAME ...]
  /path/to/bench-venv/bin/python benches/record_qwenvl.py --chat
"""
from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recorder  # noqa: E402

DATA = recorder.DATA
CHAT = {"model": "tiny-qwen2vl-f32.gguf", "mmproj": "tiny-mmproj-qwen2.5vl-f16.gguf", "image": "images/wide-300x170.png",
        "question": "What is in this picture?", "context": {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_threads": 2}}


def chat_messages(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": CHAT["question"]},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def record_chat() -> None:
    import llama_cpp
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from llama_cpp.llama_chat_format import Qwen25VLChatHandler

    url = "data:image/png;base64," + base64.b64encode((DATA / CHAT["image"]).read_bytes()).decode()
    handler = Qwen25VLChatHandler(clip_model_path=str(DATA / "models" / CHAT["mmproj"]), verbose=False)
    # the handler's text, rendered as its __call__ renders it (the default system message first)
    messages = [{"role": "system", "content": handler.DEFAULT_SYSTEM_MESSAGE}] + chat_messages(url)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string(handler.CHAT_FORMAT).render(messages=messages, add_generation_prompt=True)
    llm = llama_cpp.Llama(str(DATA / "models" / CHAT["model"]), chat_handler=handler, logits_all=True, verbose=False,
                          **CHAT["context"])
    r = llm.create_chat_completion(messages=chat_messages(url), max_tokens=1, temperature=0, logprobs=True, top_logprobs=1)
    first = r["choices"][0]["logprobs"]["content"][0]
    out = {**CHAT, "expected_text": text.replace(url, "<__media__>"), "expected_token": first["token"],
           "expected_logprob": float(first["logprob"]), "expected_prompt_tokens": r["usage"]["prompt_tokens"],
           "recorded_with": f"llama-cpp-python {llama_cpp.__version__} (llama.cpp vendored), CPU, its Llama's defaults "
                            "(F16 KV cache), logits_all"}
    (DATA / "scenarios" / "chat-qwen25vl.json").write_text(json.dumps(out, indent=1))
    print("recorded chat-qwen25vl.json", out["expected_token"], out["expected_logprob"], out["expected_prompt_tokens"])


def main(args: list[str]) -> None:
    if "--chat" in args:
        record_chat()
    else:
        recorder.update_scenarios(("mrope-*.json",), args)


if __name__ == "__main__":
    main(sys.argv[1:])
