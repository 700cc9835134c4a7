"""Qwen3.5 and Qwen3-Next files converted with their multi-token-prediction head: the extra
blocks after the trunk (`nextn_predict_layers`, counted in `block_count`) hold a full-attention
block, its FFN and the NextN tensors. llama.cpp loads them with TENSOR_SKIP and never runs them
for plain decoding: the logits are those of the file without them, and a file missing one of
the tensors llama.cpp requires there is refused."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import ferrollama as fl
import scenario_runner as sr
from conftest import load_model, model_path

E = 64


def with_mtp_block(src: Path, dst: Path, drop: str | None = None) -> str:
    """`src` (two trunk layers) with a third block: blk.1's tensors as blk.2's, plus the NextN
    projections and norms; block_count 3, nextn_predict_layers 1, recurrent_layers extended.
    `drop`: a tensor of the MTP block left out."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value, sub = f.contents(), (f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None)
        if name == f"{arch}.block_count":
            value = 3
        if name == f"{arch}.attention.recurrent_layers":
            value = [*value, False]
        writer.add_key_value(name, value, f.types[0], sub_type=sub)
    writer.add_uint32(f"{arch}.nextn_predict_layers", 1)
    rng = np.random.default_rng(7)
    mtp = {"blk.2.nextn.eh_proj.weight": rng.standard_normal((E, 2 * E)).astype(np.float32),
           "blk.2.nextn.enorm.weight": np.ones(E, np.float32), "blk.2.nextn.hnorm.weight": np.ones(E, np.float32)}
    for t in reader.tensors:
        copies = [t.name] + ([t.name.replace("blk.1.", "blk.2.", 1)] if t.name.startswith("blk.1.") else [])
        for name in copies:
            if name == drop:
                continue
            quantized = t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
            writer.add_tensor(name, np.array(t.data), raw_dtype=t.tensor_type if quantized else None)
    for name, data in mtp.items():
        if name != drop:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(dst)


def logits(scn: dict, model: fl.Model) -> np.ndarray:
    """The logits of the scenario's first part (a prompt in micro-batches, then single tokens)."""
    return np.stack([g["logits"] for g in sr.run(dict(scn, steps=scn["steps"][:6]), model, "f32") if "logits" in g])


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_mtp_blocks_are_loaded_and_not_run(arch: str, tmp_path: Path) -> None:
    scn = sr.load(f"hybrid-{arch}-f32")
    path = with_mtp_block(model_path(scn["model"]), tmp_path / "mtp.gguf")
    got, want = logits(scn, fl.Model(path)), logits(scn, load_model(scn["model"]))
    assert len(got) == 8 and np.array_equal(got, want)


@pytest.mark.parametrize("drop", ["blk.2.nextn.eh_proj.weight", "blk.2.attn_output.weight"])
def test_a_missing_mtp_tensor_is_refused(drop: str, tmp_path: Path) -> None:
    path = with_mtp_block(model_path("tiny-qwen35-f32.gguf"), tmp_path / "mtp.gguf", drop=drop)
    with pytest.raises(Exception, match=drop.replace(".", r"\.")):
        fl.Model(path)
