"""autogen-ext 0.7.5's LlamaCppChatCompletionClient as its documentation shows (text, and a tool):
it builds its llama_cpp.Llama from model_path, so on ferrollama it runs with the alias. It reads
a tool call from the answer's content (where llama-cpp-python leaves it)."""
import asyncio

from common import emit, setup

mode, model_path = setup()
if mode == "instance":
    raise SystemExit("autogen builds its Llama from model_path: it runs on ferrollama with the alias")
from autogen_core.models import SystemMessage, UserMessage  # noqa: E402 - after the alias
from autogen_core.tools import FunctionTool  # noqa: E402
from autogen_ext.models.llama_cpp import LlamaCppChatCompletionClient  # noqa: E402


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"sunny in {city}"


async def main() -> dict:
    client = LlamaCppChatCompletionClient(model_path=model_path, n_ctx=2048, verbose=False)
    greedy = {"temperature": 0.0, "max_tokens": 48}
    text = await client.create([UserMessage(content="What is the capital of France?", source="user")],
                               extra_create_args=greedy)
    tool = FunctionTool(get_weather, description="Get the current weather in a city.")
    messages = [SystemMessage(content="You are a helpful assistant."),
                UserMessage(content="What is the weather in Paris?", source="user")]
    called = await client.create(messages, tools=[tool], extra_create_args=greedy)
    # OpenAI's shape, content null beside tool_calls (no effect on llama-cpp-python's Llama)
    client.llm.tool_calls_in_content = False
    openai_shaped = await client.create(messages, tools=[tool], extra_create_args=greedy)
    return {"text": text.content, "tool": called.content, "tool_finish": called.finish_reason,
            "tool_openai_shaped": openai_shaped.content}


emit(asyncio.run(main()))
