//! Granite 4.0-H (`granitehybrid`): Granite's multipliers (of the embeddings, of each block's
//! output before its residual add, of the attention scores, and the divisor of the logits)
//! around pre-norm blocks whose mixer is a Mamba-2 mixer (layers with head_count_kv 0) or an
//! attention (the others), each followed by a SwiGLU FFN: a mixture of experts with a shared
//! expert where the file has experts, else dense. RoPE only where rope.scaling.finetuned says
//! (true by default; Granite 4.0-H's files say false: no positional encoding at all).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{embed, ffn, fill_rope_caches, output, pre_norm, residual, self_attention};
use crate::arch::ArchInfo;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{load_attention, load_experts, load_gated, ExpertParts, Ffn, LayerParts, LayerWeights, Loader, Model,
                   SharedParts, Weights};
use crate::ops::{scale_inplace, swiglu};
use crate::recurrent::{mamba2_mixer, mamba2_params, Mamba2Weights, RsWeights};

pub const GRANITE_HYBRID: ArchInfo = ArchInfo { name: "granitehybrid", rope_neox: false, hparams, load, forward, encoder: false };

/// llama_model_granite_hybrid::load_arch_hparams.
fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    let or_one = |v: f32| if v == 0.0 { 1.0 } else { v };
    hp.logit_scale = or_one(hp.opt_f32(file, "logit_scale", 0.0)?);
    hp.residual_scale = or_one(hp.opt_f32(file, "residual_scale", 0.0)?);
    hp.embedding_scale = or_one(hp.opt_f32(file, "embedding_scale", 0.0)?);
    hp.embedding_scale_raw = true;
    let attn_scale = hp.opt_f32(file, "attention.scale", 0.0)?;
    if attn_scale != 0.0 {
        hp.attn_scale = attn_scale;
    }
    // Granite uses rope.scaling.finetuned as the switch of its RoPE; without it no dimension
    // rotates, neither in the graph nor in a K-shift (llama.cpp's has_rope).
    if !hp.opt_bool(file, "rope.scaling.finetuned", true)? {
        hp.rope.n_dims = 0;
    }
    let recurrent: Vec<bool> = hp.kv_layers.iter().map(|&attends| !attends).collect();
    let rs = mamba2_params(file, &hp.arch, recurrent)?;
    // build_mamba2_layer's shapes hold for an expansion factor of 2 only (llama.cpp asserts).
    if rs.d_inner != 2 * hp.n_embd {
        return Err(EngineError::Unsupported(format!(
            "granitehybrid: ssm.inner_size {} is not twice embedding_length {} (llama.cpp supports only that)", rs.d_inner, hp.n_embd)));
    }
    if hp.n_ff == 0 && hp.n_expert == 0 {
        return Err(file.error("granitehybrid: feed_forward_length is 0 and the model has no experts").into());
    }
    if hp.kv_layers.iter().any(|&a| a) && hp.n_head == 0 {
        return Err(file.error("granitehybrid: attention layers without attention.head_count").into());
    }
    hp.rs = Some(rs);
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let rs = hp.rs.as_ref().expect("set by hparams");
    let attn_parts = LayerParts { o_bias: true, ffn_bias: true, ..LayerParts::PRE_NORM };
    let layers = (0..hp.n_layer)
        .map(|il| -> Result<LayerWeights> {
            let recurrent = rs.layers[il];
            Ok(LayerWeights {
                attn_norm: Some(ld.vector(&format!("blk.{il}.attn_norm.weight"), hp.n_embd)?),
                attn: if recurrent { None } else { Some(load_attention(ld, hp, &attn_parts, il)?) },
                rs: if recurrent { Some(RsWeights::Mamba2(Mamba2Weights::load(ld, rs, hp.n_embd, il, true)?)) } else { None },
                post_attn_norm: None,
                ffn_norm: Some(ld.vector(&format!("blk.{il}.ffn_norm.weight"), hp.n_embd)?),
                ffn: load_ffn(ld, hp, &attn_parts, il)?,
                post_ffn_norm: None, attn_out_norm: None, layer_out_norm: None,
                attn_norm_b: None, ffn_norm_b: None, latent: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut w = crate::model::load_embeddings_and_head(ld, hp, layers)?;
    if hp.rope.n_dims > 0 {
        w.rope_factors.freqs = ld.opt_vector("rope_freqs.weight", hp.rope.n_dims / 2)?;
    }
    Ok(w)
}

/// Experts (gated, with the shared expert where expert_shared_feed_forward_length is set),
/// or a dense SwiGLU FFN with optional biases.
fn load_ffn(ld: &Loader, hp: &HParams, parts: &LayerParts, il: usize) -> Result<Ffn> {
    if hp.n_expert == 0 {
        return Ok(Ffn::Gated(load_gated(ld, hp, parts, il)?));
    }
    let shared = (hp.n_ff_shexp > 0).then_some(SharedParts { gated: true, sigmoid_gate: false, scales: false });
    Ok(Ffn::Experts(load_experts(ld, hp, il, &ExpertParts { shared, ..ExpertParts::ROUTED })?))
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    let hp = &model.hparams;
    let rs = hp.rs.as_ref().expect("set by hparams");
    let (n, d, eps) = (ub.tokens.len(), hp.n_embd, hp.rms_eps);
    embed(w, ws, ub, hp, hp.embedding_scale, threads);
    fill_rope_caches(hp, ws, ub);
    for (il, lw) in w.layers.iter().enumerate() {
        if let Some(s) = ws.stats.as_deref_mut() {
            s.begin_layer(il);
        }
        pre_norm(ws, lw.attn_norm.as_deref(), eps, n, d);
        if let Some(RsWeights::Mamba2(m)) = &lw.rs {
            mamba2_mixer(rs, m, ws, &mut kv.rs, ub, il, eps, threads);
        } else {
            self_attention(hp, lw.attn(), ws, kv, ub, il, threads);
        }
        residual(ws, None, eps, hp.residual_scale, n, d);
        pre_norm(ws, lw.ffn_norm.as_deref(), eps, n, d);
        ffn(hp, lw, ws, n, swiglu, ub.lora_layer(il), threads);
        residual(ws, None, eps, hp.residual_scale, n, d);
        if let Some(cv) = ub.cvec {
            cv.apply(il, &mut ws.x[..n * d]);
        }
    }
    output(hp, w, ws, ub, threads, logits);
    if hp.logit_scale != 1.0 {
        scale_inplace(&mut logits[..ub.out_rows.len() * hp.n_vocab], 1.0 / hp.logit_scale);
    }
}
