"""Tool calls: which format a chat template's model writes them in, how to find them in its
output, and a grammar that forces one (tool_choice "required" or a named function).

The formats, as llama.cpp's chat parsers know them:

- ``hermes`` (Qwen 2.5 / Qwen 3, Hermes): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
- ``llama3`` (Llama 3.1+): ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` or ``[TOOL_CALLS]name[ARGS]{...}``
- ``gpt-oss`` (harmony): ``<|channel|>commentary to=functions.NAME ... <|message|>{...}<|call|>``
- ``generic`` (Gemma and templates without tools): a JSON object ``{"name": ..., "arguments": {...}}``
  (or ``{"tool_call": {...}}`` / ``{"tool_calls": [...]}``), bare or in a fenced block, and
  Gemma's ```` ```tool_code\\nname(arg=value)\\n``` ````; the tools are described to the model in
  a system message (:func:`tools_system_prompt`).

Nothing here depends on the server: ``Llama`` can use the same functions.
"""
from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

__all__ = ["ToolCall", "ParsedOutput", "detect_format", "parse_output", "tool_call_marker",
           "required_call_grammar", "tools_system_prompt", "FORMATS", "ToolPlan", "plan_tools", "ToolGate",
           "assistant_message", "fallback_messages", "finish_reason", "tool_choice_of_function_call",
           "with_function_call"]

FORMATS = ("hermes", "llama3", "mistral", "gpt-oss", "generic")


@dataclass
class ToolCall:
    name: str
    #: the arguments as a JSON text (OpenAI's shape)
    arguments: str
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = "call_" + uuid.uuid4().hex[:24]

    def to_openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


@dataclass
class ParsedOutput:
    content: str
    tool_calls: list[ToolCall]
    reasoning: str = ""


def detect_format(template_source: str) -> str:
    """The tool-call format of the model a chat template belongs to."""
    if "<|channel|>" in template_source:
        return "gpt-oss"
    if "<tool_call>" in template_source:
        return "hermes"
    if "[TOOL_CALLS]" in template_source:
        return "mistral"
    if "<|start_header_id|>" in template_source and "tools" in template_source:
        return "llama3"
    return "generic"


def template_takes_tools(template_source: str) -> bool:
    """Whether the template renders a ``tools`` variable itself."""
    return re.search(r"\btools\b", template_source) is not None


def tool_call_marker(fmt: str) -> str | None:
    """The text that opens a tool call (streamed content stops there); None: the whole output
    may be a call, so nothing is streamed as content before the end."""
    return {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "gpt-oss": "<|channel|>"}.get(fmt)


# --- parsing -------------------------------------------------------------------------------------

def _arguments_text(args: Any) -> str:
    if isinstance(args, str):
        return args
    return json.dumps(args if args is not None else {}, ensure_ascii=False)


def _call_from_object(obj: Any) -> ToolCall | None:
    """A call from {"name", "arguments" | "parameters"} (also OpenAI's {"function": {...}})."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = {**obj["function"], "id": obj.get("id", "")}
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return ToolCall(name, _arguments_text(args), str(obj.get("id") or ""))


def _json_values(text: str) -> list[tuple[int, int, Any]]:
    """Every top-level JSON object or array in text: (start, end, value)."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = decoder.raw_decode(text, i)
                out.append((i, end, value))
                i = end
                continue
            except json.JSONDecodeError:
                pass
        i += 1
    return out


def _calls_in_value(value: Any) -> list[ToolCall] | None:
    """Calls in one JSON value (an object, a list of them, or a generic wrapper); None if none."""
    if isinstance(value, dict) and "tool_calls" in value and isinstance(value["tool_calls"], list):
        value = value["tool_calls"]
    elif isinstance(value, dict) and isinstance(value.get("tool_call"), dict):
        value = value["tool_call"]
    items = value if isinstance(value, list) else [value]
    calls = [_call_from_object(v) for v in items]
    return calls if calls and all(c is not None for c in calls) else None  # type: ignore[return-value]


def _parse_hermes(text: str) -> ParsedOutput:
    calls, content = [], []
    pos = 0
    for m in re.finditer(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S):
        parsed = _calls_in_value(_loads(m.group(1)))
        if parsed is None:
            continue
        content.append(text[pos:m.start()])
        calls += parsed
        pos = m.end()
    content.append(text[pos:])
    if not calls and starts_like_json_call(text):  # small Qwen models often leave the tags out
        return _parse_json_calls(text)
    return ParsedOutput("".join(content).strip() if calls else text, calls)


def starts_like_json_call(text: str) -> bool:
    """Whether an output begins as a bare JSON call would (then it is not streamed as content)."""
    head = text.lstrip()
    return head.startswith(("{", "[{", "```"))


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _parse_json_calls(text: str, prefix: str = "") -> ParsedOutput:
    """Calls written as JSON values (after an optional prefix such as <|python_tag|>)."""
    body = text
    if prefix and prefix in text:
        head, _, body = text.partition(prefix)
    else:
        head = ""
    calls, rest, pos = [], [head], 0
    for start, end, value in _json_values(body):
        parsed = _calls_in_value(value)
        if parsed is None:
            continue
        rest.append(body[pos:start])
        calls += parsed
        pos = end
    rest.append(body[pos:])
    if not calls:
        return ParsedOutput(text, [])
    content = "".join(rest).strip().strip(";").strip()
    if re.fullmatch(r"(?:```(?:json)?|\s)*", content):  # only the fences the calls were in
        content = ""
    return ParsedOutput(content, calls)


def _parse_mistral(text: str) -> ParsedOutput:
    head, marker, body = text.partition("[TOOL_CALLS]")
    if not marker:
        return ParsedOutput(text, [])
    named = re.findall(r"([A-Za-z0-9_\-.]+)\[ARGS\](\{.*?\})(?=\[TOOL_CALLS\]|[A-Za-z0-9_\-.]+\[ARGS\]|$)", body, re.S)
    if named:
        return ParsedOutput(head.strip(), [ToolCall(n, a) for n, a in named])
    parsed = _parse_json_calls(body)
    return ParsedOutput(head.strip(), parsed.tool_calls) if parsed.tool_calls else ParsedOutput(text, [])


_HARMONY = re.compile(r"(?:<\|start\|>assistant)?<\|channel\|>(\w+)([^<]*?)(?:<\|constrain\|>\w+)?<\|message\|>(.*?)"
                      r"(?:<\|end\|>|<\|call\|>|<\|return\|>|$)", re.S)


def _parse_harmony(text: str) -> ParsedOutput:
    """gpt-oss: analysis -> reasoning, commentary to=functions.NAME -> a call, final -> content."""
    content, reasoning, calls = [], [], []
    for channel, header, body in _HARMONY.findall(text):
        target = re.search(r"to=functions\.([A-Za-z0-9_\-.]+)", header)
        if target:
            calls.append(ToolCall(target.group(1), body.strip()))
        elif channel == "analysis":
            reasoning.append(body)
        else:
            content.append(body)
    if not (content or reasoning or calls):
        return ParsedOutput(text, [])
    return ParsedOutput("".join(content), calls, "".join(reasoning))


def _parse_tool_code(text: str) -> ParsedOutput:
    """Gemma's ```tool_code\\nname(arg=value, ...)\\n``` blocks (Python call syntax)."""
    calls, pos, rest = [], 0, []
    for m in re.finditer(r"```tool_code\s*(.*?)```", text, re.S):
        try:
            node = ast.parse(m.group(1).strip(), mode="eval").body
            if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Name, ast.Attribute)):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        except (SyntaxError, ValueError):
            continue
        rest.append(text[pos:m.start()])
        calls.append(ToolCall(name, json.dumps(args, ensure_ascii=False)))
        pos = m.end()
    rest.append(text[pos:])
    return ParsedOutput("".join(rest).strip() if calls else text, calls)


def parse_output(text: str, fmt: str) -> ParsedOutput:
    """The content, tool calls (and gpt-oss's reasoning) of a model's output in format fmt."""
    if fmt == "hermes":
        return _parse_hermes(text)
    if fmt == "mistral":
        return _parse_mistral(text)
    if fmt == "gpt-oss":
        return _parse_harmony(text)
    if fmt == "llama3":
        return _parse_json_calls(text, "<|python_tag|>")
    parsed = _parse_tool_code(text)
    return parsed if parsed.tool_calls else _parse_json_calls(text)


# --- forcing a call ------------------------------------------------------------------------------

def _call_schema(tools: list[dict], fmt: str) -> dict:
    """The JSON schema of one call to any of the tools."""
    args_key = "parameters" if fmt == "llama3" else "arguments"
    options = [{"type": "object",
                "properties": {"name": {"const": t["function"]["name"]},
                               args_key: t["function"].get("parameters") or {"type": "object"}},
                "required": ["name", args_key]} for t in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _gbnf_literal(text: str) -> str:
    return json.dumps(text)


def required_call_grammar(tools: list[dict], fmt: str, json_schema_to_gbnf, parallel: bool = True) -> str:
    """A GBNF grammar whose sentences are calls (one, or several when parallel) to the tools,
    written the way the format's model writes them. ValueError for gpt-oss (no such grammar yet)."""
    if fmt == "gpt-oss":
        raise ValueError("tool_choice 'required' or a named function is not supported for gpt-oss templates")
    gbnf = json_schema_to_gbnf(_call_schema(tools, fmt))
    body = re.sub(r"^root ::=", "tool-call-json ::=", gbnf, count=1, flags=re.M)
    def repeated(item: str, sep: str) -> str:
        return item + (" (" + sep + " " + item + ")*" if parallel else "")

    newline = '"\\n"'
    if fmt == "hermes":
        one = _gbnf_literal("<tool_call>") + " " + newline + " tool-call-json " + newline + " " + _gbnf_literal("</tool_call>")
        root = "root ::= " + repeated("tool-call", newline) + "\ntool-call ::= " + one + "\n"
    elif fmt == "mistral":
        root = "root ::= " + _gbnf_literal("[TOOL_CALLS]") + ' "[" ' + repeated("tool-call-json", '"," " "?') + ' "]"\n'
    else:
        root = "root ::= " + repeated("tool-call-json", newline) + "\n"
    return root + body


def tools_system_prompt(tools: list[dict]) -> str:
    """How the tools are described to a model whose template does not take them (generic format)."""
    described = json.dumps([t["function"] for t in tools], ensure_ascii=False, indent=2)
    return ("You can call these tools:\n" + described + "\n\nTo call a tool, answer only with a JSON object "
            'such as {"name": "tool_name", "arguments": {...}}; otherwise answer normally.')


# --- a chat request with tools ------------------------------------------------------------------

def fallback_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """Tools described in a system message, calls and results as plain text (templates without tools)."""
    out = [{"role": "system", "content": tools_system_prompt(tools)}]
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"Tool result: {m['content']}"})
        elif m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": json.dumps(calls[0] if len(calls) == 1 else calls)})
        else:
            out.append(m)
    if len(out) > 1 and out[1]["role"] == "system":  # one system message, not two
        out[1:2], out[0] = [], {"role": "system", "content": out[1]["content"] + "\n\n" + out[0]["content"]}
    return out


@dataclass
class ToolPlan:
    """How a chat request with tools is rendered and read back."""

    #: the messages to render (tools described in a system message for templates without tools)
    messages: list[dict]
    #: extra template variables (``tools`` for templates that take them)
    template_kwargs: dict
    #: the format to parse the answer with (None: no tools, plain content)
    format: str | None
    #: a GBNF grammar forcing a call (tool_choice "required" or a named function), else None
    grammar: str | None


def plan_tools(template_source: str, messages: list[dict], tools: list[dict], tool_choice: Any,
               json_schema_to_gbnf, parallel: bool = True) -> ToolPlan:
    """The rendering of messages with tools under tool_choice ("none", "auto", "required" or
    {"type": "function", "function": {"name": ...}}): ValueError for a choice that names no tool."""
    choice = tool_choice if tool_choice is not None else ("auto" if tools else "none")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        tools = [t for t in tools if t["function"]["name"] == name]
        if not tools:
            raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    elif choice not in ("none", "auto", "required"):
        raise ValueError(f"tool_choice must be 'none', 'auto', 'required' or a function, not {choice!r}")
    if choice != "none" and not tools:
        raise ValueError("tool_choice needs tools")
    if choice == "none":
        return ToolPlan(messages, {}, None, None)
    fmt, kwargs = detect_format(template_source), {}
    if template_takes_tools(template_source):
        kwargs["tools"] = tools
    else:
        fmt, messages = "generic", fallback_messages(messages, tools)
    grammar = None
    if choice == "required" or isinstance(choice, dict):
        grammar = required_call_grammar(tools, fmt, json_schema_to_gbnf, parallel)
    return ToolPlan(messages, kwargs, fmt, grammar)


class ToolGate:
    """Streams content until a tool call may begin, then holds the rest for the final parse."""

    def __init__(self, fmt: str | None):
        self.fmt = fmt
        self.marker = tool_call_marker(fmt) if fmt else None
        self.text = ""
        self.sent = 0
        self.holding = fmt is not None and self.marker is None

    def push(self, text: str) -> str:
        self.text += text
        if self.fmt is None:
            self.sent = len(self.text)
            return text
        if self.holding:
            return ""
        if self.fmt == "hermes" and starts_like_json_call(self.text):
            self.holding = True
            return ""
        if self.fmt == "hermes" and not self.text.strip():
            return ""  # the first characters decide whether this is a bare JSON call
        at = self.text.find(self.marker, self.sent)  # type: ignore[arg-type]
        if at >= 0:
            self.holding = True
            out, self.sent = self.text[self.sent:at], at
            return out
        keep = max((k for k in range(1, len(self.marker)) if self.text.endswith(self.marker[:k])), default=0)  # type: ignore[index]
        end = len(self.text) - keep
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out

    def finish(self) -> tuple[str, list[ToolCall], str]:
        """(content not yet sent, tool calls, reasoning)."""
        if self.fmt is None:
            return self.text[self.sent:], [], ""
        parsed = parse_output(self.text, self.fmt)
        if not parsed.tool_calls and self.fmt != "gpt-oss":
            return self.text[self.sent:], [], ""
        unsent = parsed.content[self.sent:] if parsed.content.startswith(self.text[:self.sent]) else ""
        return unsent, parsed.tool_calls, parsed.reasoning


def assistant_message(text: str, fmt: str | None, parallel: bool, finish: str | None,
                      calls_in_content: bool = False) -> tuple[dict, str | None]:
    """The assistant message of a whole answer (content, tool_calls, reasoning_content) and its
    finish reason (see finish_reason). With ``calls_in_content`` the content is the answer's whole
    text, its tool calls as the model wrote them included (where llama-cpp-python leaves them)."""
    gate = ToolGate(fmt)
    content = gate.push(text)
    rest, calls, reasoning = gate.finish()
    calls = calls if parallel else calls[:1]
    if calls and calls_in_content:
        content, rest = text, ""
    message: dict[str, Any] = {"role": "assistant", "content": (content + rest) or (None if calls else "")}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [c.to_openai() for c in calls]
    return message, finish_reason(calls, finish)


def finish_reason(calls: list, finish: str | None) -> str | None:
    """The finish reason of an answer: "tool_calls" where it calls tools, but "length" where
    max_tokens cut it, calls or not (as llama-server says: the calls may be incomplete)."""
    return "tool_calls" if calls and finish != "length" else finish


def tool_choice_of_function_call(function_call: Any) -> Any:
    """The tool_choice of the older function_call ("none", "auto" or {"name": ...})."""
    if function_call is None or function_call in ("none", "auto"):
        return function_call
    if isinstance(function_call, dict) and "name" in function_call:
        return {"type": "function", "function": {"name": function_call["name"]}}
    raise ValueError(f"function_call must be 'none', 'auto' or {{'name': ...}}, not {function_call!r}")


def with_function_call(message: dict, legacy: bool) -> dict:
    """The older functions API also names the first call in function_call."""
    if legacy and message.get("tool_calls"):
        message["function_call"] = dict(message["tool_calls"][0]["function"])
    return message
