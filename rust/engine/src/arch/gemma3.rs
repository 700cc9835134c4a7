//! Gemma 3: embeddings scaled by sqrt(n_embd), per-head RMSNorm of Q and K, NEOX RoPE with
//! its own base on sliding-window layers, norms after attention and after the FFN, a GeGLU
//! FFN, tied output, and an interleaved cache (5 sliding layers : 1 global by default).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::llama::output;
use crate::arch::blocks::{attend, gated_ffn, project_qkv, rope_and_store};
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{LayerWeights, Model, Weights};
use crate::ops::{add_inplace, geglu, rms_norm, rms_norm_inplace, scale_inplace};

/// Gemma 3's hyper-parameters beyond the common ones (llama_model_gemma3::load_arch_hparams).
pub fn adjust_hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    hp.load_swa_pattern(file, 6)?;
    // The 27B model (62 layers) scales by the model width per head, the others by head size.
    hp.attn_scale = if hp.n_layer == 62 {
        1.0 / ((hp.n_embd / hp.n_head) as f32).sqrt()
    } else {
        1.0 / (hp.head_dim_k as f32).sqrt()
    };
    Ok(())
}

pub fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView,
               threads: &Threads, logits: &mut [f32]) {
    let hp = &model.hparams;
    let n = ub.tokens.len();
    let d = hp.n_embd;
    for (t, &tok) in ub.tokens.iter().enumerate() {
        w.tok_embd.dequantize_row(tok as usize, &mut ws.x[t * d..(t + 1) * d]);
    }
    scale_inplace(&mut ws.x[..n * d], (d as f32).sqrt());
    let n_rot = hp.rope.n_dims;
    let swa_rope = hp.rope_for_layer(hp.swa_layers.iter().position(|&s| s).unwrap_or(0));
    for (t, &p) in ub.pos.iter().enumerate() {
        hp.rope.fill_cache(p as f32, &mut ws.rope_cache[t * n_rot..(t + 1) * n_rot]);
        if !ws.rope_cache_swa.is_empty() {
            swa_rope.fill_cache(p as f32, &mut ws.rope_cache_swa[t * n_rot..(t + 1) * n_rot]);
        }
    }
    for (il, lw) in w.layers.iter().enumerate() {
        attention_block(model, il, lw, ws, kv, ub, threads);
        ffn_block(model, lw, ws, n, threads);
        if let Some(cv) = ub.cvec {
            cv.apply(il, &mut ws.x[..n * d]);
        }
    }
    output(model, w, ws, ub.out_rows, threads, logits);
    if hp.final_logit_softcap > 0.0 {
        let cap = hp.final_logit_softcap;
        for l in logits[..ub.out_rows.len() * hp.n_vocab].iter_mut() {
            *l = (*l / cap).tanh() * cap;
        }
    }
}

fn attention_block(model: &Model, il: usize, lw: &LayerWeights, ws: &mut Workspace, kv: &mut KvStore,
                   ub: &UBatchView, threads: &Threads) {
    let hp = &model.hparams;
    let (n, d) = (ub.tokens.len(), hp.n_embd);
    rms_norm(&ws.x[..n * d], &lw.attn_norm, hp.rms_eps, &mut ws.h[..n * d]);
    project_qkv(lw, ws, n, threads);
    let (q_dim, k_dim) = (lw.wq.rows, lw.wk.rows);
    if let Some(qn) = &lw.q_norm { rms_norm_inplace(&mut ws.q[..n * q_dim], qn, hp.rms_eps); }
    if let Some(kn) = &lw.k_norm { rms_norm_inplace(&mut ws.k[..n * k_dim], kn, hp.rms_eps); }
    let sliding = hp.swa_layers[il] && !ws.rope_cache_swa.is_empty();
    let rope_cache = std::mem::take(if sliding { &mut ws.rope_cache_swa } else { &mut ws.rope_cache });
    rope_and_store(hp, lw, &hp.rope_for_layer(il), &rope_cache, ws, kv, ub, il);
    *(if sliding { &mut ws.rope_cache_swa } else { &mut ws.rope_cache }) = rope_cache;
    // llama.cpp scales Q (after RoPE) and attends with a scale of 1.
    scale_inplace(&mut ws.q[..n * q_dim], hp.attn_scale);
    attend(hp, lw, ws, kv, ub, il, 1.0, threads);
    if let Some(pn) = &lw.post_attn_norm { rms_norm_inplace(&mut ws.o[..n * d], pn, hp.rms_eps); }
    add_inplace(&mut ws.x[..n * d], &ws.o[..n * d]);
}

fn ffn_block(model: &Model, lw: &LayerWeights, ws: &mut Workspace, n: usize, threads: &Threads) {
    let hp = &model.hparams;
    let d = hp.n_embd;
    rms_norm(&ws.x[..n * d], &lw.ffn_norm, hp.rms_eps, &mut ws.h[..n * d]);
    gated_ffn(hp, lw, ws, n, geglu, threads);
    if let Some(pn) = &lw.post_ffn_norm { rms_norm_inplace(&mut ws.o[..n * d], pn, hp.rms_eps); }
    add_inplace(&mut ws.x[..n * d], &ws.o[..n * d]);
}
