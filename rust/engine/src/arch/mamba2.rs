//! Mamba-2 (`mamba2`): a pure state-space model. Each block is an RMSNorm and a Mamba-2
//! mixer (input projection to z, x, B, C and dt; a causal convolution over x, B, C; the
//! selective scan with one decay per head and groups of B/C; the skip D; a SiLU gate and a
//! grouped RMSNorm; the output projection) added to the residual stream. No attention, no
//! FFN: its memory is one state per sequence (llama_memory_recurrent).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{embed, output, pre_norm, residual};
use crate::arch::ArchInfo;
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{Ffn, LayerWeights, Loader, Model, Weights};
use crate::recurrent::{mamba2_mixer, mamba2_params, Mamba2Weights, RsWeights};

pub const MAMBA2: ArchInfo = ArchInfo { name: "mamba2", rope_neox: false, hparams, load, forward, encoder: false };

fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    hp.rs = Some(mamba2_params(file, &hp.arch, vec![true; hp.n_layer])?);
    hp.kv_layers = vec![false; hp.n_layer];
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let rs = hp.rs.as_ref().expect("set by hparams");
    let layers = (0..hp.n_layer)
        .map(|il| -> Result<LayerWeights> {
            Ok(LayerWeights {
                attn_norm: Some(ld.vector(&format!("blk.{il}.attn_norm.weight"), hp.n_embd)?),
                attn: None,
                rs: Some(RsWeights::Mamba2(Mamba2Weights::load(ld, rs, hp.n_embd, il, true)?)),
                post_attn_norm: None, ffn_norm: None, ffn: Ffn::None, post_ffn_norm: None,
                attn_out_norm: None, layer_out_norm: None,
                attn_norm_b: None, ffn_norm_b: None, latent: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    crate::model::load_embeddings_and_head(ld, hp, layers)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    let hp = &model.hparams;
    let rs = hp.rs.as_ref().expect("set by hparams");
    let (n, d, eps) = (ub.tokens.len(), hp.n_embd, hp.rms_eps);
    embed(w, ws, ub, hp, 1.0, threads);
    for (il, lw) in w.layers.iter().enumerate() {
        if let Some(s) = ws.stats.as_deref_mut() {
            s.begin_layer(il);
        }
        pre_norm(ws, lw.attn_norm.as_deref(), eps, n, d);
        let Some(RsWeights::Mamba2(m)) = &lw.rs else { unreachable!("every mamba2 block is loaded with its mixer") };
        mamba2_mixer(rs, m, ws, &mut kv.rs, ub, il, eps, threads);
        residual(ws, None, eps, 1.0, n, d);
        if let Some(cv) = ub.cvec {
            cv.apply(il, &mut ws.x[..n * d]);
        }
    }
    output(hp, w, ws, ub, threads, logits);
}
