"""Record llama-cpp-python 0.3.36's chat formats, chat handlers and JSON-schema grammars.

Run in /work/bench-venv (llama-cpp-python installed):
    /work/bench-venv/bin/python benches/record_chat_formats.py
Writes tests/data/fixtures/chat_formats.json, which tests/test_llama_chat_format.py checks
ferrollama's llama_chat_format and llama_grammar against:
- every format registered with @register_chat_format: prompt and stop for a fixed set of conversations;
- Jinja2ChatFormatter on llama-cpp-python's template constants and the real models' templates;
- guess_chat_format_from_gguf_metadata on the real models' metadata and on template strings;
- the chat handlers (registered formats and chatml-function-calling) driven by a fake llama whose
  create_completion returns canned completions: the calls they make and the chat answers they give;
- json_schema_to_gbnf (llama-cpp-python's Python port of llama.cpp's converter) and, where
  ferrollama is importable, the engine's converter (llama.cpp's C++ one) on the same schemas.
"""
from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import llama_cpp
import llama_cpp.llama_chat_format as lcf
import llama_cpp.llama_grammar as lg

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "fixtures" / "chat_formats.json"
MODELS_DIR = Path(os.environ.get("FERROLLAMA_CACHE", Path.home() / ".cache" / "ferrollama"))
MODELS = ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "gemma-3-270m-q4_k_m.gguf"]

S = {"role": "system", "content": "You are terse."}
U1 = {"role": "user", "content": "Hello there"}
A1 = {"role": "assistant", "content": "Hi! How can I help?"}
U2 = {"role": "user", "content": "Name a colour."}
CONVERSATIONS = {
    "user": [U1],
    "system_user": [S, U1],
    "multi_turn": [S, U1, A1, U2],
    "multi_turn_no_system": [U1, A1, U2],
    "assistant_last": [S, U1, A1],
    "empty_system": [{"role": "system", "content": ""}, U1],
    "two_systems": [S, {"role": "system", "content": "Second system."}, U1],
    "special_chars": [{"role": "system", "content": "Use <b>bold</b> & 'quotes' \"here\"."},
                      {"role": "user", "content": "Ünïcødé — 日本語 <tag> & {braces} {system_message}\n  spaced  "}],
    "tool_messages": [S, U1, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "content": "18C", "tool_call_id": "call_1"},
        {"role": "function", "content": "sunny", "name": "get_weather"}],
    "content_parts": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}, A1, U2],
    "bot_role": [{"role": "bot", "content": "I am a bot."}, U1],
}


def formatters() -> dict:
    """name -> formatter of every @register_chat_format (the handler closes over its formatter)."""
    out = {}
    for name, handler in lcf.LlamaChatCompletionHandlerRegistry()._chat_handlers.items():
        code = getattr(handler, "__code__", None)
        if code is None or "chat_formatter" not in code.co_freevars:
            continue
        out[name] = handler.__closure__[code.co_freevars.index("chat_formatter")].cell_contents
    return out


def render(formatter, messages, **kwargs) -> dict:
    try:
        r = formatter(messages=copy.deepcopy(messages), **kwargs)
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e)}
    return {"prompt": r.prompt, "stop": r.stop, "added_special": r.added_special,
            "has_stopping_criteria": r.stopping_criteria is not None}


def record_formats() -> dict:
    return {name: {conv: render(f, msgs) for conv, msgs in CONVERSATIONS.items()}
            for name, f in formatters().items()}


def model_metadata() -> dict:
    out = {}
    for name in MODELS:
        path = MODELS_DIR / name
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        out[name] = {"metadata": dict(llm.metadata),
                     "bos": llm._model.token_get_text(llm.token_bos()) if llm.token_bos() >= 0 else "",
                     "eos": llm._model.token_get_text(llm.token_eos())}
    return out


def record_jinja(metadata: dict) -> dict:
    templates = {
        "CHATML": (lcf.CHATML_CHAT_TEMPLATE, lcf.CHATML_EOS_TOKEN, lcf.CHATML_BOS_TOKEN),
        "MISTRAL_INSTRUCT": (lcf.MISTRAL_INSTRUCT_CHAT_TEMPLATE, lcf.MISTRAL_INSTRUCT_EOS_TOKEN,
                             lcf.MISTRAL_INSTRUCT_BOS_TOKEN),
        "MIXTRAL_INSTRUCT": (lcf.MIXTRAL_INSTRUCT_CHAT_TEMPLATE, lcf.MISTRAL_INSTRUCT_EOS_TOKEN,
                             lcf.MISTRAL_INSTRUCT_BOS_TOKEN),
        "LLAMA3_INSTRUCT": (lcf.LLAMA3_INSTRUCT_CHAT_TEMPLATE, "<|eot_id|>", "<|begin_of_text|>"),
    }
    for name, m in metadata.items():
        if "tokenizer.chat_template" in m["metadata"]:  # gemma-3-270m's GGUF has none
            templates[name] = (m["metadata"]["tokenizer.chat_template"], m["eos"], m["bos"])
    out = {}
    for name, (template, eos, bos) in templates.items():
        cases = {}
        for add_gen in (True, False):
            f = lcf.Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos, add_generation_prompt=add_gen,
                                        stop_token_ids=[7])
            for conv in ("user", "system_user", "multi_turn", "multi_turn_no_system", "assistant_last", "special_chars"):
                cases[f"{conv}/add_generation_prompt={add_gen}"] = render(f, CONVERSATIONS[conv])
        out[name] = {"template": template, "eos_token": eos, "bos_token": bos, "cases": cases}
    return out


def record_guess(metadata: dict) -> dict:
    cases = {name: {"metadata": m["metadata"]} for name, m in metadata.items()}
    cases["chatml"] = {"metadata": {"tokenizer.chat_template": lcf.CHATML_CHAT_TEMPLATE}}
    cases["mistral"] = {"metadata": {"tokenizer.chat_template": lcf.MISTRAL_INSTRUCT_CHAT_TEMPLATE}}
    cases["mixtral"] = {"metadata": {"tokenizer.chat_template": lcf.MIXTRAL_INSTRUCT_CHAT_TEMPLATE}}
    cases["llama3"] = {"metadata": {"tokenizer.chat_template": lcf.LLAMA3_INSTRUCT_CHAT_TEMPLATE}}
    cases["chatml_plus_space"] = {"metadata": {"tokenizer.chat_template": lcf.CHATML_CHAT_TEMPLATE + " "}}
    cases["no_template"] = {"metadata": {"general.architecture": "llama"}}
    for case in cases.values():
        case["guess"] = lcf.guess_chat_format_from_gguf_metadata(case["metadata"])
    return cases


# --- handlers driven by a fake llama --------------------------------------------------------------

SCHEMAS = {
    "weather": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"]},
    "time": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["tz"]},
    "answer": {"type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "number"}},
               "required": ["answer", "score"]},
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & 'later'",
                                           "parameters": SCHEMAS["weather"]}},
         {"type": "function", "function": {"name": "get_time", "parameters": SCHEMAS["time"]}}]


def completion(cid: str, text: str, finish: str = "stop", logprobs=None, usage=(5, 3)) -> dict:
    return {"id": cid, "object": "text_completion", "created": 1700000000, "model": "fake.gguf",
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}


def chunks(cid: str, pieces: list, with_logprobs: bool = False) -> list:
    out = []
    for i, piece in enumerate(pieces):
        lp = ({"tokens": [piece], "text_offset": [i], "token_logprobs": [-0.5 * (i + 1)],
               "top_logprobs": [{piece: -0.5 * (i + 1), "x": -3.0}]} if with_logprobs else None)
        out.append({"id": cid, "object": "text_completion", "created": 1700000001, "model": "fake.gguf",
                    "choices": [{"text": piece, "index": 0, "logprobs": lp, "finish_reason": None}]})
    out.append({"id": cid, "object": "text_completion", "created": 1700000001, "model": "fake.gguf",
                "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "stop"}]})
    return out


LOGPROBS = {"tokens": ["Hi", "!"], "text_offset": [0, 2], "token_logprobs": [-0.25, -1.5],
            "top_logprobs": [{"Hi": -0.25, "Hello": -2.0}, {"!": -1.5, ".": -1.75}]}

# name -> (handler name, request kwargs, canned responses in call order)
HANDLER_CASES = {
    "chatml/plain": ("chatml", {"messages": CONVERSATIONS["multi_turn"], "max_tokens": 16, "seed": 3,
                                "temperature": 0.5, "stop": "END", "logit_bias": {"15": 1.5}},
                     [completion("cmpl-1", "Blue.")]),
    "chatml/logprobs": ("chatml", {"messages": CONVERSATIONS["user"], "logprobs": True, "top_logprobs": 2},
                        [completion("cmpl-2", "Hi!", logprobs=LOGPROBS)]),
    "chatml/stream": ("chatml", {"messages": CONVERSATIONS["user"], "stream": True, "stop": None},
                      [chunks("cmpl-3", ["Hel", "lo", "!"])]),
    "chatml/stream_logprobs": ("chatml", {"messages": CONVERSATIONS["user"], "stream": True, "logprobs": True,
                                          "top_logprobs": 2}, [chunks("cmpl-3b", ["A", "B"], with_logprobs=True)]),
    "chatml/json_object": ("chatml", {"messages": CONVERSATIONS["user"], "response_format": {"type": "json_object"}},
                           [completion("cmpl-4", "{}")]),
    "chatml/json_schema": ("chatml", {"messages": CONVERSATIONS["user"],
                                      "response_format": {"type": "json_object", "schema": SCHEMAS["answer"]}},
                           [completion("cmpl-5", "{\"answer\": \"x\", \"score\": 1}")]),
    "llama-2/named_tool": ("llama-2", {"messages": CONVERSATIONS["system_user"], "tools": TOOLS,
                                       "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
                           [completion("cmpl-6", "{\"city\": \"Paris\"}", logprobs=LOGPROBS)]),
    "llama-2/named_tool_stream": ("llama-2", {"messages": CONVERSATIONS["user"], "tools": TOOLS, "stream": True,
                                              "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
                                  [chunks("cmpl-7", ["{\"tz\"", ": \"UTC\"}"])]),
    "zephyr/legacy_functions": ("zephyr", {"messages": CONVERSATIONS["user"],
                                           "functions": [t["function"] for t in TOOLS],
                                           "function_call": {"name": "get_time"}},
                                [completion("cmpl-8", "{\"tz\": \"CET\"}")]),
    "gemma/unknown_tool": ("gemma", {"messages": CONVERSATIONS["user"], "tools": TOOLS,
                                     "tool_choice": {"type": "function", "function": {"name": "nope"}}}, []),
    "cfc/no_tools": ("chatml-function-calling", {"messages": CONVERSATIONS["special_chars"], "stop": "X",
                                                 "logprobs": True, "top_logprobs": 1},
                     [completion("cmpl-9", "Sure.", logprobs=LOGPROBS)]),
    "cfc/none_json": ("chatml-function-calling", {"messages": CONVERSATIONS["multi_turn"], "tools": TOOLS,
                                                  "tool_choice": "none", "response_format": {"type": "json_object"}},
                      [completion("cmpl-10", "{}")]),
    "cfc/named": ("chatml-function-calling", {"messages": CONVERSATIONS["special_chars"], "tools": TOOLS,
                                              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
                  [completion("cmpl-11", "{\"city\": \"Oslo\"}")]),
    "cfc/named_stream": ("chatml-function-calling", {"messages": CONVERSATIONS["user"], "tools": TOOLS, "stream": True,
                                                     "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
                         [chunks("cmpl-12", ["{\"tz\": ", "\"UTC\"}"])]),
    "cfc/auto_message": ("chatml-function-calling", {"messages": CONVERSATIONS["system_user"], "tools": TOOLS,
                                                     "tool_choice": "auto", "max_tokens": 20},
                         [completion("cmpl-13", "message"), completion("cmpl-14", "Just text.")]),
    "cfc/auto_message_stream": ("chatml-function-calling", {"messages": CONVERSATIONS["user"], "tools": TOOLS,
                                                            "tool_choice": "auto", "stream": True},
                                [completion("cmpl-15", "message"), chunks("cmpl-16", ["Te", "xt"])]),
    "cfc/auto_two_calls": ("chatml-function-calling", {"messages": CONVERSATIONS["tool_messages"], "tools": TOOLS,
                                                       "tool_choice": "auto", "max_tokens": 64, "seed": 11},
                           [completion("cmpl-17", "functions.get_weather", logprobs=LOGPROBS),
                            completion("cmpl-18", "{\"city\": \"Rome\"}", usage=(40, 6)),
                            completion("cmpl-19", "functions.get_time"),
                            completion("cmpl-20", "{\"tz\": \"UTC\"}", usage=(52, 5)),
                            completion("cmpl-21", "")]),
    "cfc/auto_one_call": ("chatml-function-calling", {"messages": CONVERSATIONS["user"], "tools": TOOLS,
                                                      "function_call": "auto",
                                                      "functions": [t["function"] for t in TOOLS]},
                          [completion("cmpl-22", "functions.get_time"),
                           completion("cmpl-23", "{\"tz\": \"CET\"}", usage=(30, 4)),
                           completion("cmpl-24", "")]),
    "cfc/auto_call_stream": ("chatml-function-calling", {"messages": CONVERSATIONS["user"], "tools": TOOLS,
                                                         "tool_choice": "auto", "stream": True},
                             [completion("cmpl-25", "functions.get_time")]),
    "cfc/unknown_tool": ("chatml-function-calling", {"messages": CONVERSATIONS["user"], "tools": TOOLS,
                                                     "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                         []),
}


class FakeLlama:
    """What a chat handler uses of a Llama; create_completion returns the canned responses in order."""

    verbose = False

    def __init__(self, responses: list):
        self.responses = list(responses)
        self.calls = []

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list:
        return ([1] if add_bos else []) + list(text) + ([-1] if special else [])

    def create_completion(self, **kwargs):
        self.calls.append(kwargs)
        response = self.responses.pop(0)
        return iter(copy.deepcopy(response)) if kwargs.get("stream") else copy.deepcopy(response)


def describe_call(call: dict, schemas: list) -> dict:
    out = {}
    for key, value in call.items():
        if key == "grammar" and value is not None:
            text = value._grammar
            match = next((s for s in schemas if lg.json_schema_to_gbnf(json.dumps(s)) == text), None)
            value = {"json_schema": match} if match is not None else {"gbnf": text}
        elif key == "stopping_criteria":
            value = None if value is None else "present"
        elif key == "logits_processor":
            value = None if value is None else "present"
        out[key] = value
    return out


def record_handlers() -> dict:
    schemas = list(SCHEMAS.values())
    out = {}
    for case, (handler_name, request, responses) in HANDLER_CASES.items():
        llama = FakeLlama(responses)
        handler = lcf.get_chat_completion_handler(handler_name)
        entry = {"handler": handler_name, "request": request, "responses": responses}
        try:
            result = handler(llama=llama, **copy.deepcopy(request))
            entry["result"] = list(result) if request.get("stream") else result
        except Exception as e:
            entry["error"] = {"type": type(e).__name__, "message": str(e)}
        entry["calls"] = [describe_call(c, schemas) for c in llama.calls]
        out[case] = entry
    return out


# --- JSON schema -> GBNF ---------------------------------------------------------------------------

GRAMMAR_SCHEMAS = {
    **SCHEMAS,
    "nested": {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object",
               "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"},
                                                                    "maxItems": 3}}}}}, "required": ["items"]},
    "enum_const": {"type": "object", "properties": {"kind": {"enum": ["a", "b", 3, None]}, "v": {"const": "x"}}},
    "string_bounds": {"type": "string", "minLength": 2, "maxLength": 5},
    "pattern": {"type": "string", "pattern": "^[a-z]{2}-[0-9]+(ab|c)?$"},
    "oneof": {"oneOf": [{"type": "integer"}, {"type": "boolean"}, {"type": "null"}]},
    "ref": {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}}},
            "type": "array", "items": {"$ref": "#/$defs/pt"}, "minItems": 1},
    "additional": {"type": "object", "additionalProperties": {"type": "integer"}},
    "formats": {"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                                                 "u": {"type": "string", "format": "uuid"}}},
    "integer_bounds": {"type": "integer", "minimum": -5, "maximum": 120},
    "empty": {},
}
PROP_ORDER_CASES = {"weather_days_first": ("weather", ["days"]), "answer_score_first": ("answer", ["score", "answer"])}


def record_grammars() -> dict:
    try:
        sys.path.insert(0, str(ROOT / "python"))
        from ferrollama import _core
        engine = _core.samplers.Grammar.json_schema_to_gbnf
    except ImportError:
        engine = None
    out = {"schemas": {}, "prop_order": {}}
    for name, schema in GRAMMAR_SCHEMAS.items():
        text = json.dumps(schema)
        entry = {"schema": schema, "python": lg.json_schema_to_gbnf(text)}
        if engine is not None:
            entry["engine"] = engine(text)
            entry["equal"] = entry["engine"] == entry["python"]
        out["schemas"][name] = entry
    for name, (schema_name, order) in PROP_ORDER_CASES.items():
        out["prop_order"][name] = {"schema": GRAMMAR_SCHEMAS[schema_name], "prop_order": order,
                                   "python": lg.json_schema_to_gbnf(json.dumps(GRAMMAR_SCHEMAS[schema_name]), order)}
    out["constants"] = {n: getattr(lg, n) for n in ("ARITHMETIC_GBNF", "C_GBNF", "CHESS_GBNF", "JAPANESE_GBNF",
                                                     "JSON_ARR_GBNF", "JSON_GBNF", "LIST_GBNF")}
    return out


TOKENIZER_TEXTS = ["Hello world", " leading space", "<|im_start|>user\nHi<|im_end|>", "Ünïcødé 日本語 🙂", ""]


def record_tokenizer() -> dict:
    """llama_cpp.LlamaTokenizer on the Qwen model: tokenize with each flag, and detokenize back."""
    from llama_cpp.llama_tokenizer import LlamaTokenizer

    llm = llama_cpp.Llama(model_path=str(MODELS_DIR / MODELS[0]), vocab_only=True, verbose=False)
    tok = LlamaTokenizer(llm)  # holds llm._model only: llm must outlive it (its __del__ frees the model)
    cases = []
    for text in TOKENIZER_TEXTS:
        for add_bos in (True, False):
            for special in (True, False):
                ids = tok.tokenize(text.encode(), add_bos=add_bos, special=special)
                cases.append({"text": text, "add_bos": add_bos, "special": special, "tokens": ids,
                              "detokenized": tok.detokenize(ids).decode("utf-8", "replace"),
                              "detokenized_special": tok.detokenize(ids, special=True).decode("utf-8", "replace"),
                              "decode": tok.decode(ids), "encode": tok.encode(text, add_bos=add_bos, special=special)})
    del tok, llm
    return {"model": MODELS[0], "cases": cases}


def record_hf_tokenizer_config() -> dict:
    config = {"chat_template": lcf.CHATML_CHAT_TEMPLATE, "bos_token": "<s>", "eos_token": "<|im_end|>"}
    out = {"config": config, "cases": {}}
    for add_gen in (True, False):
        f = lcf.hf_tokenizer_config_to_chat_formatter(config, add_generation_prompt=add_gen)
        for conv in ("user", "multi_turn", "assistant_last"):
            out["cases"][f"{conv}/add_generation_prompt={add_gen}"] = render(f, CONVERSATIONS[conv])
    return out


def record_types() -> dict:
    """Each llama_types TypedDict's keys and required keys, and which names are aliases of which."""
    import llama_cpp.llama_types as lt

    out = {"typeddicts": {}, "aliases": {}, "unions": []}
    public = [n for n in dir(lt) if n[0].isupper() and n not in
              ("Any", "Dict", "List", "Optional", "Union", "Literal", "NotRequired", "TypedDict")]
    for name in public:
        value = getattr(lt, name)
        if isinstance(value, type) and hasattr(value, "__required_keys__"):
            if value.__name__ != name:
                out["aliases"][name] = value.__name__
            else:
                out["typeddicts"][name] = {"keys": list(value.__annotations__),
                                           "required": sorted(value.__required_keys__)}
        else:
            out["unions"].append(name)
    return out


def main() -> None:
    metadata = model_metadata()
    record = {
        "llama_cpp_python": llama_cpp.__version__,
        "conversations": CONVERSATIONS,
        "registered": list(lcf.LlamaChatCompletionHandlerRegistry()._chat_handlers),
        "formats": record_formats(),
        "jinja": record_jinja(metadata),
        "guess": record_guess(metadata),
        "handlers": record_handlers(),
        "grammars": record_grammars(),
        "tokenizer": record_tokenizer(),
        "types": record_types(),
        "hf_tokenizer_config": record_hf_tokenizer_config(),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    n_formats = len(record["formats"])
    print(f"{n_formats} formats x {len(CONVERSATIONS)} conversations, {len(record['jinja'])} templates, "
          f"{len(record['handlers'])} handler cases, {len(record['grammars']['schemas'])} schemas -> {OUT}")
    if "equal" in next(iter(record["grammars"]["schemas"].values())):
        differ = [n for n, e in record["grammars"]["schemas"].items() if not e["equal"]]
        print(f"engine converter differs from llama-cpp-python's Python converter on: {differ}")


if __name__ == "__main__":
    main()
