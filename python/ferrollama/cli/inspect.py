"""``ferrollama inspect FILE``: a GGUF file's header, every key with its type and value (arrays
abridged) and the tensor table, in gguf-dump's layout (or as JSON with --json).

The header is read here, in Python, so that files the engine cannot run (another architecture,
another tensor type) can still be looked at. Every length and count is checked against the
file's size before it is used.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..models import listed_pieces
from .common import CLIError

# GGUF metadata value types.
VALUE_TYPES = {0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32", 6: "FLOAT32",
               7: "BOOL", 8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64", 12: "FLOAT64"}
SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

#: ggml tensor types: id -> (name, elements per block, bytes per block)
TENSOR_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}

SHOWN_ITEMS = 6


class GGUFFormatError(CLIError):
    """The file is not a well-formed GGUF file."""


@dataclass
class Field:
    name: str
    #: "UINT32", "STRING", ... or for arrays the element type in brackets, e.g. "[STRING]"
    type: str
    count: int
    #: the value; for arrays only the first SHOWN_ITEMS items
    value: Any


@dataclass
class Tensor:
    name: str
    shape: list[int]
    type: str
    offset: int
    n_elements: int
    nbytes: int | None


@dataclass
class GGUFHeader:
    version: int
    alignment: int
    data_offset: int
    fields: list[Field] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)


class _Reader:
    """Little-endian reads from a byte buffer, each checked against its end."""

    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def fail(self, what: str) -> GGUFFormatError:
        return GGUFFormatError(f"{self.path}: malformed GGUF: {what} (at byte {self.pos})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(f"{what} runs past the end of the file")

    def scalar(self, fmt: str, what: str):
        size = struct.calcsize("<" + fmt)
        self.need(size, what)
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str, decode: bool = True) -> str | None:
        n = self.scalar("Q", f"length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n]) if decode else None
        self.pos += n
        return raw.decode("utf-8", errors="replace") if raw is not None else None

    def value(self, vtype: int, what: str, keep: bool = True):
        if vtype == 6:  # FLOAT32, shown with the digits a float32 has
            return float(str(np.float32(self.scalar("f", what))))
        if vtype in SCALAR_FORMATS:
            return self.scalar(SCALAR_FORMATS[vtype], what)
        if vtype == 8:
            return self.string(what, decode=keep)
        raise self.fail(f"{what} has unknown value type {vtype}")

    def array(self, what: str) -> tuple[str, int, list]:
        etype = self.scalar("I", f"element type of {what}")
        count = self.scalar("Q", f"length of {what}")
        if etype == 9:
            raise self.fail(f"{what} is an array of arrays, which GGUF does not allow here")
        if etype not in VALUE_TYPES:
            raise self.fail(f"{what} has unknown element type {etype}")
        if etype in SCALAR_FORMATS:
            size = struct.calcsize("<" + SCALAR_FORMATS[etype])
            self.need(count * size, what)
            shown = [self.value(etype, what) for _ in range(min(count, SHOWN_ITEMS))]
            self.pos += (count - len(shown)) * size
            return f"[{VALUE_TYPES[etype]}]", count, shown
        if count > len(self.buf) // 8:
            raise self.fail(f"{what} claims {count} strings")
        shown = [self.value(etype, what, keep=i < SHOWN_ITEMS) for i in range(count)]
        return f"[{VALUE_TYPES[etype]}]", count, shown[:SHOWN_ITEMS]


def _read_fields(r: _Reader, n_kv: int) -> list[Field]:
    fields = []
    for i in range(n_kv):
        key = r.string(f"key {i + 1}")
        vtype = r.scalar("I", f"type of {key}")
        if vtype == 9:
            ftype, count, value = r.array(key)
        elif vtype in VALUE_TYPES:
            ftype, count, value = VALUE_TYPES[vtype], 1, r.value(vtype, key)
        else:
            raise r.fail(f"{key} has unknown value type {vtype}")
        fields.append(Field(key, ftype, count, value))
    return fields


def _read_tensor(r: _Reader, i: int) -> Tensor:
    name = r.string(f"name of tensor {i + 1}")
    n_dims = r.scalar("I", f"dimensions of {name}")
    if not 1 <= n_dims <= 4:
        raise r.fail(f"{name} has {n_dims} dimensions (GGUF allows 1 to 4)")
    shape = [r.scalar("Q", f"shape of {name}") for _ in range(n_dims)]
    type_id = r.scalar("I", f"type of {name}")
    offset = r.scalar("Q", f"offset of {name}")
    n_elements = 1
    for d in shape:
        n_elements *= d
    if n_elements >= 1 << 62:
        raise r.fail(f"{name} has {n_elements} elements")
    info = TENSOR_TYPES.get(type_id)
    if info is None:
        return Tensor(name, shape, f"type {type_id}", offset, n_elements, None)
    tname, block, size = info
    if shape[0] % block:
        raise r.fail(f"{name}: its first dimension {shape[0]} is not a multiple of the {tname} block ({block})")
    return Tensor(name, shape, tname, offset, n_elements, n_elements // block * size)


def read_header(path: str) -> GGUFHeader:
    """Header, metadata and tensor table of a GGUF file (tensor data is not read)."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise CLIError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CLIError(f"{path}: is a directory, not a GGUF file") from None
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            raise GGUFFormatError(f"{path}: the file is empty, not a GGUF file")
        pieces = listed_pieces(Path(path))
        if pieces is not None:                # a model read in place from its pieces (models.py)
            return _parse(_Reader(memoryview(b"".join(p.read_bytes() for p in pieces)), path))
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Reader(memoryview(buf), path))


def _parse(r: _Reader) -> GGUFHeader:
    try:
        r.need(4, "the magic")
        if bytes(r.buf[:4]) != b"GGUF":
            raise GGUFFormatError(f"{r.path}: not a GGUF file (it starts with {bytes(r.buf[:4])!r}, not b'GGUF')")
        r.pos = 4
        version = r.scalar("I", "the version")
        if version not in (2, 3):
            raise r.fail(f"version {version} (supported: 2 and 3)")
        n_tensors, n_kv = r.scalar("Q", "the tensor count"), r.scalar("Q", "the key count")
        if n_kv > len(r.buf) // 12 or n_tensors > len(r.buf) // 24:
            raise r.fail(f"{n_kv} keys and {n_tensors} tensors do not fit in the file")
        fields = [Field("GGUF.version", "UINT32", 1, version), Field("GGUF.tensor_count", "UINT64", 1, n_tensors),
                  Field("GGUF.kv_count", "UINT64", 1, n_kv)] + _read_fields(r, n_kv)
        tensors = [_read_tensor(r, i) for i in range(n_tensors)]
        alignment = next((f.value for f in fields if f.name == "general.alignment"), 32)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise r.fail(f"general.alignment {alignment} is not a power of two")
        data_offset = (r.pos + alignment - 1) // alignment * alignment
        header = GGUFHeader(version, alignment, data_offset, fields, tensors)
        _check_tensor_data(r, header)
        return header
    finally:
        r.buf.release()


def _check_tensor_data(r: _Reader, header: GGUFHeader) -> None:
    size = len(r.buf)
    for t in header.tensors:
        if t.nbytes is not None and header.data_offset + t.offset + t.nbytes > size:
            raise GGUFFormatError(f"{r.path}: malformed GGUF: the data of {t.name} runs past the end of the file")


# --- printing -----------------------------------------------------------------------------------

def _pretty_value(f: Field) -> str:
    if f.type == "STRING":
        text = f.value
        return repr(text[:57] + "..." if len(text) > 60 else text)
    if f.type.startswith("["):
        shown = repr(f.value)
        return shown[:-1] + ", ...]" if f.count > len(f.value) else shown
    return str(f.value)


def print_dump(path: str, h: GGUFHeader, tensors: bool = True, out=None) -> None:
    out = out or sys.stdout
    p = lambda s="": print(s, file=out)  # noqa: E731
    p(f"* File: {path}")
    p(f"* GGUF version {h.version}, little endian, alignment {h.alignment}, tensor data at byte {h.data_offset}")
    p(f"* Dumping {len(h.fields)} key/value pair(s)")
    for n, f in enumerate(h.fields, 1):
        p(f"  {n:5}: {f.type:10} | {f.count:8} | {f.name} = {_pretty_value(f)}")
    p(f"* {architecture_line(h)}")
    if not tensors:
        return
    p(f"* Dumping {len(h.tensors)} tensor(s)")
    for n, t in enumerate(h.tensors, 1):
        dims = ", ".join(f"{d:5}" for d in t.shape + [1] * (4 - len(t.shape)))
        p(f"  {n:5}: {t.n_elements:10} | {dims} | {t.type:7} | {t.name}")


def architecture_line(h: GGUFHeader) -> str:
    """Whether the engine runs the file's architecture, naming the ones it knows when not."""
    from .._core import SUPPORTED_ARCHITECTURES

    arch = next((f.value for f in h.fields if f.name == "general.architecture"), None)
    if arch in SUPPORTED_ARCHITECTURES:
        return f"Architecture {arch}: supported by ferrollama"
    what = "no general.architecture key" if arch is None else f"architecture {arch!r} is not supported by ferrollama"
    return f"{what[0].upper()}{what[1:]} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"


def as_json(h: GGUFHeader) -> dict:
    return {
        "version": h.version, "alignment": h.alignment, "data_offset": h.data_offset,
        "metadata": {f.name: {"type": f.type, "count": f.count, "value": f.value} for f in h.fields},
        "tensors": {t.name: {"type": t.type, "shape": t.shape, "offset": t.offset, "n_elements": t.n_elements,
                             "nbytes": t.nbytes} for t in h.tensors},
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="a GGUF file")
    p.add_argument("--no-tensors", action="store_true", help="do not list the tensors")
    p.add_argument("--json", action="store_true", help="print JSON (arrays abridged to their first items)")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")


def run(args: argparse.Namespace) -> int:
    header = read_header(args.file)
    if args.json:
        data = as_json(header)
        if args.no_tensors:
            del data["tensors"]
        json.dump(data, sys.stdout, ensure_ascii=False, indent=2)
        print()
    else:
        print_dump(args.file, header, tensors=not args.no_tensors)
    return 0
