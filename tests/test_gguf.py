"""GGUF loading: metadata and tensor tables equal to what the `gguf` package reads, and a
mutation fuzzer over the tiny models: every malformed file raises GGUFError naming the file,
never a crash or a huge allocation."""
from __future__ import annotations

import os
import random
from pathlib import Path

import gguf
import numpy as np
import pytest

import ferrollama as fl

DATA = Path(__file__).parent / "data"
TINY = sorted((DATA / "models").glob("*.gguf"))


def gguf_value(field: gguf.ReaderField):
    v = field.contents()
    return v


@pytest.mark.parametrize("path", TINY[:3] + [DATA / "vocab" / "ggml-vocab-qwen2.gguf"], ids=lambda p: p.name)
def test_metadata_and_tensors_match_the_gguf_package(path: Path) -> None:
    reader = gguf.GGUFReader(path)
    model = fl.Model(path, vocab_only=True)
    meta = model.metadata
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        want = gguf_value(field)
        got = meta[name]
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-7), name
        elif isinstance(want, list) and want and isinstance(want[0], float):
            assert np.allclose(got, want), name
        else:
            assert got == want, name
    assert set(meta) == {n for n in reader.fields if not n.startswith("GGUF.")}
    by_name = {t.name: t for t in model.tensors}
    assert len(by_name) == len(reader.tensors)
    for t in reader.tensors:
        mine = by_name[t.name]
        assert mine.type == t.tensor_type.name and mine.shape == tuple(int(x) for x in t.shape)
        assert mine.nbytes == t.n_bytes
        assert mine.offset + reader.data_offset == t.data_offset


def test_model_sizes(tiny_model: fl.Model) -> None:
    assert (tiny_model.n_vocab, tiny_model.n_embd, tiny_model.n_layer, tiny_model.n_head, tiny_model.n_head_kv) == (512, 256, 2, 4, 2)
    assert tiny_model.n_params == sum(int(np.prod(t.shape)) for t in tiny_model.tensors)
    assert fl.Model(TINY[0], use_mmap=False).metadata == fl.Model(TINY[0]).metadata


def test_unsupported_architecture_and_type_are_named(tmp_path: Path) -> None:
    raw = (DATA / "models" / "tiny-llama-f32.gguf").read_bytes()
    bad_arch = tmp_path / "bad-arch.gguf"
    bad_arch.write_bytes(raw.replace(b"llama.", b"llamb.").replace(b"\x05\x00\x00\x00\x00\x00\x00\x00llama", b"\x05\x00\x00\x00\x00\x00\x00\x00llamb"))
    with pytest.raises(fl.UnsupportedError, match="llamb"):
        fl.Model(bad_arch)


def test_missing_file_is_a_gguf_error(tmp_path: Path) -> None:
    with pytest.raises(fl.GGUFError, match="missing.gguf"):
        fl.Model(tmp_path / "missing.gguf")


def test_bad_magic_shows_the_four_bytes_as_text(tmp_path: Path) -> None:
    zipped = tmp_path / "model.zip"
    zipped.write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(fl.GGUFError) as e:
        fl.Model(zipped)
    assert str(e.value) == f'{zipped}: not a GGUF file (it starts with "PK\\x03\\x04", not "GGUF")'


def mutants(raw: bytes, n: int, seed: int):
    rng = random.Random(seed)
    header = 4096 if len(raw) > 4096 else len(raw)
    for _ in range(n):
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(header)
            kind = rng.randrange(4)
            if kind == 0:
                b[at] ^= 1 << rng.randrange(8)
            elif kind == 1:
                b[at] = 0xFF
            elif kind == 2:
                b[at:at + 8] = rng.randbytes(8)
            else:
                b[at:at + 8] = (2**63 - 1).to_bytes(8, "little")
        if rng.random() < 0.3:
            del b[rng.randrange(len(b)):]
        yield bytes(b)


def run_fuzz(tmp_path: Path, n: int) -> dict[str, int]:
    counts = {"ok": 0, "error": 0}
    target = tmp_path / "mutant.gguf"
    for k, src in enumerate([DATA / "models" / "tiny-llama-q4_k.gguf", DATA / "models" / "tiny-llama-q8_0.gguf"]):
        for m in mutants(src.read_bytes(), n // 2, seed=k):
            target.write_bytes(m)
            model = ctx = None
            try:
                model = fl.Model(target)
                ctx = fl.Context(model, n_ctx=64)
                ctx.decode(fl.Batch.from_tokens([1, 2, 3]))
                counts["ok"] += 1
            except (fl.Error, ValueError) as e:
                assert "mutant.gguf" in str(e) or not isinstance(e, fl.GGUFError)
                counts["error"] += 1
            # The model maps the file (and repacks from it on a thread): it must be gone
            # before the file is rewritten, as with any memory-mapped loader.
            del model, ctx
    return counts


def test_mutation_fuzz(tmp_path: Path) -> None:
    counts = run_fuzz(tmp_path, int(os.environ.get("FERROLLAMA_FUZZ_CASES", "300")))
    assert counts["error"] > 50  # most mutants of the header are malformed


@pytest.mark.slow
def test_mutation_fuzz_thousands(tmp_path: Path) -> None:
    counts = run_fuzz(tmp_path, 4000)
    assert counts["error"] > 1000
