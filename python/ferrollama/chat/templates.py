"""Chat templates: the GGUF's Jinja ``tokenizer.chat_template`` rendered by jinja2.

The environment is the one Hugging Face transformers and llama.cpp give templates: a sandbox
with ``trim_blocks`` and ``lstrip_blocks``, the loop-control and ``{% generation %}`` extensions,
``raise_exception``, ``strftime_now``, a ``tojson`` that neither escapes HTML nor sorts keys, and
the ``bos_token`` / ``eos_token`` variables.

A model without a template gets the template of its architecture's family where llama.cpp has
that family's built-in format (Gemma: ``gemma``, Qwen: ``chatml``); any other gets ChatML, as in
llama.cpp, with one warning that says so and how to choose another.
"""
from __future__ import annotations

import json
import warnings
from datetime import datetime
from typing import Any, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..generation.tokens import add_bos_of

__all__ = ["ChatTemplate", "ChatTemplateError", "ChatTemplateWarning", "CHATML", "GEMMA", "BUILTIN_TEMPLATES",
           "FAMILY_TEMPLATES", "TURN_MARKERS", "jinja_environment"]

#: llama.cpp's fallback for models without a template (its built-in ``chatml``).
CHATML = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)


#: llama.cpp's built-in ``gemma`` format (llm_chat_apply_template): "assistant" is "model", the
#: contents are trimmed, and system messages (Gemma has no system turn) go before the next user
#: message's text, followed by a blank line.
GEMMA = (
    "{%- set ns = namespace(system='') -%}\n"
    "{%- for message in messages -%}\n"
    "  {%- if message.role == 'system' -%}\n"
    "    {%- set ns.system = ns.system + (message.content | trim) -%}\n"
    "  {%- else -%}\n"
    "    {%- set role = 'model' if message.role == 'assistant' else message.role -%}\n"
    "    {{- '<start_of_turn>' + role + '\\n' -}}\n"
    "    {%- if ns.system and role != 'model' -%}\n"
    "      {{- ns.system + '\\n\\n' -}}\n"
    "      {%- set ns.system = '' -%}\n"
    "    {%- endif -%}\n"
    "    {{- (message.content | trim) + '<end_of_turn>\\n' -}}\n"
    "  {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<start_of_turn>model\\n' -}}\n"
    "{%- endif -%}"
)

#: llama.cpp's built-in formats by the names --chat-template and chat_format= accept.
BUILTIN_TEMPLATES = {"chatml": CHATML, "gemma": GEMMA}

#: The built-in format of each architecture's family, for a GGUF that carries no template.
FAMILY_TEMPLATES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "qwen2": "chatml"}

#: Texts that open or close a turn in the common formats: a chat stops when the model writes one
#: (as a token or as text), instead of running on into a turn it makes up.
TURN_MARKERS = ("<|im_end|>", "<|im_start|>", "<end_of_turn>", "<start_of_turn>", "<|eot_id|>",
                "<|start_header_id|>", "<|end|>", "<|user|>", "<|assistant|>")


class ChatTemplateWarning(UserWarning):
    """A model without a chat template, chatted with through a format that may not be its own."""


class ChatTemplateError(ValueError):
    """A template that does not parse, or that refuses the conversation (raise_exception)."""


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (HF's assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """HF's tojson: json.dumps without HTML escaping and in the order the keys were given."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def jinja_environment() -> ImmutableSandboxedEnvironment:
    """The environment templates are rendered in (transformers' and llama.cpp's: see above)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A Jinja chat template with the special-token strings it may refer to."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", add_bos: bool = False):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        #: whether tokenizing adds BOS itself (then a BOS the template writes first is dropped)
        self.add_bos = add_bos
        try:
            self._template = jinja_environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"the chat template does not parse: {e.message} (line {e.lineno})") from None
        self.typed_content_only = self._takes_only_typed_content()

    def _takes_only_typed_content(self) -> bool:
        """Whether the template writes a message's content only when it is a list of typed parts
        (SmolVLM's iterates them): llama.cpp then gives it a string content as one text part
        (common/jinja/caps.cpp, common/chat.cpp messages_inp_normalizer). Probed by rendering a
        user message both ways."""
        probe = "STRING_MARKER"

        def writes(content: Any) -> bool:
            try:
                return probe in self._render_raw([{"role": "user", "content": content}], False)
            except ChatTemplateError:
                return False

        return not writes(probe) and writes([{"type": "text", "text": probe}])

    @classmethod
    def from_model(cls, model, override: str | None = None) -> "ChatTemplate":
        """``override`` (a built-in format's name or a Jinja source), else the model's own template,
        else its family's built-in format, else ChatML with a warning."""
        source = BUILTIN_TEMPLATES.get(override, override) if override else _model_template(model)
        piece = lambda t: "" if t is None else model.token_to_piece(t, True).decode("utf-8", "replace")  # noqa: E731
        return cls(source, bos_token=piece(model.bos), eos_token=piece(model.eos), add_bos=add_bos_of(model))

    def markers(self) -> list[str]:
        """The turn markers this template writes (where a chat's answer must end)."""
        return [m for m in TURN_MARKERS if m in self.source]

    def stop_tokens(self, model) -> frozenset[int]:
        """Tokens that end an answer besides the model's end-of-generation set (``is_eog``): the
        template's turn markers that are single tokens of the vocabulary."""
        stops = set()
        for marker in self.markers():
            ids = model.tokenize(marker, add_special=False, parse_special=True)
            if len(ids) == 1:
                stops.add(int(ids[0]))
        return frozenset(stops)

    def stop_strings(self) -> list[str]:
        """The turn markers as text, for a vocabulary that spells them out in several tokens."""
        return self.markers()

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True,
               tools: list[dict] | None = None, **extra: Any) -> str:
        """The template's text for a conversation, exactly as the template writes it (string
        contents as one text part where it takes only typed parts)."""
        if self.typed_content_only:
            messages = [{**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m.get("content"), str) else m
                        for m in messages]
        return self._render_raw(messages, add_generation_prompt, tools, **extra)

    def _render_raw(self, messages: Sequence[dict], add_generation_prompt: bool,
                    tools: list[dict] | None = None, **extra: Any) -> str:
        variables = dict(messages=list(messages), add_generation_prompt=add_generation_prompt,
                         bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        if tools is not None:
            variables["tools"] = tools
        try:
            return self._template.render(**variables)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template failed: {e}") from None

    def apply(self, messages: Sequence[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The prompt text as llama.cpp makes it: a BOS the tokenizer adds anyway is not written twice."""
        text = self.render(messages, add_generation_prompt, **kwargs)
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        return text

    def tokens(self, model, messages: Sequence[dict], add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
        """The prompt's tokens: special tokens in the text are parsed, BOS added when the model wants it."""
        return list(model.tokenize(self.apply(messages, add_generation_prompt, **kwargs),
                                   add_special=True, parse_special=True))


def _model_template(model) -> str:
    """The GGUF's template, or the family's built-in format, or ChatML (with a warning)."""
    if model.chat_template:
        return model.chat_template
    family = FAMILY_TEMPLATES.get(model.arch)
    if family is not None:
        return BUILTIN_TEMPLATES[family]
    warnings.warn(
        f"this {model.arch} model has no chat template (tokenizer.chat_template) and llama.cpp knows no format "
        f"for its family: using ChatML (<|im_start|>role ... <|im_end|>). Pass the model's own with "
        f"--chat-template NAME|JINJA or --chat-template-file on the command line, chat_format=NAME or "
        f"chat_template=JINJA in Python (names: {', '.join(BUILTIN_TEMPLATES)})",
        ChatTemplateWarning, stacklevel=2)
    return CHATML
