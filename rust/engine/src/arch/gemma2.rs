//! Gemma 2: embeddings scaled by sqrt(n_embd), NEOX RoPE, Q scaled after RoPE, attention
//! scores soft-capped (tanh, 50 by default), a sliding window on every other layer (4096 by
//! default), norms after attention and after the FFN, a GeGLU FFN, tied output and final
//! logits soft-capped (30 by default).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{load_decoder, LayerParts, Loader, Model, Weights};
use crate::ops::geglu;

pub const GEMMA2: ArchInfo = ArchInfo { name: "gemma2", rope_neox: true, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: true, act: geglu };

fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    if hp.n_swa == 0 {
        hp.n_swa = 4096;
    }
    hp.load_swa_pattern(file, 2)?;
    hp.rope_freq_base_swa = hp.opt_f32(file, "rope.freq_base_swa", hp.rope.freq_base)?;
    hp.rope_freq_scale_swa = hp.rope.freq_scale;
    hp.attn_logit_softcap = hp.opt_f32(file, "attn_logit_softcapping", 50.0)?;
    hp.final_logit_softcap = hp.opt_f32(file, "final_logit_softcapping", 30.0)?;
    hp.embedding_scale = (hp.n_embd as f32).sqrt();
    // The 27B model (46 layers) scales by the model width per head, the others by head size.
    hp.attn_scale = if hp.n_layer == 46 { 1.0 / ((hp.n_embd / hp.n_head) as f32).sqrt() } else { 1.0 / (hp.head_dim_k as f32).sqrt() };
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    // The output is always the token embedding (llama.cpp reads no output.weight).
    load_decoder(ld, hp, &LayerParts { post_norms: true, tied_output: true, ..LayerParts::PRE_NORM })
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
