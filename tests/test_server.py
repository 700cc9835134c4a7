"""`ferrollama serve` driven over HTTP: the official openai client for what works, raw httpx for
bad input, hang-ups, the full queue and the API key. One server (Qwen2.5-Coder 0.5B instruct,
4 slots) for the module; a second one with one slot and no queue for the 503."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import jsonschema
import numpy as np
import openai
import pytest

from conftest import REAL_MODELS, load_model, model_path
from serving import start_server, wait_idle

KEY = "test-key"
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def served():
    server, scheduler = start_server(load_model(REAL_MODELS["qwen2"]), api_key=KEY)
    yield server, scheduler
    server.stop()
    scheduler.close()


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served[0].url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        yield c


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# --- what works, through the openai client -----------------------------------------------------

def test_greedy_completion_equals_ferrollama_generate(client):
    prompt = "def is_prime(n):\n"
    cli = subprocess.run([sys.executable, "-m", "ferrollama.cli", "generate", "-m", str(model_path(REAL_MODELS["qwen2"])),
                          "-p", prompt.replace("\n", "\\n"), "-n", "32", "--temp", "0", "--no-display-prompt", "-t", "2"],
                         capture_output=True, text=True, encoding="utf-8")
    assert cli.returncode == 0, cli.stderr
    r = client.completions.create(model="qwen", prompt=prompt, max_tokens=32, temperature=0,
                                  extra_body={"cache_prompt": False})
    assert r.choices[0].text + "\n" == cli.stdout
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, 32)


def test_stop_strings_and_seeds(client):
    prompt, fresh = "def is_prime(n):\n", {"cache_prompt": False}
    whole = client.completions.create(model="qwen", prompt=prompt, max_tokens=32, temperature=0, extra_body=fresh)
    text = whole.choices[0].text
    cut = client.completions.create(model="qwen", prompt=prompt, max_tokens=32, temperature=0, stop=["return", "zzz"],
                                    extra_body=fresh)
    assert "return" in text and cut.choices[0].text == text[:text.index("return")]
    assert cut.choices[0].finish_reason == "stop"
    seeded = [client.completions.create(model="qwen", prompt=prompt, max_tokens=12, temperature=1.0, seed=42,
                                        extra_body=fresh).choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_chat_plain_and_streamed_agree_and_reuse_the_prompt(client):
    plain = client.chat.completions.create(model="qwen", messages=user("Name a colour."), max_tokens=12, temperature=0)
    assert plain.object == "chat.completion" and plain.choices[0].message.role == "assistant"
    assert plain.choices[0].finish_reason in ("stop", "length") and plain.choices[0].message.content
    stream = client.chat.completions.create(model="qwen", messages=user("Name a colour."), max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == plain.choices[0].message.content
    assert finishes == [plain.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == plain.usage.completion_tokens
    # the second time, every prompt token but the last comes from the slot's cache
    assert usage.prompt_tokens == plain.usage.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1


def test_completion_logprobs_and_n(client):
    r = client.completions.create(model="qwen", prompt="The capital of France is", max_tokens=4, temperature=0,
                                  logprobs=3, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        lp = c.logprobs
        assert "".join(lp.tokens) == c.text and len(lp.tokens) == 4
        assert all(len(top) == 3 for top in lp.top_logprobs)
        # greedy: each chosen token is the most likely one
        assert [max(top, key=top.get) for top in lp.top_logprobs] == lp.tokens
        assert lp.token_logprobs == [top[t] for top, t in zip(lp.top_logprobs, lp.tokens)]
        assert lp.text_offset == list(np.cumsum([0] + [len(t) for t in lp.tokens[:-1]]))
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens == 5


def test_chat_logprobs_and_several_choices(client):
    r = client.chat.completions.create(model="qwen", messages=user("Say hello."), max_tokens=3, temperature=0.7,
                                       seed=5, n=3, logprobs=True, top_logprobs=2)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        content = c.logprobs.content
        assert "".join(e.token for e in content) == c.message.content and len(content) == 3
        assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob for e in content)
        assert all(bytes(e.bytes).decode() == e.token for e in content)
    assert r.usage.completion_tokens == 9


def test_json_schema_is_enforced(client):
    r = client.chat.completions.create(
        model="qwen", messages=user("Invent a person."), max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    r = client.chat.completions.create(model="qwen", messages=user("Reply with JSON."), max_tokens=40, temperature=0,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_tool_calls_auto_and_required(client):
    auto = client.chat.completions.create(model="qwen", messages=user("What is the weather in Paris?"), tools=WEATHER,
                                          max_tokens=48, temperature=0)
    call = auto.choices[0].message.tool_calls[0]
    assert auto.choices[0].finish_reason == "tool_calls" and auto.choices[0].message.content is None
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == ("function", "get_weather", {"city": "Paris"})
    forced = client.chat.completions.create(model="qwen", messages=user("Hello!"), tools=WEATHER, tool_choice="required",
                                            max_tokens=48, temperature=0, parallel_tool_calls=False)
    calls = forced.choices[0].message.tool_calls
    assert forced.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "get_weather" and set(json.loads(calls[0].function.arguments)) == {"city"}


def test_tool_call_streamed_and_answered(client):
    chunks = list(client.chat.completions.create(model="qwen", messages=user("What is the weather in Paris?"),
                                                 tools=WEATHER, max_tokens=48, temperature=0, stream=True))
    deltas = [c.choices[0].delta for c in chunks]
    calls = [t for d in deltas for t in (d.tool_calls or [])]
    assert [c.choices[0].finish_reason for c in chunks][-1] == "tool_calls"
    assert "".join(d.content or "" for d in deltas) == ""
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == [(0, "get_weather", {"city": "Paris"})]
    # the call and its result go back through the template
    history = user("What is the weather in Paris?") + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": calls[0].id, "type": "function",
                                                             "function": {"name": "get_weather", "arguments": calls[0].function.arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "22 degrees and sunny"}]
    answer = client.chat.completions.create(model="qwen", messages=history, tools=WEATHER, max_tokens=2, temperature=0)
    from ferrollama.chat import ChatTemplate

    model = load_model(REAL_MODELS["qwen2"])
    history[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}  # templates write the object
    expected = ChatTemplate.from_model(model).tokens(model, history, tools=WEATHER)
    assert b'<tool_response>\n22 degrees and sunny\n</tool_response>' in model.detokenize(expected).encode()
    assert answer.usage.prompt_tokens == len(expected)


def test_embeddings_are_normalized_and_match_llama(client):
    r = client.embeddings.create(model="qwen", input=["hello world", "goodbye"])
    vectors = [np.asarray(d.embedding) for d in r.data]
    assert [d.index for d in r.data] == [0, 1] and all(v.shape == (896,) for v in vectors)
    np.testing.assert_allclose([np.linalg.norm(v) for v in vectors], [1.0, 1.0], rtol=1e-5)
    from ferrollama import Llama

    llm = Llama(str(model_path(REAL_MODELS["qwen2"])), embedding=True, pooling_type=1, n_ctx=512, n_threads=2)
    expected = llm.embed(["hello world", "goodbye"], normalize=True)
    np.testing.assert_allclose(vectors, expected, rtol=1e-5, atol=1e-6)
    assert r.usage.prompt_tokens == len(llm.tokenize(b"hello world")) + len(llm.tokenize(b"goodbye"))


def test_models_tokenize_detokenize_health_metrics(client, http):
    assert [m.id for m in client.models.list().data] == ["qwen"]
    tokens = http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert tokens == [9707, 1879]
    pieces = http.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert pieces == [{"id": 9707, "piece": "Hello"}, {"id": 1879, "piece": " world"}]
    assert http.post("/detokenize", json={"tokens": tokens}).json() == {"content": "Hello world"}
    assert httpx.get(http.base_url.join("/health")).json()["status"] == "ok"   # no key needed
    text = http.get("/metrics").text
    assert 'ferrollama_requests_total{path="/v1/chat/completions",status="200"}' in text
    assert "ferrollama_slots_total 4.0" in text and "ferrollama_slots_busy 0.0" in text
    assert "ferrollama_tokens_predicted_total" in text and "ferrollama_predicted_tokens_seconds" in text


# --- what the SDKs and agents send ---------------------------------------------------------------

NO_EFFECT = {"store": True, "metadata": {"run": "7"}, "service_tier": "auto", "user": "u1", "prompt_cache_key": "k",
             "prompt_cache_retention": "24h", "safety_identifier": "s1", "verbosity": "low", "modalities": ["text"],
             "prediction": {"type": "content", "content": "Red."}}


def test_fields_with_no_effect_leave_the_answer_as_it_was(client):
    plain = client.chat.completions.create(model="qwen", messages=user("Name a colour."), max_tokens=8, temperature=0)
    same = client.chat.completions.create(model="qwen", messages=user("Name a colour."), max_tokens=8, temperature=0,
                                          **NO_EFFECT)
    chunks = list(client.chat.completions.create(
        model="qwen", messages=user("Name a colour."), max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False}, **NO_EFFECT))
    assert same.choices[0].message.content == plain.choices[0].message.content
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    assert same.usage.prompt_tokens == chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens


def test_reasoning_effort_goes_to_the_template(qwen_model):
    from types import SimpleNamespace

    from ferrollama.chat import ChatTemplate
    from ferrollama.server.app import Engine, plan_chat
    from ferrollama.server.schemas import ChatRequest

    source = "{{ messages[0].content }}|{{ reasoning_effort | default('-') }}|{{ enable_thinking | default('-') }}"
    engine = Engine(SimpleNamespace(model=qwen_model), "qwen", _template=ChatTemplate(source))

    def prompt(**fields) -> str:
        return qwen_model.detokenize(plan_chat(engine, ChatRequest(messages=user("hi"), **fields)).tokens)

    assert [prompt(), prompt(reasoning_effort="high"), prompt(reasoning_effort="none")] == [
        "hi|-|-", "hi|high|-", "hi|-|False"]


def test_assistant_messages_come_back_as_the_client_returned_them(client):
    question = user("What is the weather in Paris?")
    call = client.chat.completions.create(model="qwen", messages=question, tools=WEATHER, max_tokens=48,
                                          temperature=0).choices[0].message
    echoed = call.model_dump()
    assert (echoed["refusal"], echoed["audio"], echoed["annotations"], echoed["function_call"]) == (None,) * 4
    result = {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "22 degrees"}
    plain = {"role": "assistant", "content": None, "tool_calls": [c.model_dump(exclude_none=True) for c in call.tool_calls]}
    prompts = [client.chat.completions.create(model="qwen", messages=question + [m, result], tools=WEATHER, max_tokens=1,
                                              temperature=0).usage.prompt_tokens for m in (echoed, plain)]
    assert prompts[0] == prompts[1]
    refused = [{"role": "assistant", "content": None, "refusal": "I cannot."}, {"role": "assistant", "content": "I cannot."}]
    prompts = [client.chat.completions.create(model="qwen", messages=question + [m] + user("Why?"), max_tokens=1,
                                              temperature=0).usage.prompt_tokens for m in refused]
    assert prompts[0] == prompts[1]


def test_the_older_functions_api_maps_to_tools(client):
    question = user("What is the weather in Paris?")
    r = client.chat.completions.create(model="qwen", messages=question, functions=[WEATHER[0]["function"]],
                                       function_call={"name": "get_weather"}, max_tokens=48, temperature=0)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and len(message.tool_calls) == 1
    assert (message.function_call.name, json.loads(message.function_call.arguments)) == ("get_weather", {"city": "Paris"})
    chunks = list(client.chat.completions.create(model="qwen", messages=question, functions=[WEATHER[0]["function"]],
                                                 function_call={"name": "get_weather"}, max_tokens=48, temperature=0,
                                                 stream=True))
    streamed = [c.choices[0].delta.function_call for c in chunks if c.choices[0].delta.function_call]
    assert [(f.name, f.arguments) for f in streamed] == [("get_weather", message.function_call.arguments)]
    # the call and its result in the older roles make the prompt the tools' roles make
    older = [{"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
             {"role": "function", "name": "get_weather", "content": "22 degrees"}]
    newer = [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]}, {"role": "tool", "tool_call_id": "call_0", "content": "22 degrees"}]
    prompts = [client.chat.completions.create(model="qwen", messages=question + older, functions=[WEATHER[0]["function"]],
                                              max_tokens=1, temperature=0).usage.prompt_tokens,
               client.chat.completions.create(model="qwen", messages=question + newer, tools=WEATHER, max_tokens=1,
                                              temperature=0).usage.prompt_tokens]
    assert prompts[0] == prompts[1]


def test_max_tokens_beyond_the_slot_ends_with_length_when_it_is_full(client, served):
    n_ctx_slot = served[1].n_ctx_slot
    r = client.chat.completions.create(model="qwen", messages=user("hi " * 980), max_tokens=4 * n_ctx_slot, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert n_ctx_slot == 1024 and (r.usage.prompt_tokens, r.usage.completion_tokens) == (1010, 14)


def test_a_tool_call_cut_by_max_tokens_ends_with_length(client):
    # the answer is a call in 28 tokens, then the end of the turn: max_tokens 28 cuts it there
    ask = dict(model="qwen", messages=user("What is the weather in Paris and in London? Call the tool for each city."),
               tools=WEATHER, max_tokens=28, temperature=0)
    r = client.chat.completions.create(**ask)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.tool_calls[0].function.name == "get_weather"
    chunks = list(client.chat.completions.create(**ask, stream=True))
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    assert client.chat.completions.create(**{**ask, "max_tokens": 29}).choices[0].finish_reason == "tool_calls"


def test_a_prediction_is_drafted_from_on_a_drafting_server():
    from ferrollama import PromptLookupDecoding

    server, scheduler = start_server(load_model(REAL_MODELS["qwen2"]), n_seq=1, n_ctx=512,
                                     drafter=PromptLookupDecoding(max_ngram_size=2, num_pred_tokens=8))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        ask = dict(model="qwen", messages=user("Write a Python function that adds two numbers."), max_tokens=40,
                   temperature=0)
        before = scheduler.stats.accepted_tokens
        plain = client.chat.completions.create(**ask)
        accepted_plain, before = scheduler.stats.accepted_tokens - before, scheduler.stats.accepted_tokens
        text = plain.choices[0].message.content
        predicted = client.chat.completions.create(**ask, prediction={"type": "content", "content": text})
        assert predicted.choices[0].message.content == text
        assert predicted.usage.completion_tokens == plain.usage.completion_tokens
        assert scheduler.stats.accepted_tokens - before > accepted_plain
    finally:
        server.stop()
        scheduler.close()


# --- the Responses API (/v1/responses) over the chat endpoint's machinery -------------------------

WEATHER_TOOL = [{"type": "function", **WEATHER[0]["function"]}]  # the Responses shape: name etc. at the top


def test_responses_text_streamed_and_equal_to_chat(client):
    ask = dict(model="qwen", instructions="Answer briefly.", input="Name a colour.", max_output_tokens=12, temperature=0)
    r = client.responses.create(**ask, metadata={"run": "1"})
    chat = client.chat.completions.create(model="qwen", max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}])
    assert r.output_text == chat.choices[0].message.content and r.metadata == {"run": "1"}
    cut = chat.choices[0].finish_reason == "length"
    assert (r.status, r.incomplete_details and r.incomplete_details.reason) == (
        ("incomplete", "max_output_tokens") if cut else ("completed", None))
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert [o.type for o in r.output] == ["message"] and r.output[0].content[0].type == "output_text"
    events = list(client.responses.create(**ask, stream=True))
    kinds = [e.type for e in events]
    n = kinds.count("response.output_text.delta")
    assert n >= 1 and kinds == ["response.created", "response.in_progress", "response.output_item.added",
                                "response.content_part.added"] + ["response.output_text.delta"] * n + [
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.incomplete" if cut else "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    last = events[-1].response
    assert last.output_text == r.output_text and last.usage.output_tokens == r.usage.output_tokens


def test_responses_tool_round_trip_with_previous_response_id(client):
    question = "What is the weather in Paris?"
    first = client.responses.create(model="qwen", input=question, tools=WEATHER_TOOL, max_output_tokens=48, temperature=0)
    chat = client.chat.completions.create(model="qwen", messages=user(question), tools=WEATHER, max_tokens=48,
                                          temperature=0).choices[0].message
    (call,) = first.output
    assert (call.type, call.name, json.loads(call.arguments), first.status) == (
        "function_call", "get_weather", {"city": "Paris"}, "completed")
    assert (call.name, call.arguments) == (chat.tool_calls[0].function.name, chat.tool_calls[0].function.arguments)
    streamed = list(client.responses.create(model="qwen", input=question, tools=WEATHER_TOOL, max_output_tokens=48,
                                            temperature=0, stream=True))
    assert [e.type for e in streamed] == ["response.created", "response.in_progress", "response.output_item.added",
                                          "response.function_call_arguments.delta",
                                          "response.function_call_arguments.done", "response.output_item.done",
                                          "response.completed"]
    assert streamed[4].arguments == call.arguments and streamed[-1].response.output[0].name == "get_weather"
    # the result of the call, after the stored conversation: the answer chat gives the same history
    second = client.responses.create(model="qwen", previous_response_id=first.id, tools=WEATHER_TOOL, max_output_tokens=8,
                                     temperature=0, input=[{"type": "function_call_output", "call_id": call.call_id,
                                                            "output": "22 degrees and sunny"}])
    history = user(question) + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "22 degrees and sunny"}]
    answer = client.chat.completions.create(model="qwen", messages=history, tools=WEATHER, max_tokens=8, temperature=0)
    assert second.usage.input_tokens == answer.usage.prompt_tokens
    assert second.output_text == (answer.choices[0].message.content or "")
    # the same conversation sent whole, as items (the call as the first response gave it back)
    whole = client.responses.create(model="qwen", tools=WEATHER_TOOL, max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": question}]}, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "22 degrees and sunny"}])
    assert whole.output_text == second.output_text and whole.usage.input_tokens == second.usage.input_tokens


def test_responses_json_schema(client):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    r = client.responses.create(model="qwen", input="Describe a person as JSON.", text={"format": fmt},
                                max_output_tokens=64, temperature=0)
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), PERSON)
    with client.responses.stream(model="qwen", input="Describe a person as JSON.", text={"format": fmt},
                                 max_output_tokens=64, temperature=0) as stream:
        assert stream.get_final_response().output_text == r.output_text


def test_responses_stored_retrieved_and_deleted(client, http):
    kept = client.responses.create(model="qwen", input="Hi", max_output_tokens=1, temperature=0)
    assert client.responses.retrieve(kept.id).output_text == kept.output_text
    assert client.responses.delete(kept.id) is None
    unkept = client.responses.create(model="qwen", input="Hi", max_output_tokens=1, temperature=0, store=False)
    for gone in (kept.id, unkept.id):
        assert http.get(f"/v1/responses/{gone}").status_code == 404
        r = http.post("/v1/responses", json={"input": "Hi", "previous_response_id": gone})
        assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError, match="resp_nope"):
        client.responses.create(model="qwen", input="Hi", previous_response_id="resp_nope")


def test_responses_input_items_listed_as_openai_pages_them(client, http):
    items = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]}]
    r = client.responses.create(model="qwen", input=items, max_output_tokens=1, temperature=0)
    listed = client.responses.input_items.list(r.id)  # newest first, as OpenAI's
    assert [(i.role, i.content[0].text) for i in listed.data] == [
        ("user", "Name a colour."), ("assistant", "Hello!"), ("user", "Hi")]
    assert all(i.type == "message" and i.id.startswith("msg_") for i in listed.data)
    asc = client.responses.input_items.list(r.id, order="asc", limit=2)
    assert [i.content[0].text for i in asc.data] == ["Hi", "Hello!"] and asc.has_more
    rest = client.responses.input_items.list(r.id, order="asc", after=asc.last_id)
    assert [i.content[0].text for i in rest.data] == ["Name a colour."] and not rest.has_more
    assert [i.id for i in client.responses.input_items.list(r.id, order="asc")] == [i.id for i in [*asc.data, *rest.data]]
    one = client.responses.create(model="qwen", input="Hi", max_output_tokens=1, temperature=0)
    (only,) = client.responses.input_items.list(one.id).data
    assert (only.role, only.content[0].type, only.content[0].text) == ("user", "input_text", "Hi")
    for query, code in (("limit=0", "invalid_value"), ("order=up", "invalid_value"), ("after=msg_x", "invalid_value"),
                        ("include=x", "unsupported_parameter"), ("page=2", "unknown_parameter")):
        bad = http.get(f"/v1/responses/{r.id}/input_items?{query}")
        assert bad.status_code == 400 and bad.json()["error"]["code"] == code, query
    assert http.get("/v1/responses/resp_nope/input_items").status_code == 404


def test_responses_reasoning_items_sent_back_are_the_turns_reasoning(client):
    """An answer's output sent back whole (reasoning item, message) gives the assistant turn its
    reasoning; this model's template does not show past reasoning, so the prompt is the same."""
    from ferrollama.server.responses import input_messages
    from ferrollama.server.schemas import ResponsesRequest

    items = [{"role": "user", "content": "Hi"},
             {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Greet back."}],
              "content": [{"type": "reasoning_text", "text": "The user greets; greet back."}]},
             {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
              "content": [{"type": "output_text", "text": "Hello!", "annotations": []}]},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Call it."}]},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
    messages = input_messages(ResponsesRequest.model_validate({"input": items}).input)
    assert [(m.role, m.reasoning_content) for m in messages] == [
        ("user", None), ("assistant", "The user greets; greet back."), ("assistant", "Call it."), ("tool", None)]
    with_reasoning = client.responses.create(model="qwen", input=items[:3] + [{"role": "user", "content": "Bye"}],
                                             max_output_tokens=1, temperature=0)
    without = client.responses.create(model="qwen", input=[items[0], items[2], {"role": "user", "content": "Bye"}],
                                      max_output_tokens=1, temperature=0)
    assert with_reasoning.usage.input_tokens == without.usage.input_tokens


def test_responses_reasoning_output_item_is_openais_shape():
    """A harmony (gpt-oss) answer's analysis channel becomes a reasoning output item before the
    message, in events and response the official client's types accept."""
    import asyncio

    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    from ferrollama.generation.scheduler import Output
    from ferrollama.server.responses import events, response_skeleton
    from ferrollama.server.schemas import ResponsesRequest

    pieces = ["<|channel|>analysis<|message|>The user", " says hi.<|end|><|start|>assistant<|channel|>final",
              "<|message|>Hello", " there."]

    async def outputs():
        for i, text in enumerate(pieces):
            yield Output(text, finish_reason="stop" if i == len(pieces) - 1 else None,
                         usage={"prompt_tokens": 5, "completion_tokens": 9, "cached_tokens": 0} if i == len(pieces) - 1 else None)

    kept = []
    body = response_skeleton(ResponsesRequest.model_validate({"input": "hi"}), "gpt-oss")

    async def run():
        return [e async for e in events(outputs(), body, "gpt-oss", True, [], lambda r, c: kept.append(c))]

    evs = asyncio.run(run())
    adapter = TypeAdapter(ResponseStreamEvent)
    for e in evs:
        adapter.validate_python(e)
    kinds = [e["type"] for e in evs]
    assert kinds[:8] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.done",
                         "response.content_part.done", "response.output_item.done"]
    final = Response.model_validate(evs[-1]["response"])
    reasoning, message = final.output
    assert (reasoning.type, reasoning.content[0].text) == ("reasoning", "The user says hi.")
    assert (message.type, final.output_text) == ("message", "Hello there.")
    assert kept[0][-1].reasoning_content == "The user says hi."


def test_the_response_store_keeps_the_last_ones():
    from ferrollama.server.responses import ResponseStore, UnknownResponse

    store = ResponseStore(capacity=2)
    for k in "abc":
        store.put({"id": k}, [])
        if k == "b":
            store.get("a")  # used: b is now the oldest
    assert len(store) == 2 and store.get("a") == ({"id": "a"}, []) and store.get("c")
    with pytest.raises(UnknownResponse):
        store.get("b")


BAD_RESPONSES = [
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "unsupported_parameter"),
    ({"input": "hi", "tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "unsupported_parameter"),
    # a reasoning item belongs to the assistant turn after it; OpenAI's encrypted reasoning cannot be read
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "invalid_value"),
    ({"input": [{"role": "user", "content": "hi"}, {"type": "reasoning", "summary": [], "encrypted_content": "gAAA"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and?"}]}, "invalid_value"),
    # images need the projector (--mmproj): this server has none
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, "unsupported_parameter"),
    ({"input": "hi", "background": True}, "unsupported_parameter"),
    ({"input": "hi", "include": ["reasoning.encrypted_content"]}, "unsupported_parameter"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "missing_parameter"),
    ({"input": "hi", "tool_choice": {"type": "function", "name": "nope"}, "tools": WEATHER_TOOL}, "invalid_value"),
    ({"input": "hi", "tools": WEATHER}, "missing_parameter"),
    ({"input": []}, "invalid_value"),
]


@pytest.mark.parametrize("body, code", BAD_RESPONSES, ids=[c for _, c in BAD_RESPONSES])
def test_bad_responses_requests_are_400(http, body, code):
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and error["message"]


# --- bad input: a 400 with OpenAI's error body, and the server keeps serving ------------------------

BAD = [
    (b"{not json", "invalid_json"),
    (b'["a list"]', "invalid_value"),
    ({"messages": "hello"}, "invalid_value"),
    ({"messages": []}, "invalid_value"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}, "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi " * 1500}]}, "invalid_prompt"),
    ({"messages": [{"role": "user", "content": "hi"}], "grammar": "root ::= ("}, "invalid_grammar"),
    ({"messages": [{"role": "user", "content": "hi"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}, "invalid_grammar"),
    ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"999999999": 1}}, "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi"}], "modalities": ["audio"]}, "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "hi"}], "audio": {"voice": "alloy", "format": "wav"}}, "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "hi"}], "web_search_options": {}}, "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "hi"}], "moderation": {"model": "m"}}, "unsupported_parameter"),
    ({"messages": [{"role": "assistant", "content": "hi", "audio": {"id": "a1"}}]}, "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi"}], "functions": [WEATHER[0]["function"]], "tools": WEATHER},
     "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi"}], "function_call": "auto"}, "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, "invalid_value"),
]


@pytest.mark.parametrize("body, code", BAD, ids=[c for _, c in BAD])
def test_bad_chat_requests_are_400(http, body, code):
    r = http.post("/v1/chat/completions", content=body if isinstance(body, bytes) else json.dumps(body),
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "code"} and error["type"] == "invalid_request_error"
    assert error["code"] == code and error["message"]


def test_bad_completion_embedding_and_token_requests_are_400(http):
    cases = [("/v1/completions", {"prompt": "hi", "suffix": "x"}), ("/v1/completions", {"prompt": [10**8]}),
             ("/v1/completions", {"prompt": []}), ("/v1/completions", {"prompt": "hi", "stop": [""]}),
             ("/v1/embeddings", {"input": "hi " * 3000}), ("/v1/embeddings", {"input": ""}),
             ("/detokenize", {"tokens": [-1]}), ("/tokenize", {"content": 5})]
    for path, body in cases:
        r = http.post(path, json=body)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", (path, body, r.text)
    assert http.get("/health").json()["status"] == "ok"


def test_the_api_key_is_required(served):
    r = httpx.post(served[0].url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(served[0].url + "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401


# --- hang-ups and the full queue ---------------------------------------------------------------

def _cancelled(scheduler) -> int:
    return scheduler.stats.requests_cancelled


def test_a_streaming_client_that_hangs_up_frees_its_slot(served, http):
    server, scheduler = served
    before = _cancelled(scheduler)
    body = {"prompt": "Once upon a time", "max_tokens": 400, "stream": True, "ignore_eos": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: ")).startswith("data: {")
    assert wait_idle(scheduler)
    assert _cancelled(scheduler) == before + 1
    assert scheduler.stats.generated_tokens > 0


def test_a_waiting_client_that_hangs_up_frees_its_slot(served):
    server, scheduler = served
    before = _cancelled(scheduler)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=1.0,
                   json={"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True})
    assert wait_idle(scheduler)
    assert _cancelled(scheduler) == before + 1


def test_a_full_queue_answers_503_with_retry_after():
    server, scheduler = start_server(load_model(REAL_MODELS["qwen2"]), n_seq=1, n_ctx=512, queue_size=0)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json={"prompt": "Hi", "max_tokens": 300, "stream": True,
                                                               "ignore_eos": True}) as first:
                line = next(line for line in first.iter_lines() if line.startswith("data: "))
                r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
                assert r.status_code == 503 and r.headers["Retry-After"] == "1", (line, r.text)
                assert r.json()["error"]["code"] == "queue_full"
            assert wait_idle(scheduler)
            assert http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1}).status_code == 200
    finally:
        server.stop()
        scheduler.close()


def test_the_command_serves_with_llama_server_flags(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "ferrollama.cli", "serve", "-m", str(model_path(REAL_MODELS["qwen2"])),
                             "--port", str(port), "-np", "2", "-c", "1024", "-t", "2", "-a", "coder", "--api-key", "k"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url, headers = f"http://127.0.0.1:{port}", {"Authorization": "Bearer k"}
        for _ in range(600):
            try:
                models = httpx.get(url + "/v1/models", headers=headers, timeout=1).json()
                break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.1)
        assert models["data"][0]["id"] == "coder"
        assert (models["data"][0]["meta"]["n_slots"], models["data"][0]["meta"]["n_ctx_slot"]) == (2, 512)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    bad = subprocess.run([sys.executable, "-m", "ferrollama.cli", "serve", "-m", str(tmp_path / "none.gguf")],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "no such model file" in bad.stderr


def test_mixed_requests_leave_the_server_healthy(served, http):
    """A bounded soak: concurrent good, malformed and hung-up requests; then every slot is idle."""
    import concurrent.futures as cf

    server, scheduler = served
    good = {"prompt": "Count: 1, 2,", "max_tokens": 6, "temperature": 0}

    def one(k: int) -> int:
        if k % 3 == 1:
            return http.post("/v1/completions", content=b'{"prompt": ', headers={"Content-Type": "application/json"}).status_code
        if k % 3 == 2:
            try:
                httpx.post(server.url + "/v1/completions", json={**good, "max_tokens": 200},
                           headers={"Authorization": f"Bearer {KEY}"}, timeout=0.3)
            except httpx.ReadTimeout:
                return 0
            return -1
        return http.post("/v1/completions", json=good).status_code

    with cf.ThreadPoolExecutor(6) as pool:
        statuses = list(pool.map(one, range(18)))
    assert statuses == [200, 400, 0] * 6
    assert wait_idle(scheduler)
    assert http.get("/health").json() == {"status": "ok", "slots_idle": 4, "slots_processing": 0, "queue_length": 0}
    r = http.post("/v1/completions", json=good)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
