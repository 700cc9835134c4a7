//! Seed-OSS: the llama block with NEOX RoPE, optional Q/K/V biases (no output bias), heads of
//! `attention.key_length` values, and the FFN's pre-norm stored as post_attention_norm.

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

pub const SEED_OSS: ArchInfo = ArchInfo { name: "seed_oss", rope_neox: true, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    if hp.rope.n_dims != hp.head_dim_k || hp.head_dim_k != hp.head_dim_v {
        return Err(file.error("seed_oss: rope dims, key and value heads must be equal").into());
    }
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    if hp.n_expert > 0 {
        return Err(crate::error::EngineError::Unsupported("a seed_oss model with experts".into()));
    }
    load_decoder(ld, hp, &LayerParts { ffn_norm_name: "post_attention_norm.weight", ..LayerParts::PRE_NORM })
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
