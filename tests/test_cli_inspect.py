"""`ferrollama inspect`: the header, every key with its type, the tensor table; malformed files."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

DATA = Path(__file__).parent / "data"
TINY = DATA / "models" / "tiny-llama-q4_k.gguf"


def ferrollama(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferrollama.cli", *map(str, args)], capture_output=True, text=True)


def test_dump_lists_every_key_with_its_type_and_every_tensor():
    r = ferrollama("inspect", TINY)
    assert r.returncode == 0, r.stderr
    reader = gguf.GGUFReader(TINY)
    lines = r.stdout.splitlines()
    kv_lines = [l for l in lines if " | " in l and " = " in l]
    assert len(kv_lines) == len(reader.fields)
    by_name = {l.split(" | ")[2].split(" = ")[0]: l for l in kv_lines}
    for name, field in reader.fields.items():
        line = by_name[name]
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            assert f"[{field.types[-1].name}]" in line
            assert line.split(" | ")[1].strip() == str(len(field.data))
        else:
            assert kind.name in line
    assert "tokenizer.ggml.tokens = ['<unk>', '<s>', '</s>', '<0x00>', '<0x01>', '<0x02>', ...]" in r.stdout
    assert "llama.attention.layer_norm_rms_epsilon = 1e-05" in r.stdout
    assert "general.architecture = 'llama'" in r.stdout
    tensor_lines = [l for l in lines if l.rstrip().endswith(".weight")]
    assert len(tensor_lines) == len(reader.tensors)
    for t in reader.tensors:
        line = next(l for l in tensor_lines if l.endswith("| " + t.name))
        assert f"| {t.tensor_type.name:7} |" in line
        assert line.split("|")[0].split(":")[1].strip() == str(t.n_elements)


def test_json_matches_the_gguf_package():
    r = ferrollama("inspect", "--json", TINY)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    reader = gguf.GGUFReader(TINY)
    assert data["metadata"]["tokenizer.ggml.bos_token_id"] == {"type": "UINT32", "count": 1, "value": 1}
    assert data["metadata"]["tokenizer.ggml.tokens"]["count"] == 512
    assert len(data["metadata"]["tokenizer.ggml.tokens"]["value"]) == 6
    for t in reader.tensors:
        info = data["tensors"][t.name]
        assert info["type"] == t.tensor_type.name
        assert info["shape"] == [int(d) for d in t.shape]
        assert info["nbytes"] == t.n_bytes
        assert info["offset"] == t.data_offset - reader.data_offset


def test_real_model_header_without_tensors():
    from conftest import model_path

    r = ferrollama("inspect", "--no-tensors", model_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    assert r.returncode == 0, r.stderr
    assert "151936 | tokenizer.ggml.tokens" in r.stdout
    assert "tokenizer.chat_template = \"{%- if tools %}" in r.stdout
    assert "general.file_type = 15" in r.stdout
    assert "Dumping" in r.stdout and "tensor(s)" not in r.stdout


def _header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


@pytest.mark.parametrize("content, message", [
    (b"", "the file is empty"),
    (b"NOPE" + bytes(40), "not a GGUF file"),
    (b"GGUF" + struct.pack("<I", 7) + bytes(16), "version 7"),
    (_header(0, 1) + struct.pack("<Q", 1000), "runs past the end"),
    (_header(0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99), "unknown value type 99"),
    (_header(0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 4, 1 << 40), "runs past the end"),
    (_header(1 << 50, 0), "do not fit"),
    (_header(1, 0) + struct.pack("<Q", 1) + b"t" + struct.pack("<I", 9), "9 dimensions"),
])
def test_malformed_files_are_one_line_and_status_1(tmp_path, content, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    r = ferrollama("inspect", path)
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr


def test_tensor_data_past_the_end_is_reported(tmp_path):
    data = TINY.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: len(data) - 100])
    r = ferrollama("inspect", path)
    assert r.returncode == 1
    assert "runs past the end of the file" in r.stderr and "blk.1.ffn_up.weight" in r.stderr


def test_missing_file():
    r = ferrollama("inspect", "/nonexistent/model.gguf")
    assert r.returncode == 1
    assert r.stderr == "error: /nonexistent/model.gguf: no such file\n"
