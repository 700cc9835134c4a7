//! Granite (3.x): the llama block with multipliers: of the embeddings (embedding_scale), of
//! the attention scores (attention.scale), of each block's output before its residual add
//! (residual_scale), and a divisor of the logits (logit_scale).

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

pub const GRANITE: ArchInfo = ArchInfo { name: "granite", rope_neox: false, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

/// llama_model_granite::load_arch_hparams: a multiplier of 0 (or none) means none.
fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    let or_one = |v: f32| if v == 0.0 { 1.0 } else { v };
    hp.logit_scale = or_one(hp.f32(file, "logit_scale")?);
    hp.residual_scale = or_one(hp.opt_f32(file, "residual_scale", 0.0)?);
    hp.embedding_scale = or_one(hp.opt_f32(file, "embedding_scale", 0.0)?);
    hp.embedding_scale_raw = true;
    let attn_scale = hp.opt_f32(file, "attention.scale", 0.0)?;
    if attn_scale != 0.0 {
        hp.attn_scale = attn_scale;
    }
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let parts = LayerParts { o_bias: true, ffn_bias: true, rope_freqs: true, long_rope: true, ..LayerParts::PRE_NORM };
    load_decoder(ld, hp, &parts)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
