"""`ferrollama generate` run as a user would: llama.cpp's greedy text, the timings, context
shifting, Self-Extend, the prompt cache, interactive mode through a pseudo-terminal, and errors."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from conftest import model_path

DATA = Path(__file__).parent / "data"
TINY = DATA / "models" / "tiny-llama-f32.gguf"
QWEN = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
GEMMA = "gemma-3-270m-q4_k_m.gguf"


def ferrollama(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferrollama.cli", *map(str, args)], capture_output=True,
                          text=True, encoding="utf-8", **kwargs)


def greedy_cases(name: str) -> list[dict]:
    data = json.loads((DATA / "fixtures" / f"greedy_{name}.json").read_text())
    return [c for c in data["cases"] if c["kind"] == "plain"]


#: llama.cpp's top-2 logit margin below which a greedy choice is a near-tie: the engine's logits
#: may differ from llama.cpp's by that much (gemma3: top-1 agreement >= 90%, REFERENCE.md)
NEAR_TIE = 0.1


def stable_text(case: dict) -> tuple[str, bool]:
    """The recorded text up to the first near-tie, and whether that is all of it."""
    margins = [s["margin"] for s in case["steps"]]
    k = next((i for i, m in enumerate(margins) if m < NEAR_TIE), len(margins))
    return "".join(case["pieces"][:k]), k == len(margins)


def test_greedy_text_is_llama_cpp_s_qwen():
    """`generate -p "def is_prime(n):\\n" -n 32 --temp 0` prints llama.cpp's text exactly (the
    record has no near-tie); other records agree up to their first near-tie ("The capital of
    France is" has a 0.008 margin at its third token)."""
    cases = greedy_cases("qwen2.5-coder-0.5b")
    assert cases[0]["prompt"] == "def is_prime(n):\n" and stable_text(cases[0])[1]
    for case in cases:
        prompt = case["prompt"].replace("\n", "\\n")   # as typed on a command line; -p processes escapes
        r = ferrollama("generate", "-m", model_path(QWEN), "-p", prompt, "-n", len(case["generated_tokens"]),
                       "--temp", "0", "-c", case["context"]["n_ctx"])
        assert r.returncode == 0, r.stderr
        text, complete = stable_text(case)
        if complete:
            assert r.stdout == case["prompt"] + case["text"] + "\n"
        else:
            assert r.stdout.startswith(case["prompt"] + text), case["prompt"]


def test_greedy_text_is_llama_cpp_s_gemma():
    """Gemma's records have near-ties; the text must agree up to the first one (all of it if none)."""
    for case in greedy_cases("gemma-3-270m"):
        prompt = case["prompt"].replace("\n", "\\n")
        r = ferrollama("generate", "-m", model_path(GEMMA), "-p", prompt, "-n", len(case["generated_tokens"]),
                       "--temp", "0", "-c", case["context"]["n_ctx"])
        assert r.returncode == 0, r.stderr
        text, whole = stable_text(case)
        assert len(text) >= 10
        if whole:
            assert r.stdout == case["prompt"] + case["text"] + "\n"
        else:
            assert r.stdout.startswith(case["prompt"] + text)


def test_timings_on_stderr():
    import ferrollama as fl

    n_prompt = len(fl.Model(str(TINY)).tokenize("Hello", add_special=True, parse_special=True))
    r = ferrollama("generate", "-m", TINY, "-p", "Hello", "-n", 8, "--temp", "0", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    prompt = re.search(r"prompt eval time = +[\d.]+ ms / +(\d+) tokens \( *[\d.]+ ms per token, +([\d.]+) tokens per second\)",
                       r.stderr)
    gen = re.search(r"        eval time = +[\d.]+ ms / +(\d+) runs +\( *[\d.]+ ms per token, +([\d.]+) tokens per second\)",
                    r.stderr)
    assert prompt and gen, r.stderr
    assert int(prompt.group(1)) == n_prompt
    assert int(gen.group(1)) == 7             # the 8th token is sampled but not decoded
    assert float(prompt.group(2)) > 0 and float(gen.group(2)) > 0
    assert "load time" in r.stderr and "sampling time" in r.stderr


def test_no_display_prompt_and_stdout_is_only_text():
    a = ferrollama("generate", "-m", TINY, "-p", "Hello", "-n", 8, "--temp", "0", "--ignore-eos")
    b = ferrollama("generate", "-m", TINY, "-p", "Hello", "-n", 8, "--temp", "0", "--ignore-eos", "--no-display-prompt")
    assert a.stdout.startswith("Hello") or a.stdout.startswith(" Hello")
    assert a.stdout.endswith(b.stdout) and len(b.stdout) < len(a.stdout)


def test_context_shift_keeps_generating_past_the_context():
    r = ferrollama("generate", "-m", TINY, "-p", "Once upon a time", "-n", 400, "-c", 256, "--temp", "0",
                   "--ignore-eos", "--keep", 2)
    assert r.returncode == 0, r.stderr
    runs = int(re.search(r"        eval time = .* / +(\d+) runs", r.stderr).group(1))
    assert runs == 399
    stopped = ferrollama("generate", "-m", TINY, "-p", "Once upon a time", "-n", 400, "-c", 256, "--temp", "0",
                         "--ignore-eos", "--no-context-shift")
    assert stopped.returncode == 0
    assert "context full" in stopped.stderr
    runs = int(re.search(r"        eval time = .* / +(\d+) runs", stopped.stderr).group(1))
    assert runs < 256


def test_context_shift_matches_the_explicit_loop():
    """The CLI's shift is llama-cli's: keep n_keep, drop half of the rest, move the rest back."""
    import numpy as np

    import ferrollama as fl

    r = ferrollama("generate", "-m", TINY, "-p", "Once upon a time", "-n", 300, "-c", 256, "--temp", "0",
                   "--ignore-eos", "--keep", 1, "--no-display-prompt", "-ctk", "f32", "-ctv", "f32")
    assert r.returncode == 0, r.stderr
    model = fl.Model(str(TINY))
    ctx = fl.Context(model, n_ctx=256, type_k="f32", type_v="f32")
    tokens = list(model.tokenize("Once upon a time", add_special=True, parse_special=True))
    n_keep = 1 + 1
    ctx.decode(fl.Batch.from_tokens(tokens, logits="last"))
    n_past, out = len(tokens), []
    eog = [t for t in range(model.n_vocab) if model.is_eog(t)]
    for _ in range(300):
        logits = ctx.logits(-1).copy()
        logits[eog] = -np.inf                        # --ignore-eos
        token = int(np.argmax(logits))
        out.append(token)
        if len(out) == 300:
            break
        if n_past + 1 >= 256:
            n_discard = (n_past - n_keep) // 2
            ctx.kv.seq_rm(0, n_keep, n_keep + n_discard)
            ctx.kv.seq_add(0, n_keep + n_discard, n_past, -n_discard)
            n_past -= n_discard
        ctx.decode(fl.Batch.from_tokens([token], pos0=n_past, logits="last"))
        n_past += 1
    expected = b"".join(model.token_to_piece(t) for t in out).decode("utf-8", "replace")
    assert r.stdout == expected + "\n"


def test_self_extend_runs_past_the_window():
    r = ferrollama("generate", "-m", TINY, "-p", "Once upon a time", "-n", 300, "-c", 512, "--temp", "0",
                   "--ignore-eos", "-gan", 2, "-gaw", 64)
    assert r.returncode == 0, r.stderr
    bad = ferrollama("generate", "-m", TINY, "-p", "x", "-gan", 3, "-gaw", 64)
    assert bad.returncode == 1 and "multiple of --grp-attn-n" in bad.stderr


def test_prompt_cache_reuses_the_matching_prefix(tmp_path):
    cache = tmp_path / "prompt.bin"
    args = ["generate", "-m", TINY, "-n", 16, "--temp", "0", "--ignore-eos", "--prompt-cache", cache, "-v"]
    first = ferrollama(*args, "-p", "The quick brown fox jumps over the lazy dog")
    assert first.returncode == 0, first.stderr
    assert cache.exists() and cache.stat().st_size > 0
    again = ferrollama(*args, "-p", "The quick brown fox jumps over the lazy dog")
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    n = int(re.search(r"session file matches (\d+) / (\d+)", again.stderr).group(1))
    assert n == int(re.search(r"session file matches (\d+) / (\d+)", again.stderr).group(2))
    prompt_evals = int(re.search(r"prompt eval time = .* / +(\d+) tokens", again.stderr).group(1))
    assert prompt_evals <= 1          # only the last prompt token is re-evaluated for its logits
    saved = cache.read_bytes()
    other = ferrollama(*args, "-p", "The quick brown fox eats", "--prompt-cache-ro")
    assert other.returncode == 0, other.stderr
    assert int(re.search(r"session file matches (\d+) /", other.stderr).group(1)) >= 4
    assert cache.read_bytes() == saved          # read-only: the cache is not rewritten


def test_prompt_cache_all_saves_the_output(tmp_path):
    cache = tmp_path / "all.bin"
    base = ["generate", "-m", TINY, "-n", 8, "--temp", "0", "--ignore-eos", "--prompt-cache", cache, "-v"]
    first = ferrollama(*base, "-p", "Hello there", "--prompt-cache-all")
    assert first.returncode == 0, first.stderr
    prompt = first.stdout.rstrip("\n")
    second = ferrollama(*base, "-p", prompt.lstrip(" "), "--no-display-prompt")
    assert second.returncode == 0, second.stderr
    matched, total = map(int, re.search(r"session file matches (\d+) / (\d+)", second.stderr).groups())
    assert matched >= total - 1 > 3


def spawn(args: list[str]):
    """The command on a pseudo-terminal of 24 x 100 characters: (pid, the terminal's fd)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-m", "ferrollama.cli", *map(str, args)])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    return pid, fd


def read_until(fd: int, pattern: str, timeout: float = 60.0) -> str:
    out, end = b"", time.time() + timeout
    while time.time() < end:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            if re.search(pattern, out.decode("utf-8", "replace")):
                return out.decode("utf-8", "replace")
    raise AssertionError(f"{pattern!r} not seen in {out[-500:]!r}")


def wait(pid: int, fd: int, timeout: float = 60.0) -> int:
    """The exit code; meanwhile reads the terminal, so that the process never blocks writing
    to it, and shows what it printed if it does not exit."""
    out, end = b"", time.time() + timeout
    while time.time() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if select.select([fd], [], [], 0.05)[0]:
            try:
                out += os.read(fd, 4096)
            except OSError:
                pass
    os.kill(pid, 9)
    raise AssertionError(f"the process did not exit; it printed {out[-1000:]!r}")


def test_interactive_mode_through_a_terminal():
    pid, fd = spawn(["generate", "-m", TINY, "-p", "Hello", "-n", 6, "--temp", "0", "--ignore-eos", "-i",
                     "--in-prefix", "USER: ", "--in-suffix", "BOT:", "--no-warmup"])
    try:
        read_until(fd, r"USER: $")               # 6 tokens generated, control returned to the user
        os.write(fd, b"tell me more\n")
        read_until(fd, r"(?s)BOT:.*USER: $")      # the suffix, more tokens, the prefix again
        os.write(fd, b"\x04")                     # Ctrl-D: end of input
        read_until(fd, r"EOF by user")
        assert wait(pid, fd) == 0
    finally:
        os.close(fd)


def test_ctrl_c_in_interactive_mode_returns_control():
    # --context-shift: generation goes on until the Ctrl-C (a full context would end it first).
    pid, fd = spawn(["generate", "-m", TINY, "-p", "Hello", "-n", -1, "--temp", "0", "--ignore-eos", "-i",
                     "--in-prefix", "USER> ", "-c", 256, "--no-warmup", "--context-shift"])
    try:
        time.sleep(1.0)
        read_until(fd, r"Hello")
        os.write(fd, b"\x03")                     # Ctrl-C while generating: back to the user
        read_until(fd, r"USER> $")
        os.write(fd, b"\x04")
        assert wait(pid, fd) == 0
    finally:
        os.close(fd)


# --- errors a person can act on ---------------------------------------------------------------

def one_line_error(r: subprocess.CompletedProcess, text: str) -> None:
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert text in r.stderr and "Traceback" not in r.stderr


def test_prompt_longer_than_the_context():
    r = ferrollama("generate", "-m", TINY, "-p", "word " * 300, "-c", 256)
    one_line_error(r, "the prompt is too long")
    assert "max 252)" in r.stderr


def test_missing_and_malformed_models(tmp_path):
    one_line_error(ferrollama("generate", "-m", tmp_path / "none.gguf", "-p", "x"), "none.gguf: no such model file")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(10))
    one_line_error(ferrollama("generate", "-m", bad, "-p", "x"), "")


def test_unsupported_architecture(tmp_path):
    data = TINY.read_bytes().replace(b"\x05\x00\x00\x00\x00\x00\x00\x00llama", b"\x05\x00\x00\x00\x00\x00\x00\x00lla_a", 1)
    odd = tmp_path / "odd.gguf"
    odd.write_bytes(data)
    one_line_error(ferrollama("generate", "-m", odd, "-p", "x"), "lla_a")


@pytest.mark.parametrize("flags, text", [
    (["--temp", "warm"], "expected a number"),
    (["-n", "1.5"], "expected an integer"),
    (["-ctk", "q6_k"], "unsupported cache type 'q6_k'"),
    (["-l", "15043*2"], "TOKEN_ID(+/-)BIAS"),
    (["-l", "999999+1"], "outside the vocabulary"),
    (["--samplers", "top_k;banana"], "unknown sampler 'banana'"),
    (["--mirostat", "3"], "invalid choice"),
    (["-j", "{not json"], "not valid JSON"),
    (["--grammar-file", "/nonexistent.gbnf"], "no such grammar file"),
    (["-f", "/nonexistent.txt"], "give -p or -f, not both"),
    (["--bogus-flag"], "unrecognized arguments"),
])
def test_bad_flag_values(flags, text):
    one_line_error(ferrollama("generate", "-m", TINY, "-p", "x", "-n", 1, *flags), text)


def test_missing_prompt_file():
    one_line_error(ferrollama("generate", "-m", TINY, "-f", "/nonexistent.txt"), "/nonexistent.txt: no such prompt file")


def test_verbose_shows_the_traceback(tmp_path):
    r = ferrollama("generate", "-m", TINY, "-p", "word " * 300, "-c", 256, "--verbose")
    assert r.returncode == 1 and "Traceback" in r.stderr and "the prompt is too long" in r.stderr


def test_grammar_constrains_the_output():
    r = ferrollama("generate", "-m", TINY, "-p", "Answer:", "-n", 12, "--temp", "0", "--no-display-prompt",
                   "--grammar", 'root ::= ("yes" | "no") "."')
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n").removesuffix(" [end of text]") in ("yes.", "no.")


def test_json_schema_constrains_the_output():
    r = ferrollama("generate", "-m", TINY, "-p", "JSON:", "-n", 64, "--temp", "0", "--no-display-prompt", "-j",
                   '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}')
    assert r.returncode == 0, r.stderr
    text = r.stdout.rstrip("\n").removesuffix(" [end of text]")
    assert set(json.loads(text)) == {"a"}


def test_stdout_is_valid_utf8_when_text_is_split_across_tokens():
    r = subprocess.run([sys.executable, "-m", "ferrollama.cli", "generate", "-m", str(TINY), "-p", "日本語の文章",
                        "-n", "40", "--temp", "0", "--ignore-eos"], capture_output=True)
    assert r.returncode == 0
    r.stdout.decode("utf-8")        # the tiny vocabulary spells these characters byte by byte
    assert "日本語の文章" in r.stdout.decode("utf-8")


def test_classifier_free_guidance_matches_the_explicit_loop():
    import numpy as np

    import ferrollama as fl
    from ferrollama import samplers as S

    prompt, negative, scale, n = "Once upon a time", "The weather", 2.5, 12
    r = ferrollama("generate", "-m", TINY, "-p", prompt, "-n", n, "--temp", "0", "--ignore-eos", "--no-display-prompt",
                   "--cfg-negative-prompt", negative, "--cfg-scale", scale, "-ctk", "f32", "-ctv", "f32")
    assert r.returncode == 0, r.stderr
    model = fl.Model(str(TINY))
    eog = [t for t in range(model.n_vocab) if model.is_eog(t)]
    main, guide = (fl.Context(model, n_ctx=256, type_k="f32", type_v="f32") for _ in range(2))
    tokens = list(model.tokenize(prompt, add_special=True, parse_special=True))
    neg = list(model.tokenize(negative, add_special=True, parse_special=True))
    main.decode(fl.Batch.from_tokens(tokens, logits="last"))
    guide.decode(fl.Batch.from_tokens(neg, logits="last"))
    out = []
    for i in range(n):
        logits = S.apply_guidance(main.logits(-1), guide.logits(-1), scale)
        logits[eog] = -np.inf
        out.append(int(np.argmax(logits)))
        main.decode(fl.Batch.from_tokens([out[-1]], pos0=len(tokens) + i, logits="last"))
        guide.decode(fl.Batch.from_tokens([out[-1]], pos0=len(neg) + i, logits="last"))
    out = out[:n]
    assert r.stdout == b"".join(model.token_to_piece(t) for t in out).decode("utf-8", "replace") + "\n"
    plain = ferrollama("generate", "-m", TINY, "-p", prompt, "-n", n, "--temp", "0", "--ignore-eos",
                       "--no-display-prompt", "-ctk", "f32", "-ctv", "f32")
    assert plain.stdout != r.stdout


def test_control_vectors(tmp_path):
    import gguf
    import numpy as np

    def write(path, scale):
        w = gguf.GGUFWriter(path, "controlvector")
        w.add_string("controlvector.model_hint", "llama")
        w.add_uint32("controlvector.layer_count", 2)
        for layer in (1,):
            w.add_tensor(f"direction.{layer}", np.full(256, scale, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    zero, strong = tmp_path / "zero.gguf", tmp_path / "strong.gguf"
    write(zero, 0.0)
    write(strong, 3.0)
    base = ["generate", "-m", TINY, "-p", "Hello", "-n", 10, "--temp", "0", "--ignore-eos", "--no-display-prompt"]
    plain = ferrollama(*base)
    assert ferrollama(*base, "--control-vector", zero).stdout == plain.stdout
    steered = ferrollama(*base, "--control-vector", strong)
    assert steered.returncode == 0, steered.stderr
    assert steered.stdout != plain.stdout
    assert ferrollama(*base, "--control-vector-scaled", strong, "0").stdout == plain.stdout
    # the direction of layer 1 outside the range [2, 2] changes nothing
    assert ferrollama(*base, "--control-vector", strong, "--control-vector-layer-range", 2, 2).stdout == plain.stdout
    halves = ferrollama(*base, "--control-vector-scaled", strong, "0.5", "--control-vector-scaled", strong, "0.5")
    assert halves.stdout == steered.stdout
    one_line_error(ferrollama(*base, "--control-vector", tmp_path / "none.gguf"), "no such control vector file")


def test_unsupported_tensor_type(tmp_path):
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(TINY)
    path = tmp_path / "f64.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    for name, field in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.name == "token_embd.weight":   # F64: a type GGUF names and the engine does not compute in
            writer.add_tensor(t.name, np.zeros((512, 256), dtype=np.float64), raw_dtype=gguf.GGMLQuantizationType.F64)
        else:
            writer.add_tensor(t.name, np.asarray(t.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    one_line_error(ferrollama("generate", "-m", path, "-p", "x"), "F64")


def test_default_model_is_read_in_place_and_generates(tmp_path):
    """The README's first command: no -m, the default model's installed packages are read where
    pip put them (the cache gets a list of the pieces, sha256 checked, not a copy), and greedy
    text is llama.cpp's up to the record's first near-tie."""
    case = next(c for c in greedy_cases("qwen2.5-coder-0.5b") if c["prompt"] == "The capital of France is")
    text, _ = stable_text(case)
    env = dict(os.environ, FERROLLAMA_CACHE=str(tmp_path), FERROLLAMA_MODELS_DIR=str(tmp_path / "none"))
    r = ferrollama("generate", "-p", case["prompt"], "-n", "8", "--temp", "0", env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{QWEN}.pieces", f"{QWEN}.pieces.sha256"]
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) < 2000
    want = case["prompt"] + text
    assert r.stdout.startswith(want[:len(r.stdout.rstrip("\n"))]) and len(r.stdout) > len(case["prompt"]) + 8


@pytest.mark.parametrize("n", ["-3", "-5", "-1000"])
def test_n_predict_below_minus_two_is_an_error(n):
    r = ferrollama("generate", "-m", TINY, "-p", "Hello", "-n", n, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == (f"error: ferrollama generate: argument -n/--n-predict: expected N >= 0, -1 (infinite) "
                        f"or -2 (until the context is full), got '{n}'\n")


@pytest.mark.parametrize("n", ["-1", "-2"])
def test_infinite_generation_stops_at_a_full_context_without_context_shift(n):
    """llama-cli: with context shift off (its default), -1 and -2 both stop when the context is full."""
    r = ferrollama("generate", "-m", TINY, "-p", "Once upon a time", "-n", n, "-c", 256, "--temp", "0",
                   "--ignore-eos", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "context full" in r.stderr
    prompt = len(fl_model(TINY).tokenize("Once upon a time", add_special=True, parse_special=True))
    runs = int(re.search(r"        eval time = .* / +(\d+) runs", r.stderr).group(1))
    assert runs == 256 - prompt - 1     # the last sampled token would not fit: n_past + 1 >= n_ctx


def fl_model(path):
    import ferrollama as fl

    return fl.Model(str(path))


def test_unknown_flag_names_the_command():
    r = ferrollama("generate", "-m", TINY, "-p", "Hello", "--bogus", "1")
    assert r.returncode == 1
    assert r.stderr == "error: ferrollama generate: unrecognized arguments: --bogus 1\n"


def test_json_schema_output_is_llama_cpp_s_whitespace_included():
    """The grammar's space rule is llama.cpp's SPACE_RULE (at most 22 characters of whitespace
    between tokens); llama.cpp's greedy output under the same grammar ends in the same 20."""
    case = json.loads((DATA / "fixtures" / "json_whitespace_gemma-3-270m.json").read_text())
    from ferrollama import samplers as S

    assert S.Grammar.json_schema_to_gbnf(case["schema"]) + "\n" == case["gbnf"]   # (recorded from a file printed with its newline)
    assert 'space ::= | " " | "\\n"{1,2} [ \\t]{0,20}' in case["gbnf"]
    r = ferrollama("generate", "-m", model_path(case["model"]), "-p", case["prompt"], "-n", case["max_tokens"],
                   "--temp", "0", "-c", 512, "-j", json.dumps(case["schema"]), "--no-display-prompt")
    assert r.returncode == 0, r.stderr
    assert r.stdout == case["text"] + " [end of text]\n\n"
