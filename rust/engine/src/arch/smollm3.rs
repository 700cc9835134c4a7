//! SmolLM3: the llama block (RoPE in adjacent pairs, SwiGLU, optional tied output) where
//! every fourth layer attends without RoPE. llama.cpp fixes that period at 4
//! (llama_model_smollm3::load_arch_hparams sets n_no_rope_layer_step; no metadata key).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{load_decoder, LayerParts, Loader, Model, Weights};
use crate::ops::swiglu;

pub const SMOLLM3: ArchInfo = ArchInfo { name: "smollm3", rope_neox: false, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

/// Layers (il + 1) % NO_ROPE_LAYER_STEP == 0 attend without RoPE.
const NO_ROPE_LAYER_STEP: usize = 4;

fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    if hp.rope.n_dims != hp.head_dim_k || hp.head_dim_k != hp.head_dim_v {
        return Err(file.error(format!("smollm3: rope dims {}, key and value heads {} and {} must be equal",
                                      hp.rope.n_dims, hp.head_dim_k, hp.head_dim_v)).into());
    }
    hp.nope_layers = (0..hp.n_layer).map(|il| (il + 1) % NO_ROPE_LAYER_STEP == 0).collect();
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    if hp.n_expert > 0 {
        return Err(crate::error::EngineError::Unsupported("a smollm3 model with experts".into()));
    }
    load_decoder(ld, hp, &LayerParts::PRE_NORM)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
