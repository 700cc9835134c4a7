//! ERNIE 4.5: the llama block (RoPE in adjacent pairs, optional Q/K/V biases, no output bias,
//! SwiGLU). `ernie4_5-moe`: after `leading_dense_block_count` dense layers, a mixture of
//! experts (softmax router, top-k, weights renormalized, the optional selection bias
//! `exp_probs_b`) plus, with `expert_shared_feed_forward_length`, a shared expert added to
//! their sum.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, Meta, MoeGating};
use crate::kvstore::KvStore;
use crate::model::{load_decoder, Ffn, LayerParts, Loader, Model, SharedParts, Weights};
use crate::ops::swiglu;

pub const ERNIE4_5: ArchInfo = ArchInfo { name: "ernie4_5", rope_neox: false, hparams: dense_hparams, load: load_dense, forward,
                                          encoder: false };
pub const ERNIE4_5_MOE: ArchInfo = ArchInfo { name: "ernie4_5-moe", rope_neox: false, hparams: moe_hparams, load: load_moe, forward,
                                              encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

fn dense_hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    if hp.rope.n_dims != hp.head_dim_k || hp.head_dim_k != hp.head_dim_v {
        return Err(file.error(format!("{}: rope dims, key and value heads must be equal", hp.arch)).into());
    }
    Ok(())
}

/// llama_model_ernie4_5::load_arch_hparams for the MoE variant.
fn moe_hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    dense_hparams(hp, file)?;
    let m = Meta { file, arch: &hp.arch };
    if hp.n_expert == 0 || m.opt_usize("expert_feed_forward_length")?.is_none() {
        return Err(file.error("ernie4_5-moe needs expert_count and expert_feed_forward_length").into());
    }
    // The loader gives every layer from the dense lead on experts, the graph only those
    // (il + 1) % step == 0: llama.cpp runs a step of 1 only.
    let step = m.usize("interleave_moe_layer_step")?;
    if step != 1 {
        return Err(EngineError::Unsupported(format!("ernie4_5-moe.interleave_moe_layer_step = {step} (supported: 1)")));
    }
    hp.n_layer_dense_lead = m.opt_usize("leading_dense_block_count")?.unwrap_or(0).min(hp.n_layer);
    hp.moe_gating = MoeGating::Softmax { norm: true };
    // Not read by llama.cpp's ernie4_5 loader.
    hp.expert_weights_scale = 0.0;
    Ok(())
}

fn load_dense(ld: &Loader, hp: &HParams) -> Result<Weights> {
    if hp.n_expert > 0 {
        return Err(EngineError::Unsupported("an ernie4_5 model with experts (ernie4_5-moe is the architecture of those)".into()));
    }
    load_decoder(ld, hp, &LayerParts::PRE_NORM)
}

fn load_moe(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let shared = (hp.n_ff_shexp > 0).then_some(SharedParts { gated: true, sigmoid_gate: false, scales: false });
    let mut w = load_decoder(ld, hp, &LayerParts { shared_expert: shared, ..LayerParts::PRE_NORM })?;
    for (il, layer) in w.layers.iter_mut().enumerate() {
        if let Ffn::Experts(e) = &mut layer.ffn {
            e.probs_b = ld.opt_vector(&format!("blk.{il}.exp_probs_b.bias"), hp.n_expert)?;
        }
    }
    Ok(w)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
