"""Writes the tiny llama models of the tensor types added in issue 27 and records llama.cpp's
logits for them (tests/data/REFERENCE.md describes the models and the scenario format).

models: tests/data/models/tiny-llama-TYPE.gguf from tiny-llama-f32.gguf, same metadata, every
    weight matrix (token_embd and output included) in TYPE, norms F32. MXFP4, TQ1_0 and TQ2_0
    through the `gguf` package's quantizer (ggml's reference code); the i-quants, Q1_0 and Q2_0
    (which the gguf package does not quantize) through llama.cpp's own (llama_model_quantize,
    pure, with a uniform importance matrix: the IQ1/IQ2 types refuse to quantize without one,
    Q1_0 and Q2_0 ignore it).
record: tests/data/scenarios/forward-TYPE.json: the steps of forward-f32.json decoded by
    llama.cpp with an F32 KV cache (`expected`) and an F16 one (`expected_kv_f16`), the
    context parameters those records name, flash attention off as in the other records,
    everything else llama.cpp's defaults.
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
#: the llama_ftype whose default tensor type (what --pure writes) is each type quantized by
#: llama.cpp: IQ2_S is LLAMA_FTYPE_MOSTLY_IQ2_M's (MOSTLY_IQ2_S writes IQ2_XS)
LLAMA_FTYPES = {"IQ2_XXS": 19, "IQ2_XS": 20, "IQ3_XXS": 23, "IQ1_S": 24, "IQ3_S": 26,
                "IQ2_S": 29, "IQ1_M": 31, "Q1_0": 40, "Q2_0": 41}
#: general.file_type written for the gguf-package types (llama_ftype)
FILE_TYPES = {"MXFP4": 38, "TQ1_0": 36, "TQ2_0": 37}


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
        if values.ndim == 2:
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
    if type_name in GGUF_PACKAGE:
        write_with_gguf(type_name, out)
    else:
        write_with_llama(type_name, out)
    print(f"wrote {out.relative_to(DATA.parent.parent)} ({out.stat().st_size} bytes)")
    return out


class Llama:
    """llama.cpp through llama-cpp-python's low-level API: one model, contexts on demand."""

    def __init__(self, path: Path) -> None:
        import llama_cpp as L

        self.L = L
        # The C side keeps only the callback's pointer: the object must outlive the model.
        self.quiet = L.llama_log_callback(lambda level, text, user_data: None)
        L.llama_log_set(self.quiet, None)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))

    def run(self, scn: dict, cache_type: int) -> list[dict]:
        """The logits of every decode step's requested outputs (GGML_TYPE F32 = 0, F16 = 1)."""
        L = self.L
        c = scn["context"]
        p = L.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch = c["n_ctx"], c["n_batch"], c["n_ubatch"]
        p.n_seq_max = c.get("n_seq_max", 1)
        p.n_threads = p.n_threads_batch = 2
        p.type_k = p.type_v = cache_type
        # The stored records were made without flash attention (this check reproduces
        # forward-f32's to 7e-6 without it, to 3e-3 with it).
        p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = L.llama_init_from_model(self.model, p)
        expected = []
        try:
            for i, step in enumerate(scn["steps"]):
                if step["op"] != "decode":
                    raise SystemExit(f"forward scenarios decode only, step {i} is {step['op']}")
                self.decode(ctx, step)
                for b in step["logits"]:
                    ptr = L.llama_get_logits_ith(ctx, b)
                    logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(float)
                    # Five decimals, as the other records: far below the tolerances.
                    expected.append({"step": i, "batch_index": b, "logits": [round(v, 5) for v in logits.tolist()]})
        finally:
            L.llama_free(ctx)
        return expected

    def decode(self, ctx, step: dict) -> None:  # noqa: ANN001
        L = self.L
        n = len(step["tokens"])
        batch = L.llama_batch_init(n, 0, max(len(s) for s in step["seq_ids"]))
        try:
            wanted = set(step["logits"])
            for j, (tok, pos, seqs) in enumerate(zip(step["tokens"], step["pos"], step["seq_ids"])):
                batch.token[j], batch.pos[j], batch.n_seq_id[j] = tok, pos, len(seqs)
                for k, s in enumerate(seqs):
                    batch.seq_id[j][k] = s
                batch.logits[j] = j in wanted
            batch.n_tokens = n
            rc = L.llama_decode(ctx, batch)
            if rc != 0:
                raise SystemExit(f"llama_decode returned {rc}")
        finally:
            L.llama_batch_free(batch)

    def close(self) -> None:
        self.L.llama_model_free(self.model)


def record(type_name: str) -> Path:
    name = f"forward-{type_name.lower()}"
    template = json.loads((SCENARIOS / "forward-f32.json").read_text())
    model = f"tiny-llama-{type_name.lower()}.gguf"
    scn = {"name": name, "model": model, "context": template["context"], "steps": template["steps"]}
    llama = Llama(MODELS / model)
    try:
        scn["expected"] = llama.run(scn, 0)
        scn["expected_kv_f16"] = llama.run(scn, 1)
    finally:
        llama.close()
    out = SCENARIOS / f"{name}.json"
    out.write_text(json.dumps(scn, separators=(",", ":")))
    print(f"wrote {out.relative_to(DATA.parent.parent)}")
    return out


def check(name: str) -> None:
    stored = json.loads((SCENARIOS / f"forward-{name}.json").read_text())
    llama = Llama(MODELS / stored["model"])
    try:
        for key, cache in (("expected", 0), ("expected_kv_f16", 1)):
            got = llama.run(stored, cache)
            diff = max(float(np.max(np.abs(np.array(g["logits"]) - np.array(e["logits"]))))
                       for g, e in zip(got, stored[key]))
            print(f"forward-{name} {key}: max |difference| from the stored record {diff:.2e}")
    finally:
        llama.close()


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("models", "record", "check"):
        raise SystemExit(__doc__)
    types = [t.upper() for t in argv[1:]] or GGUF_PACKAGE + list(LLAMA_FTYPES)
    if argv[0] == "check":
        check(types[0].lower() if argv[1:] else "q4_k")
        return
    for t in types:
        make_model(t) if argv[0] == "models" else record(t)


if __name__ == "__main__":
    main(sys.argv[1:])
