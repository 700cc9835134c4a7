//! Qwen1.5-MoE / Qwen2-MoE: the qwen2 block (Q/K/V biases, NEOX RoPE) whose FFN is a mixture
//! of experts (softmax router, top-k, weights not renormalized) plus a shared expert behind a
//! per-token sigmoid gate (`ffn_gate_inp_shexp`), added to the experts' sum.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, Meta, MoeGating};
use crate::kvstore::KvStore;
use crate::model::{load_decoder, LayerParts, Loader, Model, SharedParts, Weights};
use crate::ops::swiglu;

pub const QWEN2MOE: ArchInfo = ArchInfo { name: "qwen2moe", rope_neox: true, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

/// llama_model_qwen2moe: experts of expert_feed_forward_length rows (n_ff / n_expert_used
/// without it), a shared expert of expert_shared_feed_forward_length rows (n_ff without it).
fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    if hp.n_expert == 0 {
        return Err(file.error("n_expert must be > 0 for QWEN2MOE").into());
    }
    if hp.rope.n_dims != hp.head_dim_k || hp.head_dim_k != hp.head_dim_v {
        return Err(file.error("qwen2moe: rope dims, key and value heads must be equal").into());
    }
    if (Meta { file, arch: &hp.arch }).opt_usize("expert_feed_forward_length")?.is_none() {
        hp.n_ff_exp = hp.n_ff / hp.n_expert_used;
        if hp.n_ff_exp == 0 {
            return Err(file.error("qwen2moe: feed_forward_length is smaller than expert_used_count").into());
        }
    }
    if hp.n_ff_shexp == 0 {
        hp.n_ff_shexp = hp.n_ff;
    }
    hp.moe_gating = MoeGating::Softmax { norm: false };
    // llama.cpp's qwen2moe does not read expert_weights_scale.
    hp.expert_weights_scale = 0.0;
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let shared = SharedParts { gated: true, sigmoid_gate: true, scales: false };
    load_decoder(ld, hp, &LayerParts { shared_expert: Some(shared), ..LayerParts::PRE_NORM })
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
