"""``ferrollama imatrix -m MODEL -f TEXT -o FILE``: an importance matrix, as llama-imatrix computes it.

The text is tokenized (with BOS) and cut into chunks of -c tokens (default 512; at least two
chunks); each chunk is decoded from an empty cache with BOS in its first place and every token
an output, several chunks per batch (one sequence each) when -b is a multiple of -c. While
decoding, the engine adds up, for each layer matrix (``blk.*``), the squares of its input
activations per input column and counts the rows (``Context.set_activation_stats``): dense
products of micro-batches under 16 tokens are skipped, each expert of a mixture has its own
row of sums and its own count — llama-imatrix's collector.

The file is llama-imatrix's GGUF format: ``general.type = "imatrix"``, ``imatrix.datasets``
(the text's path), ``imatrix.chunk_count``, ``imatrix.chunk_size``, and per matrix
``<name>.in_sum2`` (F32, n_mat rows of n_cols sums) and ``<name>.counts`` (F32, n_mat).
``ferrollama quantize --imatrix FILE`` (and llama-quantize) divide the sums by the counts.
"""
from __future__ import annotations

import argparse

import numpy as np

from .._core import Batch
from ..generation.tokens import add_bos_of
from .perplexity import Plan, chunk_plan
from .common import CLIError, add_context_args, add_model_args, int_value, load_model, log, make_context, progress, \
    read_text_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_context_args(p, n_ctx=512)
    g = p.add_argument_group("imatrix")
    g.add_argument("-f", "--file", metavar="FNAME", required=True, help="the text to compute the matrix over")
    g.add_argument("-o", "--output", metavar="FNAME", default="imatrix.gguf", help="the file to write (default: imatrix.gguf)")
    g.add_argument("--chunks", type=int_value, default=-1, metavar="N", help="use at most N chunks (default: all)")


def make_plan(n_tokens: int, n_ctx: int, n_batch: int, chunks: int) -> Plan:
    if n_ctx <= 0:
        raise CLIError("imatrix needs a context size: -c N with N > 0")
    if n_tokens < 2 * n_ctx:
        raise CLIError(f"you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens; "
                       f"the text tokenizes to only {n_tokens}")
    return chunk_plan(n_tokens, n_ctx, n_batch, chunks)


def decode_chunks(ctx, plan: Plan, tokens: list[int], first_chunk: int, n_seq: int, bos: int | None) -> None:
    """Decodes chunks first_chunk.. (n_seq of them, one sequence each) from an empty cache."""
    ctx.kv.clear()
    n_ctx = plan.n_ctx
    for j in range(0, n_ctx, plan.n_batch):
        size = min(plan.n_batch, n_ctx - j)
        batch = Batch(n_tokens_max=size * n_seq, n_seq_max=n_seq)
        for seq in range(n_seq):
            start = (first_chunk + seq) * n_ctx + j
            for k in range(size):
                token = bos if (bos is not None and j == 0 and k == 0) else tokens[start + k]
                batch.add(token, j + k, (seq,), True)
        ctx.decode(batch)


def collect(model, ctx, plan: Plan, tokens: list[int]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{tensor name: (sums (n_mat, n_cols), counts (n_mat,))} over the plan's chunks."""
    bos = model.bos if add_bos_of(model) else None
    ctx.set_activation_stats(True)
    with progress(plan.n_chunk, "imatrix", unit="chunk") as bar:
        for i in range(0, plan.n_chunk, plan.n_seq):
            n_seq = min(plan.n_seq, plan.n_chunk - i)
            decode_chunks(ctx, plan, tokens, i, n_seq, bos)
            bar.update(n_seq)
    stats = ctx.take_activation_stats()
    ctx.set_activation_stats(False)
    return stats


def write_imatrix(path: str, stats: dict[str, tuple[np.ndarray, np.ndarray]], datasets: list[str],
                  chunk_count: int, chunk_size: int) -> None:
    """llama-imatrix's GGUF file (its save_imatrix): metadata, then sums and counts per matrix, by name."""
    import gguf

    writer = gguf.GGUFWriter(path, arch="")
    # An imatrix file has no architecture: the writer adds the key for every file, llama-imatrix does not.
    writer.kv_data[0].pop("general.architecture", None)
    writer.add_type("imatrix")
    writer.add_array("imatrix.datasets", datasets)
    writer.add_uint32("imatrix.chunk_count", chunk_count)
    writer.add_uint32("imatrix.chunk_size", chunk_size)
    for name in sorted(stats):
        sums, counts = stats[name]
        writer.add_tensor(f"{name}.in_sum2", np.ascontiguousarray(sums, dtype=np.float32))
        writer.add_tensor(f"{name}.counts", np.asarray(counts, dtype=np.float32).reshape(-1, 1))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def run(args: argparse.Namespace) -> int:
    text = read_text_file(args.file, "text file")
    model = load_model(args)
    n_ctx = args.ctx_size if args.ctx_size > 0 else model.n_ctx_train
    tokens = model.tokenize(text, add_special=True)
    plan = make_plan(len(tokens), n_ctx, args.batch_size, args.chunks)
    ctx = make_context(args, model, n_ctx=plan.n_seq * n_ctx, n_batch=plan.n_batch, n_seq_max=plan.n_seq)
    log(f"imatrix: computing over {plan.n_chunk} chunks, n_ctx={n_ctx}, batch_size={plan.n_batch}, n_seq={plan.n_seq}")
    stats = collect(model, ctx, plan, tokens)
    if not stats:
        raise CLIError(f"{args.model}: no layer matrix saw a micro-batch of 16 tokens or more (use a larger -c)")
    write_imatrix(args.output, stats, [args.file], plan.n_chunk, n_ctx)
    print(f"imatrix: stored {len(stats)} matrices after {plan.n_chunk} chunks in {args.output}")
    return 0
