"""Offline batch generation: JSONL rows in, one answer per row out, in input order.

The engine of ``ferrollama batch``, in process and on each Ray worker (ferrollama.ray): a
:class:`BatchGenerator` loads the model once and decodes many prompts together through the
continuous-batching :class:`~ferrollama.generation.scheduler.Scheduler` (one sequence per prompt,
as ``Llama.create_completion`` does with a list of prompts). Both paths run this same code, so
greedy answers do not depend on where a row ran.

Input rows are ``{"id": ..., "prompt": "..."}``, or ``{"id": ..., "messages": [...]}`` for chat
(rendered with the model's chat template). Output rows are
``{"id", "text", "finish_reason", "usage"}``. :func:`resume_point` tells how many rows an earlier
run's output already holds, so that a run picks up where the last one stopped.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from ._core import Model
from .generation.params import SamplingParams
from .models import model_file

__all__ = ["BatchInputError", "BatchOptions", "BatchGenerator", "read_rows", "parse_rows", "resume_point"]


class BatchInputError(ValueError):
    """A malformed input or output file, naming the file and line."""


# --- input ---------------------------------------------------------------------------------------

def _check_row(row: Any, where: str, chat: bool) -> dict:
    """The row if it is one this run can answer; BatchInputError naming where it is otherwise."""
    if not isinstance(row, dict):
        raise BatchInputError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "id" not in row:
        raise BatchInputError(f"{where}: no \"id\"")
    if isinstance(row["id"], bool) or not isinstance(row["id"], (str, int)):
        raise BatchInputError(f"{where}: \"id\" must be a string or an integer, not {json.dumps(row['id'])}")
    key = "messages" if chat else "prompt"
    other = "prompt" if chat else "messages"
    if key not in row:
        hint = f" (rows with \"{other}\" need {'no ' if chat else ''}--chat)" if other in row else ""
        raise BatchInputError(f"{where}: no \"{key}\"{hint}")
    unknown = sorted(set(row) - {"id", key})
    if unknown:
        raise BatchInputError(f"{where}: unknown field \"{unknown[0]}\" (a row holds \"id\" and \"{key}\")")
    if chat:
        _check_messages(row["messages"], where)
    elif not isinstance(row["prompt"], str):
        raise BatchInputError(f"{where}: \"prompt\" must be a string")
    return row


def _check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise BatchInputError(f"{where}: \"messages\" must be a non-empty list of messages")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BatchInputError(f"{where}: message {k} must be an object with a \"role\"")


def parse_rows(lines: Iterable[str], chat: bool = False, name: str = "<input>") -> list[dict]:
    """Rows of JSONL text (blank lines skipped); BatchInputError naming the line of a malformed
    row, a row without its prompt, or an id given twice."""
    rows: list[dict] = []
    first_line: dict[Any, int] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise BatchInputError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        row = _check_row(row, where, chat)
        key = _id_key(row["id"])
        if key in first_line:
            raise BatchInputError(f"{where}: id {json.dumps(row['id'])} was already given on line {first_line[key]}")
        first_line[key] = lineno
        rows.append(row)
    return rows


def _id_key(value: Any) -> tuple[str, Any]:
    """Ids compared with their type: 1 and "1" are different ids."""
    return (type(value).__name__, value)


def read_rows(path: str | os.PathLike[str], chat: bool = False) -> list[dict]:
    """The rows of a JSONL file (see :func:`parse_rows`)."""
    with open(path, encoding="utf-8") as f:
        return parse_rows(f, chat, os.fspath(path))


# --- resuming ------------------------------------------------------------------------------------

def resume_point(out_path: str | os.PathLike[str], rows: Sequence[dict], group_size: int = 1) -> int:
    """How many rows the output of an earlier run already answers (the first K, in order), the
    file cut to those rows.

    K is a multiple of group_size (rows are answered in groups: a group cut short is answered
    again whole, so that its answers are those of an uninterrupted run). A last line cut short by
    an interrupted run is removed too; a complete row whose id is not the input's next one is an
    error (the output belongs to another input)."""
    if not os.path.exists(out_path):
        return 0
    with open(out_path, "rb") as f:
        data = f.read()
    ends = [0]  # ends[k]: where the k-th answer ends
    for line in data.splitlines(keepends=True):
        n_done = len(ends) - 1
        try:
            row = json.loads(line) if line.endswith(b"\n") else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            row = None
        if not isinstance(row, dict):
            if ends[-1] + len(line) < len(data):
                raise BatchInputError(f"{os.fspath(out_path)}:{n_done + 1}: not an output row; "
                                      "remove the file to start again")
            break  # the last line, cut short: answer its row again
        if n_done >= len(rows) or _id_key(row.get("id")) != _id_key(rows[n_done]["id"]):
            expected = json.dumps(rows[n_done]["id"]) if n_done < len(rows) else "no more rows"
            raise BatchInputError(f"{os.fspath(out_path)}:{n_done + 1}: id {json.dumps(row.get('id'))} where the "
                                  f"input has {expected}; the output is from another input")
        ends.append(ends[-1] + len(line))
    n_done = len(ends) - 1
    if n_done < len(rows):
        n_done -= n_done % group_size
    if ends[n_done] < len(data):
        with open(out_path, "r+b") as f:
            f.truncate(ends[n_done])
    return n_done


# --- generation ----------------------------------------------------------------------------------

@dataclass
class BatchOptions:
    """How rows are answered: the same on every worker."""

    #: tokens per answer at most (None: until the sequence's context is full)
    max_tokens: int | None = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    #: rows are "messages" rendered with the model's chat template
    chat: bool = False
    #: sequences decoded together
    n_seq: int = 8
    #: tokens each sequence holds (prompt and answer)
    n_ctx: int = 2048
    n_batch: int = 512
    n_ubatch: int | None = None
    n_threads: int | None = None
    n_threads_batch: int | None = None
    type_k: str = "f16"
    type_v: str = "f16"
    use_mmap: bool = True


class BatchGenerator:
    """A model answering rows, a group at a time, many decoded together (one sequence each).

    A group is decoded on a scheduler of its own, made for it: a row's answer depends on its
    group only (the engine's sums round differently with the number of tokens decoded
    together), so rows grouped alike get the same answers wherever the groups run.
    """

    def __init__(self, model_path: str | os.PathLike[str] | None = None, options: BatchOptions | None = None,
                 model: Model | None = None):
        self.options = o = options or BatchOptions()
        o.sampling.validate()
        self.model = model or Model(model_file(model_path), use_mmap=o.use_mmap)
        self.template = None
        if o.chat:
            from .chat.templates import ChatTemplate

            self.template = ChatTemplate.from_model(self.model)

    def prompt_tokens(self, row: dict) -> list[int]:
        if self.template is not None:
            return self.template.tokens(self.model, row["messages"], add_generation_prompt=True)
        tokens = list(self.model.tokenize(row["prompt"], add_special=True, parse_special=True))
        return tokens or ([self.model.bos] if self.model.bos is not None else [])

    def _scheduler(self, n_rows: int):
        from .generation.scheduler import Scheduler

        o = self.options
        n_seq = max(1, min(o.n_seq, n_rows))
        return Scheduler(self.model, n_ctx=o.n_ctx * n_seq, n_seq=n_seq, n_batch=o.n_batch, n_ubatch=o.n_ubatch,
                         n_threads=o.n_threads, n_threads_batch=o.n_threads_batch, queue_size=n_rows,
                         type_k=o.type_k, type_v=o.type_v)

    def run(self, rows: Sequence[dict]) -> list[dict]:
        """Answers one group of rows (at most n_seq decoded at a time); the output rows in order."""
        from .generation.sampler import Sampler
        from .generation.scheduler import Request

        if not rows:
            return []
        o = self.options
        stops = self.template.stop_strings() if self.template is not None else []
        requests = [Request(self.prompt_tokens(r), o.sampling, o.max_tokens, stops) for r in rows]
        with self._scheduler(len(rows)) as scheduler:
            for row, request in zip(rows, requests):
                try:
                    scheduler.check(request)
                except ValueError as e:
                    raise BatchInputError(f"row {json.dumps(row['id'])}: {e}") from None
            jobs = scheduler.submit_many(requests, [Sampler(self.model, o.sampling) for _ in rows])
            return [_answer(row, job) for row, job in zip(rows, jobs)]

    def run_groups(self, rows: Sequence[dict], group_size: int) -> Iterator[dict]:
        """Answers rows in groups of group_size, one group after the other; yields in order."""
        for start in range(0, len(rows), group_size):
            yield from self.run(rows[start:start + group_size])


def _answer(row: dict, job: Any) -> dict:
    text, outs = job.result()
    usage = outs[-1].usage or {}
    return {"id": row["id"], "text": text, "finish_reason": outs[-1].finish_reason,
            "usage": {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
                      "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}}
