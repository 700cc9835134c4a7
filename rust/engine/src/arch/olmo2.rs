//! OLMo 2: no pre-norms; RMSNorm of Q and K over each token's whole projection before RoPE
//! (NEOX); norms after attention and after the FFN, before the residual adds; a SwiGLU FFN.
//! Files with a sliding window (OLMo 3) slide on three layers of every four.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{load_decoder, LayerParts, Loader, Model, QkNorm, Weights};
use crate::ops::swiglu;

pub const OLMO2: ArchInfo = ArchInfo { name: "olmo2", rope_neox: true, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    if hp.n_swa > 0 {
        hp.load_swa_pattern(file, 4)?;
        hp.rope_freq_base_swa = hp.opt_f32(file, "rope.freq_base_swa", hp.rope.freq_base)?;
    }
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let parts = LayerParts { pre_norms: false, qk_norm: Some(QkNorm::Whole), post_norms: true, ..LayerParts::PRE_NORM };
    load_decoder(ld, hp, &parts)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
