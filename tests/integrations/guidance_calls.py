"""guidance 0.3.1 on a Llama as its documentation shows (guidance.models.LlamaCpp): gen, select
and json. guidance imports llama_cpp's C API itself: on ferrollama it runs with the alias only."""
from common import emit, llama_class, setup

mode, model_path = setup()
if mode == "instance":
    raise SystemExit("guidance imports llama_cpp's C API itself: it runs on ferrollama with the alias only")
import guidance  # noqa: E402 - after the alias
from guidance import gen, select  # noqa: E402
from pydantic import BaseModel  # noqa: E402


class City(BaseModel):
    name: str
    country: str


llm = llama_class(mode)(model_path, n_ctx=1024, verbose=False)
lm = guidance.models.LlamaCpp(llm, echo=False)
answer = lm + "Question: What is the capital of France?\nAnswer:" + gen("answer", max_tokens=12, stop="\n")
choice = lm + "Is the sky blue? Answer: " + select(["yes", "no"], name="choice")
city = lm + "Tokyo as JSON: " + guidance.json(name="city", schema=City, max_tokens=40)
emit({"gen": answer["answer"], "select": choice["choice"], "json": City.model_validate_json(city["city"]).model_dump()})
