//! The llama family graph (llama, qwen2): pre-norm decoder blocks with RoPE attention and a
//! SwiGLU feed-forward network; qwen2 adds Q/K/V biases and rotates NEOX-style.

use ferrollama_tensor::{matmul, Threads};

use crate::arch::blocks::{attend, gated_ffn, project_qkv, rope_and_store};
use crate::graph::{UBatchView, Workspace};
use crate::kvstore::KvStore;
use crate::model::{LayerWeights, Model, Weights};
use crate::ops::{add_inplace, rms_norm, rms_norm_inplace, swiglu};

/// Runs the micro-batch through the model, storing K/V in the cache and writing the logits
/// of `ub.out_rows` (n_out rows of n_vocab) to `logits`.
pub fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView,
               threads: &Threads, logits: &mut [f32]) {
    let hp = &model.hparams;
    let n = ub.tokens.len();
    let d = hp.n_embd;
    for (t, &tok) in ub.tokens.iter().enumerate() {
        w.tok_embd.dequantize_row(tok as usize, &mut ws.x[t * d..(t + 1) * d]);
    }
    let n_rot = hp.rope.n_dims;
    for (t, &p) in ub.pos.iter().enumerate() {
        hp.rope.fill_cache(p as f32, &mut ws.rope_cache[t * n_rot..(t + 1) * n_rot]);
    }
    for (il, lw) in w.layers.iter().enumerate() {
        attention_block(model, il, lw, ws, kv, ub, threads);
        ffn_block(model, lw, ws, n, threads);
        if let Some(cv) = ub.cvec {
            cv.apply(il, &mut ws.x[..n * d]);
        }
    }
    output(model, w, ws, ub.out_rows, threads, logits);
}

fn attention_block(model: &Model, il: usize, lw: &LayerWeights, ws: &mut Workspace, kv: &mut KvStore,
                   ub: &UBatchView, threads: &Threads) {
    let hp = &model.hparams;
    let (n, d) = (ub.tokens.len(), hp.n_embd);
    rms_norm(&ws.x[..n * d], &lw.attn_norm, hp.rms_eps, &mut ws.h[..n * d]);
    project_qkv(lw, ws, n, threads);
    let rope_cache = std::mem::take(&mut ws.rope_cache);
    rope_and_store(hp, lw, &hp.rope, &rope_cache, ws, kv, ub, il);
    ws.rope_cache = rope_cache;
    attend(hp, lw, ws, kv, ub, il, hp.attn_scale, threads);
    add_inplace(&mut ws.x[..n * d], &ws.o[..n * d]);
}

fn ffn_block(model: &Model, lw: &LayerWeights, ws: &mut Workspace, n: usize, threads: &Threads) {
    let hp = &model.hparams;
    let d = hp.n_embd;
    rms_norm(&ws.x[..n * d], &lw.ffn_norm, hp.rms_eps, &mut ws.h[..n * d]);
    gated_ffn(hp, lw, ws, n, swiglu, threads);
    add_inplace(&mut ws.x[..n * d], &ws.o[..n * d]);
}

/// Final norm and output projection of the wanted rows only.
pub(crate) fn output(model: &Model, w: &Weights, ws: &mut Workspace, out_rows: &[usize], threads: &Threads,
                     logits: &mut [f32]) {
    let hp = &model.hparams;
    let d = hp.n_embd;
    let n_out = out_rows.len();
    if n_out == 0 {
        return;
    }
    for (i, &r) in out_rows.iter().enumerate() {
        let (src, dst) = (r * d, i * d);
        ws.h[dst..dst + d].copy_from_slice(&ws.x[src..src + d]);
    }
    rms_norm_inplace(&mut ws.h[..n_out * d], &w.output_norm, hp.rms_eps);
    matmul(&w.output, &ws.h, n_out, &mut logits[..n_out * hp.n_vocab], &mut ws.mm, threads);
}
