#!/usr/bin/env python3
"""Records llama.cpp's importance matrices of the tiny models (tests/data/imatrix/*.imatrix.gguf),
which tests/test_cli_imatrix.py compares with `ferrollama imatrix`'s.

llama-cpp-python does not ship llama-imatrix, so this script is llama-imatrix on its low-level
API: compute_imatrix's loop (tokens with BOS, chunks of N_CTX tokens decoded from an empty cache
with BOS first and every token an output, N_BATCH / N_CTX chunks per batch, one sequence each)
with flash attention off, and collect_imatrix's arithmetic in the eval callback the scheduler calls for every node
(`cb_eval` of llama_context_params, as llama-imatrix passes it): for a MUL_MAT by a `blk.*`
matrix with at least 16 F32 input rows, the squares of each input row added per column, and the
row count; for a MUL_MAT_ID, the rows each expert received, per expert. The sums are float32
(llama-imatrix's Stats::values), added row by row as it adds them. The file is llama-imatrix's
GGUF format (save_imatrix).

  /path/to/bench-venv/bin/python benches/record_imatrix.py
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import llama_cpp as L
import numpy as np

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
TEXT = DATA / "imatrix" / "calibration.txt"
MODELS = ("tiny-llama-f32", "tiny-qwen3moe-f32", "tiny-phi3-f32")
N_CTX, N_BATCH = 64, 128  # two chunks per batch, as llama-imatrix -c 64 -b 128
GGML_OP_MUL_MAT, GGML_OP_MUL_MAT_ID = 29, 30  # ggml.h's enum ggml_op
GGML_TYPE_F32 = 0


class GgmlTensor(ctypes.Structure):
    """ggml.h's struct ggml_tensor (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64)."""


GgmlTensor._fields_ = [
    ("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
    ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(GgmlTensor) * 10), ("view_src", ctypes.POINTER(GgmlTensor)), ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8),
]


def weight_name(t: GgmlTensor) -> str:
    """filter_tensor_name: the name between '#'s when a backend prefixed it."""
    name = t.name.decode()
    return name.split("#")[1] if "#" in name else name


def rows_of(t: GgmlTensor, i1: int, i2: int) -> np.ndarray:
    """The ne[0] float32 values at (i1, i2) of a host tensor."""
    addr = t.data + i1 * t.nb[1] + i2 * t.nb[2]
    return np.ctypeslib.as_array(ctypes.cast(addr, ctypes.POINTER(ctypes.c_float)), shape=(t.ne[0],))


class Collector:
    def __init__(self):
        self.stats: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, tensor_p, ask, _user) -> bool:
        t = ctypes.cast(tensor_p, ctypes.POINTER(GgmlTensor)).contents
        if t.op not in (GGML_OP_MUL_MAT, GGML_OP_MUL_MAT_ID):
            return False
        src0, src1 = t.src[0].contents, t.src[1].contents
        wname = weight_name(src0)
        if ask:
            if t.op == GGML_OP_MUL_MAT_ID:
                return True
            return src1.ne[1] >= 16 and src1.type == GGML_TYPE_F32 and wname.startswith("blk.")
        if t.op == GGML_OP_MUL_MAT_ID:
            self.add_experts(wname, src0, src1, t.src[2].contents)
        else:
            self.add_dense(wname, src0, src1)
        return True

    def entry(self, name: str, n_cols: int, n_mat: int) -> tuple[np.ndarray, np.ndarray]:
        if name not in self.stats:
            self.stats[name] = (np.zeros((n_mat, n_cols), np.float32), np.zeros(n_mat, np.int64))
        return self.stats[name]

    def add_dense(self, name: str, src0: GgmlTensor, src1: GgmlTensor) -> None:
        assert src0.ne[2] == 1 and src0.ne[3] == 1 and src1.ne[2] == 1 and src1.ne[3] == 1
        sums, counts = self.entry(name, src1.ne[0], 1)
        for row in range(src1.ne[1]):
            x = rows_of(src1, row, 0)
            sums[0] += x * x
        counts[0] += src1.ne[1]

    def add_experts(self, name: str, src0: GgmlTensor, src1: GgmlTensor, ids: GgmlTensor) -> None:
        n_as, n_ids, n_tokens = src0.ne[2], ids.ne[0], src1.ne[2]
        sums, counts = self.entry(name, src1.ne[0], n_as)
        for idx in range(n_ids):
            for row in range(n_tokens):
                ex = ctypes.cast(ids.data + row * ids.nb[1] + idx * ids.nb[0], ctypes.POINTER(ctypes.c_int32))[0]
                x = rows_of(src1, idx % src1.ne[1], row)
                sums[ex] += x * x
                counts[ex] += 1


def tokenize(model, text: str) -> list[int]:
    vocab = L.llama_model_get_vocab(model)
    raw = text.encode()
    buf = (L.llama_token * (len(raw) + 8))()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, False)
    assert n >= 0
    return list(buf[:n])


def compute(path: Path, text: str) -> tuple[dict, int]:
    params = L.llama_model_default_params()
    params.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(path).encode(), params)
    vocab = L.llama_model_get_vocab(model)
    tokens = tokenize(model, text)
    n_seq = max(1, N_BATCH // N_CTX)
    collector = Collector()
    callback = L.ggml_backend_sched_eval_callback(collector)
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_seq * N_CTX, N_BATCH, N_BATCH, n_seq
    p.n_threads = p.n_threads_batch = 2
    p.kv_unified = True
    # Flash attention off: the attention arithmetic the engine reproduces (llama-imatrix's
    # default, auto, turns it on on a CPU, which rounds Q to F16 before the products).
    p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    p.cb_eval = callback
    p.no_perf = True
    ctx = L.llama_init_from_model(model, p)
    n_chunk = len(tokens) // N_CTX
    add_bos = L.llama_vocab_get_add_bos(vocab)
    for i in range(0, n_chunk, n_seq):
        n_seq_batch = min(n_seq, n_chunk - i)
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        batch = L.llama_batch_init(N_CTX * n_seq_batch, 0, n_seq_batch)
        for seq in range(n_seq_batch):
            start = (i + seq) * N_CTX
            for k in range(N_CTX):
                j = seq * N_CTX + k
                batch.token[j] = L.llama_vocab_bos(vocab) if (add_bos and k == 0) else tokens[start + k]
                batch.pos[j], batch.n_seq_id[j], batch.logits[j] = k, 1, True
                batch.seq_id[j][0] = seq
        batch.n_tokens = N_CTX * n_seq_batch
        assert L.llama_decode(ctx, batch) == 0
        L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return collector.stats, n_chunk


def save(path: Path, stats: dict, n_chunk: int) -> None:
    writer = gguf.GGUFWriter(str(path), arch="")
    writer.kv_data[0].pop("general.architecture", None)
    writer.add_type("imatrix")
    writer.add_array("imatrix.datasets", [TEXT.name])
    writer.add_uint32("imatrix.chunk_count", n_chunk)
    writer.add_uint32("imatrix.chunk_size", N_CTX)
    for name in sorted(stats):
        sums, counts = stats[name]
        writer.add_tensor(f"{name}.in_sum2", sums)
        writer.add_tensor(f"{name}.counts", counts.astype(np.float32).reshape(-1, 1))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    text = TEXT.read_text()
    for name in MODELS:
        stats, n_chunk = compute(DATA / "models" / f"{name}.gguf", text)
        out = DATA / "imatrix" / f"{name}.imatrix.gguf"
        save(out, stats, n_chunk)
        print(f"{out}: {len(stats)} matrices, {n_chunk} chunks")


if __name__ == "__main__":
    main()
