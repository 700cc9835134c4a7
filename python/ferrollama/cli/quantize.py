"""``ferrollama quantize IN OUT TYPE``: convert an F32/F16/BF16 model to a type the engine reads.

The file is read and written with the ``gguf`` package. Every weight matrix (2-D tensor) becomes
TYPE, except where llama.cpp's rules say otherwise: a row length that is not a multiple of the
type's block falls back to llama.cpp's fallback type; the ``_M`` / ``_S`` mixes keep a few tensors
at more bits (Q4_K_M: output and some attn_v / ffn_down in Q6_K). 1-D tensors (norms, biases)
stay F32. ``general.file_type`` is set to the new type.

Quantization itself is ggml's reference code: the ``gguf`` package's for F16, BF16, Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, TQ1_0, TQ2_0 and MXFP4; the engine's (``ferrollama._core.quantize``) for the
k-quants and IQ4. The IQ1/IQ2/IQ3 types, which the engine reads, are not written: llama.cpp's
quantizers for them search their grids under an importance matrix.
"""
from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass

import numpy as np

from .common import CLIError, progress

#: TYPE -> (base tensor type, llama_ftype id, mix rule)
TARGETS = {
    "F32": ("F32", 0, None), "F16": ("F16", 1, None), "BF16": ("BF16", 32, None),
    "Q4_0": ("Q4_0", 2, None), "Q4_1": ("Q4_1", 3, None), "Q5_0": ("Q5_0", 8, None), "Q5_1": ("Q5_1", 9, None),
    "Q8_0": ("Q8_0", 7, None), "Q2_K": ("Q2_K", 10, None), "Q3_K": ("Q3_K", 12, None),
    "Q4_K": ("Q4_K", 15, None), "Q4_K_S": ("Q4_K", 14, "s"), "Q4_K_M": ("Q4_K", 15, "m"),
    "Q5_K": ("Q5_K", 17, None), "Q5_K_S": ("Q5_K", 16, "s"), "Q5_K_M": ("Q5_K", 17, "m"),
    "Q6_K": ("Q6_K", 18, None), "IQ4_NL": ("IQ4_NL", 25, None), "IQ4_XS": ("IQ4_XS", 30, None),
    "TQ1_0": ("TQ1_0", 36, None), "TQ2_0": ("TQ2_0", 37, None), "MXFP4": ("MXFP4", 38, None),
}
#: types the gguf package quantizes with ggml's reference code
GGUF_PACKAGE_TYPES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4"}
#: llama.cpp's fallback when a row is not a multiple of the 256-element super-block
FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
            "TQ1_0": "Q4_0", "TQ2_0": "Q4_0"}
SOURCE_TYPES = {"F32", "F16", "BF16"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN", help="the model to convert (F32, F16 or BF16 weights)")
    p.add_argument("output", metavar="OUT", help="the file to write")
    p.add_argument("type", metavar="TYPE", help="the new type: " + ", ".join(TARGETS))
    p.add_argument("--pure", action="store_true", help="every weight matrix in TYPE (no mix rules)")
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


def _use_more_bits(i_layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


@dataclass
class Rules:
    base: str
    mix: str | None
    n_layer: int
    output_type: str | None
    embd_type: str | None
    #: whether the model has its own output matrix (else token_embd is also the output)
    has_output: bool = True

    def type_of(self, name: str) -> str:
        """The type of a weight matrix by llama.cpp's llama_tensor_get_type (its main rules for these mixes)."""
        is_output = name == "output.weight" or (not self.has_output and name == "token_embd.weight")
        if name == "output.weight" and self.output_type:
            return self.output_type
        if name == "token_embd.weight" and self.embd_type:
            return self.embd_type
        if self.mix is None:
            return self.base
        if is_output:
            return "Q6_K"
        layer = re.match(r"blk\.(\d+)\.", name)
        i_layer = int(layer.group(1)) if layer else 0
        if self.mix == "m" and (".attn_v." in name or ".ffn_down." in name):
            return "Q6_K" if _use_more_bits(i_layer, self.n_layer) else self.base
        if self.mix == "s" and self.base == "Q4_K" and ".attn_v." in name and i_layer < 4:
            return "Q5_K"
        return self.base


def _block_size(gguf, type_name: str) -> int:
    qtype = gguf.GGMLQuantizationType[type_name]
    return gguf.GGML_QUANT_SIZES[qtype][0]


def _fit(gguf, type_name: str, n_per_row: int) -> str:
    """The type, or its fallbacks, whose block divides the row length (F16 at worst)."""
    while n_per_row % _block_size(gguf, type_name):
        type_name = FALLBACK.get(type_name, "F16")
    return type_name


def _as_f32(gguf, tensor) -> np.ndarray:
    """The tensor's values as float32 rows (n_rows, n_per_row)."""
    kind = tensor.tensor_type.name
    shape = [int(d) for d in tensor.shape]
    n_per_row = shape[0]
    values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type) if kind != "F32" else np.asarray(tensor.data)
    return np.asarray(values, dtype=np.float32).reshape(-1, n_per_row)


def quantize_rows(gguf, rows: np.ndarray, type_name: str) -> np.ndarray:
    if type_name in GGUF_PACKAGE_TYPES:
        return gguf.quants.quantize(rows, gguf.GGMLQuantizationType[type_name])
    from .. import _core

    engine_quantize = getattr(_core, "quantize", None)
    if engine_quantize is None:
        raise CLIError(f"{type_name}: this build of the engine has no quantizer for it "
                       f"(the gguf package quantizes {', '.join(sorted(GGUF_PACKAGE_TYPES))})")
    return np.asarray(engine_quantize(np.ascontiguousarray(rows, dtype=np.float32), type_name))


def _copy_metadata(gguf, reader, writer, ftype: int) -> None:
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type", "general.alignment"):
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        writer.add_key_value(name, f.contents(), vtype, sub_type=sub)
    writer.add_file_type(ftype)
    if "general.quantization_version" not in reader.fields:
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _open(gguf, path: str):
    if not os.path.exists(path):
        raise CLIError(f"{path}: no such file")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, OSError) as e:
        raise CLIError(f"{path}: not a readable GGUF file ({e})") from None


def run(args: argparse.Namespace) -> int:
    gguf = _gguf()
    target = args.type.upper()
    if target not in TARGETS:
        raise CLIError(f"unknown type {args.type!r}; known: {', '.join(TARGETS)}")
    for t in (args.output_tensor_type, args.token_embedding_type):
        if t and t.upper() not in TARGETS:
            raise CLIError(f"unknown tensor type {t!r}")
    if os.path.abspath(args.input) == os.path.abspath(args.output):
        raise CLIError("IN and OUT are the same file")
    reader = _open(gguf, args.input)
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise CLIError(f"{args.input}: no general.architecture")
    arch = arch_field.contents()
    base, ftype, mix = TARGETS[target]
    n_layer = int(reader.fields[f"{arch}.block_count"].contents()) if f"{arch}.block_count" in reader.fields else 0
    rules = Rules(base, None if args.pure else mix, n_layer,
                  args.output_tensor_type and args.output_tensor_type.upper(),
                  args.token_embedding_type and args.token_embedding_type.upper())
    rules.has_output = any(t.name == "output.weight" for t in reader.tensors)
    partial = args.output + ".partial"
    try:
        sizes = _write(gguf, reader, partial, arch, ftype, rules, args.allow_requantize)
        os.replace(partial, args.output)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    print(f"model size  = {sizes[0] / 2**20:8.2f} MiB")
    print(f"quant size  = {sizes[1] / 2**20:8.2f} MiB")
    return 0


def _write(gguf, reader, path: str, arch: str, ftype: int, rules: Rules, allow_requantize: bool) -> list[int]:
    """Writes the converted model to path; returns [bytes of tensor data in, out]."""
    writer = gguf.GGUFWriter(path, arch)
    _copy_metadata(gguf, reader, writer, ftype)
    sizes = [0, 0]
    with progress(len(reader.tensors), "quantize", unit="tensor") as bar:
        for tensor in reader.tensors:
            data, kind = _convert(gguf, tensor, rules, allow_requantize)
            writer.add_tensor(tensor.name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
            sizes[0] += int(tensor.n_bytes)
            sizes[1] += int(data.nbytes)
            bar.update(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sizes


def _convert(gguf, tensor, rules: Rules, allow_requantize: bool) -> tuple[np.ndarray, str]:
    kind = tensor.tensor_type.name
    shape = [int(d) for d in tensor.shape]
    if len(shape) < 2 or not tensor.name.endswith(".weight") or "_norm" in tensor.name:
        if kind in SOURCE_TYPES:
            return _as_f32(gguf, tensor).reshape(list(reversed(shape))), "F32"
        return np.asarray(tensor.data), kind
    if kind not in SOURCE_TYPES and not allow_requantize:
        raise CLIError(f"{tensor.name} is already {kind}; convert from F32/F16/BF16 or pass --allow-requantize")
    new_type = _fit(gguf, rules.type_of(tensor.name), shape[0])
    rows = _as_f32(gguf, tensor)
    if new_type == "F32":
        return rows.reshape(list(reversed(shape))), "F32"
    if new_type == "F16":
        return rows.astype(np.float16).reshape(list(reversed(shape))), "F16"
    quantized = quantize_rows(gguf, rows, new_type)
    return quantized.reshape(list(reversed(shape))[:-1] + [-1]), new_type
