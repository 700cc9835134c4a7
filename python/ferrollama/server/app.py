"""The OpenAI-compatible HTTP API (Starlette) over a :class:`Scheduler`.

Routes: POST /v1/chat/completions, /v1/responses, /v1/completions, /v1/embeddings, /tokenize,
/detokenize; GET /v1/models, /health, /slots, /metrics; GET and DELETE /v1/responses/{id}, GET
/v1/responses/{id}/input_items.
Errors have OpenAI's shape, ``{"error": {"message", "type", "code"}}``: 400 for anything wrong
with the request, 401 without the API key, 503 with Retry-After when the queue is full, 500 when
the engine fails one request.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

import numpy as np
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .._core import Error as EngineError
from .._core import Model, samplers
from ..chat import tools as T
from ..chat.templates import ChatTemplate, ChatTemplateError
from ..generation.media import MediaError, load_image_url
from ..generation.multimodal import MEDIA_MARKER, prompt_keys
from ..generation.params import DEFAULT_SEED, SamplingParams
from ..generation.sampler import Sampler
from ..generation.scheduler import JobFailed, Output, QueueFull, Request, Scheduler, chat_logprobs, completion_logprobs
from . import responses as R
from .metrics import Metrics
from .schemas import (ChatRequest, CompletionRequest, DetokenizeRequest, EmbeddingRequest, ImageUrlPart, InputAudio,
                      InputAudioPart, Message,
                      MessageToolCall, ResponsesRequest, SamplingFields, TextPart, TokenizeRequest)

__all__ = ["create_app", "ApiError"]


class ApiError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.headers = status, message, type_, code, headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}


def bad_request(message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, code=code)


# --- request parsing ------------------------------------------------------------------------------

def _validation_message(err: ValidationError) -> tuple[str, str]:
    errors = err.errors()
    # an item of a type the server does not take says so; else the deepest error: in a union
    # (a string or a list of items), what the item that came lacks, not that it is no string
    first = max(errors, key=lambda e: (e["type"] == "union_tag_invalid", len(e["loc"])))
    where = ".".join(str(p) for p in first["loc"] if "[" not in str(p))  # not pydantic's names of union branches
    if first["type"] == "union_tag_invalid":
        return (f"{where}: type {first['ctx']['tag']!r} is not supported by this server "
                f"(it takes {first['ctx']['expected_tags']})"), "unsupported_parameter"
    if first["type"] == "json_invalid":
        return f"the body is not valid JSON: {first['msg']}", "invalid_json"
    if first["type"] == "extra_forbidden":
        return f"unsupported field {where!r}: this server does not honour it", "unsupported_parameter"
    if first["type"] == "missing":
        return f"missing field {where!r}", "missing_parameter"
    return f"{where}: {first['msg']}", "invalid_value"


async def parse_body(request: HttpRequest, schema: type[BaseModel]) -> Any:
    body = await request.body()
    try:
        return schema.model_validate_json(body or b"null", strict=True)
    except ValidationError as e:
        raise bad_request(*_validation_message(e)) from None


# --- sampling ---------------------------------------------------------------------------------------

@dataclass
class Engine:
    """What the routes share: the scheduler, the model, its name and chat template."""

    scheduler: Scheduler
    model_name: str
    embedder: Any = None
    #: the projector of --mmproj (generation.multimodal.Projector): images in chat messages
    projector: Any = None
    #: the stored responses of /v1/responses (previous_response_id)
    responses: R.ResponseStore = field(default_factory=R.ResponseStore)
    _template: ChatTemplate | None = None
    _eog: list[int] | None = None

    @property
    def model(self) -> Model:
        return self.scheduler.model

    @property
    def template(self) -> ChatTemplate:
        if self._template is None:
            self._template = ChatTemplate.from_model(self.model)
        return self._template

    def eog_tokens(self) -> list[int]:
        if self._eog is None:
            self._eog = [t for t in range(self.model.n_vocab) if self.model.is_eog(t)]
        return self._eog


def _logit_bias(engine: Engine, req: SamplingFields) -> dict[int, float]:
    bias: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise bad_request(f"logit_bias: {key!r} is not a token id") from None
        if not 0 <= token < engine.model.n_vocab:
            raise bad_request(f"logit_bias: token {token} is outside the vocabulary (0..{engine.model.n_vocab - 1})")
        if not math.isfinite(value):
            raise bad_request(f"logit_bias: the bias of token {token} is not a finite number")
        bias[token] = value
    if req.ignore_eos:
        bias.update({t: -math.inf for t in engine.eog_tokens()})
    return bias


def _json_schema(req: SamplingFields) -> Any:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return fmt.schema_ or {"type": "object"}
    if fmt.json_schema is None:
        raise bad_request("response_format: json_schema needs a 'json_schema' object with a 'schema'")
    return fmt.json_schema.schema_ or {"type": "object"}


def _stops(req: SamplingFields) -> list[str]:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stops):
        raise bad_request("stop: an empty stop string would stop before anything is written")
    return stops


def sampling_params(engine: Engine, req: SamplingFields, tool_grammar: str | None = None) -> SamplingParams:
    """The sampling of a request; tool_grammar forces a tool call (tool_choice "required" or named)."""
    schema = _json_schema(req)
    constraints = [c for c in (schema, req.grammar, tool_grammar) if c]
    if len(constraints) > 1:
        raise bad_request("give one of grammar, response_format (JSON) and a required tool call, not several")
    grammar = req.grammar or tool_grammar or ""
    return SamplingParams(
        seed=DEFAULT_SEED if req.seed in (None, -1) else req.seed, temp=req.temperature, top_p=req.top_p,
        top_k=req.top_k, min_p=req.min_p, penalty_repeat=req.repeat_penalty, penalty_freq=req.frequency_penalty,
        penalty_present=req.presence_penalty, logit_bias=_logit_bias(engine, req), grammar=grammar,
        json_schema=schema)


def _choice_samplers(engine: Engine, params: SamplingParams, n: int) -> list[Sampler]:
    """One sampler per choice; a given seed s gives the choices s, s+1, ... (a grammar or schema
    that does not compile is a 400)."""
    out = []
    for i in range(n):
        seed = params.seed if params.seed == DEFAULT_SEED else (params.seed + i) % DEFAULT_SEED
        try:
            out.append(Sampler(engine.model, SamplingParams(**{**params.__dict__, "seed": seed})))
        except (ValueError, EngineError) as e:
            raise bad_request(f"{_sampler_field(params)}: {e}", "invalid_grammar") from None
    return out


def _sampler_field(params: SamplingParams) -> str:
    return "response_format" if params.json_schema is not None else "grammar" if params.grammar else "sampling"


async def submit(engine: Engine, requests: list[Request], samplers: list[Sampler]):
    try:
        return engine.scheduler.submit_many(requests, samplers)
    except QueueFull as e:
        raise ApiError(503, f"the server is busy: {e}", "server_busy", "queue_full", {"Retry-After": "1"}) from None
    except ValueError as e:
        raise bad_request(str(e), "invalid_prompt") from None


# --- running jobs -----------------------------------------------------------------------------------

async def merged(jobs: Sequence) -> AsyncIterator[tuple[int, Output]]:
    """(choice index, output) of several jobs as they come; cancels every job when left early."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, job) -> None:
        try:
            async for out in job:
                await queue.put((i, out))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, e))

    tasks = [asyncio.create_task(pump(i, j)) for i, j in enumerate(jobs)]
    try:
        done = 0
        while done < len(jobs):
            i, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            done += item.finish_reason is not None
            yield i, item
    finally:
        for job in jobs:
            job.cancel()
        for t in tasks:
            t.cancel()


async def _until_disconnect(request: HttpRequest) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect(request: HttpRequest, jobs: Sequence) -> list[list[Output]]:
    """Every output of every job; cancels them when the client hangs up first."""
    outs: list[list[Output]] = [[] for _ in jobs]

    async def gather() -> None:
        async for i, out in merged(jobs):
            outs[i].append(out)

    work, gone = asyncio.create_task(gather()), asyncio.create_task(_until_disconnect(request))
    await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    gone.cancel()
    if not work.done():
        work.cancel()
        for job in jobs:
            job.cancel()
        raise ApiError(499, "the client closed the connection", code="client_closed")
    work.result()
    return outs


def _job_failed(e: JobFailed) -> ApiError:
    return ApiError(500, str(e), "server_error", "engine_error")


def sse(data: Any, named: bool = False) -> str:
    """One server-sent event; named: with an event line of its type (the Responses API's)."""
    head = f"event: {data['type']}\n" if named and "type" in data else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def event_stream(chunks: AsyncIterator[dict], named: bool = False) -> StreamingResponse:
    """The chunks as server-sent events, then [DONE] (the chat API's end; the Responses API's
    clients end at response.completed and skip it)."""
    async def body() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield sse(chunk, named)
        except JobFailed as e:
            yield sse(_job_failed(e).body())
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached}}


def _sum_usage(lasts: Sequence[Output], n_per_prompt: int) -> dict:
    firsts = [o.usage for k, o in enumerate(lasts) if k % n_per_prompt == 0 and o.usage]
    completion = sum(o.usage["completion_tokens"] for o in lasts if o.usage)
    return _usage(sum(u["prompt_tokens"] for u in firsts), completion, sum(u["cached_tokens"] for u in firsts))


# --- chat ------------------------------------------------------------------------------------------

#: the roles of the older API and of OpenAI's newer one, as templates know them
_TEMPLATE_ROLES = {"developer": "system", "function": "tool"}


def _text(content: str | list | None) -> str:
    """A message's text; each image part is the media marker where the projector puts it."""
    if not isinstance(content, list):
        return content
    return "".join(p.text if isinstance(p, TextPart) else MEDIA_MARKER for p in content)


def _image_urls(req: ChatRequest) -> list[str | InputAudio]:
    """The messages' media in order: an image part's URL, an audio part's input_audio."""
    return [p.image_url.url if isinstance(p, ImageUrlPart) else p.input_audio for m in req.messages
            if isinstance(m.content, list) for p in m.content if isinstance(p, (ImageUrlPart, InputAudioPart))]


def _message_dict(m: Message) -> dict:
    # an assistant's refusal is what it said (the openai client sends content null beside it)
    out: dict[str, Any] = {"role": _TEMPLATE_ROLES.get(m.role, m.role), "content": _text(m.content) or m.refusal or ""}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    calls = m.tool_calls or ([MessageToolCall(id="call_0", function=m.function_call)] if m.function_call else [])
    if calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": _arguments_value(c.function.arguments)}}
                             for c in calls]
    if m.reasoning_content:
        out["reasoning_content"] = m.reasoning_content
    return out


def _arguments_value(text: str) -> Any:
    """Templates write arguments with tojson: give them the object, not its JSON text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@dataclass
class ChatPlan:
    tokens: list[int]
    #: the tool-call format to parse the answer with (None: no tools)
    tool_format: str | None
    grammar: str | None
    #: whether the answer may hold several calls, and whether it names one in function_call (the older API)
    parallel: bool = True
    legacy: bool = False
    #: the images of a prompt with images, by key (Request.media)
    media: dict = field(default_factory=dict)


def _refuse_what_is_not_text(req: ChatRequest) -> None:
    """Audio answers and web search: refused with the reason (this server writes text only)."""
    if "audio" in (req.modalities or []) or req.audio is not None:
        raise bad_request("modalities: this server answers in text; audio output is not available", "unsupported_parameter")
    if req.web_search_options is not None:
        raise bad_request("web_search_options: this server does not search the web", "unsupported_parameter")


def _tools_of(req: ChatRequest) -> tuple[list[dict], Any, bool]:
    """The tools, tool_choice and parallel_tool_calls, also of the older functions and function_call."""
    if req.functions is None:
        if req.function_call is not None:
            raise bad_request("function_call needs functions")
        tools = [t.model_dump(by_alias=True, exclude_none=True) for t in req.tools or []]
        choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, BaseModel) else req.tool_choice
        return tools, choice, req.parallel_tool_calls
    if req.tools is not None or req.tool_choice is not None:
        raise bad_request("give tools or functions, not both")
    call = req.function_call.model_dump() if isinstance(req.function_call, BaseModel) else req.function_call
    return ([{"type": "function", "function": f.model_dump(exclude_none=True)} for f in req.functions],
            T.tool_choice_of_function_call(call), False)


def _reasoning_kwargs(effort: str | None) -> dict:
    """The template's variables for reasoning_effort (llama-server's: "none" turns thinking off)."""
    if effort is None:
        return {}
    if effort == "none":
        return {"enable_thinking": False}
    return {"reasoning_effort": effort, "reasoning_strength": effort}


def plan_chat(engine: Engine, req: ChatRequest) -> ChatPlan:
    _refuse_what_is_not_text(req)
    messages = [_message_dict(m) for m in req.messages]
    tools, choice, parallel = _tools_of(req)
    try:
        plan = T.plan_tools(engine.template.source, messages, tools, choice,
                            samplers.Grammar.json_schema_to_gbnf, parallel)
    except (ValueError, EngineError) as e:
        if "tool_choice" in str(e):
            raise bad_request(str(e)) from None
        raise bad_request(f"tools: {e}", "invalid_tools") from None
    kwargs = {**plan.template_kwargs, **_reasoning_kwargs(req.reasoning_effort)}
    urls = _image_urls(req)
    try:
        if urls:
            tokens, media = _media_prompt(engine, engine.template.apply(plan.messages, add_generation_prompt=True, **kwargs),
                                          urls)
        else:
            tokens, media = engine.template.tokens(engine.model, plan.messages, add_generation_prompt=True, **kwargs), {}
    except ChatTemplateError as e:
        raise bad_request(f"messages: {e}", "invalid_messages") from None
    return ChatPlan(tokens, plan.format, plan.grammar, parallel, req.functions is not None, media)


def _media_prompt(engine: Engine, text: str, urls: list[str]) -> tuple[list[int], dict]:
    """The keys and images of a prompt with images (data: URIs and http(s) URLs: a client's
    paths are not read on the server)."""
    if engine.projector is None:
        raise bad_request("image_url: this server takes no images (start it with --mmproj FILE, the model's projector)",
                          "unsupported_parameter")
    images: list = []
    for url in urls:
        if isinstance(url, InputAudio):
            images.append(_audio_bytes(url))
            continue
        if not url.startswith(("data:", "http://", "https://")):
            raise bad_request("image_url: give a data: URI or an http(s) URL (the server reads no paths)", "invalid_image")
        try:
            images.append(load_image_url(url, engine.projector.limits))
        except MediaError as e:
            raise bad_request(f"image_url: {e}", "invalid_image") from None
    try:
        return prompt_keys(engine.projector.tokenize(text, images))
    except ValueError as e:
        raise bad_request(f"messages: {e}", "invalid_messages") from None


def _audio_bytes(audio: InputAudio) -> bytes:
    try:
        return base64.b64decode(audio.data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise bad_request(f"input_audio: data is not base64 ({e})", "invalid_audio") from None


def _prediction_tokens(engine: Engine, req: ChatRequest) -> list[int]:
    if req.prediction is None:
        return []
    return list(engine.model.tokenize(_text(req.prediction.content), add_special=False, parse_special=False))


def _chat_logprobs(engine: Engine, outs: Sequence[Output]) -> dict | None:
    return chat_logprobs(engine.model, outs)


def _chat_message(outs: list[Output], plan: ChatPlan) -> tuple[dict, str]:
    message, finish = T.assistant_message("".join(o.text for o in outs), plan.tool_format, plan.parallel,
                                          outs[-1].finish_reason)
    return T.with_function_call(message, plan.legacy), finish  # type: ignore[return-value]


async def start_chat(engine: Engine, req: ChatRequest) -> tuple[ChatPlan, list]:
    """The plan of a chat request and its jobs, submitted (one per choice)."""
    # images are fetched and encoded off the event loop
    plan = await asyncio.to_thread(plan_chat, engine, req) if _image_urls(req) else plan_chat(engine, req)
    params = sampling_params(engine, req, plan.grammar)
    # beyond what the slot holds, the answer ends with "length" when the slot is full (as llama-server's)
    max_tokens = req.max_completion_tokens or req.max_tokens
    top = (req.top_logprobs or 0) if req.logprobs else None
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs: true")
    special = plan.tool_format in ("hermes", "mistral", "gpt-oss")
    gen = Request(plan.tokens, params, max_tokens, _stops(req), top, req.cache_prompt, special,
                  _prediction_tokens(engine, req), plan.media)
    return plan, await submit(engine, [gen] * req.n, _choice_samplers(engine, params, req.n))


async def chat_completions(request: HttpRequest) -> Response:
    engine: Engine = request.app.state.engine
    req = await parse_body(request, ChatRequest)
    plan, jobs = await start_chat(engine, req)
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": req.model or engine.model_name}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return event_stream(_chat_chunks(engine, jobs, meta, plan, req, include_usage))
    try:
        outs = await collect(request, jobs)
    except JobFailed as e:
        raise _job_failed(e) from None
    choices = []
    for i, o in enumerate(outs):
        message, finish = _chat_message(o, plan)
        choices.append({"index": i, "message": message, "logprobs": _chat_logprobs(engine, o) if req.logprobs else None,
                        "finish_reason": finish})
    return JSONResponse({**meta, "object": "chat.completion", "choices": choices,
                         "usage": _sum_usage([o[-1] for o in outs], req.n)})


async def _chat_chunks(engine: Engine, jobs: list, meta: dict, plan: ChatPlan, req: ChatRequest,
                       include_usage: bool) -> AsyncIterator[dict]:
    base = {**meta, "object": "chat.completion.chunk"}
    chunk = lambda i, delta, finish=None, logprobs=None: {  # noqa: E731
        **base, "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
    for i in range(len(jobs)):
        yield chunk(i, {"role": "assistant", "content": ""})
    gates = [T.ToolGate(plan.tool_format) for _ in jobs]
    lasts: list[Output] = [Output("")] * len(jobs)
    async for i, out in merged(jobs):
        text = gates[i].push(out.text)
        logprobs = _chat_logprobs(engine, [out]) if req.logprobs else None
        if text or logprobs:
            yield chunk(i, {"content": text}, logprobs=logprobs)
        if out.finish_reason is None:
            continue
        lasts[i] = out
        rest, calls, reasoning = gates[i].finish()
        calls = calls if plan.parallel else calls[:1]
        if reasoning:
            yield chunk(i, {"reasoning_content": reasoning})
        if rest:
            yield chunk(i, {"content": rest})
        if calls:
            delta = {"tool_calls": [c.to_openai(k) for k, c in enumerate(calls)]}
            yield chunk(i, T.with_function_call(delta, plan.legacy))
        yield chunk(i, {}, T.finish_reason(calls, out.finish_reason))
    if include_usage:
        yield {**base, "choices": [], "usage": _sum_usage(lasts, req.n)}


# --- responses -------------------------------------------------------------------------------------

def _history(engine: Engine, previous_id: str | None) -> list[Message]:
    if previous_id is None:
        return []
    try:
        return engine.responses.get(previous_id)[1]
    except R.UnknownResponse:
        raise bad_request(f"previous_response_id: no stored response {previous_id!r} (this server keeps the last "
                          f"{engine.responses.capacity}, in memory)", "previous_response_not_found") from None


async def _outputs(job) -> AsyncIterator[Output]:
    async for _, out in merged([job]):
        yield out


async def _listed(outs: list[Output]) -> AsyncIterator[Output]:
    for out in outs:
        yield out


async def responses(request: HttpRequest) -> Response:
    engine: Engine = request.app.state.engine
    req = await parse_body(request, ResponsesRequest)
    history = _history(engine, req.previous_response_id)
    try:
        chat, conversation = R.chat_request(req, history)
    except R.Unsupported as e:
        raise bad_request(str(e), "unsupported_parameter") from None
    except ValueError as e:
        raise bad_request(str(e)) from None
    plan, jobs = await start_chat(engine, chat)
    body = R.response_skeleton(req, engine.model_name)

    input_items = R.input_item_list(req.input)

    def keep(response: dict, whole: list[Message]) -> None:
        engine.responses.put(response, whole, input_items)

    def events(outputs: AsyncIterator[Output]) -> AsyncIterator[dict]:
        return R.events(outputs, body, plan.tool_format, plan.parallel, conversation, keep)

    if req.stream:
        return event_stream(events(_outputs(jobs[0])), named=True)
    try:
        outs = await collect(request, jobs)
    except JobFailed as e:
        raise _job_failed(e) from None
    async for _ in events(_listed(outs[0])):
        pass
    return JSONResponse(body)


def _stored(request: HttpRequest) -> tuple[Engine, str]:
    engine: Engine = request.app.state.engine
    response_id = request.path_params["response_id"]
    try:
        engine.responses.get(response_id)
    except R.UnknownResponse:
        raise ApiError(404, f"no stored response {response_id!r}", code="not_found") from None
    return engine, response_id


async def get_response(request: HttpRequest) -> Response:
    engine, response_id = _stored(request)
    return JSONResponse(engine.responses.get(response_id)[0])


async def list_input_items(request: HttpRequest) -> Response:
    """GET /v1/responses/{id}/input_items: the stored request's input, a page at a time."""
    engine, response_id = _stored(request)
    query = request.query_params
    unknown = sorted(set(query) - {"order", "after", "limit", "include"})
    if unknown:
        raise bad_request(f"unknown query parameters: {', '.join(unknown)}", "unknown_parameter")
    if query.getlist("include"):
        raise bad_request("include: this server adds nothing to input items", "unsupported_parameter")
    try:
        limit = int(query.get("limit", "20"))
        page = R.page_of_items(engine.responses.input_items(response_id), query.get("order", "desc"),
                               query.get("after"), limit)
    except ValueError as e:
        raise bad_request(str(e)) from None
    return JSONResponse(page)


async def delete_response(request: HttpRequest) -> Response:
    engine, response_id = _stored(request)
    engine.responses.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


# --- completions -----------------------------------------------------------------------------------

def _prompts(engine: Engine, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if prompt and all(isinstance(t, int) for t in prompt):
        prompt = [prompt]
    if not prompt:
        raise bad_request("prompt: empty", "invalid_prompt")
    out = []
    for p in prompt:
        tokens = list(engine.model.tokenize(p, add_special=True, parse_special=True)) if isinstance(p, str) else list(p)
        if not tokens and engine.model.bos is not None:
            tokens = [engine.model.bos]
        out.append(tokens)
    return out


async def completions(request: HttpRequest) -> Response:
    engine: Engine = request.app.state.engine
    req = await parse_body(request, CompletionRequest)
    prompts = _prompts(engine, req.prompt)
    params = sampling_params(engine, req)
    max_tokens = 16 if req.max_tokens is None else req.max_tokens
    gens = [Request(p, params, max_tokens, _stops(req), req.logprobs, req.cache_prompt) for p in prompts for _ in range(req.n)]
    samplers = [s for _ in prompts for s in _choice_samplers(engine, params, req.n)]
    jobs = await submit(engine, gens, samplers)
    echoes = [engine.model.detokenize(p) if req.echo else "" for p in prompts for _ in range(req.n)]
    meta = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": req.model or engine.model_name,
            "object": "text_completion"}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return event_stream(_completion_chunks(engine, jobs, meta, echoes, req, include_usage))
    try:
        outs = await collect(request, jobs)
    except JobFailed as e:
        raise _job_failed(e) from None
    choices = [{"index": i, "text": echoes[i] + "".join(o.text for o in out),
                "logprobs": completion_logprobs(engine.model, out, len(echoes[i])) if req.logprobs is not None else None,
                "finish_reason": out[-1].finish_reason} for i, out in enumerate(outs)]
    return JSONResponse({**meta, "choices": choices, "usage": _sum_usage([o[-1] for o in outs], req.n)})


async def _completion_chunks(engine: Engine, jobs: list, meta: dict, echoes: list[str], req: CompletionRequest,
                             include_usage: bool) -> AsyncIterator[dict]:
    chunk = lambda i, text, finish=None, logprobs=None: {  # noqa: E731
        **meta, "choices": [{"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}]}
    for i, echo in enumerate(echoes):
        if echo:
            yield chunk(i, echo)
    offsets = [len(e) for e in echoes]
    lasts: list[Output] = [Output("")] * len(jobs)
    async for i, out in merged(jobs):
        logprobs = completion_logprobs(engine.model, [out], offsets[i]) if req.logprobs is not None else None
        offsets[i] += len(out.text)
        if out.finish_reason is None:
            yield chunk(i, out.text, logprobs=logprobs)
            continue
        lasts[i] = out
        yield chunk(i, out.text, out.finish_reason, logprobs)
    if include_usage:
        yield {**meta, "choices": [], "usage": _sum_usage(lasts, req.n)}


# --- embeddings, tokens, models, health ----------------------------------------------------------

async def embeddings(request: HttpRequest) -> Response:
    engine: Engine = request.app.state.engine
    req = await parse_body(request, EmbeddingRequest)
    if req.input == "" or (isinstance(req.input, list) and "" in req.input):
        raise bad_request("input: an empty string has no embedding", "invalid_input")
    inputs = _prompts(engine, req.input)
    try:
        vectors = await asyncio.to_thread(engine.embedder.embed, inputs)
    except ValueError as e:
        raise bad_request(f"input: {e}", "invalid_input") from None
    count = sum(len(t) for t in inputs)
    encode = (lambda v: v) if req.encoding_format == "float" else (  # noqa: E731
        lambda v: base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii"))
    return JSONResponse({"object": "list", "model": req.model or engine.model_name,
                         "data": [{"object": "embedding", "index": i, "embedding": encode(v)}
                                  for i, v in enumerate(vectors)],
                         "usage": {"prompt_tokens": count, "total_tokens": count}})


async def tokenize(request: HttpRequest) -> Response:
    engine: Engine = request.app.state.engine
    req = await parse_body(request, TokenizeRequest)
    tokens = engine.model.tokenize(req.content, add_special=req.add_special, parse_special=req.parse_special)
    if not req.with_pieces:
        return JSONResponse({"tokens": list(tokens)})
    pieces = [{"id": t, "piece": engine.model.token_to_piece(t, True).decode("utf-8", "replace")} for t in tokens]
    return JSONResponse({"tokens": pieces})


async def detokenize(request: HttpRequest) -> Response:
    engine: Engine = request.app.state.engine
    req = await parse_body(request, DetokenizeRequest)
    bad = [t for t in req.tokens if not 0 <= t < engine.model.n_vocab]
    if bad:
        raise bad_request(f"tokens: {bad[0]} is outside the vocabulary (0..{engine.model.n_vocab - 1})")
    return JSONResponse({"content": engine.model.detokenize(req.tokens)})


async def models(request: HttpRequest) -> Response:
    engine: Engine = request.app.state.engine
    m = engine.model
    meta = {"n_vocab": m.n_vocab, "n_ctx_train": m.n_ctx_train, "n_embd": m.n_embd, "n_params": m.n_params,
            "size": m.size, "n_ctx_slot": engine.scheduler.n_ctx_slot, "n_slots": engine.scheduler.n_seq}
    return JSONResponse({"object": "list", "data": [{"id": engine.model_name, "object": "model",
                                                     "created": request.app.state.started, "owned_by": "ferrollama",
                                                     "meta": meta}]})


async def health(request: HttpRequest) -> Response:
    sched = request.app.state.engine.scheduler
    busy = sched.slots_busy
    return JSONResponse({"status": "ok", "slots_idle": sched.n_seq - busy, "slots_processing": busy,
                         "queue_length": sched.queue_length})


async def slots(request: HttpRequest) -> Response:
    sched = request.app.state.engine.scheduler
    return JSONResponse([{"id": s.seq_id, "state": s.state, "n_ctx": sched.n_ctx_slot, "n_cached": len(s.tokens)}
                         for s in sched.slots])


async def metrics(request: HttpRequest) -> Response:
    m: Metrics = request.app.state.metrics
    return Response(m.render(), media_type=m.content_type)


# --- the application -----------------------------------------------------------------------------

class Gate:
    """ASGI middleware: the API key, OpenAI-shaped errors, request counts by route and status."""

    def __init__(self, app, api_key: str | None, metrics: Metrics):
        self.app, self.api_key, self.metrics = app, api_key, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, status = scope["path"], [500]

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if self.api_key and path != "/health" and not self._authorized(scope):
                await _error_response(ApiError(401, "invalid or missing API key", "authentication_error",
                                               "invalid_api_key"))(scope, receive, counting_send)
            else:
                await self.app(scope, receive, counting_send)
        finally:
            self.metrics.count_request(path, status[0])

    def _authorized(self, scope) -> bool:
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        return auth == f"Bearer {self.api_key}"


def _error_response(err: ApiError) -> Response:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _on_api_error(request: HttpRequest, exc: Exception) -> Response:
    return _error_response(exc)  # type: ignore[arg-type]


async def _on_http_error(request: HttpRequest, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    return _error_response(ApiError(exc.status_code, str(exc.detail), kind, None))


async def _on_unexpected(request: HttpRequest, exc: Exception) -> Response:
    return _error_response(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error", "internal_error"))


def create_app(scheduler: Scheduler, model_name: str | None = None, api_key: str | None = None,
               embedder: Any = None, projector: Any = None) -> Any:
    """The ASGI application serving scheduler's model (wrapped in the API-key and metrics gate)."""
    from .embeddings import Embedder

    engine = Engine(scheduler, model_name or os.path.basename(scheduler.model.path),
                    embedder or Embedder(scheduler.model, n_threads=scheduler.ctx.n_threads, loras=scheduler.loras),
                    projector)
    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/responses", responses, methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/embeddings", embeddings, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/slots", slots, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={ApiError: _on_api_error, HTTPException: _on_http_error,
                                                       Exception: _on_unexpected})
    app.state.engine = engine
    app.state.started = int(time.time())
    app.state.metrics = Metrics(scheduler)
    return Gate(app, api_key, app.state.metrics)
