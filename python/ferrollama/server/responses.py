"""OpenAI's Responses API as the chat endpoint's machinery sees it.

A Responses request becomes a :class:`ChatRequest` (input items -> messages, the Responses shape
of tools and text.format -> the chat one), so the prompt, sampling, tool parsing and limits are
the chat endpoint's; the answer's outputs become the Responses events (streamed) or the last
event's response (not streamed). Stored responses are kept in memory, the last
:data:`STORED_RESPONSES`, for ``previous_response_id`` and GET /v1/responses/{id}.
"""
from __future__ import annotations

import collections
import time
import uuid
from typing import Any, AsyncIterator, Callable

from ..chat import tools as T
from ..generation.scheduler import Output
from .schemas import (ChatRequest, FunctionCallItem, FunctionCallOutputItem, ImageUrl, ImageUrlPart, InputImage,
                      InputMessage, InputText, Message, MessageToolCall, ReasoningItem, TextPart,
                      ResponsesRequest, ToolCallFunction)

__all__ = ["STORED_RESPONSES", "ResponseStore", "Unsupported", "UnknownResponse", "chat_request", "events",
           "input_item_list", "page_of_items", "response_skeleton"]

#: how many responses are kept for previous_response_id (the least recently used go first)
STORED_RESPONSES = 256


class Unsupported(ValueError):
    """A field this server cannot honour (a 400 that says so)."""


class UnknownResponse(KeyError):
    """A response id that is not (or no longer) stored."""


class ResponseStore:
    """The last responses (their body, the conversation they end and their request's input items),
    least recently used out first."""

    def __init__(self, capacity: int = STORED_RESPONSES):
        self.capacity = capacity
        self._items: collections.OrderedDict[str, tuple[dict, list[Message], list[dict]]] = collections.OrderedDict()

    def put(self, response: dict, conversation: list[Message], input_items: list[dict] | None = None) -> None:
        self._items[response["id"]] = (response, conversation, input_items or [])
        self._items.move_to_end(response["id"])
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def _entry(self, response_id: str) -> tuple[dict, list[Message], list[dict]]:
        if response_id not in self._items:
            raise UnknownResponse(response_id)
        self._items.move_to_end(response_id)
        return self._items[response_id]

    def get(self, response_id: str) -> tuple[dict, list[Message]]:
        response, conversation, _ = self._entry(response_id)
        return response, conversation

    def input_items(self, response_id: str) -> list[dict]:
        return self._entry(response_id)[2]

    def delete(self, response_id: str) -> None:
        self._entry(response_id)
        del self._items[response_id]

    def __len__(self) -> int:
        return len(self._items)


def page_of_items(items: list[dict], order: str, after: str | None, limit: int) -> dict:
    """One page of a response's input items as OpenAI lists them (newest first unless order is
    "asc"; ``after`` an item id of the previous page)."""
    if order not in ("asc", "desc"):
        raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
    if not 1 <= limit <= 100:
        raise ValueError(f"limit must be between 1 and 100, not {limit}")
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise ValueError(f"after: no input item {after!r} in this response")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}


# --- request -> chat request ------------------------------------------------------------------------

def _text(content: str | list) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def _chat_content(content: str | list) -> str | list:
    """A message's content as the chat endpoint takes it: text, or text and image_url parts."""
    if isinstance(content, str) or not any(isinstance(p, InputImage) for p in content):
        return _text(content)
    return [ImageUrlPart(type="image_url", image_url=ImageUrl(url=p.image_url, detail=p.detail))
            if isinstance(p, InputImage) else TextPart(type="text", text=p.text) for p in content]


def _reasoning_text(item: ReasoningItem) -> str:
    """A reasoning item's text: its full text where it carries it, else its summary."""
    return "".join(p.text for p in (item.content or item.summary))


def input_messages(items: str | list) -> list[Message]:
    """The chat messages of a request's input: a function_call joins the assistant message just
    before it (an answer's text and its calls are one assistant turn, as on the chat endpoint),
    and a reasoning item is the reasoning of the assistant turn that follows it."""
    if isinstance(items, str):
        return [Message(role="user", content=items)]
    out: list[Message] = []
    reasoning: str | None = None
    for item in items:
        if isinstance(item, ReasoningItem):
            reasoning = (reasoning or "") + _reasoning_text(item)
            continue
        if isinstance(item, InputMessage):
            out.append(Message(role=item.role, content=_chat_content(item.content)))
        elif isinstance(item, FunctionCallItem):
            call = MessageToolCall(id=item.call_id, function=ToolCallFunction(name=item.name, arguments=item.arguments))
            if not (out and out[-1].role == "assistant") or reasoning is not None:
                out.append(Message(role="assistant", content=None))
            out[-1].tool_calls = [*(out[-1].tool_calls or []), call]
        elif isinstance(item, FunctionCallOutputItem):
            out.append(Message(role="tool", tool_call_id=item.call_id, content=_text(item.output)))
        if reasoning is not None:
            if out[-1].role != "assistant":
                raise ValueError("input: a reasoning item must come just before the assistant message or "
                                 "function call it belongs to")
            out[-1].reasoning_content, reasoning = reasoning, None
    if reasoning is not None:
        raise ValueError("input: a reasoning item must come just before the assistant message or function call "
                         "it belongs to, not last")
    return out


def input_item_list(items: str | list) -> list[dict]:
    """A request's input as GET /v1/responses/{id}/input_items lists it: each item with an id."""
    if isinstance(items, str):
        items = [InputMessage(role="user", content=[InputText(type="input_text", text=items)])]
    prefixes = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
    listed = []
    for item in items:
        body = item.model_dump(exclude_none=True)
        if isinstance(body.get("content"), str):
            body["content"] = [{"type": "input_text", "text": body["content"]}]
        body.setdefault("id", f"{prefixes[body['type']]}_{uuid.uuid4().hex}")
        listed.append(body)
    return listed


def _response_format(req: ResponsesRequest) -> dict | None:
    fmt = req.text.format if req.text else None
    if fmt is None:
        return None
    if fmt.type == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}}
    return {"type": fmt.type}


def _tool_choice(req: ResponsesRequest) -> Any:
    if req.tool_choice is None or isinstance(req.tool_choice, str):
        return req.tool_choice
    return {"type": "function", "function": {"name": req.tool_choice.name}}


def chat_request(req: ResponsesRequest, history: list[Message]) -> tuple[ChatRequest, list[Message]]:
    """The chat request that answers req after history (a previous response's conversation), and
    the conversation it continues (history and req's input; the instructions are not carried over,
    as OpenAI's are not)."""
    if req.background:
        raise Unsupported("background: this server answers while the client waits; "
                          "background responses are not available")
    conversation = history + input_messages(req.input)
    if not conversation:
        raise ValueError("input: empty")
    system = [Message(role="system", content=req.instructions)] if req.instructions else []
    fields: dict[str, Any] = {
        "model": req.model, "messages": system + conversation, "stream": req.stream,
        "max_completion_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
        "tools": [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                  for t in req.tools] if req.tools else None,
        "tool_choice": _tool_choice(req), "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": _response_format(req), "reasoning_effort": req.reasoning.effort if req.reasoning else None}
    return ChatRequest.model_validate({k: v for k, v in fields.items() if v is not None}), conversation


# --- outputs -> events ------------------------------------------------------------------------------

def response_skeleton(req: ResponsesRequest, model: str) -> dict:
    """The response body before its answer: what the request set, echoed."""
    return {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "error": None, "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "model": req.model or model, "output": [],
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
            "store": req.store, "temperature": req.temperature, "top_p": req.top_p,
            "text": {"format": req.text.format.model_dump(by_alias=True, exclude_none=True)
                     if req.text and req.text.format else {"type": "text"}},
            "tool_choice": req.tool_choice.model_dump() if req.tool_choice is not None and not isinstance(
                req.tool_choice, str) else (req.tool_choice or "auto"),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []], "truncation": "disabled",
            "usage": None, "metadata": req.metadata or {}, "background": False}


def _usage(last: Output) -> dict:
    u = last.usage or {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
    # the tokens not read from a slot's cache were computed and are kept there for the next request
    written = u["prompt_tokens"] - u["cached_tokens"]
    return {"input_tokens": u["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": u["cached_tokens"], "cache_write_tokens": written},
            "output_tokens": u["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["prompt_tokens"] + u["completion_tokens"]}


class _Events:
    """The numbered events of one response and the output items they build."""

    def __init__(self, response: dict):
        self.response, self.seq = response, 0

    def event(self, type_: str, **fields: Any) -> dict:
        self.seq += 1
        return {"type": type_, "sequence_number": self.seq - 1, **fields}

    def snapshot(self, type_: str) -> dict:
        return self.event(type_, response={**self.response, "output": list(self.response["output"])})

    def add_item(self, item: dict) -> tuple[dict, int]:
        self.response["output"].append(item)
        index = len(self.response["output"]) - 1
        return self.event("response.output_item.added", output_index=index, item=dict(item)), index

    def done_item(self, index: int, status: str = "completed", **fields: Any) -> dict:
        item = self.response["output"][index]
        item.update(fields, status=status)
        return self.event("response.output_item.done", output_index=index, item=dict(item))


def _message_item() -> dict:
    return {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "in_progress", "role": "assistant",
            "content": []}


def _output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


async def events(outputs: AsyncIterator[Output], response: dict, tool_format: str | None, parallel: bool,
                 conversation: list[Message], keep: Callable[[dict, list[Message]], None]) -> AsyncIterator[dict]:
    """The Responses events of one answer's outputs, response.created to response.completed (or
    response.incomplete when max_output_tokens cut it); keep(response, conversation + answer)
    stores it at the end."""
    ev = _Events(response)
    yield ev.snapshot("response.created")
    yield ev.snapshot("response.in_progress")
    gate, text, message_at = T.ToolGate(tool_format), "", None
    last, calls, reasoning = Output(""), [], ""
    async for out in outputs:
        delta = gate.push(out.text)
        last = out if out.finish_reason is not None else last
        if out.finish_reason is not None:
            rest, calls, reasoning = gate.finish()
            delta += rest
            if reasoning:
                async for e in _reasoning_events(ev, reasoning):
                    yield e
        if delta:
            if message_at is None:
                added, message_at = ev.add_item(_message_item())
                yield added
                yield ev.event("response.content_part.added", item_id=added["item"]["id"], output_index=message_at,
                               content_index=0, part=_output_text(""))
            text += delta
            yield ev.event("response.output_text.delta", item_id=response["output"][message_at]["id"],
                           output_index=message_at, content_index=0, delta=delta, logprobs=[])
    cut = last.finish_reason == "length"
    if message_at is not None:
        item_id = response["output"][message_at]["id"]
        yield ev.event("response.output_text.done", item_id=item_id, output_index=message_at, content_index=0,
                       text=text, logprobs=[])
        yield ev.event("response.content_part.done", item_id=item_id, output_index=message_at, content_index=0,
                       part=_output_text(text))
        yield ev.done_item(message_at, "incomplete" if cut else "completed", content=[_output_text(text)])
    calls = calls if parallel else calls[:1]
    for call in calls:
        async for e in _call_events(ev, call):
            yield e
    response.update(status="incomplete" if cut else "completed", usage=_usage(last),
                    incomplete_details={"reason": "max_output_tokens"} if cut else None)
    answer = Message(role="assistant", content=text or None, reasoning_content=reasoning or None,
                     tool_calls=[MessageToolCall(id=c.id, function=ToolCallFunction(name=c.name, arguments=c.arguments))
                                 for c in calls] or None)
    if response["store"]:
        keep(response, conversation + [answer])
    yield ev.snapshot("response.incomplete" if cut else "response.completed")


async def _reasoning_events(ev: _Events, reasoning: str) -> AsyncIterator[dict]:
    """A reasoning output item (its text whole: the format's parser finds it at the end)."""
    added, index = ev.add_item({"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": [], "content": [],
                                "status": "in_progress"})
    yield added
    item_id, part = added["item"]["id"], {"type": "reasoning_text", "text": reasoning}
    yield ev.event("response.content_part.added", item_id=item_id, output_index=index, content_index=0,
                   part={"type": "reasoning_text", "text": ""})
    yield ev.event("response.reasoning_text.delta", item_id=item_id, output_index=index, content_index=0,
                   delta=reasoning)
    yield ev.event("response.reasoning_text.done", item_id=item_id, output_index=index, content_index=0,
                   text=reasoning)
    yield ev.event("response.content_part.done", item_id=item_id, output_index=index, content_index=0, part=part)
    yield ev.done_item(index, content=[part])


async def _call_events(ev: _Events, call: T.ToolCall) -> AsyncIterator[dict]:
    added, index = ev.add_item({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call.id,
                                "name": call.name, "arguments": "", "status": "in_progress"})
    yield added
    item_id = added["item"]["id"]
    yield ev.event("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=call.arguments)
    yield ev.event("response.function_call_arguments.done", item_id=item_id, output_index=index, name=call.name,
                   arguments=call.arguments)
    yield ev.done_item(index, arguments=call.arguments)
