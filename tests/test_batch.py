"""`ferrollama batch` in process: llama.cpp's greedy texts for every row, in input order, resuming
after an earlier run's output (a cut-short last line answered again), and bad input named by line.
(On Ray: test_ray.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import model_path
from test_cli_generate import QWEN, greedy_cases, stable_text

from ferrollama.batch import BatchInputError, parse_rows, resume_point
from ferrollama.cli import main

FIXTURES = Path(__file__).parent / "data" / "fixtures"


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def batch(*args) -> int:
    return main(["batch", "-m", str(model_path(QWEN)), "--temp", "0", "-t", "2", "-c", "512", *map(str, args)])


def test_answers_every_row_in_order_with_llama_cpp_s_greedy_text(tmp_path):
    """Three plain prompts, each twice, decoded together on 4 sequences (so a row waits for a
    free one): one row per id, in input order, each text llama.cpp's greedy text up to its
    first near-tie."""
    cases = greedy_cases("qwen2.5-coder-0.5b")
    rows = [{"id": f"r{k}", "prompt": cases[k % len(cases)]["prompt"]} for k in range(2 * len(cases))]
    src, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    assert batch("-i", src, "-o", out, "-n", 32, "-np", 4) == 0
    answers = read_jsonl(out)
    assert [a["id"] for a in answers] == [r["id"] for r in rows]
    for k, a in enumerate(answers):
        case = cases[k % len(cases)]
        text, whole = stable_text(case)
        assert a["text"] == case["text"] if whole else a["text"].startswith(text)
        assert a["finish_reason"] == "length"
        assert a["usage"] == {"prompt_tokens": len(case["prompt_tokens"]), "completion_tokens": 32,
                              "total_tokens": len(case["prompt_tokens"]) + 32}


def test_chat_rows_are_rendered_with_the_template(tmp_path):
    """--chat: llama.cpp's greedy chat answer (up to its first near-tie) for the recorded messages;
    it ends at the end-of-turn token."""
    data = json.loads((FIXTURES / "greedy_qwen2.5-coder-0.5b.json").read_text())
    case = next(c for c in data["cases"] if c["kind"] == "chat")
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": 7, "messages": case["messages"]}])
    out = tmp_path / "out.jsonl"
    assert batch("-i", src, "-o", out, "-n", 64, "--chat") == 0
    [answer] = read_jsonl(out)
    text, whole = stable_text(case)
    assert answer["id"] == 7 and answer["text"].startswith(text)
    assert answer["usage"]["prompt_tokens"] == len(case["prompt_tokens"])
    if whole:
        assert answer["text"] == case["text"] and answer["finish_reason"] == "stop"


def test_resumes_after_the_rows_already_answered(tmp_path, capsys):
    """Rows answered in groups of 2. An output holding the first two answers and half of the
    third: the run keeps the two, answers the third again and the rest, each id once, as an
    uninterrupted run does. An output holding three answers: the third's group is answered
    again whole (its answers depend on the group)."""
    rows = [{"id": k, "prompt": f"def f{k}(x):"} for k in range(5)]
    src, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    assert batch("-i", src, "-o", out, "-n", 4, "--group-size", 2) == 0
    full = out.read_text(encoding="utf-8")
    lines = full.splitlines(keepends=True)
    for kept, n_kept in (("".join(lines[:2]) + '{"id": 2, "te', 2), ("".join(lines[:3]), 2)):
        out.write_text(kept, encoding="utf-8")
        assert batch("-i", src, "-o", out, "-n", 4, "--group-size", 2) == 0
        assert out.read_text(encoding="utf-8") == full
        assert f"already answers {n_kept} of 5 rows; resuming" in capsys.readouterr().err
    assert batch("-i", src, "-o", out, "-n", 4, "--group-size", 2) == 0   # nothing left: nothing added
    assert out.read_text(encoding="utf-8") == full


def test_resume_point_checks_the_ids(tmp_path):
    rows = parse_rows(['{"id": "a", "prompt": "x"}', '{"id": "b", "prompt": "y"}'])
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a", "text": ""}\n{"id": "c", "text": ""}\n')
    with pytest.raises(BatchInputError, match=r'out.jsonl:2: id "c" where the input has "b"'):
        resume_point(out, rows)
    out.write_text('{"id": "a", "text": ""}\nnot json\n{"id": "b", "text": ""}\n')
    with pytest.raises(BatchInputError, match="out.jsonl:2: not an output row"):
        resume_point(out, rows)
    out.write_text('{"id": "a", "text": ""}\n{"id": "b", "text": ""}\n{"id": "z"}\n')
    with pytest.raises(BatchInputError, match='out.jsonl:3: id "z" where the input has no more rows'):
        resume_point(out, rows)


@pytest.mark.parametrize("lines,flags,message", [
    (['{"id": 1, "prompt": "a"}', '{"id": 2, "prompt": "b"'], [], r"in.jsonl:2: not valid JSON"),
    (['{"id": 1, "prompt": "a"}', '', '{"id": 2}'], [], r'in.jsonl:3: no "prompt"'),
    (['{"prompt": "a"}'], [], r'in.jsonl:1: no "id"'),
    (['{"id": 1, "prompt": "a"}', '{"id": 1, "prompt": "b"}'], [], r"in.jsonl:2: id 1 was already given on line 1"),
    (['{"id": 1, "messages": [{"role": "user", "content": "hi"}]}'], [], r'in.jsonl:1: no "prompt" \(rows with "messages" need --chat\)'),
    (['{"id": 1, "prompt": "a"}'], ["--chat"], r'in.jsonl:1: no "messages" \(rows with "prompt" need no --chat\)'),
    (['{"id": 1, "prompt": "a", "label": "x"}'], [], r'in.jsonl:1: unknown field "label"'),
    (['{"id": [1], "prompt": "a"}'], [], r'in.jsonl:1: "id" must be a string or an integer'),
    (['{"id": 1, "prompt": 5}'], [], r'in.jsonl:1: "prompt" must be a string'),
    (['{"id": 1, "messages": []}'], ["--chat"], r'in.jsonl:1: "messages" must be a non-empty list'),
    (['[1, 2]'], [], r"in.jsonl:1: expected a JSON object, got list"),
])
def test_bad_input_is_named_by_line(tmp_path, capsys, lines, flags, message):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    assert batch("-i", src, "-o", tmp_path / "out.jsonl", *flags) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "out.jsonl").exists()


def test_flag_errors(tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "prompt": "a" * 3000}])
    assert batch("-i", src, "-o", tmp_path / "out.jsonl", "--workers", 2) == 1
    assert "--address and --workers need --ray" in capsys.readouterr().err
    assert batch("-i", src, "-o", src) == 1
    assert "--output must not be the input file" in capsys.readouterr().err
    assert batch("-i", tmp_path / "nope.jsonl", "-o", tmp_path / "out.jsonl") == 1
    assert "nope.jsonl: no such input file" in capsys.readouterr().err
    # a prompt longer than a sequence's context: named by its id
    assert batch("-i", src, "-o", tmp_path / "out.jsonl", "-c", 256) == 1
    assert "row 1: the prompt has" in capsys.readouterr().err


def test_ray_flags_without_ray_installed_say_how_to_install_it(tmp_path, capsys, monkeypatch):
    """Ray is an extra: without it, --ray (batch and serve) is one line naming the pip command."""
    monkeypatch.setitem(__import__("sys").modules, "ray", None)   # `import ray` fails as if not installed
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "prompt": "a"}])
    assert batch("-i", src, "-o", tmp_path / "out.jsonl", "--ray") == 1
    assert "this needs Ray: pip install 'ferrollama[ray]'" in capsys.readouterr().err
    assert main(["serve", "-m", str(model_path(QWEN)), "--ray", "--replicas", "2"]) == 1
    assert "this needs Ray: pip install 'ferrollama[ray]'" in capsys.readouterr().err
    assert main(["serve", "-m", str(model_path(QWEN)), "--replicas", "2"]) == 1
    assert "--replicas and --address need --ray" in capsys.readouterr().err
