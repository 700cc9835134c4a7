//! Gemma 3: embeddings scaled by sqrt(n_embd), per-head RMSNorm of Q and K, NEOX RoPE with
//! its own base on sliding-window layers, norms after attention and after the FFN, a GeGLU
//! FFN, tied output, and an interleaved cache (5 sliding layers : 1 global by default).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::{matmul, Threads};

use crate::arch::llama::output;
use crate::attention::{attention, AttnInput};
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{LayerWeights, Model, Weights};
use crate::ops::{add_inplace, geglu, rms_norm, rms_norm_inplace, rope_apply, scale_inplace};

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
    let n = ub.tokens.len();
    let d = hp.n_embd;
    let hd = hp.head_dim_k;
    rms_norm(&ws.x[..n * d], &lw.attn_norm, hp.rms_eps, &mut ws.h[..n * d]);
    let (q_dim, k_dim, v_dim) = (lw.wq.rows, lw.wk.rows, lw.wv.rows);
    matmul(&lw.wq, &ws.h, n, &mut ws.q[..n * q_dim], &mut ws.mm, threads);
    matmul(&lw.wk, &ws.h, n, &mut ws.k[..n * k_dim], &mut ws.mm, threads);
    matmul(&lw.wv, &ws.h, n, &mut ws.v[..n * v_dim], &mut ws.mm, threads);
    if let Some(qn) = &lw.q_norm { rms_norm_inplace(&mut ws.q[..n * q_dim], qn, hp.rms_eps); }
    if let Some(kn) = &lw.k_norm { rms_norm_inplace(&mut ws.k[..n * k_dim], kn, hp.rms_eps); }
    let is_swa = hp.swa_layers[il];
    let rope = hp.rope_for_layer(il);
    let n_rot = rope.n_dims;
    let cache_all = if is_swa && !ws.rope_cache_swa.is_empty() { &ws.rope_cache_swa } else { &ws.rope_cache };
    for t in 0..n {
        let cache = &cache_all[t * n_rot..(t + 1) * n_rot];
        for head in ws.q[t * q_dim..(t + 1) * q_dim].chunks_exact_mut(hd) {
            rope_apply(head, cache, &rope);
        }
        for head in ws.k[t * k_dim..(t + 1) * k_dim].chunks_exact_mut(hd) {
            rope_apply(head, cache, &rope);
        }
        kv.write(il, ub.kv(il).slots[t] as usize, &ws.k[t * k_dim..(t + 1) * k_dim], &ws.v[t * v_dim..(t + 1) * v_dim]);
    }
    // llama.cpp scales Q (after RoPE) and attends with a scale of 1.
    scale_inplace(&mut ws.q[..n * q_dim], hp.attn_scale);
    let attn_dim = hp.n_head * hp.head_dim_v;
    let input = AttnInput {
        q: &ws.q[..n * q_dim], n_tokens: n, n_head: hp.n_head, n_head_kv: hp.n_head_kv, kv, layer: il,
        mask: ub.kv(il).mask, n_kv: ub.kv(il).n_kv, scale: 1.0, softcap: 0.0,
    };
    attention(&input, &mut ws.attn[..n * attn_dim], threads);
    matmul(&lw.wo, &ws.attn, n, &mut ws.o[..n * d], &mut ws.mm, threads);
    if let Some(pn) = &lw.post_attn_norm { rms_norm_inplace(&mut ws.o[..n * d], pn, hp.rms_eps); }
    add_inplace(&mut ws.x[..n * d], &ws.o[..n * d]);
}

fn ffn_block(model: &Model, lw: &LayerWeights, ws: &mut Workspace, n: usize, threads: &Threads) {
    let hp = &model.hparams;
    let (d, ff) = (hp.n_embd, hp.n_ff);
    rms_norm(&ws.x[..n * d], &lw.ffn_norm, hp.rms_eps, &mut ws.h[..n * d]);
    matmul(&lw.ffn_gate, &ws.h, n, &mut ws.gate[..n * ff], &mut ws.mm, threads);
    matmul(&lw.ffn_up, &ws.h, n, &mut ws.up[..n * ff], &mut ws.mm, threads);
    geglu(&mut ws.gate[..n * ff], &ws.up[..n * ff]);
    matmul(&lw.ffn_down, &ws.gate, n, &mut ws.o[..n * d], &mut ws.mm, threads);
    if let Some(pn) = &lw.post_ffn_norm { rms_norm_inplace(&mut ws.o[..n * d], pn, hp.rms_eps); }
    add_inplace(&mut ws.x[..n * d], &ws.o[..n * d]);
}
