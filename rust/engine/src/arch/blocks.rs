//! The pieces of a decoder block the architectures share: embeddings, norms, Q/K/V
//! projections, RoPE and storing K/V in the cache, attention with its output projection, the
//! feed-forward networks (gated, or a mixture of experts), residuals and the output head.
//! Each architecture file composes them in its own order.

use ferrollama_tensor::{matmul, MatmulScratch, QMatrix, SendPtr, Threads};

use crate::actstats::{ActivationStats, Matrix};
use crate::attention::{attention, AttnInput};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::lora::{add_embedding_terms, add_terms, LayerLora, LoraScratch, Proj, Term};
use crate::model::{AttnWeights, Ffn, GatedFfn, LayerWeights, Weights};
use crate::ops::{
    add_bias, add_inplace, layer_norm_rows, rms_norm, rms_norm_inplace, rms_norm_plain_inplace, rope_apply, scale_inplace, RopeParams,
};

/// out = W·x for n tokens, times W's second scale where it has one, plus the LoRA terms of W
/// (llama.cpp's build_lora_mm).
#[allow(clippy::too_many_arguments)]
pub fn lora_mm(w: &QMatrix, scale: Option<f32>, terms: &[Term], x: &[f32], n: usize, out: &mut [f32], mm: &mut MatmulScratch,
               lora: &mut LoraScratch, threads: &Threads) {
    matmul(w, x, n, out, mm, threads);
    if let Some(s) = scale {
        scale_inplace(&mut out[..n * w.rows], s);
    }
    if !terms.is_empty() {
        add_terms(terms, 0, x, n, out, lora, mm, threads);
    }
}

/// ws.x = the embeddings of the micro-batch's tokens (with the adapters' terms of the token
/// embedding), times `scale` (1: none); or the batch's own input embeddings, scaled only where
/// the model scales those too (`HParams::embedding_scale_raw`).
pub fn embed(w: &Weights, ws: &mut Workspace, ub: &UBatchView, hp: &HParams, scale: f32, threads: &Threads) {
    let (n, d) = (ub.tokens.len(), hp.n_embd);
    if let Some(rows) = ub.embd {
        // each row's main embedding (its DeepStack parts follow it: add_deepstack)
        for (x, row) in ws.x[..n * d].chunks_exact_mut(d).zip(rows.chunks_exact(hp.n_embd_inp())) {
            x.copy_from_slice(&row[..d]);
        }
        if scale != 1.0 && hp.embedding_scale_raw {
            scale_inplace(&mut ws.x[..n * d], scale);
        }
        return;
    }
    for (t, &tok) in ub.tokens.iter().enumerate() {
        w.tok_embd.dequantize_row(tok as usize, &mut ws.x[t * d..(t + 1) * d]);
    }
    if let Some(l) = ub.lora.filter(|l| !l.tok_embd().is_empty()) {
        add_embedding_terms(l.tok_embd(), ub.tokens, &mut ws.x[..n * d], &mut ws.lora, threads);
    }
    if scale != 1.0 {
        scale_inplace(&mut ws.x[..n * d], scale);
    }
}

/// Each token's RoPE cos/sin: ws.rope_cache for the model's RoPE, and ws.rope_cache_swa for
/// the sliding-window layers' own base where the model has one.
pub fn fill_rope_caches(hp: &HParams, ws: &mut Workspace, ub: &UBatchView) {
    let n_rot = hp.rope.n_dims;
    let swa_il = hp.swa_layers.iter().position(|&s| s).unwrap_or(0);
    let (swa_rope, swa_factors) = (hp.layer_rope(ub.rope, swa_il), hp.layer_rope_factors(swa_il, ub.rope_factors));
    let n_rot_swa = swa_rope.n_dims;
    for (t, &p) in ub.pos.iter().enumerate() {
        let cache = &mut ws.rope_cache[t * n_rot..(t + 1) * n_rot];
        match &hp.mrope {
            Some(m) => ub.rope.fill_cache_mrope(ub.mrope_pos(t), m, ub.rope_factors, cache),
            None => ub.rope.fill_cache(p as f32, ub.rope_factors, cache),
        }
        if !ws.rope_cache_swa.is_empty() {
            swa_rope.fill_cache(p as f32, swa_factors, &mut ws.rope_cache_swa[t * n_rot_swa..(t + 1) * n_rot_swa]);
        }
    }
}

/// Qwen3-VL's DeepStack: after layer il (of the first n_deepstack), each input embedding's
/// part il + 1 (an image's features of an earlier vision layer) is added to the token's
/// residual stream. Token embeddings add nothing (llama.cpp pads them with zeros).
pub fn add_deepstack(hp: &HParams, ws: &mut Workspace, ub: &UBatchView, il: usize) {
    let Some(rows) = ub.embd.filter(|_| il < hp.n_deepstack) else { return };
    let d = hp.n_embd;
    let n = ub.tokens.len();
    for (x, row) in ws.x[..n * d].chunks_exact_mut(d).zip(rows.chunks_exact(hp.n_embd_inp())) {
        add_inplace(x, &row[(il + 1) * d..(il + 2) * d]);
    }
}

/// ws.h = RMSNorm(ws.x) with `norm`'s weights, or a copy of ws.x for a block without one.
pub fn pre_norm(ws: &mut Workspace, norm: Option<&[f32]>, eps: f32, n: usize, d: usize) {
    match norm {
        Some(w) => rms_norm(&ws.x[..n * d], w, eps, &mut ws.h[..n * d]),
        None => ws.h[..n * d].copy_from_slice(&ws.x[..n * d]),
    }
}

/// ws.h = the model's norm of ws.x: a LayerNorm (with `bias` where it has one) in a model
/// of LayerNorms, else RMSNorm (a copy of ws.x for a block without norm).
pub fn layer_pre_norm(hp: &HParams, ws: &mut Workspace, norm: Option<&[f32]>, bias: Option<&[f32]>, n: usize, d: usize) {
    match norm {
        Some(w) if hp.layer_norm => {
            ws.h[..n * d].copy_from_slice(&ws.x[..n * d]);
            layer_norm_rows(&mut ws.h[..n * d], w, bias, hp.norm_eps);
        }
        _ => pre_norm(ws, norm, hp.rms_eps, n, d),
    }
}

/// ws.q, ws.k, ws.v = W·ws.h (+ the adapters' terms, + biases) for n tokens.
pub fn project_qkv(lw: &AttnWeights, ws: &mut Workspace, n: usize, lora: LayerLora, threads: &Threads) {
    project_q(lw, ws, n, lora, threads);
    project_kv(lw, ws, n, lora, threads);
}

/// ws.q = Wq·ws.h (+ the adapters' terms, + bias) for n tokens.
pub fn project_q(lw: &AttnWeights, ws: &mut Workspace, n: usize, lora: LayerLora, threads: &Threads) {
    let q_dim = lw.wq.rows;
    lora_mm(&lw.wq, lw.scales.q, lora.terms(Proj::Q), &ws.h, n, &mut ws.q[..n * q_dim], &mut ws.mm, &mut ws.lora, threads);
    if let Some(b) = &lw.bq {
        add_bias(&mut ws.q[..n * q_dim], b);
    }
}

/// ws.k, ws.v = W·ws.h (+ the adapters' terms, + biases) for n tokens, and the activation
/// statistics of the three projections' input.
pub fn project_kv(lw: &AttnWeights, ws: &mut Workspace, n: usize, lora: LayerLora, threads: &Threads) {
    let (k_dim, v_dim) = (lw.wk.rows, lw.wv.rows);
    lora_mm(&lw.wk, lw.scales.k, lora.terms(Proj::K), &ws.h, n, &mut ws.k[..n * k_dim], &mut ws.mm, &mut ws.lora, threads);
    lora_mm(&lw.wv, lw.scales.v, lora.terms(Proj::V), &ws.h, n, &mut ws.v[..n * v_dim], &mut ws.mm, &mut ws.lora, threads);
    if let Some(s) = ws.stats.as_deref_mut() {
        let x = &ws.h[..n * lw.wq.cols];
        for m in [Matrix::AttnQ, Matrix::AttnK, Matrix::AttnV] {
            s.record(m, x, n);
        }
    }
    for (buf, bias, dim) in [(&mut ws.k, &lw.bk, k_dim), (&mut ws.v, &lw.bv, v_dim)] {
        if let Some(b) = bias {
            add_bias(&mut buf[..n * dim], b);
        }
    }
}

/// RMSNorm of Q and K where the layer has their norms: per head (norms of head_dim values)
/// or over each token's whole projection (norms of n_head·head_dim values): the norm's
/// length is the row it normalizes.
pub fn qk_norm(lw: &AttnWeights, ws: &mut Workspace, n: usize, eps: f32) {
    let (q_dim, k_dim) = (lw.wq.rows, lw.wk.rows);
    if let Some(w) = &lw.q_norm { rms_norm_inplace(&mut ws.q[..n * q_dim], w, eps); }
    if let Some(w) = &lw.k_norm { rms_norm_inplace(&mut ws.k[..n * k_dim], w, eps); }
}

/// Rotates every head of Q and K (`rope_cache` holds each token's cos/sin) and stores each
/// token's K and V in its cell of layer `il`.
pub fn rope_and_store(hp: &HParams, lw: &AttnWeights, rope: &RopeParams, rope_cache: &[f32], ws: &mut Workspace,
                      kv: &mut KvStore, ub: &UBatchView, il: usize) {
    rope_qk(hp, lw, rope, rope_cache, ws, ub.tokens.len(), il);
    store_kv(lw, ws, kv, ub, il);
}

/// Rotates every head of Q and K of n tokens of layer il (`rope_cache` holds each token's
/// cos/sin; the heads are the layer's size).
pub fn rope_qk(hp: &HParams, lw: &AttnWeights, rope: &RopeParams, rope_cache: &[f32], ws: &mut Workspace, n: usize, il: usize) {
    let hd = hp.head_dim_k_of(il);
    let (q_dim, k_dim) = (hp.n_head * hd, lw.wk.rows);
    let n_rot = rope.n_dims;
    for t in 0..n {
        let cache = &rope_cache[t * n_rot..(t + 1) * n_rot];
        for head in ws.q[t * q_dim..(t + 1) * q_dim].chunks_exact_mut(hd) {
            rope_apply(head, cache, rope);
        }
        for head in ws.k[t * k_dim..(t + 1) * k_dim].chunks_exact_mut(hd) {
            rope_apply(head, cache, rope);
        }
    }
}

/// Stores each token's K and V (ws.k, ws.v) in its cell of layer `il`.
pub fn store_kv(lw: &AttnWeights, ws: &Workspace, kv: &mut KvStore, ub: &UBatchView, il: usize) {
    let (k_dim, v_dim) = (lw.wk.rows, lw.wv.rows);
    for t in 0..ub.tokens.len() {
        kv.write(il, ub.kv(il).slots[t] as usize, &ws.k[t * k_dim..(t + 1) * k_dim], &ws.v[t * v_dim..(t + 1) * v_dim]);
    }
}

/// RoPE of layer il (its sliding-window base where it has one; none on a no-RoPE layer) and
/// the K/V store.
pub fn rope_layer_and_store(hp: &HParams, lw: &AttnWeights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, il: usize) {
    if !hp.nope_layers.get(il).copied().unwrap_or(false) {
        rope_layer(hp, lw, ws, ub, il);
    }
    store_kv(lw, ws, kv, ub, il);
}

/// Rotates Q and K with layer il's RoPE (its sliding-window base where it has one).
pub fn rope_layer(hp: &HParams, lw: &AttnWeights, ws: &mut Workspace, ub: &UBatchView, il: usize) {
    let sliding = hp.swa_layers[il] && !ws.rope_cache_swa.is_empty();
    let rope_cache = std::mem::take(if sliding { &mut ws.rope_cache_swa } else { &mut ws.rope_cache });
    rope_qk(hp, lw, &hp.layer_rope(ub.rope, il), &rope_cache, ws, ub.tokens.len(), il);
    *(if sliding { &mut ws.rope_cache_swa } else { &mut ws.rope_cache }) = rope_cache;
}

/// Rotates every query head of layer il (its sliding-window RoPE where it has one), for a
/// layer that attends over an earlier layer's K/V and stores none (Gemma 4's shared KV).
pub fn rope_queries(hp: &HParams, ws: &mut Workspace, ub: &UBatchView, il: usize) {
    let sliding = hp.swa_layers[il] && !ws.rope_cache_swa.is_empty();
    let rope = hp.layer_rope(ub.rope, il);
    let (hd, n_rot) = (hp.head_dim_k_of(il), rope.n_dims);
    let q_dim = hp.n_head * hd;
    let cache = if sliding { &ws.rope_cache_swa } else { &ws.rope_cache };
    for t in 0..ub.tokens.len() {
        let c = &cache[t * n_rot..(t + 1) * n_rot];
        for head in ws.q[t * q_dim..(t + 1) * q_dim].chunks_exact_mut(hd) {
            rope_apply(head, c, &rope);
        }
    }
}

/// Q times each token's attention temperature (llama.cpp's Llama 4 temperature tuning) where
/// the model has one.
pub fn temper_q(hp: &HParams, ws: &mut Workspace, ub: &UBatchView) {
    let Some(temp) = hp.attn_temp else { return };
    let q_dim = hp.n_head * hp.head_dim_k;
    for (t, &p) in ub.pos.iter().enumerate() {
        scale_inplace(&mut ws.q[t * q_dim..(t + 1) * q_dim], temp.factor(p));
    }
}

/// ws.o = Wo · attention(ws.q over layer il's cells) (+ output bias), scores scaled by
/// `scale` and soft-capped by `softcap` (0: none) before the softmax.
pub fn attend(hp: &HParams, lw: &AttnWeights, ws: &mut Workspace, kv: &KvStore, ub: &UBatchView, il: usize,
              scale: f32, softcap: f32, threads: &Threads) {
    attend_heads(hp, lw, ws, kv, ub, il, scale, softcap, threads);
    attn_output(hp, lw, ws, ub, il, threads);
}

/// ws.attn = attention(ws.q over layer il's cells), every head's output side by side.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads(hp: &HParams, lw: &AttnWeights, ws: &mut Workspace, kv: &KvStore, ub: &UBatchView, il: usize,
                    scale: f32, softcap: f32, threads: &Threads) {
    let n = ub.tokens.len();
    let (q_dim, attn_dim) = (hp.n_head * hp.head_dim_k_of(il), hp.n_head * hp.head_dim_v_of(il));
    let view = ub.kv(il);
    let input = AttnInput {
        q: &ws.q[..n * q_dim], n_tokens: n, n_head: hp.n_head, n_head_kv: hp.n_head_kv_of(il), kv, layer: hp.kv_source[il],
        mask: view.mask, n_kv: view.n_kv, visible: view.visible, scale, softcap, sinks: lw.sinks.as_deref(),
    };
    attention(&input, &mut ws.attn[..n * attn_dim], threads);
}

/// ws.o = Wo · ws.attn (+ the adapters' terms, + output bias).
pub fn attn_output(hp: &HParams, lw: &AttnWeights, ws: &mut Workspace, ub: &UBatchView, il: usize, threads: &Threads) {
    let n = ub.tokens.len();
    let (attn_dim, d) = (hp.n_head * hp.head_dim_v_of(il), hp.n_embd);
    lora_mm(&lw.wo, lw.scales.o, ub.lora_layer(il).terms(Proj::O), &ws.attn, n, &mut ws.o[..n * d], &mut ws.mm, &mut ws.lora, threads);
    note(&mut ws.stats, Matrix::AttnOutput, &ws.attn[..n * attn_dim], n);
    if let Some(b) = &lw.bo {
        add_bias(&mut ws.o[..n * d], b);
    }
}

/// ws.o = layer il's self-attention of ws.h: Q/K/V, their norms where the layer has them,
/// RoPE (of no dimension in a model without it) and the K/V store, attention with scores
/// scaled by hp.attn_scale, the output projection.
pub fn self_attention(hp: &HParams, lw: &AttnWeights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, il: usize,
                      threads: &Threads) {
    let n = ub.tokens.len();
    project_qkv(lw, ws, n, ub.lora_layer(il), threads);
    qk_norm(lw, ws, n, hp.rms_eps);
    rope_layer_and_store(hp, lw, ws, kv, ub, il);
    attend(hp, lw, ws, kv, ub, il, hp.attn_scale, hp.attn_logit_softcap, threads);
}

/// Gated full attention (llama.cpp's Qwen3-Next and Qwen3.5 build_layer_attn): Q's
/// projection yields each head's query and an output gate side by side; per-head RMS norms of
/// Q and K; RoPE and the K/V store; attention; its output times sigmoid(gate), then Wo.
/// ws.o receives the result.
pub fn gated_attention(hp: &HParams, lw: &AttnWeights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, il: usize,
                       threads: &Threads) {
    let n = ub.tokens.len();
    let (hd, eps) = (hp.head_dim_k, hp.rms_eps);
    let q_dim = hp.n_head * hd;
    let lora = ub.lora_layer(il);
    let q_gated = crate::recurrent::sized(&mut ws.q_gated, n * 2 * q_dim);
    lora_mm(&lw.wq, lw.scales.q, lora.terms(Proj::Q), &ws.h, n, q_gated, &mut ws.mm, &mut ws.lora, threads);
    if let Some(b) = &lw.bq {
        add_bias(q_gated, b);
    }
    for (q, qg) in ws.q[..n * q_dim].chunks_exact_mut(hd).zip(q_gated.chunks_exact(2 * hd)) {
        q.copy_from_slice(&qg[..hd]);
    }
    project_kv(lw, ws, n, lora, threads);
    let (q_norm, k_norm) = (lw.q_norm.as_deref(), lw.k_norm.as_deref());
    rms_norm_inplace(&mut ws.q[..n * q_dim], q_norm.expect("gated attention is loaded with its Q norm"), eps);
    rms_norm_inplace(&mut ws.k[..n * lw.wk.rows], k_norm.expect("gated attention is loaded with its K norm"), eps);
    rope_layer_and_store(hp, lw, ws, kv, ub, il);
    attend_heads(hp, lw, ws, kv, ub, il, hp.attn_scale, 0.0, threads);
    for (out, qg) in ws.attn[..n * q_dim].chunks_exact_mut(hd).zip(ws.q_gated.chunks_exact_mut(2 * hd)) {
        let gate = &mut qg[hd..];
        crate::ops::sigmoid_inplace(gate);
        out.iter_mut().zip(gate.iter()).for_each(|(o, &g)| *o *= g);
    }
    attn_output(hp, lw, ws, ub, il, threads);
}

/// ws.o = layer il's attention of ws.h as Gemma 3n and Gemma 4 compute it: Q with its
/// per-head norm and RoPE; for a layer with K/V of its own, K with its norm and RoPE and V
/// RMS-normalized without weights, stored in the cache; attention with scores scaled by
/// hp.attn_scale over its own or its source layer's cells (HParams::share_kv_from).
pub fn normed_qkv_attention(hp: &HParams, a: &AttnWeights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, il: usize,
                            threads: &Threads) {
    let n = ub.tokens.len();
    let lora = ub.lora_layer(il);
    project_q(a, ws, n, lora, threads);
    if hp.stores_kv(il) {
        project_kv(a, ws, n, lora, threads);
        qk_norm(a, ws, n, hp.rms_eps);
        rms_norm_plain_inplace(&mut ws.v[..n * a.wv.rows], hp.head_dim_v_of(il), hp.rms_eps);
        rope_layer_and_store(hp, a, ws, kv, ub, il);
    } else {
        qk_norm(a, ws, n, hp.rms_eps);
        rope_queries(hp, ws, ub, il);
    }
    attend(hp, a, ws, kv, ub, il, hp.attn_scale, 0.0, threads);
}

/// Adds a dense product's input rows to the activation statistics, when they are collected.
pub fn note(stats: &mut Option<Box<ActivationStats>>, m: Matrix, x: &[f32], n: usize) {
    if let Some(s) = stats.as_deref_mut() {
        s.record(m, x, n);
    }
}

/// ws.x += post_norm(ws.o) · scale: a block's output into the residual stream.
pub fn residual(ws: &mut Workspace, post_norm: Option<&[f32]>, eps: f32, scale: f32, n: usize, d: usize) {
    if let Some(w) = post_norm {
        rms_norm_inplace(&mut ws.o[..n * d], w, eps);
    }
    if scale != 1.0 {
        scale_inplace(&mut ws.o[..n * d], scale);
    }
    add_inplace(&mut ws.x[..n * d], &ws.o[..n * d]);
}

/// ws.o = the layer's FFN of ws.h: gated, or its experts.
pub fn ffn(hp: &HParams, lw: &LayerWeights, ws: &mut Workspace, n: usize, act: Activation, lora: LayerLora, threads: &Threads) {
    match &lw.ffn {
        Ffn::Gated(f) => gated_ffn(hp, f, ws, n, act, lora, threads),
        Ffn::Experts(e) => crate::moe::moe_ffn(hp, e, ws, n, FfnAct::Gated(act), lora, threads),
        Ffn::Plain(f) => plain_ffn(hp, f, ws, n, crate::ops::gelu_inplace, lora, threads),
        Ffn::None => ws.o[..n * hp.n_embd].fill(0.0),
    }
}

/// ws.o = W_down · act(W_up·ws.h + b_up) + b_down, not gated (BERT's GELU, Nemotron-H's
/// squared ReLU), each product's second scale after its bias.
pub fn plain_ffn(hp: &HParams, f: &crate::model::PlainFfn, ws: &mut Workspace, n: usize, act: Unary, lora: LayerLora,
                 threads: &Threads) {
    let (d, ff) = (hp.n_embd, f.up.rows);
    lora_mm(&f.up, None, lora.terms(Proj::Up), &ws.h, n, &mut ws.up[..n * ff], &mut ws.mm, &mut ws.lora, threads);
    if let Some(b) = &f.up_b { add_bias(&mut ws.up[..n * ff], b); }
    if let Some(s) = f.up_s { scale_inplace(&mut ws.up[..n * ff], s); }
    act(&mut ws.up[..n * ff]);
    lora_mm(&f.down, None, lora.terms(Proj::Down), &ws.up, n, &mut ws.o[..n * d], &mut ws.mm, &mut ws.lora, threads);
    note(&mut ws.stats, Matrix::FfnUp, &ws.h[..n * d], n);
    note(&mut ws.stats, Matrix::FfnDown, &ws.up[..n * ff], n);
    if let Some(b) = &f.down_b { add_bias(&mut ws.o[..n * d], b); }
    if let Some(s) = f.down_s { scale_inplace(&mut ws.o[..n * d], s); }
}

/// ws.o = W_down · act(W_gate·ws.h, W_up·ws.h) (+ biases), with `act` the gated activation.
pub fn gated_ffn(hp: &HParams, f: &GatedFfn, ws: &mut Workspace, n: usize, act: Activation, lora: LayerLora, threads: &Threads) {
    let (d, ff) = (hp.n_embd, f.up.rows);
    lora_mm(&f.gate, None, lora.terms(Proj::Gate), &ws.h, n, &mut ws.gate[..n * ff], &mut ws.mm, &mut ws.lora, threads);
    lora_mm(&f.up, None, lora.terms(Proj::Up), &ws.h, n, &mut ws.up[..n * ff], &mut ws.mm, &mut ws.lora, threads);
    if let Some(b) = &f.gate_b { add_bias(&mut ws.gate[..n * ff], b); }
    if let Some(b) = &f.up_b { add_bias(&mut ws.up[..n * ff], b); }
    // build_ffn's second scales come after the biases.
    if let Some(s) = f.gate_s { scale_inplace(&mut ws.gate[..n * ff], s); }
    if let Some(s) = f.up_s { scale_inplace(&mut ws.up[..n * ff], s); }
    rows_on_threads(act, &mut ws.gate[..n * ff], &ws.up[..n * ff], ff, threads);
    lora_mm(&f.down, None, lora.terms(Proj::Down), &ws.gate, n, &mut ws.o[..n * d], &mut ws.mm, &mut ws.lora, threads);
    note(&mut ws.stats, Matrix::FfnGate, &ws.h[..n * d], n);
    note(&mut ws.stats, Matrix::FfnUp, &ws.h[..n * d], n);
    note(&mut ws.stats, Matrix::FfnDown, &ws.gate[..n * ff], n);
    if let Some(b) = &f.down_b { add_bias(&mut ws.o[..n * d], b); }
    if let Some(s) = f.down_s { scale_inplace(&mut ws.o[..n * d], s); }
}

/// Final norm and output projection (+ the adapters' terms, + bias) of the wanted rows only.
pub fn output(hp: &HParams, w: &Weights, ws: &mut Workspace, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    let out_rows = ub.out_rows;
    let d = hp.n_embd;
    let n_out = out_rows.len();
    if n_out == 0 {
        return;
    }
    for (i, &r) in out_rows.iter().enumerate() {
        let (src, dst) = (r * d, i * d);
        ws.h[dst..dst + d].copy_from_slice(&ws.x[src..src + d]);
    }
    if hp.layer_norm {
        layer_norm_rows(&mut ws.h[..n_out * d], &w.output_norm, w.output_norm_b.as_deref(), hp.norm_eps);
    } else {
        rms_norm_inplace(&mut ws.h[..n_out * d], &w.output_norm, hp.rms_eps);
    }
    let logits = &mut logits[..n_out * hp.n_vocab];
    let terms = ub.lora.map_or(&[][..], |l| l.output());
    lora_mm(&w.output, w.output_s, terms, &ws.h, n_out, logits, &mut ws.mm, &mut ws.lora, threads);
    if let Some(b) = &w.output_b {
        add_bias(logits, b);
    }
}

/// tanh soft-capping of logits: cap · tanh(l / cap) (Gemma 2 and 3).
pub fn softcap_logits(logits: &mut [f32], cap: f32) {
    for l in logits.iter_mut() {
        *l = (*l / cap).tanh() * cap;
    }
}

/// A gated activation: x = act(x) * y over rows of the given length (ggml applies some of
/// them row by row: SwiGLU's vector chunks start at each row).
pub type Activation = fn(&mut [f32], &[f32], usize);

/// An activation of one operand, in place (GELU, squared ReLU).
pub type Unary = fn(&mut [f32]);

/// What an FFN applies between its up and down projections: a gated activation of the gate
/// and up projections, or an activation of the up projection alone (an FFN without gate).
#[derive(Clone, Copy)]
pub enum FfnAct {
    Gated(Activation),
    Ungated(Unary),
}

/// Elements per task of an element-wise step: below two tasks' worth, the dispatch costs
/// more than the second thread gives.
const ELEMENTWISE_CHUNK: usize = 8192;

/// `act(x, y, row)` over runs of whole rows on the threads (the same bits: each row's
/// arithmetic is its own). With several tokens, the activation of a 4864-wide FFN is
/// otherwise a serial step the other thread waits through (measured: 3 % of an 8-sequence
/// decode step, and as much again spinning).
pub fn rows_on_threads(act: Activation, x: &mut [f32], y: &[f32], row: usize, threads: &Threads) {
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

/// How an architecture arranges the shared blocks of a decoder layer. Every layer runs:
/// pre-norm (or none) → Q/K/V → Q/K norms (where present) → RoPE → attention → post-norm
/// (where present) → residual, then pre-norm → FFN → post-norm → residual; the optional
/// tensors the architecture loaded decide which steps apply.
pub struct DecoderStyle {
    /// Scale Q by the attention scale after RoPE and attend with a scale of 1 (Gemma, Phi-3),
    /// instead of scaling the scores.
    pub q_prescale: bool,
    pub act: Activation,
}

/// The forward pass of a decoder made of the shared blocks in `style`'s arrangement.
pub fn decoder_forward(model: &crate::model::Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView,
                       threads: &Threads, logits: &mut [f32], style: &DecoderStyle) {
    let hp = &model.hparams;
    let (n, d, eps) = (ub.tokens.len(), hp.n_embd, hp.rms_eps);
    embed(w, ws, ub, hp, hp.embedding_scale, threads);
    fill_rope_caches(hp, ws, ub);
    for (il, lw) in w.layers.iter().enumerate() {
        if let Some(s) = ws.stats.as_deref_mut() {
            s.begin_layer(il);
        }
        layer_pre_norm(hp, ws, lw.attn_norm.as_deref(), lw.attn_norm_b.as_deref(), n, d);
        let a = lw.attn();
        project_qkv(a, ws, n, ub.lora_layer(il), threads);
        qk_norm(a, ws, n, eps);
        rope_layer_and_store(hp, a, ws, kv, ub, il);
        temper_q(hp, ws, ub);
        let scale = if style.q_prescale {
            scale_inplace(&mut ws.q[..n * a.wq.rows], hp.attn_scale);
            1.0
        } else {
            hp.attn_scale
        };
        attend(hp, a, ws, kv, ub, il, scale, hp.attn_logit_softcap, threads);
        residual(ws, lw.post_attn_norm.as_deref(), eps, hp.residual_scale, n, d);
        layer_pre_norm(hp, ws, lw.ffn_norm.as_deref(), lw.ffn_norm_b.as_deref(), n, d);
        ffn(hp, lw, ws, n, style.act, ub.lora_layer(il), threads);
        residual(ws, lw.post_ffn_norm.as_deref(), eps, hp.residual_scale, n, d);
        if let Some(cv) = ub.cvec {
            cv.apply(il, &mut ws.x[..n * d]);
        }
        add_deepstack(hp, ws, ub, il);
    }
    output(hp, w, ws, ub, threads, logits);
    scale_logits(hp, &mut logits[..ub.out_rows.len() * hp.n_vocab]);
}

/// The forward pass of a pre-norm decoder whose blocks differ only in their token mixer
/// (attention of one kind or another, a recurrent mixer): per block x += mixer(rms_norm(x)),
/// x += swiglu_ffn(rms_norm(x)) (dense or experts), the control vector; then the head.
/// `mixer(lw, ws, kv, il)` reads ws.o's input rows from ws.x's norm and leaves its output in ws.o.
pub fn pre_norm_blocks(model: &crate::model::Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView,
                       threads: &Threads, logits: &mut [f32],
                       mut mixer: impl FnMut(&LayerWeights, &mut Workspace, &mut KvStore, usize)) {
    let hp = &model.hparams;
    let (n, d, eps) = (ub.tokens.len(), hp.n_embd, hp.rms_eps);
    embed(w, ws, ub, hp, 1.0, threads);
    fill_rope_caches(hp, ws, ub);
    for (il, lw) in w.layers.iter().enumerate() {
        if let Some(s) = ws.stats.as_deref_mut() {
            s.begin_layer(il);
        }
        pre_norm(ws, lw.attn_norm.as_deref(), eps, n, d);
        mixer(lw, ws, kv, il);
        residual(ws, None, eps, 1.0, n, d);
        pre_norm(ws, lw.ffn_norm.as_deref(), eps, n, d);
        ffn(hp, lw, ws, n, crate::ops::swiglu, ub.lora_layer(il), threads);
        residual(ws, None, eps, 1.0, n, d);
        if let Some(cv) = ub.cvec {
            cv.apply(il, &mut ws.x[..n * d]);
        }
    }
    output(hp, w, ws, ub, threads, logits);
}

/// The logits' divisor (Granite), multiplier (Cohere 2) and soft cap (Gemma), where the model
/// has them.
pub fn scale_logits(hp: &HParams, logits: &mut [f32]) {
    if hp.logit_scale != 1.0 {
        scale_inplace(logits, 1.0 / hp.logit_scale);
    }
    if hp.logit_multiplier != 1.0 {
        scale_inplace(logits, hp.logit_multiplier);
    }
    if hp.final_logit_softcap > 0.0 {
        softcap_logits(logits, hp.final_logit_softcap);
    }
}

/// The forward pass of a decoder of parallel blocks (Cohere's): each layer's one pre-norm
/// feeds both its attention and its FFN, and x += FFN, then x += attention (ggml's order of
/// the adds).
#[allow(clippy::too_many_arguments)]
pub fn parallel_decoder_forward(model: &crate::model::Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore,
                                ub: &UBatchView, threads: &Threads, logits: &mut [f32], act: Activation) {
    let hp = &model.hparams;
    let (n, d) = (ub.tokens.len(), hp.n_embd);
    embed(w, ws, ub, hp, hp.embedding_scale, threads);
    fill_rope_caches(hp, ws, ub);
    for (il, lw) in w.layers.iter().enumerate() {
        if let Some(s) = ws.stats.as_deref_mut() {
            s.begin_layer(il);
        }
        layer_pre_norm(hp, ws, lw.attn_norm.as_deref(), lw.attn_norm_b.as_deref(), n, d);
        self_attention(hp, lw.attn(), ws, kv, ub, il, threads);
        let attn_out = crate::recurrent::sized(&mut ws.parallel_attn, n * d);
        attn_out.copy_from_slice(&ws.o[..n * d]);
        ffn(hp, lw, ws, n, act, ub.lora_layer(il), threads);
        add_inplace(&mut ws.x[..n * d], &ws.o[..n * d]);
        add_inplace(&mut ws.x[..n * d], &ws.parallel_attn[..n * d]);
        if let Some(cv) = ub.cvec {
            cv.apply(il, &mut ws.x[..n * d]);
        }
    }
    output(hp, w, ws, ub, threads, logits);
    scale_logits(hp, &mut logits[..ub.out_rows.len() * hp.n_vocab]);
}
