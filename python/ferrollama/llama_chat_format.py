"""llama-cpp-python's ``llama_cpp.llama_chat_format``: named chat prompt formats and chat handlers.

A *chat formatter* turns messages into a prompt text and stop strings (``ChatFormatterResponse``);
``chat_formatter_to_chat_completion_handler`` makes it a *chat handler*: a callable that prompts
``llama.create_completion`` and converts the completion (or its stream of chunks) to the OpenAI
chat shapes, applying ``response_format`` and a forced ``tool_choice`` as grammars. Every format
llama-cpp-python 0.3.36 registers is registered here under the same name and renders the same
text (tests/data/fixtures/chat_formats.json holds its outputs). The image handlers run the
projectors the engine runs (MTMDChatHandler; Llava15ChatHandler and its 1.5-style subclasses over
``mlp``; Qwen25VLChatHandler over the Qwen VL mergers; MiniCPMv26ChatHandler over MiniCPM-V's
``resampler``). ``functionary*`` (a Hugging Face tokenizer) is present under its names and raises
``ChatHandlerUnavailableError`` saying so.

Where llama-cpp-python 0.3.36 errs, this module does not follow it: an unknown handler name and a
template's raise_exception are ValueErrors (subclasses), not bare Exceptions; chatml-function-calling
honours seed, logit_bias and max_tokens (it drops them), lets a message be free text (it applies the
function-picking grammar to it), takes tool_choice="required", names a single call's legacy
function_call after the function (it writes ""), and refuses keywords it cannot honour.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from datetime import datetime
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Tuple, Union

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from . import llama_grammar
from . import llama_types
from ._llama_hooks import StoppingCriteriaList
from .chat.templates import ChatTemplate, ChatTemplateError, jinja_environment

__all__ = [
    "CHATML_CHAT_TEMPLATE", "CHATML_BOS_TOKEN", "CHATML_EOS_TOKEN", "MISTRAL_INSTRUCT_CHAT_TEMPLATE",
    "MISTRAL_INSTRUCT_BOS_TOKEN", "MISTRAL_INSTRUCT_EOS_TOKEN", "MIXTRAL_INSTRUCT_CHAT_TEMPLATE",
    "LLAMA3_INSTRUCT_CHAT_TEMPLATE",
    "LlamaChatCompletionHandler", "LlamaChatCompletionHandlerNotFoundException", "LlamaChatCompletionHandlerRegistry",
    "ChatHandlerUnavailableError", "get_chat_completion_handler", "register_chat_completion_handler",
    "ChatFormatterResponse", "ChatFormatter", "Jinja2ChatFormatter", "chat_formatter_to_chat_completion_handler",
    "hf_autotokenizer_to_chat_formatter", "hf_autotokenizer_to_chat_completion_handler",
    "hf_tokenizer_config_to_chat_formatter", "hf_tokenizer_config_to_chat_completion_handler",
    "guess_chat_format_from_gguf_metadata", "register_chat_format", "chatml_function_calling",
    "functionary_chat_handler", "functionary_v1_v2_chat_handler",
    "Llava15ChatHandler", "Llava16ChatHandler", "MoondreamChatHandler", "NanoLlavaChatHandler",
    "Llama3VisionAlpha", "Llama3VisionAlphaChatHandler", "MiniCPMv26ChatHandler", "Qwen25VLChatHandler",
    "ObsidianChatHandler", "MTMDChatHandler", "Gemma4ChatHandler",
]

# --- chat templates llama-cpp-python recognises in GGUF metadata (from the models' tokenizer_config.json) ---

CHATML_CHAT_TEMPLATE = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
CHATML_BOS_TOKEN = '<s>'
CHATML_EOS_TOKEN = '<|im_end|>'
MISTRAL_INSTRUCT_CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
MISTRAL_INSTRUCT_BOS_TOKEN = '<s>'
MISTRAL_INSTRUCT_EOS_TOKEN = '</s>'
MIXTRAL_INSTRUCT_CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
LLAMA3_INSTRUCT_CHAT_TEMPLATE = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"


# --- handlers and their registry ----------------------------------------------------------------

class LlamaChatCompletionHandler(Protocol):
    """A chat handler: called with ``llama=`` and the OpenAI chat parameters (keywords only), returns
    a ``chat.completion`` dict, or an iterator of ``chat.completion.chunk`` dicts when ``stream``."""

    def __call__(self, *, llama: Any, messages: List[llama_types.ChatCompletionRequestMessage],
                 **kwargs: Any) -> Union[llama_types.CreateChatCompletionResponse,
                                         Iterator[llama_types.CreateChatCompletionStreamResponse]]: ...


class LlamaChatCompletionHandlerNotFoundException(ValueError):
    """No chat handler is registered under the asked name."""


class ChatHandlerUnavailableError(ValueError):
    """A llama-cpp-python chat handler that needs what ferrollama does not have."""


class LlamaChatCompletionHandlerRegistry:
    """The process-wide name -> chat handler table (one instance, as llama-cpp-python's Singleton)."""

    _instance: Optional["LlamaChatCompletionHandlerRegistry"] = None
    _chat_handlers: Dict[str, LlamaChatCompletionHandler] = {}

    def __new__(cls) -> "LlamaChatCompletionHandlerRegistry":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def register_chat_completion_handler(self, name: str, chat_handler: LlamaChatCompletionHandler,
                                         overwrite: bool = False) -> None:
        if not overwrite and name in self._chat_handlers:
            raise ValueError(f"Formatter with name '{name}' is already registered. Use `overwrite=True` to overwrite it.")
        self._chat_handlers[name] = chat_handler

    def unregister_chat_handler(self, name: str) -> None:
        if name not in self._chat_handlers:
            raise ValueError(f"No formatter registered under the name '{name}'.")
        del self._chat_handlers[name]

    def get_chat_completion_handler_by_name(self, name: str) -> LlamaChatCompletionHandler:
        try:
            return self._chat_handlers[name]
        except KeyError:
            raise LlamaChatCompletionHandlerNotFoundException(
                f"Invalid chat handler: {name} (valid formats: {list(self._chat_handlers.keys())})") from None


def get_chat_completion_handler(name: str) -> LlamaChatCompletionHandler:
    return LlamaChatCompletionHandlerRegistry().get_chat_completion_handler_by_name(name)


def register_chat_completion_handler(name: str) -> Callable[[LlamaChatCompletionHandler], LlamaChatCompletionHandler]:
    def decorator(f: LlamaChatCompletionHandler) -> LlamaChatCompletionHandler:
        LlamaChatCompletionHandlerRegistry().register_chat_completion_handler(name, f)
        return f

    return decorator


# --- formatters ---------------------------------------------------------------------------------

@dataclasses.dataclass
class ChatFormatterResponse:
    """A rendered prompt, the stop strings the format adds, an optional StoppingCriteriaList, and
    whether the prompt already holds the special prefix (then the handler adds no BOS)."""

    prompt: str
    stop: Optional[Union[str, List[str]]] = None
    stopping_criteria: Optional[Any] = None
    added_special: bool = False


class ChatFormatter(Protocol):
    """messages (and the request's other fields) -> ChatFormatterResponse."""

    def __call__(self, *, messages: List[llama_types.ChatCompletionRequestMessage],
                 **kwargs: Any) -> ChatFormatterResponse: ...


class Jinja2ChatFormatter(ChatFormatter):
    """A Hugging Face chat template (jinja2, sandboxed, with HF's helpers) as a formatter; its stop is
    the EOS text, and ``stop_token_ids`` (if given) stop generation on those tokens."""

    def __init__(self, template: str, eos_token: str, bos_token: str, add_generation_prompt: bool = True,
                 stop_token_ids: Optional[List[int]] = None):
        self.template = template
        self.eos_token = eos_token
        self.bos_token = bos_token
        self.add_generation_prompt = add_generation_prompt
        self.stop_token_ids = set(stop_token_ids) if stop_token_ids is not None else None
        try:
            self._environment = jinja_environment().from_string(template)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"the chat template does not parse: {e} (line {e.lineno})") from e

    @staticmethod
    def strftime_now(f: str) -> str:
        return datetime.now().strftime(f)

    def __call__(self, *, messages: List[llama_types.ChatCompletionRequestMessage],
                 functions: Optional[List[llama_types.ChatCompletionFunction]] = None,
                 function_call: Optional[llama_types.ChatCompletionRequestFunctionCall] = None,
                 tools: Optional[List[llama_types.ChatCompletionTool]] = None,
                 tool_choice: Optional[llama_types.ChatCompletionToolChoiceOption] = None,
                 **kwargs: Any) -> ChatFormatterResponse:
        prompt = self._environment.render(
            messages=messages, eos_token=self.eos_token, bos_token=self.bos_token,
            add_generation_prompt=self.add_generation_prompt, functions=functions, function_call=function_call,
            tools=tools, tool_choice=tool_choice, **kwargs)
        return ChatFormatterResponse(prompt=prompt, stop=[self.eos_token], stopping_criteria=self._stopping_criteria(),
                                     added_special=True)

    def _stopping_criteria(self) -> Optional[Any]:
        if self.stop_token_ids is None:
            return None
        stop_ids = self.stop_token_ids

        def stop_on_last_token(tokens: Any, logits: Any) -> bool:
            return tokens[-1] in stop_ids

        return StoppingCriteriaList([stop_on_last_token])

    def to_chat_handler(self) -> LlamaChatCompletionHandler:
        return chat_formatter_to_chat_completion_handler(self)


# --- completion -> chat conversions -------------------------------------------------------------

def _convert_text_completion_logprobs_to_chat(
        logprobs: Optional[llama_types.CompletionLogprobs]) -> Optional[llama_types.ChatCompletionLogprobs]:
    """Completion logprobs (parallel lists) -> chat logprobs (one record per token); no byte lists."""
    if logprobs is None:
        return None
    content = []
    for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]):
        top_list = [{"token": t, "logprob": lp, "bytes": None} for t, lp in (top or {}).items()]
        content.append({"token": token, "bytes": None, "logprob": logprob, "top_logprobs": top_list})
    return {"content": content, "refusal": None}


def _convert_text_completion_to_chat(completion: llama_types.Completion) -> llama_types.ChatCompletion:
    choice = completion["choices"][0]
    return {
        "id": "chat" + completion["id"],
        "object": "chat.completion",
        "created": completion["created"],
        "model": completion["model"],
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": choice["text"]},
            "logprobs": _convert_text_completion_logprobs_to_chat(choice["logprobs"]),
            "finish_reason": choice["finish_reason"],
        }],
        "usage": completion["usage"],
    }


def _chat_chunk(chunk: Dict[str, Any], choice: Dict[str, Any]) -> llama_types.ChatCompletionChunk:
    return {"id": "chat" + chunk["id"], "model": chunk["model"], "created": chunk["created"],
            "object": "chat.completion.chunk", "choices": [choice]}


def _convert_text_completion_chunks_to_chat(
        chunks: Iterator[llama_types.CreateCompletionStreamResponse]) -> Iterator[llama_types.ChatCompletionChunk]:
    """A role chunk first, then one chunk per completion chunk (the last, with a finish_reason, empty)."""
    for i, chunk in enumerate(chunks):
        if i == 0:
            yield _chat_chunk(chunk, {"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                      "finish_reason": None})
        choice = chunk["choices"][0]
        delta = {"content": choice["text"]} if choice["finish_reason"] is None else {}
        yield _chat_chunk(chunk, {"index": 0, "delta": delta,
                                  "logprobs": _convert_text_completion_logprobs_to_chat(choice["logprobs"]),
                                  "finish_reason": choice["finish_reason"]})


def _convert_completion_to_chat(completion_or_chunks: Any, stream: bool = False) -> Any:
    if stream:
        return _convert_text_completion_chunks_to_chat(completion_or_chunks)
    return _convert_text_completion_to_chat(completion_or_chunks)


def _tool_call_id(index: int, tool_name: str, completion_id: str) -> str:
    return f"call__{index}_{tool_name}_{completion_id}"


def _convert_completion_to_chat_function(tool_name: str, completion_or_chunks: Any, stream: bool) -> Any:
    """A completion whose text is a forced tool's arguments -> a chat answer calling that tool."""
    if not stream:
        completion = completion_or_chunks
        text = completion["choices"][0]["text"]
        return {
            "id": "chat" + completion["id"],
            "object": "chat.completion",
            "created": completion["created"],
            "model": completion["model"],
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "function_call": {"name": tool_name, "arguments": text},
                    "tool_calls": [{"id": _tool_call_id(0, tool_name, completion["id"]), "type": "function",
                                    "function": {"name": tool_name, "arguments": text}}],
                },
                "logprobs": _convert_text_completion_logprobs_to_chat(completion["choices"][0]["logprobs"]),
                "finish_reason": "tool_calls",
            }],
            "usage": completion["usage"],
        }
    return _function_stream(tool_name, completion_or_chunks)


def _function_stream(tool_name: str, chunks: Iterator[Dict[str, Any]]) -> Iterator[llama_types.ChatCompletionChunk]:
    """The streamed form: a role chunk, an arguments delta per completion chunk, a tool_calls finish."""
    empty_delta = {"role": None, "content": None, "function_call": None, "tool_calls": None}
    first = None
    for chunk in chunks:
        if first is None:
            first = chunk
            yield _chat_chunk(chunk, {"index": 0, "finish_reason": None, "logprobs": None,
                                      "delta": dict(empty_delta, role="assistant")})
        text = chunk["choices"][0]["text"]
        call = {"index": 0, "id": _tool_call_id(0, tool_name, first["id"]), "type": "function",
                "function": {"name": tool_name, "arguments": text}}
        delta = {"role": None, "content": None, "function_call": {"name": tool_name, "arguments": text},
                 "tool_calls": [call]}
        yield _chat_chunk(chunk, {"index": 0, "finish_reason": None, "delta": delta,
                                  "logprobs": _convert_text_completion_logprobs_to_chat(chunk["choices"][0]["logprobs"])})
    if first is not None:
        yield _chat_chunk(first, {"index": 0, "finish_reason": "tool_calls", "logprobs": None, "delta": empty_delta})


# --- grammars for response_format and forced tools ----------------------------------------------

def _grammar_for_json(verbose: bool = False) -> llama_grammar.LlamaGrammar:
    return llama_grammar.LlamaGrammar.from_string(llama_grammar.JSON_GBNF, verbose=verbose)


def _grammar_for_json_schema(schema: str, verbose: bool = False, fallback_to_json: bool = True):
    """The schema's grammar; a schema the converter refuses falls back to any JSON, as llama-cpp-python does."""
    try:
        return llama_grammar.LlamaGrammar.from_json_schema(schema, verbose=verbose)
    except Exception as e:
        if not fallback_to_json:
            raise
        if verbose:
            print(f"JSON schema not converted ({e}); constraining to any JSON", file=sys.stderr)
        return _grammar_for_json(verbose=verbose)


def _grammar_for_response_format(response_format: llama_types.ChatCompletionRequestResponseFormat,
                                 verbose: bool = False):
    if response_format["type"] != "json_object":
        return None
    if "schema" in response_format:
        return _grammar_for_json_schema(json.dumps(response_format["schema"]), verbose=verbose)
    return _grammar_for_json(verbose=verbose)


def _tools_of(tools: Optional[list], functions: Optional[list]) -> Optional[list]:
    """The legacy ``functions`` as tools (they win over ``tools``, as in llama-cpp-python)."""
    if functions is not None:
        return [{"type": "function", "function": function} for function in functions]
    return tools


def _tool_choice_of(tool_choice: Any, function_call: Any) -> Any:
    """The legacy ``function_call`` as a tool_choice."""
    if isinstance(function_call, str) and function_call in ("none", "auto"):
        return function_call
    if isinstance(function_call, dict) and "name" in function_call:
        return {"type": "function", "function": {"name": function_call["name"]}}
    return tool_choice


def _find_tool(tools: list, name: str) -> Optional[dict]:
    return next((t for t in tools if t["function"]["name"] == name), None)


def chat_formatter_to_chat_completion_handler(chat_formatter: ChatFormatter) -> LlamaChatCompletionHandler:
    """A chat handler that prompts with ``chat_formatter`` and answers with ``llama.create_completion``."""

    def chat_completion_handler(
        *, llama: Any, messages: List[llama_types.ChatCompletionRequestMessage],
        functions: Optional[list] = None, function_call: Any = None, tools: Optional[list] = None,
        tool_choice: Any = None, temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
        min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
        stop: Optional[Union[str, List[str]]] = [], seed: Optional[int] = None,
        response_format: Optional[llama_types.ChatCompletionRequestResponseFormat] = None,
        max_tokens: Optional[int] = None, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.1, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1, model: Optional[str] = None, logits_processor: Any = None,
        grammar: Optional[llama_grammar.LlamaGrammar] = None, logit_bias: Optional[Dict[str, float]] = None,
        logprobs: Optional[bool] = None, top_logprobs: Optional[int] = None, **kwargs: Any,
    ) -> Any:
        result = chat_formatter(messages=messages, functions=functions, function_call=function_call, tools=tools,
                                tool_choice=tool_choice, **kwargs)
        prompt = llama.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)
        if result.stop is not None:
            stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
            stop = stop + (result.stop if isinstance(result.stop, list) else [result.stop])
        if response_format is not None and response_format["type"] == "json_object":
            grammar = _grammar_for_response_format(response_format, verbose=llama.verbose)

        tools = _tools_of(tools, functions)
        tool_choice = _tool_choice_of(tool_choice, function_call)
        tool = None
        if isinstance(tool_choice, dict) and tools is not None:
            name = tool_choice["function"]["name"]
            tool = _find_tool(tools, name)
            if tool is None:
                raise ValueError(f"Tool choice '{name}' not found in tools.")
            grammar = _grammar_for_json_schema(json.dumps(tool["function"]["parameters"]), verbose=llama.verbose)

        completion_or_chunks = llama.create_completion(
            prompt=prompt, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
            logprobs=top_logprobs if logprobs else None, stream=stream, stop=stop, seed=seed, max_tokens=max_tokens,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, repeat_penalty=repeat_penalty,
            tfs_z=tfs_z, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
            model=model, logits_processor=logits_processor, stopping_criteria=result.stopping_criteria,
            grammar=grammar, logit_bias=logit_bias)
        if tool is not None:
            return _convert_completion_to_chat_function(tool["function"]["name"], completion_or_chunks, stream)
        return _convert_completion_to_chat(completion_or_chunks, stream=stream)

    return chat_completion_handler


# --- formatters from Hugging Face tokenizers ----------------------------------------------------

def hf_autotokenizer_to_chat_formatter(pretrained_model_name_or_path: Any) -> ChatFormatter:
    """A formatter using a Hugging Face tokenizer's ``apply_chat_template`` (needs ``transformers``)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ImportError("hf_autotokenizer_to_chat_formatter needs the `transformers` library "
                          "(pip install transformers)") from e
    tokenizer = AutoTokenizer.from_pretrained(pretrained_model_name_or_path)

    def format_autotokenizer(messages: List[llama_types.ChatCompletionRequestMessage],
                             **kwargs: Any) -> ChatFormatterResponse:
        tokenizer.use_default_system_prompt = False
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        return ChatFormatterResponse(prompt=prompt, stop=tokenizer.eos_token, added_special=True)

    return format_autotokenizer


def hf_autotokenizer_to_chat_completion_handler(pretrained_model_name_or_path: Any) -> LlamaChatCompletionHandler:
    return chat_formatter_to_chat_completion_handler(hf_autotokenizer_to_chat_formatter(pretrained_model_name_or_path))


def hf_tokenizer_config_to_chat_formatter(tokenizer_config: Dict[str, Any],
                                          add_generation_prompt: bool = True) -> ChatFormatter:
    """A formatter from a tokenizer_config.json's ``chat_template``, ``bos_token`` and ``eos_token``.

    As in llama-cpp-python, the generation prompt is an empty assistant message appended to the
    conversation, and the stops are the EOS and BOS texts.
    """
    if not isinstance(tokenizer_config, dict):
        raise ValueError("tokenizer_config must be a dict (a parsed tokenizer_config.json)")
    for field in ("chat_template", "bos_token", "eos_token"):
        if not isinstance(tokenizer_config.get(field), str):
            raise ValueError(f"tokenizer_config needs a string {field!r}")
    bos_token, eos_token = tokenizer_config["bos_token"], tokenizer_config["eos_token"]
    try:
        template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
            tokenizer_config["chat_template"])
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template does not parse: {e} (line {e.lineno})") from e

    def format_tokenizer_config(messages: List[llama_types.ChatCompletionRequestMessage],
                                **kwargs: Any) -> ChatFormatterResponse:
        if add_generation_prompt:
            messages = [*messages, {"role": "assistant", "content": ""}]
        prompt = template.render(messages=messages, bos_token=bos_token, eos_token=eos_token, **kwargs)
        return ChatFormatterResponse(prompt=prompt, stop=[eos_token, bos_token], added_special=True)

    return format_tokenizer_config


def hf_tokenizer_config_to_chat_completion_handler(tokenizer_config: Dict[str, Any],
                                                   add_generation_prompt: bool = True) -> LlamaChatCompletionHandler:
    return chat_formatter_to_chat_completion_handler(
        hf_tokenizer_config_to_chat_formatter(tokenizer_config, add_generation_prompt=add_generation_prompt))


def guess_chat_format_from_gguf_metadata(metadata: Dict[str, str]) -> Optional[str]:
    """The registered format whose template is exactly the model's ``tokenizer.chat_template``, or None."""
    template = metadata.get("tokenizer.chat_template")
    if template is None:
        return None
    if template == CHATML_CHAT_TEMPLATE:
        return "chatml"
    if template in (MISTRAL_INSTRUCT_CHAT_TEMPLATE, MIXTRAL_INSTRUCT_CHAT_TEMPLATE):
        return "mistral-instruct"
    if template == LLAMA3_INSTRUCT_CHAT_TEMPLATE:
        return "llama-3"
    return None


# --- the pieces of the hand-written formats -----------------------------------------------------

Turns = List[Tuple[str, Optional[str]]]  # (role label, content or None for "the model speaks next")


def _get_system_message(messages: List[llama_types.ChatCompletionRequestMessage]) -> str:
    """The first system message's content ("" if none)."""
    for message in messages:
        if message["role"] == "system":
            return message["content"] or ""
    return ""


def _map_roles(messages: List[llama_types.ChatCompletionRequestMessage], role_map: Dict[str, str]) -> Turns:
    """The messages whose role the format knows, as (label, text); non-text content becomes None."""
    return [(role_map[m["role"]], m["content"] if isinstance(m["content"], str) else None)
            for m in messages if m["role"] in role_map]


def _format_llama2(system_message: str, messages: Turns, sep: str, sep2: str) -> str:
    seps = [sep, sep2]
    ret = system_message + sep
    for i, (role, message) in enumerate(messages):
        if system_message and i == 0:
            ret += (message or "") + seps[i % 2]  # the first turn joins the system block
        elif message:
            ret += role + message + " " + seps[i % 2]
        else:
            ret += role + " "
    return ret


def _format_add_colon_single(system_message: str, messages: Turns, sep: str) -> str:
    ret = system_message + sep
    for role, message in messages:
        ret += role + ": " + message + sep if message else role + ":"
    return ret


def _format_add_colon_two(system_message: str, messages: Turns, sep: str, sep2: str) -> str:
    seps = [sep, sep2]
    ret = system_message + seps[0]
    for i, (role, message) in enumerate(messages):
        ret += role + ": " + message + seps[i % 2] if message else role + ":"
    return ret


def _format_no_colon_single(system_message: str, messages: Turns, sep: str) -> str:
    ret = system_message
    for role, message in messages:
        ret += role + message + sep if message else role
    return ret


def _format_add_colon_space_single(system_message: str, messages: Turns, sep: str) -> str:
    ret = system_message + sep
    for role, message in messages:
        ret += role + ": " + message + sep if message else role + ": "  # the open turn ends with a space
    return ret


def _format_chatml(system_message: str, messages: Turns, sep: str) -> str:
    ret = "" if system_message == "" else system_message + sep + "\n"
    for role, message in messages:
        ret += role + "\n" + message + sep + "\n" if message else role + "\n"
    return ret


def _format_chatglm3(system_message: str, messages: Turns, sep: str) -> str:
    ret = system_message or ""
    for role, message in messages:
        ret += role + "\n" + " " + message if message else role
    return ret


_FORMATTERS: Dict[str, ChatFormatter] = {}  # the registered formats' formatters, by name


def register_chat_format(name: str) -> Callable[[ChatFormatter], ChatFormatter]:
    """Register a formatter under ``name`` as a chat handler (the formatter itself is returned)."""

    def decorator(f: ChatFormatter) -> ChatFormatter:
        _FORMATTERS[name] = f
        LlamaChatCompletionHandlerRegistry().register_chat_completion_handler(
            name, chat_formatter_to_chat_completion_handler(f))
        return f

    return decorator


def _open_turn(messages: List[llama_types.ChatCompletionRequestMessage], roles: Dict[str, str]) -> Turns:
    """The mapped messages plus the assistant's open turn."""
    return _map_roles(messages, roles) + [(roles["assistant"], None)]


# --- the named formats (texts as llama-cpp-python 0.3.36 renders them) --------------------------

@register_chat_format("llama-2")
def format_llama2(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    system = _get_system_message(messages)
    if system:
        system = f"[INST] <<SYS>>\n{system}\n<</SYS>>"
    turns = _map_roles(messages, {"user": "<s>[INST]", "assistant": "[/INST]"})
    return ChatFormatterResponse(prompt=_format_llama2(system, turns, " ", "</s>") + "[/INST]")


@register_chat_format("llama-3")
def format_llama3(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    roles = {r: f"<|start_header_id|>{r}<|end_header_id|>\n\n" for r in ("system", "user", "assistant")}
    sep = "<|eot_id|>"
    return ChatFormatterResponse(prompt=_format_no_colon_single("", _open_turn(messages, roles), sep), stop=sep)


@register_chat_format("alpaca")
def format_alpaca(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    turns = _map_roles(messages, {"user": "### Instruction", "assistant": "### Response"})
    return ChatFormatterResponse(prompt=_format_add_colon_two(_get_system_message(messages), turns, "\n\n", "</s>"))


@register_chat_format("qwen")
def format_qwen(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    system = "<|im_start|>system\n" + (_get_system_message(messages) or "You are a helpful assistant.")
    turns = _open_turn(messages, {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"})
    return ChatFormatterResponse(prompt=_format_chatml(system, turns, "<|im_end|>"), stop="<|endoftext|>")


@register_chat_format("vicuna")
def format(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    # (llama-cpp-python names this one plain ``format``.) The system prompt is fixed.
    system = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
              "helpful, detailed, and polite answers to the user's questions.")
    turns = _open_turn(messages, {"user": "USER", "assistant": "ASSISTANT"})
    return ChatFormatterResponse(prompt=_format_add_colon_two(system, turns, " ", "</s>"))


@register_chat_format("oasst_llama")
def format_oasst_llama(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    system = f"[INST] <<SYS>>\n{_get_system_message(messages)}\n<</SYS>>\n\n"
    turns = _open_turn(messages, {"user": "<|prompter|>", "assistant": "<|assistant|>"})
    return ChatFormatterResponse(prompt=_format_no_colon_single(system, turns, "</s>"))


def _format_baichuan_with(messages: List[llama_types.ChatCompletionRequestMessage], user: str,
                          assistant: str) -> ChatFormatterResponse:
    turns = _open_turn(messages, {"user": user, "assistant": assistant})
    return ChatFormatterResponse(prompt=_format_no_colon_single(_get_system_message(messages), turns, ""))


@register_chat_format("baichuan-2")
def format_baichuan2(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    return _format_baichuan_with(messages, "<reserved_106>", "<reserved_107>")


@register_chat_format("baichuan")
def format_baichuan(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    return _format_baichuan_with(messages, "<reserved_102>", "<reserved_103>")


_OPENBUDDY_SYSTEM = """You are a helpful, respectful and honest INTP-T AI Assistant named Buddy. You are talking to a human User.
Always answer as helpfully and logically as possible, while being safe. Your answers should not include any harmful, political, religious, unethical, racist, sexist, toxic, dangerous, or illegal content. Please ensure that your responses are socially unbiased and positive in nature.
If a question does not make any sense, or is not factually coherent, explain why instead of answering something not correct. If you don't know the answer to a question, please don't share false information.
You can speak fluently in many languages, for example: English, Chinese.
You cannot access the internet, but you have vast knowledge, cutoff: 2021-09.
You are trained by OpenBuddy team, (https://openbuddy.ai, https://github.com/OpenBuddy/OpenBuddy), you are based on LLaMA and Falcon transformers model, not related to GPT or OpenAI.

"""


@register_chat_format("openbuddy")
def format_openbuddy(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    turns = _open_turn(messages, {"user": "User", "assistant": "Assistant"})
    return ChatFormatterResponse(prompt=_format_add_colon_single(_OPENBUDDY_SYSTEM, turns, "\n"))


@register_chat_format("redpajama-incite")
def format_redpajama_incite(messages: List[llama_types.ChatCompletionRequestMessage],
                            **kwargs: Any) -> ChatFormatterResponse:
    turns = _open_turn(messages, {"user": "<human>", "assistant": "<bot>"})
    return ChatFormatterResponse(prompt=_format_add_colon_single(_get_system_message(messages), turns, "\n"),
                                 stop="<human>")


@register_chat_format("snoozy")
def format_snoozy(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    # llama-cpp-python builds a "### Instruction:" header but then uses the bare system text (or this default).
    system = _get_system_message(messages) or (
        "The prompt below is a question to answer, a task to complete, or a conversation to respond to; "
        "decide which and write an appropriate response.")
    turns = _open_turn(messages, {"user": "### Prompt", "assistant": "### Response"})
    return ChatFormatterResponse(prompt=_format_add_colon_single(system, turns, "\n"), stop="###")


@register_chat_format("phind")
def format_phind(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    system = "### System Prompt\nYou are an intelligent programming assistant."
    turns = _open_turn(messages, {"user": "### User Message", "assistant": "### Assistant"})
    return ChatFormatterResponse(prompt=_format_add_colon_single(system, turns, "\n\n"))


@register_chat_format("intel")
def format_intel(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    # The system header keeps its unfilled "{system_message}" placeholder, as in llama-cpp-python.
    turns = _open_turn(messages, {"user": "### User:", "assistant": "### Assistant:"})
    return ChatFormatterResponse(prompt=_format_add_colon_single("### System:\n{system_message}", turns, "\n"))


_OPEN_ORCA_SYSTEM = (
    "You are a helpful assistant. Please answer truthfully and write out your "
    "thinking step by step to be sure you get the right answer. If you make a mistake or encounter "
    "an error in your thinking, say so out loud and attempt to correct it. If you don't know or "
    "aren't sure about something, say so clearly. You will act as a professional logician, mathematician, "
    "and physicist. You will also act as the most appropriate type of expert to answer any particular "
    "question or solve the relevant problem; state which expert type your are, if so. Also think of "
    "any particular named expert that would be ideal to answer the relevant question or solve the "
    "relevant problem; name and act as them, if appropriate."
)


@register_chat_format("open-orca")
def format_open_orca(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    # Role labels are the message roles themselves ("User"/"Assistant"), so OpenAI's lower-case
    # roles are all dropped, as in llama-cpp-python: only the open turn is rendered.
    turns = _map_roles(messages, {"User": "User", "Assistant": "Assistant"}) + [("Assistant", None)]
    return ChatFormatterResponse(prompt=_format_add_colon_space_single(_OPEN_ORCA_SYSTEM, turns, "<|end_of_turn|>\n"),
                                 stop="User")


@register_chat_format("mistrallite")
def format_mistrallite(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    system = f"<|system|>{_get_system_message(messages)}</s>"
    turns = _open_turn(messages, {"user": "<|prompter|>", "assistant": "</s>\n<|assistant|>"})
    return ChatFormatterResponse(prompt=_format_no_colon_single(system, turns, " "))


@register_chat_format("zephyr")
def format_zephyr(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    system = f"<|system|>\n{_get_system_message(messages)}"
    turns = _open_turn(messages, {"user": "<|user|>\n", "assistant": "<|assistant|>\n"})
    return ChatFormatterResponse(prompt=_format_chatml(system, turns, "</s>"), stop="</s>")


@register_chat_format("pygmalion")
def format_pygmalion(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    system = f"<|system|>{_get_system_message(messages)}"
    turns = _open_turn(messages, {"user": "<|user|>", "assistant": "<|model|>"})
    return ChatFormatterResponse(prompt=_format_chatml(system, turns, "\n"), stop="\n")


@register_chat_format("chatml")
def format_chatml(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    system = f"<|im_start|>system\n{_get_system_message(messages)}"
    turns = _open_turn(messages, {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"})
    return ChatFormatterResponse(prompt=_format_chatml(system, turns, "<|im_end|>"), stop="<|im_end|>")


@register_chat_format("mistral-instruct")
def format_mistral_instruct(messages: List[llama_types.ChatCompletionRequestMessage],
                            **kwargs: Any) -> ChatFormatterResponse:
    # System messages are dropped; the model's turns are closed by EOS text.
    prompt = ""
    for message in messages:
        content = message.get("content")
        if message["role"] == "user" and isinstance(content, str):
            prompt += "[INST] " + content
        elif message["role"] == "assistant" and content is not None:
            prompt += " [/INST]" + content + "</s>"
    return ChatFormatterResponse(prompt=prompt + " [/INST]", stop="</s>")


@register_chat_format("chatglm3")
def format_chatglm3(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    system = f"<|system|>\n{_get_system_message(messages)}"
    turns = _open_turn(messages, {"user": "<|user|>", "assistant": "<|assistant|>"})
    return ChatFormatterResponse(prompt=_format_chatglm3(system, turns, "</s>"), stop="</s>")


@register_chat_format("openchat")
def format_openchat(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    system = f"{_get_system_message(messages)}<|end_of_turn|>"
    turns = _open_turn(messages, {"user": "GPT4 Correct User: ",
                                  "assistant": "<|end_of_turn|>GPT4 Correct Assistant: "})
    return ChatFormatterResponse(prompt=_format_chatml(system, turns, "<|end_of_turn|>"), stop="<|end_of_turn|>")


@register_chat_format("saiga")
def format_saiga(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    prompt = ""
    for role, content in _map_roles(messages, {"user": "user", "bot": "bot", "system": "system"}):
        prompt += f"<s>{role}\n{content}</s>" if content else f"<s>{role}\n"
    return ChatFormatterResponse(prompt=(prompt + "<s>bot").strip())


@register_chat_format("gemma")
def format_gemma(messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> ChatFormatterResponse:
    # Gemma has no system role: system messages are dropped.
    sep = "<end_of_turn>\n"
    turns = _open_turn(messages, {"user": "<start_of_turn>user\n", "assistant": "<start_of_turn>model\n"})
    return ChatFormatterResponse(prompt=_format_no_colon_single("", turns, sep), stop=sep)


# --- chatml-function-calling: tools through a ChatML prompt and grammars ------------------------

_FUNCTION_CALLING_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message.role }}\n"
    "{% if message.role == 'system' %}"
    "{{ message.content }}"
    "{% if tool_calls %}"
    "\n\nYou have access to the following functions:\n"
    "{% for tool in tools %}"
    "\nfunctions.{{ tool.function.name }}:\n"
    "{{ tool.function.parameters | tojson }}"
    "\n{% endfor %}"
    "\n\nYou can respond to users messages with either a single message or one or more function calls."
    "\n\nTo respond with a message begin the message with 'message:', use the following format:"
    "\n\nmessage:"
    "\n<message>"
    "\n\nTo respond with one or more function calls begin the message with 'functions.<function_name>:', use the following format:"
    "\n\nfunctions.<function_name>:"
    '\n{ "arg1": "value1", "arg2": "value2" }'
    "\nfunctions.<function_name>:"
    '\n{ "arg1": "value1", "arg2": "value2" }'
    "{% endif %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% if message.role == 'user' %}"
    "{{ message.content }}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% if message.role == 'assistant' %}"
    "{% if message.content and message.content | length > 0 %}"
    "{% if tool_calls %}"
    "message:\n"
    "{% endif %}"
    "{{ message.content }}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% if 'tool_calls' in message %}"
    "{% for tool_call in message.tool_calls %}"
    "functions.{{ tool_call.function.name }}:\n"
    "{{ tool_call.function.arguments }}"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# llama-cpp-python renders it with jinja2's defaults plus HTML autoescaping (select_autoescape
# autoescapes templates made from strings) and StrictUndefined: contents are HTML-escaped and the
# parameters' JSON is jinja2's (sorted keys, <>&' as \u escapes). Kept, so prompts are identical.
_function_calling_template = ImmutableSandboxedEnvironment(
    autoescape=jinja2.select_autoescape(["html", "xml"]), undefined=jinja2.StrictUndefined,
).from_string(_FUNCTION_CALLING_TEMPLATE)


@register_chat_completion_handler("chatml-function-calling")
def chatml_function_calling(
    llama: Any, messages: List[llama_types.ChatCompletionRequestMessage], functions: Optional[list] = None,
    function_call: Any = None, tools: Optional[list] = None, tool_choice: Any = None, temperature: float = 0.2,
    top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
    stop: Optional[Union[str, List[str]]] = [],
    response_format: Optional[llama_types.ChatCompletionRequestResponseFormat] = None,
    max_tokens: Optional[int] = None, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
    repeat_penalty: float = 1.1, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
    mirostat_eta: float = 0.1, model: Optional[str] = None, logits_processor: Any = None,
    grammar: Optional[llama_grammar.LlamaGrammar] = None, logprobs: Optional[bool] = None,
    top_logprobs: Optional[int] = None, seed: Optional[int] = None, logit_bias: Optional[Dict[str, float]] = None,
    **kwargs: Any,
) -> Any:
    """ChatML with tools: the system message lists the functions; the model answers ``message:`` or
    ``functions.<name>:`` followed by JSON arguments, each step constrained by a grammar.

    tool_choice None/"none" (or no tools): a plain ChatML answer. A named tool: its arguments under
    that tool's schema grammar. "auto": a first grammar picks message or a function; function calls
    repeat until the model closes its turn (not streamable, as in llama-cpp-python).
    """
    if kwargs:  # llama-cpp-python ignores them; a parameter this flow cannot honour is refused
        raise TypeError(f"chatml-function-calling does not take {sorted(kwargs)}")
    tools = _tools_of(tools, functions)
    tool_choice = _tool_choice_of(tool_choice, function_call)
    stop = [stop, "<|im_end|>"] if isinstance(stop, str) else (stop + ["<|im_end|>"] if stop else ["<|im_end|>"])
    sampling = dict(  # what every completion of the flow shares
        top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p, presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty, repeat_penalty=repeat_penalty, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
        mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, model=model, logits_processor=logits_processor,
        seed=seed, logit_bias=logit_bias)  # llama-cpp-python drops these two here; they are honoured
    chat_logprobs = top_logprobs if logprobs else None

    if tool_choice is None or tool_choice == "none" or not tools:
        prompt = _function_calling_template.render(messages=messages, tools=[], tool_calls=None,
                                                   add_generation_prompt=True)
        if response_format is not None and response_format["type"] == "json_object":
            grammar = _grammar_for_response_format(response_format)
        completion = llama.create_completion(prompt=prompt, temperature=temperature, stream=stream, stop=stop,
                                             max_tokens=max_tokens, grammar=grammar, logprobs=chat_logprobs,
                                             **sampling)
        return _convert_completion_to_chat(completion, stream=stream)

    prompt = _function_calling_template.render(messages=messages, tools=tools, tool_calls=True,
                                               add_generation_prompt=True)
    if isinstance(tool_choice, dict):
        tool_name = tool_choice["function"]["name"]
        tool = _find_tool(tools, tool_name)
        if tool is None:
            raise ValueError(f"Tool with name '{tool_name}' not found in tools")
        completion = llama.create_completion(
            prompt=prompt + f"functions.{tool_name}:\n", temperature=temperature, stream=stream, stop=stop,
            max_tokens=max_tokens, grammar=_arguments_grammar(tool, llama.verbose), **sampling)
        return _convert_completion_to_chat_function(tool_name, completion, stream)

    if tool_choice not in ("auto", "required"):
        raise ValueError(f"tool_choice must be 'none', 'auto', 'required' or a named function, not {tool_choice!r}")
    return _auto_tool_choice(llama, prompt, tools, stop, temperature, stream, max_tokens, chat_logprobs, sampling,
                             required=tool_choice == "required")


def _arguments_grammar(tool: dict, verbose: bool) -> llama_grammar.LlamaGrammar:
    return _grammar_for_json_schema(json.dumps(tool["function"]["parameters"]), verbose=verbose)


def _auto_tool_choice(llama: Any, prompt: str, tools: list, stop: List[str], temperature: float, stream: bool,
                      max_tokens: Optional[int], chat_logprobs: Optional[int], sampling: Dict[str, Any],
                      required: bool = False) -> Any:
    """Deliberate differences from llama-cpp-python 0.3.36, whose answers here are wrong: it
    constrains a message's text with the grammar that picks the next function (so a message can
    only read "functions.<name>:" or nothing), and it drops max_tokens. Here a message is free text
    up to <|im_end|>, and max_tokens bounds the message and each call's arguments. It also fails on
    tool_choice="required"; here that is "auto" without the message option (OpenAI's meaning)."""
    names = " | ".join(f'"functions.{t["function"]["name"]}:"' for t in tools)
    choice_rule = "root   ::= functions\n" if required else 'root   ::= functions | "message:"\n'
    first_grammar = choice_rule + f"functions ::= {names}\n"
    next_grammar = f'root   ::= functions | "<|im_end|>"\nfunctions ::= {names}\n'
    choice = llama.create_completion(
        prompt=prompt, temperature=0, stream=False, stop=[":"], max_tokens=None,
        grammar=llama_grammar.LlamaGrammar.from_string(first_grammar, verbose=llama.verbose), **sampling)
    text = choice["choices"][0]["text"]
    if "message" in text:
        completion = llama.create_completion(
            prompt=prompt + "message:\n", temperature=temperature, stream=stream, stop=["<|im_end|>"],
            logprobs=chat_logprobs, max_tokens=max_tokens, grammar=None, **sampling)
        return _convert_completion_to_chat(completion, stream=stream)
    if stream:
        raise ValueError("Automatic streaming tool choice is not supported")

    calls: List[Tuple[str, Dict[str, Any]]] = []  # (tool name, completion of its arguments)
    tool_name = text[len("functions."):]
    tool = _find_tool(tools, tool_name)
    while tool is not None:
        prompt += f"functions.{tool_name}:\n"
        arguments = llama.create_completion(prompt=prompt, temperature=temperature, stream=False, stop=stop,
                                            max_tokens=max_tokens, grammar=_arguments_grammar(tool, llama.verbose),
                                            **sampling)
        calls.append((tool_name, arguments))
        prompt += arguments["choices"][0]["text"] + "\n"
        following = llama.create_completion(
            prompt=prompt, temperature=temperature, stream=False, stop=stop, max_tokens=None,
            grammar=llama_grammar.LlamaGrammar.from_string(next_grammar, verbose=llama.verbose), **sampling)
        tool_name = following["choices"][0]["text"][len("functions."):]
        tool = _find_tool(tools, tool_name)
    return _merge_tool_calls(choice, calls)


def _merge_tool_calls(choice: Dict[str, Any], calls: List[Tuple[str, Dict[str, Any]]]) -> Dict[str, Any]:
    """One chat answer holding every call; ids, created and model come from the choosing completion.

    llama-cpp-python names the legacy ``function_call`` (given for a single call) after the text the
    model produced when closing its turn (""); it is named after the called function here.
    """
    message: Dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": _tool_call_id(i, name, c["id"]), "type": "function",
                        "function": {"name": name, "arguments": c["choices"][0]["text"]}}
                       for i, (name, c) in enumerate(calls)],
    }
    if len(calls) == 1:
        name, c = calls[0]
        message["function_call"] = {"name": name, "arguments": c["choices"][0]["text"]}

    def total(field: str) -> int:
        return sum(c["usage"][field] if "usage" in c else 0 for _, c in calls)

    return {
        "id": "chat" + choice["id"],
        "object": "chat.completion",
        "created": choice["created"],
        "model": choice["model"],
        "choices": [{"finish_reason": "tool_calls", "index": 0,
                     "logprobs": _convert_text_completion_logprobs_to_chat(choice["choices"][0]["logprobs"]),
                     "message": message}],
        "usage": {"completion_tokens": total("completion_tokens"), "prompt_tokens": total("prompt_tokens"),
                  "total_tokens": total("total_tokens")},
    }


# --- llama-cpp-python handlers that need what ferrollama has not --------------------------------

_FUNCTIONARY_REASON = (
    "the functionary chat handlers tokenize with the model's Hugging Face tokenizer "
    "(llama-cpp-python requires Llama(tokenizer=LlamaHFTokenizer...) for them), which ferrollama does not support; "
    "use chat_format='chatml-function-calling' or the model's own chat template with tools")


def _unavailable(name: str, reason: str) -> LlamaChatCompletionHandler:
    def handler(*args: Any, **kwargs: Any) -> Any:
        raise ChatHandlerUnavailableError(f"chat handler {name!r} is not available in ferrollama: {reason}")

    handler.__name__ = name.replace("-", "_") + "_chat_handler"
    return handler


functionary_chat_handler = register_chat_completion_handler("functionary")(
    _unavailable("functionary", _FUNCTIONARY_REASON))
functionary_v1_v2_chat_handler = _unavailable("functionary-v1/v2", _FUNCTIONARY_REASON)
register_chat_completion_handler("functionary-v1")(functionary_v1_v2_chat_handler)
register_chat_completion_handler("functionary-v2")(functionary_v1_v2_chat_handler)


class MTMDChatHandler:
    """llama-cpp-python's handler for a model with its projector (mmproj): the model's own chat
    template, each ``image_url`` part (a data: URI, a path or file:// URL, an http(s) URL) a media
    marker in its text, the images encoded and decoded as libmtmd does
    (ferrollama.generation.multimodal). ``use_gpu`` has no effect on a CPU. The projector loads at
    the first chat, on the Llama's threads."""

    def __init__(self, clip_model_path: str, verbose: bool = True, use_gpu: bool = True):
        if not os.path.exists(clip_model_path):
            raise ValueError(f"Clip model path does not exist: {clip_model_path}")
        self.clip_model_path = clip_model_path
        self.verbose = verbose
        self.use_gpu = use_gpu
        self._projector: Any = None

    def projector(self, llama: Any) -> Any:
        """The projector for this Llama's model (loaded once)."""
        from .generation.multimodal import Projector

        if self._projector is None or self._projector.model is not llama.model:
            self._projector = Projector(llama.model, self.clip_model_path, n_threads=llama.n_threads)
        return self._projector

    def load_image(self, image_url: str) -> bytes:
        """The bytes behind an image URL (llama-cpp-python's method)."""
        from .generation.media import image_url_bytes

        return image_url_bytes(image_url)

    @staticmethod
    def get_image_urls(messages: List[llama_types.ChatCompletionRequestMessage]) -> List[str]:
        from .chat.media import image_urls

        return image_urls(messages)  # type: ignore[arg-type]

    def __call__(self, *, llama: Any, messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> Any:
        return llama._template_chat(messages=messages, media=self.projector(llama), **kwargs)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: Optional[str], **kwargs: Any) -> "MTMDChatHandler":
        raise ValueError("MTMDChatHandler.from_pretrained downloads from the Hugging Face Hub, which ferrollama "
                         "does not do: download the mmproj file and pass clip_model_path")


class Gemma4ChatHandler(MTMDChatHandler):
    pass


class _HandlerFormat(ChatTemplate):
    """A llava handler's CHAT_FORMAT, rendered as llama-cpp-python renders it (the same Jinja
    settings, the model's BOS and EOS pieces); it stops generation nowhere of its own (the
    handler passes only the caller's stop strings)."""

    def markers(self) -> list[str]:
        return []


class Llava15ChatHandler(MTMDChatHandler):
    """llama-cpp-python's handler for LLaVA 1.5 and, below, the llava-style models with their own
    formats (over an ``mlp`` projector): not the model's template but ``CHAT_FORMAT``, with
    ``DEFAULT_SYSTEM_MESSAGE`` first where the messages have no system message; a user message
    renders its image parts' URLs first, then its text parts, and each URL becomes the media
    marker. The projector is loaded and run as MTMDChatHandler's (the engine refuses, by name,
    a projector type it does not run)."""

    DEFAULT_SYSTEM_MESSAGE: Optional[str] = (
        "A chat between a curious human and an artificial intelligence assistant. The assistant gives helpful, detailed, and polite answers to the human's questions."
    )
    CHAT_FORMAT = (
        "{% for message in messages %}"
        "{% if message.role == 'system' %}"
        "{{ message.content }}"
        "{% endif %}"
        "{% if message.role == 'user' %}"
        "{% if message.content is string %}"
        "\nUSER: {{ message.content }}"
        "{% endif %}"
        "{% if message.content is iterable %}"
        "\nUSER: "
        "{% for content in message.content %}"
        "{% if content.type == 'image_url' and content.image_url is string %}"
        "{{ content.image_url }}"
        "{% endif %}"
        "{% if content.type == 'image_url' and content.image_url is mapping %}"
        "{{ content.image_url.url }}"
        "{% endif %}"
        "{% endfor %}"
        "{% for content in message.content %}"
        "{% if content.type == 'text' %}"
        "{{ content.text }}"
        "{% endif %}"
        "{% endfor %}"
        "{% endif %}"
        "{% endif %}"
        "{% if message.role == 'assistant' and message.content is not none %}"
        "\nASSISTANT: {{ message.content }}"
        "{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}"
        "\nASSISTANT: "
        "{% endif %}"
    )

    def __init__(self, clip_model_path: str, verbose: bool = True):
        super().__init__(clip_model_path, verbose=verbose)

    def __call__(self, *, llama: Any, messages: List[llama_types.ChatCompletionRequestMessage], **kwargs: Any) -> Any:
        from .generation.multimodal import MEDIA_MARKER

        if _get_system_message(messages) == "" and self.DEFAULT_SYSTEM_MESSAGE is not None:
            messages = [{"role": "system", "content": self.DEFAULT_SYSTEM_MESSAGE}] + list(messages)  # type: ignore[assignment]
        fmt = _HandlerFormat(self.CHAT_FORMAT, bos_token=llama.detokenize([llama.token_bos()]).decode("utf-8", "replace"),
                             eos_token=llama.detokenize([llama.token_eos()]).decode("utf-8", "replace"))
        text = fmt.render(messages, add_generation_prompt=True)
        for url in self.get_image_urls(messages):
            text = text.replace(url, MEDIA_MARKER)
        return llama._template_chat(messages=messages, media=self.projector(llama), template=fmt, media_text=text,
                                    **kwargs)


class ObsidianChatHandler(Llava15ChatHandler):
    CHAT_FORMAT = (
        "{% for message in messages %}"
        # System message
        "{% if message.role == 'system' %}"
        "<|im_start|>system\n"
        "{{ message.content }}\n"
        "###\n"
        "{% endif %}"
        # User message
        "{% if message.role == 'user' %}"
        "<|im_start|>user\n"
        "{% if message.content is string %}"
        "{{ message.content }}"
        "{% endif %}"
        "{% if message.content is iterable %}"
        "{% for content in message.content %}"
        "{% if content.type == 'image_url' and content.image_url is string %}"
        "{{ content.image_url }}"
        "{% endif %}"
        "{% if content.type == 'image_url' and content.image_url is mapping %}"
        "{{ content.image_url.url }}"
        "{% endif %}"
        "{% endfor %}"
        "{% for content in message.content %}"
        "{% if content.type == 'text' %}"
        "{{ content.text }}"
        "{% endif %}"
        "{% endfor %}"
        "{% endif %}"
        "###\n"
        "{% endif %}"
        # Assistant message
        "{% if message.role == 'assistant' %}"
        "<|im_start|>assistant\n"
        "{{ message.content }}"
        "###\n"
        "{% endif %}"
        "{% endfor %}"
        # Generation prompt
        "{% if add_generation_prompt %}"
        "<|im_start|>assistant\n"
        "{% endif %}"
    )

class MoondreamChatHandler(Llava15ChatHandler):
    CHAT_FORMAT = (
        "{% for message in messages %}"
        "{% if message.role == 'user' %}"
        "{% if message.content is iterable %}"
        # <image>
        "{% for content in message.content %}"
        "{% if content.type == 'image_url' %}"
        "{% if content.image_url is string %}"
        "{{ content.image_url }}\n\n"
        "{% endif %}"
        "{% if content.image_url is mapping %}"
        "{{ content.image_url.url }}\n\n"
        "{% endif %}"
        "{% endif %}"
        "{% endfor %}"
        # Question:
        "{% for content in message.content %}"
        "{% if content.type == 'text' %}"
        "Question: {{ content.text }}\n\n"
        "{% endif %}"
        "{% endfor %}"
        "{% endif %}"
        # Question:
        "{% if message.content is string %}"
        "Question: {{ message.content }}\n\n"
        "{% endif %}"
        "{% endif %}"
        # Answer:
        "{% if message.role == 'assistant' %}"
        "Answer:{{ message.content }}\n\n"
        "{% endif %}"
        "{% endfor %}"
        # Generation prompt
        "{% if add_generation_prompt %}"
        "Answer:"
        "{% endif %}"
    )

class NanoLlavaChatHandler(Llava15ChatHandler):
    DEFAULT_SYSTEM_MESSAGE = "Answer the question"
    CHAT_FORMAT = (
        "{% for message in messages %}"
        # System message
        "{% if message.role == 'system' %}"
        "<|im_start|>system\n"
        "{{ message.content }}"
        "<|im_end|>"
        "{% endif %}"
        # User message
        "{% if message.role == 'user' %}"
        "<|im_start|>user\n"
        "{% if message.content is string %}"
        "{{ message.content }}"
        "{% endif %}"
        "{% if message.content is iterable %}"
        "{% for content in message.content %}"
        "{% if content.type == 'image_url' and content.image_url is string %}"
        "{{ content.image_url }}"
        "{% endif %}"
        "{% if content.type == 'image_url' and content.image_url is mapping %}"
        "{{ content.image_url.url }}"
        "{% endif %}"
        "{% endfor %}"
        "{% for content in message.content %}"
        "{% if content.type == 'text' %}"
        "{{ content.text }}"
        "{% endif %}"
        "{% endfor %}"
        "{% endif %}"
        "<|im_end|>"
        "{% endif %}"
        # Assistant message
        "{% if message.role == 'assistant' %}"
        "<|im_start|>assistant\n"
        "{{ message.content }}"
        "<|im_end|>"
        "{% endif %}"
        "{% endfor %}"
        # Generation prompt
        "{% if add_generation_prompt %}"
        "<|im_start|>assistant\n"
        "{% endif %}"
    )

class Llama3VisionAlphaChatHandler(Llava15ChatHandler):
    DEFAULT_SYSTEM_MESSAGE = None
    CHAT_FORMAT = (
        "{% for message in messages %}"
        "<|start_header_id|>"
        "{% if message.role == 'user' %}"
        "user<|end_header_id|>\n\n"
        "{% if message.content is iterable %}"
        # <image>
        "{% for content in message.content %}"
        "{% if content.type == 'image_url' %}"
        "{% if content.image_url is string %}"
        "{{ content.image_url }}"
        "{% endif %}"
        "{% if content.image_url is mapping %}"
        "{{ content.image_url.url }}"
        "{% endif %}"
        "{% endif %}"
        "{% endfor %}"
        # Question:
        "{% for content in message.content %}"
        "{% if content.type == 'text' %}"
        "{{ content.text }}"
        "{% endif %}"
        "{% endfor %}"
        "{% endif %}"
        # Question:
        "{% if message.content is string %}"
        "{{ message.content }}"
        "{% endif %}"
        "{% endif %}"
        # Answer:
        "{% if message.role == 'assistant' %}"
        "assistant<|end_header_id|>\n\n"
        "{{ message.content }}"
        "{% endif %}"
        "<|eot_id|>"
        "{% endfor %}"
        # Generation prompt
        "{% if add_generation_prompt %}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        "{% endif %}"
    )


class Llava16ChatHandler(Llava15ChatHandler):
    DEFAULT_SYSTEM_MESSAGE = ("A chat between a curious human and an artificial intelligence assistant. The assistant "
                              "gives helpful, detailed, and polite answers to the human's questions. ")
    CHAT_FORMAT = (
        "{% for message in messages %}"
        "{% if message.role == 'system' %}"
        "{{ message.content }}"
        "{% endif %}"
        "{% if message.role == 'user' %}"
        "{% if message.content is iterable %}"
        # <image>
        "{% for content in message.content %}"
        "{% if content.type == 'image_url' %}"
        "{% if content.image_url is string %}"
        "{{ content.image_url }}\n"
        "{% endif %}"
        "{% if content.image_url is mapping %}"
        "{{ content.image_url.url }}\n"
        "{% endif %}"
        "{% endif %}"
        "{% endfor %}"
        # Question:
        "{% for content in message.content %}"
        "{% if content.type == 'text' %}"
        "{{ content.text }}"
        "{% endif %}"
        "{% endfor %}"
        "{% endif %}"
        # Question:
        "{% if message.content is string %}"
        "{{ message.content }}"
        "{% endif %}"
        "{% endif %}"
        # Answer:
        "{% if message.role == 'assistant' %}"
        "{{ message.content }}"
        "{% endif %}"
        "{% endfor %}"
        # Generation prompt
        "{% if add_generation_prompt %}"
        "Answer:"
        "{% endif %}"
    )


class MiniCPMv26ChatHandler(Llava15ChatHandler):
    """MiniCPM-V 2.6 (its ``resampler`` projector, llava-uhd slices): ChatML with a default system
    message, a user message's images before its text."""

    DEFAULT_SYSTEM_MESSAGE = "You are a helpful assistant."

    CHAT_FORMAT = (
        "{% for message in messages %}"
        "{% if loop.first and messages[0]['role'] != 'system' %}"
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "{% endif %}"
        "<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is iterable %}"
        "{% for content in message['content'] %}"
        "{% if content.type == 'image_url' %}"
        "{% if content.image_url is string %}"
        "{{ content.image_url }}"
        "{% endif %}"
        "{% if content.image_url is mapping %}"
        "{{ content.image_url.url }}"
        "{% endif %}"
        "{% endif %}"
        "{% endfor %}"
        "{% for content in message['content'] %}"
        "{% if content.type == 'text' %}"
        "{{ content.text }}"
        "{% endif %}"
        "{% endfor %}"
        "{% endif %}"
        "{% if message['content'] is string %}"
        "{{ message['content'] }}"
        "{% endif %}"
        "<|im_end|>\n"
        "{% endfor %}"
        "{% if add_generation_prompt %}"
        "<|im_start|>assistant\n"
        "{% endif %}"
    )


class Qwen25VLChatHandler(Llava15ChatHandler):
    """llama-cpp-python's handler for Qwen2.5-VL (over a qwen2.5vl_merger projector; the other
    Qwen VL mergers run the same way): ChatML with "You are a helpful assistant." as the default
    system message, a message's image and text parts in their order, each image's URL the media
    marker; the image's tokens take their 2-D M-RoPE positions (generation.multimodal). Its
    state is the Llama's prompt cache, as every handler's here (llama-cpp-python clears it first
    and decodes the whole prompt again: the same text, the same positions)."""

    DEFAULT_SYSTEM_MESSAGE = "You are a helpful assistant."

    CHAT_FORMAT = (
        "{% for message in messages %}"
        "{% if loop.first and message['role'] != 'system' %}"
        "<|im_start|>system\n"
        "{{ self.DEFAULT_SYSTEM_MESSAGE }}<|im_end|>\n"
        "{% endif %}"
        "<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}"
        "{{ message['content'] }}<|im_end|>\n"
        "{% else %}"
        "{% for content in message['content'] %}"
        "{% if content['type'] == 'image_url' %}"
        "{% if content.image_url is string %}"
        "{{ content.image_url }}"
        "{% else %}"
        "{{ content.image_url.url }}"
        "{% endif %}"
        "{% elif content['type'] == 'text' %}"
        "{{ content['text'] }}"
        "{% endif %}"
        "{% endfor %}"
        "<|im_end|>\n"
        "{% endif %}"
        "{% endfor %}"
        "<|im_start|>assistant\n"
    )


Llama3VisionAlpha = Llama3VisionAlphaChatHandler  # llama-cpp-python's alias
