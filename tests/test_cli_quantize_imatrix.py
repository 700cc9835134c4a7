"""`ferrollama quantize --imatrix`: the weighted quantizers against llama.cpp's llama_model_quantize with
the same importance matrix (tests/data/quants/llama_quantize.json, benches/record_quantize.py):
every tensor's type and bytes (sha256) equal, with and without the imatrix; and llama.cpp's
refusal of the types that need one."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from ferrollama.cli.inspect import read_header

DATA = Path(__file__).parent / "data"
F32 = DATA / "models" / "tiny-llama-f32.gguf"
IMATRIX = DATA / "imatrix" / "tiny-llama-f32.imatrix.gguf"
RECORD = json.loads((DATA / "quants" / "llama_quantize.json").read_text())


def ferrollama(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferrollama.cli", *map(str, args)], capture_output=True, text=True)


def digests(path: Path) -> dict[str, list[str]]:
    """Each tensor's type and sha256, read as benches/record_quantize.py reads them (the gguf package
    does not know Q2_0)."""
    header = read_header(str(path))
    data = path.read_bytes()
    return {t.name: [t.type, hashlib.sha256(data[header.data_offset + t.offset:][:t.nbytes]).hexdigest()]
            for t in header.tensors}


def embd_and_output(kind: str) -> list[str]:
    """The i-quant records keep token_embd and output in Q8_0 (benches/record_quantize.py says why)."""
    other = RECORD["types"][kind].get("embd_and_output")
    return ["--token-embedding-type", other, "--output-tensor-type", other] if other else []


@pytest.mark.parametrize("kind", sorted(RECORD["types"]))
def test_weighted_quantizers_equal_llama_quantize(tmp_path, kind):
    out = tmp_path / "out.gguf"
    r = ferrollama("quantize", F32, out, kind, "--pure", "--imatrix", IMATRIX, *embd_and_output(kind))
    assert r.returncode == 0, r.stderr
    assert digests(out) == RECORD["types"][kind]["imatrix"]


@pytest.mark.parametrize("kind", sorted(k for k, v in RECORD["types"].items() if "plain" in v and v.get("embd_and_output")))
def test_i_quants_without_imatrix_equal_llama_quantize(tmp_path, kind):
    """IQ3_S is the i-quant llama-quantize writes without an importance matrix (ggml weights by x²)."""
    out = tmp_path / "out.gguf"
    r = ferrollama("quantize", F32, out, kind, "--pure", *embd_and_output(kind))
    assert r.returncode == 0, r.stderr
    assert digests(out) == RECORD["types"][kind]["plain"]


@pytest.mark.parametrize("case", sorted(RECORD["mixes"]))
def test_mixes_with_an_imatrix_equal_llama_quantize(tmp_path, case):
    """The preset's per-tensor types and the weighted bytes together; on the MoE model each expert
    is quantized with its own row of the importance matrix."""
    model, preset = case.split()
    out = tmp_path / "out.gguf"
    r = ferrollama("quantize", DATA / "models" / f"{model}.gguf", out, preset,
                   "--imatrix", DATA / "imatrix" / f"{model}.imatrix.gguf")
    assert r.returncode == 0, r.stderr
    assert digests(out) == RECORD["mixes"][case]


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q1_0", "Q2_0"])
def test_legacy_types_without_imatrix_equal_llama_quantize(tmp_path, kind):
    out = tmp_path / "out.gguf"
    assert ferrollama("quantize", F32, out, kind, "--pure").returncode == 0
    assert digests(out) == RECORD["types"][kind]["plain"]


def test_legacy_dat_imatrix_gives_the_same_bytes(tmp_path):
    """llama-imatrix's older format (mean · ncall per entry) loads to the same weights."""
    reader = gguf.GGUFReader(IMATRIX)
    tensors = {t.name: np.asarray(t.data, dtype=np.float32).reshape(-1) for t in reader.tensors}
    names = sorted(k[: -len(".in_sum2")] for k in tensors if k.endswith(".in_sum2"))
    ncall = 10
    blob = bytearray(np.int32(len(names)).tobytes())
    for name in names:
        mean = tensors[name + ".in_sum2"] / tensors[name + ".counts"][0]
        blob += np.int32(len(name)).tobytes() + name.encode() + np.int32(ncall).tobytes()
        blob += np.int32(mean.size).tobytes() + (mean * np.float32(ncall)).astype("<f4").tobytes()
    dat = tmp_path / "imatrix.dat"
    dat.write_bytes(bytes(blob))
    out = tmp_path / "out.gguf"
    r = ferrollama("quantize", F32, out, "Q6_K", "--pure", "--imatrix", dat)
    assert r.returncode == 0, r.stderr
    # (mean · 10) / 10 rounds back to the mean here: the bytes are llama.cpp's
    assert digests(out) == RECORD["types"]["Q6_K"]["imatrix"]


@pytest.mark.parametrize("preset", ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "Q2_K_S"])
def test_types_that_need_an_imatrix_are_refused_without_one(tmp_path, preset):
    r = ferrollama("quantize", F32, tmp_path / "o.gguf", preset)
    assert r.returncode == 1
    assert "this quantization requires an importance matrix" in r.stderr and "blk.0." in r.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_q2_k_s_with_an_imatrix_writes(tmp_path):
    r = ferrollama("quantize", F32, tmp_path / "o.gguf", "Q2_K_S", "--imatrix", IMATRIX)
    assert r.returncode == 0, r.stderr
    types = {v[0] for v in digests(tmp_path / "o.gguf").values()}
    assert "Q2_K" in types


@pytest.mark.parametrize("kind", ["IQ2_XXS", "IQ2_XS", "IQ1_S"])
def test_a_tensor_without_importance_weights_is_refused_by_name(tmp_path, kind):
    """With --pure the token embeddings get the type too, and the imatrix has no weights for them
    (llama-imatrix sees no product with them): ggml's quantizer of these types has nothing to work
    with (llama.cpp aborts there). The error names the tensor and the way out."""
    r = ferrollama("quantize", F32, tmp_path / "o.gguf", kind, "--pure", "--imatrix", IMATRIX)
    assert r.returncode == 1
    assert f"token_embd.weight would be {kind}" in r.stderr and "--token-embedding-type" in r.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_an_imatrix_of_another_model_is_refused(tmp_path):
    other = DATA / "imatrix" / "tiny-qwen3moe-f32.imatrix.gguf"
    r = ferrollama("quantize", F32, tmp_path / "o.gguf", "Q4_K_M", "--imatrix", other)
    assert r.returncode == 1 and "imatrix size" in r.stderr and "is different from tensor size" in r.stderr


def test_row_size_fallbacks_of_q1_0_and_q2_0_are_llama_quantizes(tmp_path):
    """Rows of 96 and 48 values (tiny-llama-oddrows-f32.gguf): Q2_0 falls back to Q4_0, then to F16;
    Q1_0 has no fallback type, and llama.cpp refuses the model."""
    odd_rows = DATA / "models" / "tiny-llama-oddrows-f32.gguf"
    out = tmp_path / "q2.gguf"
    r = ferrollama("quantize", odd_rows, out, "Q2_0", "--pure")
    assert r.returncode == 0, r.stderr
    assert digests(out) == RECORD["fallbacks"]["Q2_0"]
    assert RECORD["fallbacks"]["Q1_0"] is None
    r = ferrollama("quantize", odd_rows, tmp_path / "q1.gguf", "Q1_0", "--pure")
    assert r.returncode == 1 and "no tensor type fallback is defined for type Q1_0" in r.stderr
    assert not (tmp_path / "q1.gguf").exists()
