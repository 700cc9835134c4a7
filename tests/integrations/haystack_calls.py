"""llama-cpp-haystack 3.0.2's LlamaCppChatGenerator as its documentation shows: it builds its
llama_cpp.Llama from the model path, so on ferrollama it runs with the alias."""
from common import emit, setup

mode, model_path = setup()
if mode == "instance":
    raise SystemExit("llama-cpp-haystack builds its Llama from the model path: it runs on ferrollama with the alias")
from haystack.dataclasses import ChatMessage  # noqa: E402 - after the alias
from haystack_integrations.components.generators.llama_cpp import LlamaCppChatGenerator  # noqa: E402

chat = LlamaCppChatGenerator(model=model_path, n_ctx=1024, n_batch=128,
                             model_kwargs={"verbose": False}, generation_kwargs={"max_tokens": 32, "temperature": 0.0})
chat.warm_up()
messages = [ChatMessage.from_system("Answer in one short sentence."),
            ChatMessage.from_user("What is the largest planet of the solar system?")]
emit({
    "chat": chat.run([ChatMessage.from_user("What is the capital of France?")])["replies"][0].text,
    "chat_with_system": chat.run(messages)["replies"][0].text,
})
