//! Qwen 3: the llama block with a per-head RMSNorm of Q and K before RoPE (NEOX), no biases;
//! `qwen3moe` replaces the FFN by a mixture of experts (softmax router, top-k, weights
//! renormalized), its experts' width in `expert_feed_forward_length`.

use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::{no_extra_hparams, ArchInfo};
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{load_decoder, LayerParts, Loader, Model, QkNorm, Weights};
use crate::ops::swiglu;

pub const QWEN3: ArchInfo = ArchInfo { name: "qwen3", rope_neox: true, hparams: no_extra_hparams, load: load_dense, forward, encoder: false };
pub const QWEN3MOE: ArchInfo = ArchInfo { name: "qwen3moe", rope_neox: true, hparams: no_extra_hparams, load: load_moe, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };
const PARTS: LayerParts = LayerParts { qk_norm: Some(QkNorm::PerHead), ffn_scales: true, ..LayerParts::PRE_NORM };

fn load_dense(ld: &Loader, hp: &HParams) -> Result<Weights> {
    if hp.n_expert > 0 {
        return Err(crate::error::EngineError::Unsupported("a qwen3 model with experts (qwen3moe is the architecture of those)".into()));
    }
    load_decoder(ld, hp, &PARTS)
}

fn load_moe(ld: &Loader, hp: &HParams) -> Result<Weights> {
    if hp.n_expert == 0 {
        return Err(ld.error("qwen3moe.expert_count is missing or 0"));
    }
    load_decoder(ld, hp, &PARTS)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
