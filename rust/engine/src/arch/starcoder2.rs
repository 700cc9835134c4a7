//! StarCoder 2: pre-norm blocks of LayerNorms with biases (the output norm too), biases on
//! Q/K/V (optional) and on the output projection, NEOX RoPE, and a GELU FFN without gate
//! whose up and down projections have biases.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, Meta};
use crate::kvstore::KvStore;
use crate::model::{load_attention, load_embeddings_and_head, Ffn, LayerParts, LayerWeights, Loader, Model, PlainFfn, Weights};
use crate::ops::swiglu;

pub const STARCODER2: ArchInfo = ArchInfo { name: "starcoder2", rope_neox: true, hparams, load, forward, encoder: false };

/// The FFN is plain GELU (Ffn::Plain); the gated activation is never applied.
const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    if (Meta { file, arch: &hp.arch }).opt_f32("attention.layer_norm_epsilon")?.is_none() {
        return Err(file.error("missing metadata key starcoder2.attention.layer_norm_epsilon").into());
    }
    if hp.rope.n_dims != hp.head_dim_k || hp.head_dim_k != hp.head_dim_v {
        return Err(file.error("starcoder2: rope dims, key and value heads must be equal").into());
    }
    hp.layer_norm = true;
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    if hp.n_expert > 0 {
        return Err(EngineError::Unsupported("a starcoder2 model with experts".into()));
    }
    let layers = (0..hp.n_layer).map(|il| layer(ld, hp, il)).collect::<Result<Vec<_>>>()?;
    let mut w = load_embeddings_and_head(ld, hp, layers)?;
    w.output_norm_b = Some(ld.vector("output_norm.bias", hp.n_embd)?);
    Ok(w)
}

fn layer(ld: &Loader, hp: &HParams, il: usize) -> Result<LayerWeights> {
    let (d, ff) = (hp.n_embd, hp.n_ff);
    let n = |s: &str| format!("blk.{il}.{s}");
    let parts = LayerParts { o_bias: true, ..LayerParts::PRE_NORM };
    Ok(LayerWeights {
        attn_norm: Some(ld.vector(&n("attn_norm.weight"), d)?),
        attn_norm_b: Some(ld.vector(&n("attn_norm.bias"), d)?),
        attn: Some(load_attention(ld, hp, &parts, il)?),
        rs: None,
        post_attn_norm: None,
        ffn_norm: Some(ld.vector(&n("ffn_norm.weight"), d)?),
        ffn_norm_b: Some(ld.vector(&n("ffn_norm.bias"), d)?),
        ffn: Ffn::Plain(PlainFfn {
            up: ld.matrix(&n("ffn_up.weight"), d, ff)?,
            down: ld.matrix(&n("ffn_down.weight"), ff, d)?,
            up_b: Some(ld.vector(&n("ffn_up.bias"), ff)?),
            down_b: Some(ld.vector(&n("ffn_down.bias"), d)?),
            up_s: None,
            down_s: None,
        }),
        post_ffn_norm: None,
        attn_out_norm: None,
        layer_out_norm: None,
        latent: None,
    })
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
