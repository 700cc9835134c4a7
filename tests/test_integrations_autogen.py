"""autogen-ext 0.7.5's LlamaCppChatCompletionClient on ferrollama (tests/integrations/autogen_calls.py).

What autogen reads of a chat answer: ``message.content``, and tool calls from ``choices[0]
["tool_calls"]`` (beside the message, where neither llama-cpp-python nor OpenAI put them), so a
tool call reaches it as the answer's text, where llama-cpp-python leaves it. ferrollama parses the
call into ``message.tool_calls`` and, by default (``Llama(tool_calls_in_content=True)``), leaves the
text in ``content`` too: autogen gets llama-cpp-python's content. With OpenAI's shape (content
null) autogen gets nothing."""
from integrations_expect import on_ferrollama


def test_autogen_through_the_alias_gets_the_tool_call_where_llama_cpp_leaves_it():
    got, expected = on_ferrollama("autogen")
    assert got["text"] == expected["text"]
    assert got["tool"] == expected["tool"] == '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    # llama-cpp-python says "stop"; ferrollama's "tool_calls" is one autogen does not list: "unknown"
    assert (expected["tool_finish"], got["tool_finish"]) == ("stop", "unknown")
    assert (expected["tool_openai_shaped"], got["tool_openai_shaped"]) == (expected["tool"], "")
