//! Cohere 2 (Command R7B, Command A): parallel blocks (one LayerNorm without bias feeds both
//! the attention and the SwiGLU FFN, both added to the residual stream), a sliding window on
//! three layers of every four whose global layers attend without RoPE (adjacent pairs), the
//! output tied to the token embedding, and the logits multiplied by `logit_scale`.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::parallel_decoder_forward;
use crate::arch::ArchInfo;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, Meta};
use crate::kvstore::KvStore;
use crate::model::{load_attention, load_embeddings_and_head, load_gated, Ffn, LayerParts, LayerWeights, Loader, Model, Weights};
use crate::ops::swiglu;

pub const COHERE2: ArchInfo = ArchInfo { name: "cohere2", rope_neox: false, hparams, load, forward, encoder: false };

/// llama_model_cohere2::load_arch_hparams: sliding_window, logit_scale and
/// layer_norm_epsilon are required.
fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    let m = Meta { file, arch: &hp.arch };
    if hp.n_swa == 0 {
        return Err(file.error("cohere2 needs attention.sliding_window > 0").into());
    }
    if m.opt_f32("attention.layer_norm_epsilon")?.is_none() {
        return Err(file.error("missing metadata key cohere2.attention.layer_norm_epsilon").into());
    }
    hp.load_swa_pattern(file, 4)?;
    // The graph rotates the sliding layers with the context's RoPE; llama.cpp's K-shift with
    // rope.freq_base_swa (the base without it) and the file's scale.
    hp.swa_own_rope = false;
    hp.rope_freq_base_swa = hp.opt_f32(file, "rope.freq_base_swa", hp.rope_train.freq_base)?;
    hp.rope_freq_scale_swa = hp.rope_train.freq_scale;
    hp.nope_layers = hp.swa_layers.iter().map(|&s| !s).collect();
    let logit_scale = hp.f32(file, "logit_scale")?;
    hp.logit_multiplier = if logit_scale == 0.0 { 1.0 } else { logit_scale };
    hp.layer_norm = true;
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    if hp.n_expert > 0 {
        return Err(EngineError::Unsupported("a cohere2 model with experts".into()));
    }
    let parts = LayerParts { ffn_scales: true, ..LayerParts::PRE_NORM };
    let layers = (0..hp.n_layer).map(|il| layer(ld, hp, &parts, il)).collect::<Result<Vec<_>>>()?;
    let w = load_embeddings_and_head(ld, hp, layers)?;
    if !w.output_tied {
        return Err(EngineError::Unsupported("cohere2 with an output.weight (llama.cpp ties the output to token_embd)".into()));
    }
    Ok(w)
}

fn layer(ld: &Loader, hp: &HParams, parts: &LayerParts, il: usize) -> Result<LayerWeights> {
    Ok(LayerWeights {
        attn_norm: Some(ld.vector(&format!("blk.{il}.attn_norm.weight"), hp.n_embd)?),
        attn_norm_b: None,
        attn: Some(load_attention(ld, hp, parts, il)?),
        rs: None,
        post_attn_norm: None,
        ffn_norm: None,
        ffn_norm_b: None,
        ffn: Ffn::Gated(load_gated(ld, hp, parts, il)?),
        post_ffn_norm: None,
        attn_out_norm: None,
        layer_out_norm: None,
        latent: None,
    })
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    parallel_decoder_forward(model, w, ws, kv, ub, threads, logits, swiglu);
}
