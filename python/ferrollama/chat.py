"""Chat templates: the GGUF's Jinja ``tokenizer.chat_template`` rendered by jinja2.

The environment is the one Hugging Face transformers and llama.cpp give templates: a sandbox
with ``trim_blocks`` and ``lstrip_blocks``, the loop-control and ``{% generation %}`` extensions,
``raise_exception``, ``strftime_now``, a ``tojson`` that neither escapes HTML nor sorts keys, and
the ``bos_token`` / ``eos_token`` variables. A model without a template gets ChatML, as in
llama.cpp.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "ChatTemplateError", "CHATML"]

#: llama.cpp's fallback for models without a template.
CHATML = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)


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


def _environment() -> ImmutableSandboxedEnvironment:
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
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"the chat template does not parse: {e.message} (line {e.lineno})") from None

    @classmethod
    def from_model(cls, model, override: str | None = None) -> "ChatTemplate":
        """The model's own template (or ``override``, or ChatML when it has none)."""
        from .llama import add_bos_of

        source = override or _model_template(model) or CHATML
        piece = lambda t: "" if t is None else model.token_to_piece(t, True).decode("utf-8", "replace")  # noqa: E731
        return cls(source, bos_token=piece(model.bos), eos_token=piece(model.eos), add_bos=add_bos_of(model))

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True,
               tools: list[dict] | None = None, **extra: Any) -> str:
        """The template's text for a conversation, exactly as the template writes it."""
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


def _model_template(model) -> str | None:
    return model.chat_template or None
