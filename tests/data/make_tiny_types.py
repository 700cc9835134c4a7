"""Writes the tiny llama models of the tensor types added in issue 27 and records llama.cpp's
logits for them (tests/data/REFERENCE.md describes the models and the scenario format).

models: tests/data/models/tiny-llama-TYPE.gguf from tiny-llama-f32.gguf, same metadata, every
    weight matrix (token_embd and output included) in TYPE, norms F32. MXFP4, TQ1_0 and TQ2_0
    through the `gguf` package's quantizer (ggml's reference code); the i-quants, Q1_0 and Q2_0
    (which the gguf package does not quantize) through llama.cpp's own (llama_model_quantize,
    pure, with a uniform importance matrix: the IQ1/IQ2 types refuse to quantize without one,
    Q1_0 and Q2_0 ignore it). NVFP4 (which neither quantizes) through ggml's
    quantize_row_nvfp4_ref (ggml_quantize_chunk), laid out as convert_hf_to_gguf.py writes a
    ModelOpt checkpoint: each block matrix and the output divided by a per-tensor second scale
    (amax / (6 * 448), ModelOpt's, so that the block scales use UE4M3's range), which goes to
    NAME.scale (F32, shape [1]); attn_q and ffn_down also get the NAME.input_scale that
    llama.cpp loads and never reads; token_embd (llama.cpp has no scale for it) as is.
record: tests/data/scenarios/forward-TYPE.json: the steps of forward-f32.json decoded by
    llama.cpp with an F32 KV cache (`expected`) and an F16 one (`expected_kv_f16`), the
    context parameters those records name, through benches/recorder.py (the recorder of every
    tiny-model scenario: flash attention off, 2 threads, as the other records).
check [TYPE]: re-records forward-TYPE.json (default q4_k) and prints its largest difference
    from the stored record (made on another machine): with float weights it shows whether the
    recorder's settings are the original's.

Run with the Python that has llama-cpp-python 0.3.36 and gguf, from the repository root:
/work/bench-venv/bin/python tests/data/make_tiny_types.py models|record|check [TYPE ...]
"""
from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent
MODELS = DATA / "models"
SCENARIOS = DATA / "scenarios"
SOURCE = MODELS / "tiny-llama-f32.gguf"
#: the types the gguf package quantizes with ggml's reference code
GGUF_PACKAGE = ["MXFP4", "TQ1_0", "TQ2_0"]
#: the types written through the gguf package's writer with ggml's own quantizer (ctypes):
#: the gguf package reads NVFP4 but does not quantize it, nor does llama_model_quantize
GGML_QUANTIZED = ["NVFP4"]
#: the llama_ftype whose default tensor type (what --pure writes) is each type quantized by
#: llama.cpp: IQ2_S is LLAMA_FTYPE_MOSTLY_IQ2_M's (MOSTLY_IQ2_S writes IQ2_XS)
LLAMA_FTYPES = {"IQ2_XXS": 19, "IQ2_XS": 20, "IQ3_XXS": 23, "IQ1_S": 24, "IQ3_S": 26,
                "IQ2_S": 29, "IQ1_M": 31, "Q1_0": 40, "Q2_0": 41}
#: general.file_type written for the gguf-package types and NVFP4 (llama_ftype)
FILE_TYPES = {"MXFP4": 38, "TQ1_0": 36, "TQ2_0": 37, "NVFP4": 39}
#: ModelOpt's per-tensor second scale divides amax by E2M1's largest value times UE4M3's
NVFP4_SCALE2_DIVISOR = 6.0 * 448.0
#: the tensors whose NVFP4 conversion also writes an (unused) input_scale
NVFP4_INPUT_SCALES = ("attn_q", "ffn_down")


def ggml_quantize(type_id: int, values: np.ndarray) -> np.ndarray:
    """ggml_quantize_chunk of a 2-D f32 array (ggml's reference quantizers), row bytes."""
    import llama_cpp

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    rows, cols = values.shape
    src = np.ascontiguousarray(values, dtype=np.float32)
    out = np.zeros((rows, lib.ggml_row_size(type_id, cols)), dtype=np.uint8)
    lib.ggml_quantize_chunk(type_id, src.ctypes.data, out.ctypes.data, 0, rows, cols, None)
    return out


def nvfp4_tensors(name: str, values: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """An F32 matrix as an NVFP4 conversion writes it: the weight, then its scale tensors."""
    if name == "token_embd.weight":
        return [(name, ggml_quantize(40, values))]
    scale2 = np.float32(np.abs(values).max() / NVFP4_SCALE2_DIVISOR)
    out = [(name, ggml_quantize(40, values / scale2)), (name.replace(".weight", ".scale"), np.array([scale2], dtype=np.float32))]
    if any(f".{p}." in name for p in NVFP4_INPUT_SCALES):
        out.append((name.replace(".weight", ".input_scale"), np.array([0.0123], dtype=np.float32)))
    return out


def copy_fields(reader, writer) -> None:  # noqa: ANN001
    """The metadata of a gguf.GGUFReader into a gguf.GGUFWriter, less the GGUF header's fields,
    the architecture (the writer's own) and the name."""
    import gguf

    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.name"):
            continue
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        writer.add_key_value(name, f.contents(), f.types[0], sub_type=sub)


def write_with_gguf(type_name: str, out: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(SOURCE)
    writer = gguf.GGUFWriter(out, "llama")
    copy_fields(reader, writer)
    writer.add_name(f"tiny-llama-{type_name.lower()}")
    writer.add_file_type(FILE_TYPES[type_name])
    qtype = gguf.GGMLQuantizationType[type_name]
    for t in reader.tensors:
        values = np.asarray(t.data, dtype=np.float32)
        if values.ndim == 2 and type_name == "NVFP4":
            for name, data in nvfp4_tensors(t.name, values):
                writer.add_tensor(name, data, raw_dtype=qtype if data.dtype == np.uint8 else None)
        elif values.ndim == 2:
            writer.add_tensor(t.name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_with_llama(type_name: str, out: Path) -> None:
    """llama.cpp's quantizer, every matrix in the type (pure), with an importance matrix of
    ones over every column of every matrix: the IQ1/IQ2 types refuse to run without one, and
    uniform weights are what the quantizers assume without one."""
    import gguf
    import llama_cpp as L

    columns = {t.name: int(t.shape[0]) for t in gguf.GGUFReader(SOURCE).tensors if len(t.shape) == 2}
    ones = {name: (ctypes.c_float * n)(*([1.0] * n)) for name, n in columns.items()}
    entries = (L.llama_model_imatrix_data * (len(ones) + 1))()
    for e, (name, data) in zip(entries, ones.items()):
        e.name, e.data, e.size = name.encode(), ctypes.cast(data, ctypes.POINTER(ctypes.c_float)), len(data)
    quiet = L.llama_log_callback(lambda level, text, user_data: None)
    L.llama_log_set(quiet, None)
    params = L.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPES[type_name]
    params.pure = True
    params.nthread = 2
    params.imatrix = ctypes.cast(entries, ctypes.POINTER(L.llama_model_imatrix_data))
    if L.llama_model_quantize(str(SOURCE).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"{type_name}: llama_model_quantize failed")


def make_model(type_name: str) -> Path:
    out = MODELS / f"tiny-llama-{type_name.lower()}.gguf"
    if type_name in GGUF_PACKAGE + GGML_QUANTIZED:
        write_with_gguf(type_name, out)
    else:
        write_with_llama(type_name, out)
    print(f"wrote {out.relative_to(DATA.parent.parent)} ({out.stat().st_size} bytes)")
    return out


def recorder():  # noqa: ANN201
    """benches/recorder.py, the recorder of every tiny-model scenario (needs llama-cpp-python)."""
    sys.path.insert(0, str(DATA.parent.parent / "benches"))
    import recorder as R

    return R


def record(type_name: str) -> Path:
    name = f"forward-{type_name.lower()}"
    template = json.loads((SCENARIOS / "forward-f32.json").read_text())
    model = f"tiny-llama-{type_name.lower()}.gguf"
    scn = {"name": name, "model": model, "context": template["context"], "steps": template["steps"]}
    # Five decimals, as the other forward records: far below the tolerances.
    scn.update(recorder().record(MODELS / model, scn["context"], scn["steps"], digits=5))
    out = SCENARIOS / f"{name}.json"
    out.write_text(json.dumps(scn, separators=(",", ":")))
    print(f"wrote {out.relative_to(DATA.parent.parent)}")
    return out


def check(name: str) -> None:
    stored = json.loads((SCENARIOS / f"forward-{name}.json").read_text())
    got = recorder().record(MODELS / stored["model"], stored["context"], stored["steps"], digits=5)
    for key in ("expected", "expected_kv_f16"):
        diff = max(float(np.max(np.abs(np.array(g["logits"]) - np.array(e["logits"]))))
                   for g, e in zip(got[key], stored[key]))
        print(f"forward-{name} {key}: max |difference| from the stored record {diff:.2e}")


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("models", "record", "check"):
        raise SystemExit(__doc__)
    types = [t.upper() for t in argv[1:]] or GGUF_PACKAGE + GGML_QUANTIZED + list(LLAMA_FTYPES)
    if argv[0] == "check":
        check(types[0].lower() if argv[1:] else "q4_k")
        return
    for t in types:
        make_model(t) if argv[0] == "models" else record(t)


if __name__ == "__main__":
    main(sys.argv[1:])
