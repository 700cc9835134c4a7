"""llm-gguf 0.2 (the GGUF plugin of Simon Willison's `llm`) as its README shows: register a GGUF
file with `llm gguf register-model` and `register-embed-model`, prompt it through llm's Python API,
continue a conversation, embed a text. The plugin builds its own llama_cpp.Llama (chat_format
"chatml-function-calling", no max_tokens, llama-cpp-python's default temperature 0.2 and a random
seed), so on ferrollama it runs with the alias. Each prompt runs three times (three seeds): the
prompts are ones whose answer at temperature 0.2 does not depend on the seed. llm's streamed path
is the one that works in llm-gguf 0.2 (its non-streamed path stops at a breakpoint())."""
import os
import tempfile

from common import emit, setup

mode, model_path = setup()
if mode == "instance":
    raise SystemExit("llm-gguf builds its Llama from a registered path: it runs on ferrollama with the alias")
os.environ["LLM_USER_PATH"] = tempfile.mkdtemp(prefix="llm-user-")
import llm  # noqa: E402 - after the alias and LLM_USER_PATH
from click.testing import CliRunner  # noqa: E402
from llm.cli import cli  # noqa: E402

runner = CliRunner()
for command in (["gguf", "register-model", "qwen", model_path], ["gguf", "register-embed-model", "qwen-embed", model_path]):
    result = runner.invoke(cli, command, catch_exceptions=False)
    assert result.exit_code == 0, result.output

model = llm.get_model("gguf/qwen")


def conversation() -> list[str]:
    talk = model.conversation()
    return [talk.prompt("My name is Ada. Reply with one word: hello.").text(), talk.prompt("What is my name? Answer with my name only.").text()]


vector = llm.get_embedding_model("gguf/qwen-embed").embed("Hello world")
rows = vector if vector and isinstance(vector[0], list) else [vector]
emit({
    "capital": [model.prompt("What is the capital of France? Answer with one word.").text() for _ in range(3)],
    "system": [model.prompt("Count from 1 to 5.", system="Answer with digits separated by spaces only.").text()
               for _ in range(3)],
    "conversation": [conversation() for _ in range(3)],
    "embedding_shape": [len(rows), len(rows[0])],
    "embedding_head": [round(x, 6) for x in rows[0][:8]] + [round(x, 6) for x in rows[-1][:8]],
    "cli": runner.invoke(cli, ["-m", "gguf/qwen", "What is 2 + 2? Answer with a number."], catch_exceptions=False).output,
})
