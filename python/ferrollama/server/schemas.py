"""The OpenAI request bodies (and llama.cpp's extra fields) as pydantic models.

Every model forbids unknown fields and validates strictly: a field the server does not honour,
or a value of the wrong type, is a 400 that names it, never silently ignored. The fields OpenAI's
clients send that cannot change a local answer (``store``, ``metadata``, ...) are accepted and
listed as such (README "Server").
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

MAX_CHOICES = 16
MAX_TOP_LOGPROBS = 20


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class FunctionDef(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: str


class ToolChoiceNamed(Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaSpec(Strict):
    name: str = "response"
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaSpec] = None
    #: llama-server's extension: {"type": "json_object", "schema": {...}}
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")


class StreamOptions(Strict):
    include_usage: bool = False
    #: OpenAI pads chunks against length side channels; a local server has none to close: no effect
    include_obfuscation: Optional[bool] = None


class ToolCallFunction(Strict):
    name: str
    arguments: str


class MessageToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class TextPart(Strict):
    type: Literal["text"]
    text: str


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[MessageToolCall]] = None
    tool_call_id: Optional[str] = None
    # what an assistant message holds as the openai client returns it (message.model_dump()), sent back
    refusal: Optional[str] = None
    #: an earlier audio answer (never this server's): null only
    audio: None = None
    annotations: Optional[list[dict[str, Any]]] = None
    #: the older functions API's call
    function_call: Optional[ToolCallFunction] = None
    reasoning_content: Optional[str] = None


class Prediction(Strict):
    """OpenAI's predicted output: text the answer is expected to repeat much of."""

    type: Literal["content"]
    content: Union[str, list[TextPart]]


class SamplingFields(Strict):
    """Fields of both completion endpoints; defaults are llama-server's."""

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Union[str, list[str], None] = None
    temperature: float = Field(default=0.8, ge=0.0)
    top_p: float = Field(default=0.95, ge=0.0, le=1.0)
    seed: Optional[int] = Field(default=None, ge=-1, le=0xFFFFFFFF)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, float]] = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    user: Optional[str] = None
    response_format: Optional[ResponseFormat] = None
    # llama.cpp's fields
    top_k: int = Field(default=40, ge=0)
    min_p: float = Field(default=0.05, ge=0.0, le=1.0)
    repeat_penalty: float = Field(default=1.0, ge=0.0)
    grammar: Optional[str] = None
    ignore_eos: bool = False
    cache_prompt: bool = True


class ChatRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], ToolChoiceNamed, None] = None
    parallel_tool_calls: bool = True
    #: the older API of tools: functions and function_call (one call)
    functions: Optional[list[FunctionDef]] = Field(default=None, min_length=1)
    function_call: Union[Literal["none", "auto"], NamedFunction, None] = None
    #: given to the chat template as reasoning_effort, "none" as enable_thinking false (llama-server's rule)
    reasoning_effort: Optional[str] = None
    #: drafts for speculative decoding on a server that drafts (--lookup, -md)
    prediction: Optional[Prediction] = None
    # refused with a reason when set: this server writes text and searches nothing
    modalities: Optional[list[Literal["text", "audio"]]] = None
    audio: Optional[dict[str, Any]] = None
    web_search_options: Optional[dict[str, Any]] = None
    # OpenAI's fields with no effect on the answer here (README "Server")
    store: Optional[bool] = None
    metadata: Optional[dict[str, str]] = None
    service_tier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    prompt_cache_retention: Optional[str] = None
    safety_identifier: Optional[str] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None


PromptType = Union[str, list[str], list[int], list[list[int]]]


class CompletionRequest(SamplingFields):
    prompt: PromptType
    logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False


class EmbeddingRequest(Strict):
    input: PromptType
    model: Optional[str] = None
    encoding_format: Literal["float", "base64"] = "float"
    user: Optional[str] = None


class TokenizeRequest(Strict):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(Strict):
    tokens: list[int]
