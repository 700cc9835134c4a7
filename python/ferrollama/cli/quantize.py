"""``ferrollama quantize IN OUT TYPE``: convert an F32/F16/BF16 model, as llama-quantize does.

TYPE is one of llama-quantize's presets: a plain type (Q8_0, Q4_0, Q6_K, IQ4_XS, TQ1_0, ...) or a
mix (Q2_K_S, Q3_K_S/M/L, Q4_K_S/M, Q5_K_S/M, IQ2_M, IQ3_M, ..., MXFP4_MOE; Q3_K, Q4_K, Q5_K are
aliases of the _M mixes). Each tensor's type is llama-quantize's choice (quant_plan.py, a port of
llama_tensor_get_type): unless ``--pure``, the mix rules move some tensors to other types by their
role, layer, the architecture, experts and grouped-query ratio; a row the type's block does not
divide falls back to a smaller block (F16 at worst); tensors llama.cpp never quantizes (norms,
biases, routers, 1-D tensors) are copied as they are. ``general.file_type`` is the preset's id.

``--imatrix FILE`` (llama-imatrix's GGUF format, or its older .dat) weights the quantizers that
take importance weights (Q2_K..Q6_K, Q4_0..Q5_1, IQ4_NL, IQ4_XS and the IQ1/IQ2/IQ3 types: ggml's
quantize_row_*_impl);
without it they are ggml's reference quantizers. As llama.cpp, quantize refuses without an
importance matrix where the result would be garbage: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS
tensors, and the Q2_K tensors of Q2_K_S. IQ2_XXS, IQ2_XS and IQ1_S cannot be quantized at all without
importance weights: a tensor of those types that the imatrix has no weights for (token_embd, output)
is refused by name, where llama.cpp aborts.

Quantization itself is ggml's code, bit for bit: the ``gguf`` package's for F16, BF16, Q8_0, TQ1_0,
TQ2_0, MXFP4 and (without an imatrix) Q4_0..Q5_1; the engine's (``ferrollama._core.quantize``) for
the k-quants, the i-quants, Q1_0, Q2_0, NVFP4 and everything under an importance matrix.

NVFP4 is no preset: llama-quantize has none (llama_model_quantize refuses its file type), and NVFP4
models come from convert_hf_to_gguf.py of NVFP4 checkpoints, with the per-tensor second scales
that a plain quantization lacks. As with llama-quantize, ``--output-tensor-type`` and
``--token-embedding-type`` may name it.

  ferrollama imatrix -m model-f16.gguf -f calibration.txt -o imatrix.gguf
  ferrollama quantize model-f16.gguf model-q4_k_m.gguf Q4_K_M --imatrix imatrix.gguf
"""
from __future__ import annotations

import argparse
import os
import struct

import numpy as np

from .common import CLIError, progress
from .quant_plan import ALIASES, PRESETS, ModelFacts, Planner, requires_imatrix, resolve_preset

#: types the gguf package quantizes with ggml's reference code
GGUF_PACKAGE_TYPES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4"}
#: types whose ggml quantizer takes importance weights (the others ignore them)
WEIGHTED_TYPES = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS",
                  "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"}
#: types ggml cannot quantize at all without importance weights (ggml_quantize_requires_imatrix)
ONLY_WEIGHTED = {"IQ2_XXS", "IQ2_XS", "IQ1_S"}
#: types only the engine quantizes (the gguf package has no quantizer for them); ggml's quantizers of
#: these ignore importance weights
ENGINE_ONLY_TYPES = {"Q1_0", "Q2_0", "NVFP4"}
#: ggml type ids of the types the gguf package may not know (0.19 has no Q2_0)
TYPE_IDS = {"Q1_0": 41, "Q2_0": 42}
#: types ferrollama writes
WRITABLE = GGUF_PACKAGE_TYPES | WEIGHTED_TYPES | ENGINE_ONLY_TYPES
SOURCE_TYPES = {"F32", "F16", "BF16"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN", help="the model to convert (F32, F16 or BF16 weights)")
    p.add_argument("output", metavar="OUT", help="the file to write")
    p.add_argument("type", metavar="TYPE", help="llama-quantize's preset: " + ", ".join([*PRESETS, *ALIASES]))
    p.add_argument("--imatrix", metavar="FILE", default=None,
                   help="importance matrix (llama-imatrix's .gguf or .dat) for the quantizers that use one")
    p.add_argument("--pure", action="store_true", help="every weight matrix in TYPE's default type (no mix rules)")
    p.add_argument("--allow-requantize", action="store_true", help="also convert tensors that are already quantized")
    p.add_argument("--output-tensor-type", metavar="T", default=None, help="type of output.weight")
    p.add_argument("--token-embedding-type", metavar="T", default=None, help="type of token_embd.weight")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")


def _gguf():
    try:
        import gguf
    except ImportError:
        raise CLIError("quantize needs the gguf package: pip install gguf") from None
    return gguf


# --- the importance matrix ----------------------------------------------------------------------

def load_imatrix(path: str) -> dict[str, np.ndarray]:
    """llama-quantize's load_imatrix: {tensor name: mean squared activation per column (per expert,
    concatenated)}: the sums divided by their counts (1 where a count is 0)."""
    if not os.path.exists(path):
        raise CLIError(f"{path}: no such file")
    with open(path, "rb") as f:
        magic = f.read(4)
    return _load_gguf_imatrix(path) if magic == b"GGUF" else _load_dat_imatrix(path)


def _load_gguf_imatrix(path: str) -> dict[str, np.ndarray]:
    gguf = _gguf()
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, OSError) as e:
        raise CLIError(f"{path}: not a readable imatrix file ({e})") from None
    if not all(k in reader.fields for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")):
        raise CLIError(f"{path}: missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size)")
    tensors = {t.name: t for t in reader.tensors}
    out = {}
    for key, t in tensors.items():
        if not key.endswith(".in_sum2"):
            continue
        name = key[: -len(".in_sum2")]
        counts_t = tensors.get(name + ".counts")
        if counts_t is None:
            raise CLIError(f"{path}: mismatched sums and counts for {name}")
        if t.tensor_type.name != "F32" or counts_t.tensor_type.name != "F32":
            raise CLIError(f"{path}: sums and counts for {name} must be F32")
        sums = np.asarray(t.data, dtype=np.float32).reshape(-1)
        counts = np.rint(np.asarray(counts_t.data, dtype=np.float32).reshape(-1))
        if len(counts) == 0 or len(sums) % len(counts):
            raise CLIError(f"{path}: {name} has {len(sums)} sums for {len(counts)} counts")
        rows = sums.reshape(len(counts), -1)
        out[name] = np.concatenate([r / np.float32(c) if c > 0 else np.ones_like(r) for r, c in zip(rows, counts)])
    return _checked(path, out)


def _load_dat_imatrix(path: str) -> dict[str, np.ndarray]:
    """The legacy format: entries of (name, ncall, values = mean · ncall)."""
    with open(path, "rb") as f:
        data = f.read()
    out, pos = {}, 0

    def take(fmt: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise CLIError(f"{path}: truncated imatrix file")
        values = struct.unpack_from(fmt, data, pos)
        pos += size
        return values

    (n_entries,) = take("<i")
    if n_entries < 1:
        raise CLIError(f"{path}: not an imatrix file (no entries)")
    for _ in range(n_entries):
        (name_len,) = take("<i")
        if not 0 < name_len <= len(data) - pos:
            raise CLIError(f"{path}: truncated imatrix file")
        name = data[pos:pos + name_len].decode("utf-8", "replace")
        pos += name_len
        ncall, nval = take("<ii")
        if not 0 < nval <= (len(data) - pos) // 4:
            raise CLIError(f"{path}: truncated imatrix file")
        values = np.frombuffer(data, dtype="<f4", count=nval, offset=pos).astype(np.float32)
        pos += 4 * nval
        out[name] = values / np.float32(ncall) if ncall > 0 else values
    return _checked(path, out)


def _checked(path: str, imatrix: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for name, values in imatrix.items():
        if not np.isfinite(values).all():
            raise CLIError(f"{path}: imatrix contains non-finite values for {name}")
    return imatrix


# --- the conversion -------------------------------------------------------------------------------

def _as_f32(gguf, tensor) -> np.ndarray:
    """The tensor's values as float32 rows (n_rows, n_per_row)."""
    kind = tensor.tensor_type.name
    n_per_row = int(tensor.shape[0])
    try:
        values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type) if kind != "F32" else np.asarray(tensor.data)
    except NotImplementedError:
        raise CLIError(f"{tensor.name}: the gguf package cannot dequantize {kind} to requantize it") from None
    return np.asarray(values, dtype=np.float32).reshape(-1, n_per_row)


def quantize_rows(gguf, rows: np.ndarray, type_name: str, weights: np.ndarray | None = None) -> np.ndarray:
    """Rows quantized by ggml's quantizer of the type; `weights` (one per column) for the weighted one."""
    if weights is None and type_name in GGUF_PACKAGE_TYPES:
        return gguf.quants.quantize(rows, gguf.GGMLQuantizationType[type_name])
    try:
        from .._core import quantize as engine_quantize
    except ImportError:  # an extension built before it had one
        engine_quantize = None
    if engine_quantize is None:
        raise CLIError(f"{type_name}: this build of the engine has no quantizer for it "
                       f"(the gguf package quantizes {', '.join(sorted(GGUF_PACKAGE_TYPES))})")
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if weights is None:
        return np.asarray(engine_quantize(rows, type_name))
    return np.asarray(engine_quantize(rows, type_name, np.ascontiguousarray(weights, dtype=np.float32)))


def _copy_metadata(gguf, reader, writer, ftype: int) -> None:
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type", "general.alignment",
                                                 "general.quantization_version"):
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        writer.add_key_value(name, f.contents(), vtype, sub_type=sub)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_file_type(ftype)


def _open(gguf, path: str):
    if not os.path.exists(path):
        raise CLIError(f"{path}: no such file")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, OSError) as e:
        raise CLIError(f"{path}: not a readable GGUF file ({e})") from None


def _tensor_type_arg(name: str | None) -> str | None:
    if name is None:
        return None
    if name.upper() not in WRITABLE:
        raise CLIError(f"unknown tensor type {name!r}; ferrollama writes {', '.join(sorted(WRITABLE))}")
    return name.upper()


def plan_of(reader, preset: str, pure: bool, has_imatrix: bool, output_type: str | None = None,
            embd_type: str | None = None) -> dict[str, str]:
    """{tensor name: the type llama-quantize gives it} for a model read by gguf.GGUFReader."""
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise CLIError("the model has no general.architecture")
    arch = arch_field.contents()
    # the hyper-parameters only: contents() of the vocabulary's arrays would take long
    fields = {k: f.contents() for k, f in reader.fields.items() if k.startswith(arch + ".")}
    fields["general.architecture"] = arch
    planner = Planner(ModelFacts.of_fields(fields), preset, pure, has_imatrix, output_type, embd_type)
    tensors = [(t.name, tuple(int(d) for d in t.shape), t.tensor_type.name) for t in reader.tensors]
    return planner.plan(tensors)


def _check_plan(plan: dict[str, str], reader, preset: str, imatrix: dict | None) -> None:
    """llama.cpp's refusal without an importance matrix; the tensors whose type cannot be quantized
    without weights that the imatrix has none for (where llama.cpp aborts); the types ferrollama cannot
    write."""
    current = {t.name: t.tensor_type.name for t in reader.tensors}
    changed = {name: new_type for name, new_type in plan.items() if new_type != current[name]}
    if imatrix is None:
        for name, new_type in changed.items():
            if requires_imatrix(name, new_type, preset):
                raise CLIError(f"this quantization requires an importance matrix (--imatrix FILE, from ferrollama "
                               f"imatrix): {name} would be {new_type}, which is garbage without one")
    unweighted = [f"{name} would be {new_type}" for name, new_type in changed.items()
                  if new_type in ONLY_WEIGHTED and (imatrix is None or name not in imatrix)]
    if unweighted:
        raise CLIError(f"{', '.join(unweighted)}: that quantizer needs importance weights, and the imatrix has none "
                       f"(llama-imatrix records the inputs of the layers' products only); give such tensors another "
                       f"type with --token-embedding-type T / --output-tensor-type T")
    for name, new_type in changed.items():
        if new_type not in WRITABLE:
            raise CLIError(f"{preset} puts {name} in {new_type}, a type ferrollama reads but cannot write yet "
                           f"(it writes {', '.join(sorted(WRITABLE))})")


def run(args: argparse.Namespace) -> int:
    gguf = _gguf()
    preset = resolve_preset(args.type)
    if preset == "NVFP4":
        raise CLIError("NVFP4 is not a file type llama-quantize writes (llama.cpp refuses LLAMA_FTYPE_MOSTLY_NVFP4); "
                       "--output-tensor-type and --token-embedding-type take NVFP4")
    if preset not in PRESETS:
        raise CLIError(f"unknown type {args.type!r}; known: {', '.join([*PRESETS, *ALIASES])}")
    output_type, embd_type = _tensor_type_arg(args.output_tensor_type), _tensor_type_arg(args.token_embedding_type)
    if os.path.abspath(args.input) == os.path.abspath(args.output):
        raise CLIError("IN and OUT are the same file")
    imatrix = load_imatrix(args.imatrix) if args.imatrix else None
    reader = _open(gguf, args.input)
    plan = plan_of(reader, preset, args.pure, imatrix is not None, output_type, embd_type)
    _check_plan(plan, reader, preset, imatrix)
    partial = args.output + ".partial"
    try:
        sizes = _write(gguf, reader, partial, PRESETS[preset][0], plan, imatrix, args.allow_requantize)
        os.replace(partial, args.output)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    print(f"model size  = {sizes[0] / 2**20:8.2f} MiB")
    print(f"quant size  = {sizes[1] / 2**20:8.2f} MiB")
    return 0


def _write(gguf, reader, path: str, ftype: int, plan: dict[str, str], imatrix: dict | None, allow_requantize: bool) -> list[int]:
    """Writes the converted model to path; returns [bytes of tensor data in, out]."""
    writer = gguf.GGUFWriter(path, reader.fields["general.architecture"].contents())
    _copy_metadata(gguf, reader, writer, ftype)
    sizes = [0, 0]
    with progress(len(reader.tensors), "quantize", unit="tensor") as bar:
        for tensor in reader.tensors:
            data, kind = _convert(gguf, tensor, plan[tensor.name], imatrix, allow_requantize)
            _add_tensor(gguf, writer, tensor, data, kind)
            sizes[0] += int(tensor.n_bytes)
            sizes[1] += int(data.nbytes)
            bar.update(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sizes


def _add_tensor(gguf, writer, tensor, data: np.ndarray, kind: str) -> None:
    # llama-quantize writes ggml_n_dims(t) dimensions: trailing ones dropped (Mamba-2's ssm_norm
    # [2048, 1] comes out [2048]); numpy's shapes are reversed, so those are its leading ones.
    while data.ndim > 1 and data.shape[0] == 1:
        data = data[0]
    member = gguf.GGMLQuantizationType.__members__.get(kind)
    if member is not None:
        writer.add_tensor(tensor.name, data, raw_dtype=member)
        return
    # A type this gguf package does not know: its writer derives the element shape of uint8 bytes
    # from its own table, so the bytes go as int8, with the element shape given.
    shape = [int(d) for d in reversed(tensor.shape)]
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    writer.add_tensor(tensor.name, data.view(np.int8), raw_shape=shape, raw_dtype=TYPE_IDS[kind])


def _importance(imatrix: dict | None, name: str, shape: list[int]) -> np.ndarray | None:
    """The tensor's importance weights (n_expert rows of n_per_row), or None where the matrix has none."""
    if imatrix is None or name not in imatrix:
        return None
    values = imatrix[name]
    n_per_row, n_mat = shape[0], shape[2] if len(shape) > 2 else 1
    if values.size != n_per_row * n_mat:
        if name in ("token_embd.weight", "per_layer_token_embd.weight"):
            return None
        raise CLIError(f"imatrix size {values.size} is different from tensor size {n_per_row * n_mat} for {name}")
    return values.reshape(n_mat, n_per_row)


def _convert(gguf, tensor, new_type: str, imatrix: dict | None, allow_requantize: bool) -> tuple[np.ndarray, str]:
    kind = tensor.tensor_type.name
    if new_type == kind:
        return np.asarray(tensor.data), kind
    if kind not in SOURCE_TYPES and not allow_requantize:
        raise CLIError(f"{tensor.name} is already {kind}; convert from F32/F16/BF16 or pass --allow-requantize")
    shape = [int(d) for d in tensor.shape]
    rows = _as_f32(gguf, tensor)
    out_shape = list(reversed(shape))
    if new_type == "F32":
        return rows.reshape(out_shape), "F32"
    if new_type == "F16":
        return rows.astype(np.float16).reshape(out_shape), "F16"
    weights = _importance(imatrix, tensor.name, shape) if new_type in WEIGHTED_TYPES else None
    if weights is None:
        quantized = quantize_rows(gguf, rows, new_type)
    else:
        per_expert = np.split(rows, len(weights))
        quantized = np.concatenate([quantize_rows(gguf, r, new_type, w) for r, w in zip(per_expert, weights)])
    return quantized.reshape(out_shape[:-1] + [-1]), new_type
