"""The README's Python snippets run as written, each on its own, on the default model."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def python_snippets() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", README.read_text(), flags=re.S | re.M)


def run_snippet(source: str) -> str:
    """Runs a snippet in a namespace of its own (none depends on another); returns what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, str(README), "exec"), {"__name__": "__readme__"})
    return out.getvalue()


def test_every_snippet_runs_on_the_default_model():
    snippets = python_snippets()
    assert len(snippets) == 4
    outputs = [run_snippet(s) for s in snippets]
    # speculative decoding: the renamed function, and drafts that were accepted
    assert "width" in outputs[0] and "<|im_" not in outputs[0]
    stats = outputs[0].splitlines()[-1]
    assert stats.startswith("SpeculativeStats(") and "n_accepted=0," not in stats
    outputs = outputs[1:]
    assert outputs[0] == ""
    assert outputs[1].strip() and "<|im_" not in outputs[1]
    assert outputs[2].splitlines()[-1] == repr("{}\n\n")    # the greedy token that opens (and closes) an object
