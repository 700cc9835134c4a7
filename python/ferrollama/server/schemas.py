"""The OpenAI request bodies (and llama.cpp's extra fields) as pydantic models.

Every model forbids unknown fields and validates strictly: a field the server does not honour,
or a value of the wrong type, is a 400 that names it, never silently ignored. The fields OpenAI's
clients send that cannot change a local answer (``store``, ``metadata``, ...) are accepted and
listed as such (README "Server").
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

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


class ImageUrl(Strict):
    #: a data: URI, an http(s) URL the server fetches (bounded in size and time), or a path / file:// URL
    url: str
    #: OpenAI's resolution hint: no effect (the projector's own preprocessing decides the size)
    detail: Optional[Literal["auto", "low", "high"]] = None


class ImageUrlPart(Strict):
    """An image in a message (needs the server's projector, --mmproj)."""

    type: Literal["image_url"]
    image_url: ImageUrl


class InputAudio(Strict):
    #: the audio file's bytes in base64
    data: str
    format: Literal["wav", "mp3"]


class InputAudioPart(Strict):
    """Audio in a message (needs the server's audio projector, --mmproj)."""

    type: Literal["input_audio"]
    input_audio: InputAudio


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[Annotated[Union[TextPart, ImageUrlPart, InputAudioPart], Field(discriminator="type")]], None] = None
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


# --- the Responses API (POST /v1/responses) ---------------------------------------------------------

def _type_tag(default: str | None):
    """A discriminator on an item's "type" (default when it has none): an item of another type
    fails with the tag named (union_tag_invalid, a 400 that says the server does not take it)."""
    def tag(value: Any) -> Any:
        if isinstance(value, dict):
            return value.get("type", default)
        return getattr(value, "type", default)
    return tag


class InputText(Strict):
    """A text part of a message: input_text, or output_text as an earlier answer comes back."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: Optional[list[dict[str, Any]]] = None
    logprobs: Optional[list[dict[str, Any]]] = None


class InputImage(Strict):
    """An image part of a message (needs the server's projector, --mmproj): a data: URI or an
    http(s) URL. ``file_id`` is refused (this server keeps no files); ``detail`` has no effect."""

    type: Literal["input_image"]
    image_url: str
    detail: Optional[Literal["auto", "low", "high"]] = None


class InputMessage(Strict):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[Annotated[Union[InputText, InputImage], Field(discriminator="type")]]]
    # what an output message carries when it is sent back as input
    id: Optional[str] = None
    status: Optional[str] = None


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: Optional[str] = None
    status: Optional[str] = None


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: Union[str, list[InputText]]
    id: Optional[str] = None
    status: Optional[str] = None


class ReasoningPart(Strict):
    """A part of a reasoning item: its text (reasoning_text) or a summary of it (summary_text)."""

    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(Strict):
    """An earlier answer's reasoning sent back as input: it becomes the reasoning of the assistant
    turn that follows it (what chat templates that show past reasoning read). OpenAI's encrypted
    reasoning cannot be read here and is refused."""

    type: Literal["reasoning"]
    id: Optional[str] = None
    summary: list[ReasoningPart] = Field(default_factory=list)
    content: Optional[list[ReasoningPart]] = None
    encrypted_content: None = None
    status: Optional[str] = None


InputItem = Annotated[Union[Annotated[InputMessage, Tag("message")], Annotated[FunctionCallItem, Tag("function_call")],
                            Annotated[FunctionCallOutputItem, Tag("function_call_output")],
                            Annotated[ReasoningItem, Tag("reasoning")]],
                      Discriminator(_type_tag("message"))]


class FunctionTool(Strict):
    """A function tool in the Responses shape: name, description and parameters at the top."""

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


ResponseTool = Annotated[Union[Annotated[FunctionTool, Tag("function")]], Discriminator(_type_tag(None))]


class FunctionChoice(Strict):
    type: Literal["function"]
    name: str


class TextFormatText(Strict):
    type: Literal["text"]


class TextFormatJsonObject(Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(Strict):
    type: Literal["json_schema"]
    name: str
    schema_: dict[str, Any] = Field(alias="schema")
    description: Optional[str] = None
    strict: Optional[bool] = None


TextFormat = Annotated[Union[Annotated[TextFormatText, Tag("text")], Annotated[TextFormatJsonObject, Tag("json_object")],
                             Annotated[TextFormatJsonSchema, Tag("json_schema")]], Discriminator(_type_tag(None))]


class TextConfig(Strict):
    format: Optional[TextFormat] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None


class ReasoningConfig(Strict):
    #: given to the chat template as reasoning_effort does on the chat endpoint
    effort: Optional[str] = None
    #: reasoning summaries: not written here; null only
    summary: None = None


class ResponsesStreamOptions(Strict):
    include_obfuscation: Optional[bool] = None


class ResponsesRequest(Strict):
    model: Optional[str] = None
    input: Union[str, list[InputItem]]
    instructions: Optional[str] = None
    previous_response_id: Optional[str] = None
    max_output_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0)
    top_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    tools: Optional[list[ResponseTool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], FunctionChoice, None] = None
    parallel_tool_calls: bool = True
    text: Optional[TextConfig] = None
    reasoning: Optional[ReasoningConfig] = None
    stream: bool = False
    stream_options: Optional[ResponsesStreamOptions] = None
    #: whether the response is kept (in memory, the last ones) for previous_response_id and GET
    store: bool = True
    metadata: Optional[dict[str, str]] = None
    #: refused when true: a local server answers while the client waits
    background: Optional[bool] = None
    # OpenAI's fields with no effect on the answer here (README "Server")
    user: Optional[str] = None
    service_tier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    prompt_cache_retention: Optional[str] = None
    safety_identifier: Optional[str] = None
