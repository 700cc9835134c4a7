"""Chat: templates and tool calls, over generation (for ``add_bos_of``) and the core.

- ``templates``: :class:`ChatTemplate`, the GGUF's Jinja chat template (or a built-in format)
  rendered as transformers and llama.cpp render it;
- ``tools``: which format a template's model writes tool calls in, parsing them from its output
  (also while streaming), and a grammar that forces one.

``Llama``, the server and the command line all chat through these.
"""
from .templates import (BUILTIN_TEMPLATES, CHATML, FAMILY_TEMPLATES, GEMMA, TURN_MARKERS, ChatTemplate,
                        ChatTemplateError, ChatTemplateWarning, jinja_environment)

__all__ = ["ChatTemplate", "ChatTemplateError", "ChatTemplateWarning", "CHATML", "GEMMA", "BUILTIN_TEMPLATES",
           "FAMILY_TEMPLATES", "TURN_MARKERS", "jinja_environment"]
