"""langchain-community 0.4.2's LlamaCpp, ChatLlamaCpp (text, a bound tool, structured output) and
LlamaCppEmbeddings as its documentation shows: each builds its llama_cpp.Llama from model_path,
so on ferrollama they run with the alias."""
from common import emit, setup

mode, model_path = setup()
if mode == "instance":
    raise SystemExit("LangChain builds its Llama from model_path: it runs on ferrollama with the alias")
from langchain_community.chat_models import ChatLlamaCpp  # noqa: E402 - after the alias
from langchain_community.embeddings import LlamaCppEmbeddings  # noqa: E402
from langchain_community.llms import LlamaCpp  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402


class GetWeather(BaseModel):
    """Get the current weather in a city."""
    city: str = Field(description="the city")


class Person(BaseModel):
    name: str
    age: int


llm = LlamaCpp(model_path=model_path, temperature=0.0, max_tokens=24, n_ctx=1024, verbose=False)
chat = ChatLlamaCpp(model_path=model_path, temperature=0.0, max_tokens=64, n_ctx=1024, verbose=False)
tool_call = chat.bind_tools([GetWeather], tool_choice={"type": "function", "function": {"name": "GetWeather"}}).invoke(
    "What is the weather like in Paris?").tool_calls[0]
person = chat.with_structured_output(Person).invoke("Extract the person: Jason is 25 years old.")
embeddings = LlamaCppEmbeddings(model_path=model_path, n_ctx=512, verbose=False)
emit({
    "llm": llm.invoke("Question: What is the capital of France?\nAnswer:"),
    "chat": chat.invoke([("system", "You answer in one short sentence."), ("human", "What is the largest ocean?")]).content,
    "tool_call": {"name": tool_call["name"], "args": tool_call["args"]},
    "structured": person.model_dump(),
    "embed_query": embeddings.embed_query("The cat sat on the mat."),
    "embed_documents_len": [len(v) for v in embeddings.embed_documents(["one", "two words"])],
})
