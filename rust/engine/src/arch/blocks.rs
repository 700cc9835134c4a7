//! The pieces of a decoder block the architectures share: Q/K/V projections, RoPE and storing
//! K/V in the cache, attention with its output projection, and a gated feed-forward network.
//! Each architecture file composes them with its own norms and residuals.

use ferrollama_tensor::{matmul, SendPtr, Threads};

use crate::attention::{attention, AttnInput};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::LayerWeights;
use crate::ops::{add_bias, rope_apply, RopeParams};

/// ws.q, ws.k, ws.v = W·ws.h (+ biases) for n tokens.
pub fn project_qkv(lw: &LayerWeights, ws: &mut Workspace, n: usize, threads: &Threads) {
    let (q_dim, k_dim, v_dim) = (lw.wq.rows, lw.wk.rows, lw.wv.rows);
    matmul(&lw.wq, &ws.h, n, &mut ws.q[..n * q_dim], &mut ws.mm, threads);
    matmul(&lw.wk, &ws.h, n, &mut ws.k[..n * k_dim], &mut ws.mm, threads);
    matmul(&lw.wv, &ws.h, n, &mut ws.v[..n * v_dim], &mut ws.mm, threads);
    for (buf, bias, dim) in [(&mut ws.q, &lw.bq, q_dim), (&mut ws.k, &lw.bk, k_dim), (&mut ws.v, &lw.bv, v_dim)] {
        if let Some(b) = bias {
            add_bias(&mut buf[..n * dim], b);
        }
    }
}

/// Rotates every head of Q and K (`rope_cache` holds each token's cos/sin) and stores each
/// token's K and V in its cell of layer `il`.
pub fn rope_and_store(hp: &HParams, lw: &LayerWeights, rope: &RopeParams, rope_cache: &[f32], ws: &mut Workspace,
                      kv: &mut KvStore, ub: &UBatchView, il: usize) {
    let (q_dim, k_dim, v_dim) = (lw.wq.rows, lw.wk.rows, lw.wv.rows);
    let n_rot = rope.n_dims;
    for t in 0..ub.tokens.len() {
        let cache = &rope_cache[t * n_rot..(t + 1) * n_rot];
        for head in ws.q[t * q_dim..(t + 1) * q_dim].chunks_exact_mut(hp.head_dim_k) {
            rope_apply(head, cache, rope);
        }
        for head in ws.k[t * k_dim..(t + 1) * k_dim].chunks_exact_mut(hp.head_dim_k) {
            rope_apply(head, cache, rope);
        }
        kv.write(il, ub.kv(il).slots[t] as usize, &ws.k[t * k_dim..(t + 1) * k_dim], &ws.v[t * v_dim..(t + 1) * v_dim]);
    }
}

/// ws.o = Wo · attention(ws.q over layer il's cells) (+ output bias), scores scaled by `scale`.
pub fn attend(hp: &HParams, lw: &LayerWeights, ws: &mut Workspace, kv: &KvStore, ub: &UBatchView, il: usize,
              scale: f32, threads: &Threads) {
    let n = ub.tokens.len();
    let (q_dim, attn_dim, d) = (lw.wq.rows, hp.n_head * hp.head_dim_v, hp.n_embd);
    let view = ub.kv(il);
    let input = AttnInput {
        q: &ws.q[..n * q_dim], n_tokens: n, n_head: hp.n_head, n_head_kv: hp.n_head_kv, kv, layer: il,
        mask: view.mask, n_kv: view.n_kv, scale, softcap: 0.0,
    };
    attention(&input, &mut ws.attn[..n * attn_dim], threads);
    matmul(&lw.wo, &ws.attn, n, &mut ws.o[..n * d], &mut ws.mm, threads);
    if let Some(b) = &lw.bo {
        add_bias(&mut ws.o[..n * d], b);
    }
}

/// ws.o = W_down · act(W_gate·ws.h, W_up·ws.h), with `act` the gated activation (SwiGLU, GeGLU).
pub fn gated_ffn(hp: &HParams, lw: &LayerWeights, ws: &mut Workspace, n: usize, act: Activation, threads: &Threads) {
    let (d, ff) = (hp.n_embd, hp.n_ff);
    matmul(&lw.ffn_gate, &ws.h, n, &mut ws.gate[..n * ff], &mut ws.mm, threads);
    matmul(&lw.ffn_up, &ws.h, n, &mut ws.up[..n * ff], &mut ws.mm, threads);
    rows_on_threads(act, &mut ws.gate[..n * ff], &ws.up[..n * ff], ff, threads);
    matmul(&lw.ffn_down, &ws.gate, n, &mut ws.o[..n * d], &mut ws.mm, threads);
}

/// A gated activation: x = act(x) * y over rows of the given length (ggml applies some of
/// them row by row: SwiGLU's vector chunks start at each row).
pub type Activation = fn(&mut [f32], &[f32], usize);

/// Elements per task of an element-wise step: below two tasks' worth, the dispatch costs
/// more than the second thread gives.
const ELEMENTWISE_CHUNK: usize = 8192;

/// `act(x, y, row)` over runs of whole rows on the threads (the same bits: each row's
/// arithmetic is its own). With several tokens, the activation of a 4864-wide FFN is
/// otherwise a serial step the other thread waits through (measured: 3 % of an 8-sequence
/// decode step, and as much again spinning).
fn rows_on_threads(act: Activation, x: &mut [f32], y: &[f32], row: usize, threads: &Threads) {
    assert!(x.len() == y.len() && row > 0 && x.len() % row == 0, "element-wise operands of whole rows, of one length");
    let chunk = row * (ELEMENTWISE_CHUNK / row).max(1);
    let n_chunks = x.len().div_ceil(chunk);
    if n_chunks < 2 || threads.n_threads() < 2 {
        act(x, y, row);
        return;
    }
    let xs = SendPtr(x.as_mut_ptr());
    threads.run(n_chunks, |c| {
        let range = c * chunk..((c + 1) * chunk).min(y.len());
        // SAFETY: the chunks are disjoint ranges of x (x and y have the same length).
        let part = unsafe { std::slice::from_raw_parts_mut(xs.get().add(range.start), range.len()) };
        act(part, &y[range], row);
    });
}
