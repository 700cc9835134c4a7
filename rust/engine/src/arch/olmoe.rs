//! OLMoE: pre-norm blocks with RMSNorm of Q and K over each token's whole projection (before
//! NEOX RoPE), no output bias, and a mixture of experts of feed_forward_length rows (softmax
//! router, top-k, weights not renormalized).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, MoeGating};
use crate::kvstore::KvStore;
use crate::model::{load_decoder, LayerParts, Loader, Model, QkNorm, Weights};
use crate::ops::swiglu;

pub const OLMOE: ArchInfo = ArchInfo { name: "olmoe", rope_neox: true, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    if hp.n_expert == 0 {
        return Err(file.error("n_expert must be > 0").into());
    }
    // llama.cpp's Q and K norms are n_embd long: Q and K projections of n_embd values.
    if hp.n_head * hp.head_dim_k != hp.n_embd || hp.n_embd_k_gqa() != hp.n_embd || hp.rope.n_dims != hp.head_dim_k {
        return Err(file.error("olmoe: Q and K projections of n_embd values, rotated whole, are required").into());
    }
    // The experts are feed_forward_length wide; llama.cpp reads neither
    // expert_feed_forward_length nor expert_weights_scale for olmoe.
    hp.n_ff_exp = hp.n_ff;
    hp.expert_weights_scale = 0.0;
    hp.moe_gating = MoeGating::Softmax { norm: false };
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    load_decoder(ld, hp, &LayerParts { qk_norm: Some(QkNorm::Whole), ..LayerParts::PRE_NORM })
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
