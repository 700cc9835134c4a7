//! Gemma 3: embeddings scaled by sqrt(n_embd), per-head RMSNorm of Q and K, NEOX RoPE with
//! its own base on sliding-window layers, Q scaled after RoPE, norms after attention and
//! after the FFN, a GeGLU FFN, tied output, and an interleaved cache (5 sliding layers : 1
//! global by default).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{load_decoder, LayerParts, Loader, Model, QkNorm, Weights};
use crate::ops::geglu;

pub const GEMMA3: ArchInfo = ArchInfo { name: "gemma3", rope_neox: true, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: true, act: geglu };

/// Gemma 3's hyper-parameters beyond the common ones (llama_model_gemma3::load_arch_hparams).
fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    hp.load_swa_pattern(file, 6)?;
    // The 27B model (62 layers) scales by the model width per head, the others by head size.
    hp.attn_scale = if hp.n_layer == 62 {
        1.0 / ((hp.n_embd / hp.n_head) as f32).sqrt()
    } else {
        1.0 / (hp.head_dim_k as f32).sqrt()
    };
    hp.embedding_scale = (hp.n_embd as f32).sqrt();
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    load_decoder(ld, hp, &LayerParts { qk_norm: Some(QkNorm::PerHead), post_norms: true, ..LayerParts::PRE_NORM })
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
