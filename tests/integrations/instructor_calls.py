"""instructor 1.17.0 on a Llama as its documentation for llama-cpp-python shows: a client patched
over ``create_chat_completion_openai_v1`` in JSON_SCHEMA mode. instructor never imports llama_cpp:
a ferrollama.Llama is handed over as it is (instance), or built through the alias."""
from common import emit, llama_class, setup

mode, model_path = setup()
import instructor  # noqa: E402 - after the alias
from pydantic import BaseModel  # noqa: E402


class UserDetail(BaseModel):
    name: str
    age: int


if mode == "alias":
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model_path, n_ctx=1024, verbose=False)
else:
    llm = llama_class(mode)(model_path=model_path, n_ctx=1024, verbose=False)
create = instructor.patch(create=llm.create_chat_completion_openai_v1, mode=instructor.Mode.JSON_SCHEMA)
try:
    user = create(messages=[{"role": "user", "content": "Extract: Jason is 25 years old."}], response_model=UserDetail,
                  temperature=0.0, max_tokens=64, max_retries=1)
    emit({"extract": user.model_dump()})
except instructor.core.InstructorRetryException as e:
    # llama-cpp-python 0.3.36 takes response_format {"type": "json_schema"} (what JSON_SCHEMA mode
    # sends, as OpenAI's API) for no constraint: the answer is not JSON
    emit({"error": type(e).__name__, "completion": e.last_completion.choices[0].message.content})
