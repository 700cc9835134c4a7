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


@contextlib.contextmanager
def readme_server():
    """`ferrollama serve` on 127.0.0.1:8080, the address the README's OpenAI-client snippet uses."""
    import subprocess
    import sys
    import time
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "ferrollama.cli", "serve", "--host", "127.0.0.1", "--port", "8080",
                             "-c", "2048"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:8080/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the server did not start: " + proc.stderr.read().decode()[-2000:])
                time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_every_snippet_runs_on_the_default_model():
    snippets = python_snippets()
    assert len(snippets) == 5
    outputs = [run_snippet(s) for s in snippets[:4]]
    # the OpenAI client's snippet runs against `ferrollama serve`, as the README starts it
    assert "OpenAI(" in snippets[4]
    with readme_server():
        answer = run_snippet(snippets[4])
    assert answer.strip() and "<|im_" not in answer
    # speculative decoding: the renamed function, and drafts that were accepted
    assert "width" in outputs[0] and "<|im_" not in outputs[0]
    stats = outputs[0].splitlines()[-1]
    assert stats.startswith("SpeculativeStats(") and "n_accepted=0," not in stats
    outputs = outputs[1:]
    assert outputs[0] == ""
    assert outputs[1].strip() and "<|im_" not in outputs[1]
    assert outputs[2].splitlines()[-1] == repr("{}\n\n")    # the greedy token that opens (and closes) an object
