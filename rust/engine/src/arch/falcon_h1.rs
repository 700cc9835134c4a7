//! Falcon-H1 (`falcon-h1`): every block runs an attention (NeoX RoPE) and a Mamba-2 mixer in
//! parallel on the same RMS-normed input and adds both outputs to the residual stream, then a
//! SwiGLU FFN (optional biases) whose pre-norm is stored as `blk.N.ffn_norm`, without
//! `.weight`. llama.cpp's graph applies none of the checkpoint's µP multipliers (they are
//! folded into the weights when converted), no RoPE factors and no attention output bias.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{pre_norm_blocks, self_attention};
use crate::arch::ArchInfo;
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{load_attention, load_gated, Ffn, LayerParts, LayerWeights, Loader, Model, Weights};
use crate::ops::add_inplace;
use crate::recurrent::{mamba2_mixer, mamba2_params, sized, Mamba2Weights, RsWeights};

pub const FALCON_H1: ArchInfo = ArchInfo { name: "falcon-h1", rope_neox: true, hparams, load, forward, encoder: false };

/// llama_model_falcon_h1::load_arch_hparams: every layer attends and is recurrent.
fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    hp.rs = Some(mamba2_params(file, &hp.arch, vec![true; hp.n_layer])?);
    hp.check_attention_only(file)
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let rs = hp.rs.as_ref().expect("set by hparams");
    let parts = LayerParts { ffn_bias: true, ..LayerParts::PRE_NORM };
    let layers = (0..hp.n_layer)
        .map(|il| -> Result<LayerWeights> {
            let n = |s: &str| format!("blk.{il}.{s}");
            // The group norm is optional here (the mixer skips it where the file has none).
            let ssm_norm = ld.has(&n("ssm_norm.weight"));
            Ok(LayerWeights {
                attn_norm: Some(ld.vector(&n("attn_norm.weight"), hp.n_embd)?),
                attn: Some(load_attention(ld, hp, &parts, il)?),
                rs: Some(RsWeights::Mamba2(Mamba2Weights::load(ld, rs, hp.n_embd, il, ssm_norm)?)),
                post_attn_norm: None,
                ffn_norm: Some(ld.vector(&n("ffn_norm"), hp.n_embd)?),
                ffn: Ffn::Gated(load_gated(ld, hp, &parts, il)?),
                post_ffn_norm: None, attn_out_norm: None, layer_out_norm: None,
                attn_norm_b: None, ffn_norm_b: None, latent: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    crate::model::load_embeddings_and_head(ld, hp, layers)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    let hp = &model.hparams;
    let rs = hp.rs.as_ref().expect("set by hparams");
    let (n, d) = (ub.tokens.len(), hp.n_embd);
    pre_norm_blocks(model, w, ws, kv, ub, threads, logits, |lw, ws, kv, il| {
        let Some(RsWeights::Mamba2(m)) = &lw.rs else { unreachable!("every falcon-h1 block is loaded with its mixer") };
        mamba2_mixer(rs, m, ws, &mut kv.rs, ub, il, hp.rms_eps, threads);
        let mut mixed = std::mem::take(&mut ws.rs.mixed);
        sized(&mut mixed, n * d).copy_from_slice(&ws.o[..n * d]);
        self_attention(hp, lw.attn(), ws, kv, ub, il, threads);
        // the block's output: attention + mixer, then added to the stream
        add_inplace(&mut ws.o[..n * d], &mixed[..n * d]);
        ws.rs.mixed = mixed;
    });
}
