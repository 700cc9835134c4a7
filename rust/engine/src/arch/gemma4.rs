//! Gemma 4 (llama_model_gemma4): sliding-window and full layers in a per-layer pattern, each
//! kind with its own head size, rotated dimensions and RoPE base; the full layers' RoPE is
//! "proportional" (rope_freqs factors of 1e30 leave the pairs past the rotated fraction
//! unrotated, and only the full layers use them); per-head RMS norms of Q and K and a plain
//! RMS norm of V; attention scores unscaled; the last layers may attend over the K/V of the
//! last earlier layer of their kind and store none; norms after attention and after the FFN;
//! a GeGLU FFN, or in the MoE variant a dense FFN beside the experts (each with its own
//! norms, the router reading the normalized residual stream times a scale, a second scale
//! per expert); per-layer embeddings (`arch::ple`); a per-layer output scale; embeddings
//! scaled by sqrt(n_embd) and soft-capped logits.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{
    embed, ffn, fill_rope_caches, gated_ffn, normed_qkv_attention, output, pre_norm, residual, softcap_logits, FfnAct,
};
use crate::arch::{ple, ArchInfo};
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, Meta, MoeGating};
use crate::kvstore::KvStore;
use crate::model::{
    load_experts, load_gated_sized, load_proj_scales, load_qkv, AttnWeights, DenseBesideExperts, ExpertParts, ExtraParts,
    Ffn, LayerExtras, LayerParts, LayerWeights, Loader, Model, Weights,
};
use crate::ops::{add_inplace, geglu, rms_norm_inplace, scale_inplace};

pub const GEMMA4: ArchInfo = ArchInfo { name: "gemma4", rope_neox: true, hparams, load, forward, encoder: false };

/// llama_model_gemma4::load_arch_hparams, and the generic keys it relies on.
fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    let arch = hp.arch.clone();
    let m = Meta { file, arch: &arch };
    let pattern_key = m.key("attention.sliding_window_pattern");
    if file.get(&pattern_key).and_then(|v| v.as_array()).is_none() {
        return Err(file.error(format!("missing metadata array {pattern_key}")).into());
    }
    if hp.n_swa == 0 {
        return Err(EngineError::Unsupported(format!("{}: attention.sliding_window of 0", hp.arch)));
    }
    hp.load_swa_pattern(file, 0)?;
    if !hp.has_swa() {
        // llama.cpp asserts is_swa_any() when it builds the cache
        return Err(EngineError::Unsupported(format!("{}: no sliding-window layer in attention.sliding_window_pattern", hp.arch)));
    }
    hp.head_dim_k_swa = m.usize("attention.key_length_swa")?;
    hp.head_dim_v_swa = m.usize("attention.value_length_swa")?;
    hp.n_rot_swa = m.opt_usize("rope.dimension_count_swa")?.unwrap_or(hp.rope.n_dims);
    if hp.head_dim_k != hp.head_dim_v || hp.head_dim_k_swa != hp.head_dim_v_swa {
        return Err(file.error("Gemma 4 requires key_length == value_length and key_length_swa == value_length_swa").into());
    }
    if hp.head_dim_k_swa == 0 || hp.head_dim_k_swa > 1 << 16 || hp.n_rot_swa > hp.head_dim_k_swa || hp.n_rot_swa % 2 != 0 {
        return Err(file.error(format!("rope.dimension_count_swa {} does not fit head size {}", hp.n_rot_swa, hp.head_dim_k_swa)).into());
    }
    // The full layers may have KV heads of their own (num_global_key_value_heads).
    hp.kv_heads_per_layer = true;
    hp.attn_scale = 1.0;
    hp.embedding_scale = (hp.n_embd as f32).sqrt();
    hp.swa_rope_factors = false;
    hp.rope_freq_scale_swa = 1.0;
    // build_moe_ffn is called with a softmax, renormalized weights and a scale of 1.
    hp.moe_gating = MoeGating::Softmax { norm: true };
    hp.expert_weights_scale = 0.0;
    let n_shared = m.opt_usize("attention.shared_kv_layers")?.unwrap_or(0);
    share_kv(hp, n_shared)?;
    m.usize("embedding_length_per_layer_input")?;
    Ok(())
}

/// The last `n_shared` layers attend over the K/V of the last earlier layer of their kind
/// (HParams::share_kv_from); llama.cpp asserts that at least 2 layers keep K/V.
fn share_kv(hp: &mut HParams, n_shared: usize) -> Result<()> {
    // llama.cpp asserts n_layer_kv_from_start >= 2 for every Gemma 4 cache, shared layers or not.
    let n_kv = hp.n_layer.checked_sub(n_shared).filter(|&k| k >= 2).ok_or_else(|| {
        EngineError::Unsupported(format!("{}: {n_shared} shared-KV layers of {} leave fewer than 2 with K/V", hp.arch, hp.n_layer))
    })?;
    hp.share_kv_from(n_kv)
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let m = Meta { file: ld.file(), arch: &hp.arch };
    let ffs = m.layer_values("feed_forward_length", hp.n_layer)?.unwrap_or_else(|| vec![hp.n_ff; hp.n_layer]);
    let n_pl = m.usize("embedding_length_per_layer_input")?;
    if n_pl > 1 << 16 {
        return Err(ld.error(format!("{}.embedding_length_per_layer_input {n_pl} is out of range", hp.arch)));
    }
    let mut layers = Vec::with_capacity(hp.n_layer);
    let mut extras = Vec::with_capacity(hp.n_layer);
    for (il, &n_ff) in ffs.iter().enumerate() {
        let (lw, ex) = load_layer(ld, hp, il, n_ff)?;
        layers.push(lw);
        extras.push(ex);
    }
    let mut w = crate::model::load_embeddings_and_head(ld, hp, layers)?;
    if hp.swa_layers.iter().any(|&s| !s) {
        // the full layers' proportional RoPE (one tensor, which every full layer reads)
        w.rope_factors.freqs = Some(ld.vector("rope_freqs.weight", hp.head_dim_k / 2)?);
    }
    w.extras = ExtraParts { ple: ple::load(ld, hp, n_pl)?, altup: None, layers: extras };
    Ok(w)
}

fn load_layer(ld: &Loader, hp: &HParams, il: usize, n_ff: usize) -> Result<(LayerWeights, LayerExtras)> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let norm = |name: &str| ld.vector(&n(name), hp.n_embd);
    // llama.cpp's gemma4 graph passes the FFN's second scales to build_ffn.
    let ffn = load_gated_sized(ld, hp, &LayerParts { ffn_scales: true, ..LayerParts::PRE_NORM }, il, n_ff)?;
    let (ffn, dense_beside_experts) = if ld.has(&n("ffn_gate_inp.weight")) {
        if hp.n_expert == 0 {
            return Err(ld.error(format!("{}: blk.{il}.ffn_gate_inp without expert_count", hp.arch)));
        }
        let ep = ExpertParts { scales: true, ..ExpertParts::ROUTED };
        let mut experts = load_experts(ld, hp, il, &ep)?;
        experts.router_in_scale = Some(ld.vector(&n("ffn_gate_inp.scale"), hp.n_embd)?);
        let dense = DenseBesideExperts {
            ffn,
            dense_post_norm: norm("post_ffw_norm_1.weight")?,
            experts_pre_norm: norm("pre_ffw_norm_2.weight")?,
            experts_post_norm: norm("post_ffw_norm_2.weight")?,
        };
        (Ffn::Experts(experts), Some(dense))
    } else {
        (Ffn::Gated(ffn), None)
    };
    let lw = LayerWeights {
        attn_norm: Some(norm("attn_norm.weight")?),
        attn: Some(load_attention(ld, hp, il)?),
        rs: None,
        post_attn_norm: Some(norm("post_attention_norm.weight")?),
        ffn_norm: Some(norm("ffn_norm.weight")?),
        ffn,
        post_ffn_norm: Some(norm("post_ffw_norm.weight")?),
        attn_out_norm: None,
        layer_out_norm: None,
        latent: None,
        attn_norm_b: None, ffn_norm_b: None,
    };
    let out_scale = ld.opt_vector(&n("layer_output_scale.weight"), 1)?.map(|s| s[0]);
    Ok((lw, LayerExtras { out_scale, dense_beside_experts }))
}

/// Layer il's attention in its kind's head size: Q/K/V separate or fused; without
/// `attn_v`, V is K's projection (llama.cpp's use_alternative_attention). A shared-KV layer
/// projects no K or V: its K and V matrices, which llama.cpp loads when present and never
/// uses, are read and dropped, and its `wk`/`wv` hold Q's matrix, never read.
fn load_attention(ld: &Loader, hp: &HParams, il: usize) -> Result<AttnWeights> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let hd = hp.head_dim_k_of(il);
    let (q_dim, kv_dim) = (hd * hp.n_head, hd * hp.n_head_kv_of(il));
    let own_kv = hp.stores_kv(il);
    let [wq, wk, wv] = if ld.has(&n("attn_qkv.weight")) {
        load_qkv(ld, &n, hp.n_embd, [q_dim, kv_dim, kv_dim])?
    } else {
        let wq = ld.matrix(&n("attn_q.weight"), hp.n_embd, q_dim)?;
        let wk = if own_kv { Some(ld.matrix(&n("attn_k.weight"), hp.n_embd, kv_dim)?) } else { ld.opt_matrix(&n("attn_k.weight"), hp.n_embd, kv_dim)? };
        let wv = ld.opt_matrix(&n("attn_v.weight"), hp.n_embd, kv_dim)?;
        let wk = if own_kv { wk.expect("read above") } else { wq.clone() };
        let wv = if own_kv { wv.unwrap_or_else(|| wk.clone()) } else { wq.clone() };
        [wq, wk, wv]
    };
    let k_norm = ld.opt_vector(&n("attn_k_norm.weight"), hd)?;
    if own_kv && k_norm.is_none() {
        return Err(ld.error(format!("missing tensor 'blk.{il}.attn_k_norm.weight'")));
    }
    let mut scales = load_proj_scales(ld, &n)?;
    if !ld.has(&n("attn_v.weight")) && !ld.has(&n("attn_qkv.weight")) {
        // V is K's product, with K's scale.
        scales.v = scales.k;
    }
    Ok(AttnWeights {
        wq, wk, wv,
        wo: ld.matrix(&n("attn_output.weight"), q_dim, hp.n_embd)?,
        bq: None, bk: None, bv: None, bo: None,
        scales,
        q_norm: Some(ld.vector(&n("attn_q_norm.weight"), hd)?),
        k_norm: if own_kv { k_norm } else { None },
        sinks: None,
    })
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    let hp = &model.hparams;
    let (n, d, eps) = (ub.tokens.len(), hp.n_embd, hp.rms_eps);
    embed(w, ws, ub, hp, hp.embedding_scale, threads);
    fill_rope_caches(hp, ws, ub);
    if let Some(p) = &w.extras.ple {
        ple::inputs(p, hp, ws, ub, threads);
    }
    for (il, lw) in w.layers.iter().enumerate() {
        if let Some(s) = ws.stats.as_deref_mut() {
            s.begin_layer(il);
        }
        pre_norm(ws, lw.attn_norm.as_deref(), eps, n, d);
        normed_qkv_attention(hp, lw.attn(), ws, kv, ub, il, threads);
        residual(ws, lw.post_attn_norm.as_deref(), eps, 1.0, n, d);
        let extras = &w.extras.layers[il];
        feed_forward(hp, lw, extras, ws, ub, il, threads);
        residual(ws, lw.post_ffn_norm.as_deref(), eps, 1.0, n, d);
        if let Some(p) = &w.extras.ple {
            ple::apply(p, hp, il, ws, n, threads);
        }
        if let Some(s) = extras.out_scale {
            scale_inplace(&mut ws.x[..n * d], s);
        }
        if let Some(cv) = ub.cvec {
            cv.apply(il, &mut ws.x[..n * d]);
        }
    }
    output(hp, w, ws, ub, threads, logits);
    if hp.final_logit_softcap > 0.0 {
        softcap_logits(&mut logits[..ub.out_rows.len() * hp.n_vocab], hp.final_logit_softcap);
    }
}

/// ws.o = the layer's FFN of the residual stream ws.x: ffn_norm then the GeGLU FFN, or (MoE
/// layers) that dense FFN through its own post-norm plus the experts of the pre_ffw_norm_2
/// input through theirs.
fn feed_forward(hp: &HParams, lw: &LayerWeights, ex: &LayerExtras, ws: &mut Workspace, ub: &UBatchView, il: usize,
                threads: &Threads) {
    let (n, d, eps) = (ub.tokens.len(), hp.n_embd, hp.rms_eps);
    let lora = ub.lora_layer(il);
    pre_norm(ws, lw.ffn_norm.as_deref(), eps, n, d);
    match (&lw.ffn, &ex.dense_beside_experts) {
        (Ffn::Experts(experts), Some(dense)) => {
            gated_ffn(hp, &dense.ffn, ws, n, geglu, lora, threads);
            rms_norm_inplace(&mut ws.o[..n * d], &dense.dense_post_norm, eps);
            crate::recurrent::sized(&mut ws.aux, n * d).copy_from_slice(&ws.o[..n * d]);
            pre_norm(ws, Some(&dense.experts_pre_norm), eps, n, d);
            crate::moe::moe_ffn(hp, experts, ws, n, FfnAct::Gated(geglu), lora, threads);
            rms_norm_inplace(&mut ws.o[..n * d], &dense.experts_post_norm, eps);
            add_inplace(&mut ws.o[..n * d], &ws.aux[..n * d]);
        }
        _ => ffn(hp, lw, ws, n, geglu, lora, threads),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(swa: &[bool]) -> HParams {
        let mut hp = HParams::vocab_only("gemma4", 8);
        hp.n_layer = swa.len();
        hp.swa_layers = swa.to_vec();
        hp.kv_source = (0..swa.len()).collect();
        hp.kv_layers = vec![true; swa.len()];
        hp.n_head_kv_layers = vec![1; swa.len()];
        hp
    }

    #[test]
    fn shared_layers_attend_over_the_last_layer_of_their_kind_with_kv() {
        let mut hp = layers(&[true, true, false, true, false]);
        share_kv(&mut hp, 2).unwrap();
        assert_eq!(hp.kv_source, [0, 1, 2, 1, 2]);
        assert!(hp.stores_kv(2) && !hp.stores_kv(3) && !hp.stores_kv(4));
    }

    #[test]
    fn a_shared_layer_whose_source_is_of_the_other_kind_is_refused() {
        let mut hp = layers(&[false, true, true, false]);
        assert!(share_kv(&mut hp, 2).is_err());
        let mut hp = layers(&[true, false]);
        assert!(share_kv(&mut hp, 1).is_err(), "fewer than two layers with K/V");
    }
}
