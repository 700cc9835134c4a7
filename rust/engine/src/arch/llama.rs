//! The llama family graph (llama, qwen2): pre-norm decoder blocks with RoPE attention and a
//! SwiGLU feed-forward network; qwen2 adds Q/K/V biases and rotates NEOX-style.

use ferrollama_tensor::{matmul, Threads};

use crate::attention::{attention, AttnInput};
use crate::graph::{UBatchView, Workspace};
use crate::kvstore::KvStore;
use crate::model::{LayerWeights, Model, Weights};
use crate::ops::{add_bias, add_inplace, rms_norm, rms_norm_inplace, rope_apply, swiglu};

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
    let n = ub.tokens.len();
    let d = hp.n_embd;
    rms_norm(&ws.x[..n * d], &lw.attn_norm, hp.rms_eps, &mut ws.h[..n * d]);
    let (q_dim, k_dim, v_dim) = (lw.wq.rows, lw.wk.rows, lw.wv.rows);
    matmul(&lw.wq, &ws.h, n, &mut ws.q[..n * q_dim], &mut ws.mm, threads);
    matmul(&lw.wk, &ws.h, n, &mut ws.k[..n * k_dim], &mut ws.mm, threads);
    matmul(&lw.wv, &ws.h, n, &mut ws.v[..n * v_dim], &mut ws.mm, threads);
    for (buf, bias, dim) in [(&mut ws.q, &lw.bq, q_dim), (&mut ws.k, &lw.bk, k_dim), (&mut ws.v, &lw.bv, v_dim)] {
        if let Some(b) = bias {
            add_bias(&mut buf[..n * dim], b);
        }
    }
    let n_rot = hp.rope.n_dims;
    for t in 0..n {
        let cache = &ws.rope_cache[t * n_rot..(t + 1) * n_rot];
        for head in ws.q[t * q_dim..(t + 1) * q_dim].chunks_exact_mut(hp.head_dim_k) {
            rope_apply(head, cache, &hp.rope);
        }
        for head in ws.k[t * k_dim..(t + 1) * k_dim].chunks_exact_mut(hp.head_dim_k) {
            rope_apply(head, cache, &hp.rope);
        }
        kv.write(il, ub.kv(il).slots[t] as usize, &ws.k[t * k_dim..(t + 1) * k_dim], &ws.v[t * v_dim..(t + 1) * v_dim]);
    }
    let attn_dim = hp.n_head * hp.head_dim_v;
    let input = AttnInput {
        q: &ws.q[..n * q_dim], n_tokens: n, n_head: hp.n_head, n_head_kv: hp.n_head_kv, kv, layer: il,
        mask: ub.kv(il).mask, n_kv: ub.kv(il).n_kv, scale: hp.attn_scale, softcap: 0.0,
    };
    attention(&input, &mut ws.attn[..n * attn_dim], threads);
    matmul(&lw.wo, &ws.attn, n, &mut ws.o[..n * d], &mut ws.mm, threads);
    if let Some(b) = &lw.bo {
        add_bias(&mut ws.o[..n * d], b);
    }
    add_inplace(&mut ws.x[..n * d], &ws.o[..n * d]);
}

fn ffn_block(model: &Model, lw: &LayerWeights, ws: &mut Workspace, n: usize, threads: &Threads) {
    let hp = &model.hparams;
    let (d, ff) = (hp.n_embd, hp.n_ff);
    rms_norm(&ws.x[..n * d], &lw.ffn_norm, hp.rms_eps, &mut ws.h[..n * d]);
    matmul(&lw.ffn_gate, &ws.h, n, &mut ws.gate[..n * ff], &mut ws.mm, threads);
    matmul(&lw.ffn_up, &ws.h, n, &mut ws.up[..n * ff], &mut ws.mm, threads);
    swiglu(&mut ws.gate[..n * ff], &ws.up[..n * ff]);
    matmul(&lw.ffn_down, &ws.gate, n, &mut ws.o[..n * d], &mut ws.mm, threads);
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
