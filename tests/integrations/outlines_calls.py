"""outlines 1.3.3 on a Llama as its documentation shows (outlines.from_llamacpp): plain text, a
choice (Literal), JSON through a pydantic model, a regex, a grammar (CFG, through llguidance)."""
from typing import Literal

from common import emit, llama_class, setup

mode, model_path = setup()
import outlines  # noqa: E402 - after the alias
from outlines.types import CFG, Regex  # noqa: E402
from pydantic import BaseModel  # noqa: E402

if mode == "instance":
    raise SystemExit("outlines imports llama_cpp's C API itself: it runs on ferrollama with the alias only")


class City(BaseModel):
    name: str
    country: str
    population: int


llm = llama_class(mode)(model_path, n_ctx=1024, verbose=False)
model = outlines.from_llamacpp(llm)
greedy = dict(temperature=0.0, max_tokens=60)
COLOR = """
start: "The sky is " COLOR "."
COLOR: "red" | "green" | "blue"
"""
emit({
    "text": model("What is the capital of France?", **greedy),
    "choice": model("Is Paris the capital of France? Answer yes or no.", Literal["yes", "no"], **greedy),
    "json": City.model_validate_json(model("Describe Tokyo as JSON.", City, **greedy)).model_dump(),
    "regex": model("What is 12 times 12?", Regex(r"[0-9]{1,4}"), **greedy),
    "cfg": model("What color is the sky on a clear day?", CFG(COLOR), **greedy),
})
