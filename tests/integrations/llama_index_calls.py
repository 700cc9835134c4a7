"""llama-index-llms-llama-cpp 0.7.0's LlamaCPP as its documentation shows (complete, chat): it
builds its llama_cpp.Llama from model_path, so on ferrollama it runs with the alias."""
from common import emit, setup

mode, model_path = setup()
if mode == "instance":
    raise SystemExit("llama-index builds its Llama from model_path: it runs on ferrollama with the alias")
from llama_index.core.llms import ChatMessage  # noqa: E402 - after the alias
from llama_index.llms.llama_cpp import LlamaCPP  # noqa: E402

llm = LlamaCPP(model_path=model_path, temperature=0.0, max_new_tokens=12, context_window=1024,
               generate_kwargs={}, model_kwargs={"n_gpu_layers": 0}, verbose=False)
emit({
    "complete": llm.complete("Question: What is the capital of France?\nAnswer:").text,
    "stream": "".join(r.delta for r in llm.stream_complete("Question: What is 2 + 2?\nAnswer:")),
    "chat": llm.chat([ChatMessage(role="user", content="Name a primary color.")]).message.content,
})
