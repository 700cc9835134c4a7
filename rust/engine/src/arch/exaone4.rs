//! EXAONE 4.0: no pre-norms; per-head RMSNorm of Q and K before NEOX RoPE; norms after
//! attention and after the FFN, before the residual adds (OLMo 2's arrangement); a SwiGLU
//! FFN; optional `rope_freqs`. The 64-layer model (32B) slides on three layers of every four
//! (or as `attention.sliding_window_pattern` says, window 4096 unless
//! `attention.sliding_window`), and its global layers attend without RoPE; llama.cpp gives
//! the other sizes no window (all layers global, all rotated).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, Meta};
use crate::kvstore::KvStore;
use crate::model::{load_decoder, LayerParts, Loader, Model, QkNorm, Weights};
use crate::ops::swiglu;

pub const EXAONE4: ArchInfo = ArchInfo { name: "exaone4", rope_neox: true, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

/// The layer count of the one size llama.cpp runs with sliding windows.
const SWA_LAYERS: usize = 64;

/// llama_model_exaone4::load_arch_hparams.
fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    let m = Meta { file, arch: &hp.arch };
    if m.opt_usize("nextn_predict_layers")?.unwrap_or(0) > 0 {
        return Err(EngineError::Unsupported("exaone4: multi-token-prediction layers (nextn_predict_layers)".into()));
    }
    if hp.rope.n_dims != hp.head_dim_k || hp.head_dim_k != hp.head_dim_v || hp.n_head * hp.head_dim_k != hp.n_embd {
        return Err(file.error("exaone4: rope dims, key and value heads equal, n_head heads of n_embd values").into());
    }
    if hp.n_layer != SWA_LAYERS {
        hp.n_swa = 0;
        return Ok(());
    }
    if hp.n_swa == 0 {
        hp.n_swa = 4096;
    }
    hp.load_swa_pattern(file, 4)?;
    // The graph rotates the sliding layers with the context's RoPE; llama.cpp's K-shift with
    // rope.freq_base_swa (the base without it) and the file's scale.
    hp.swa_own_rope = false;
    hp.rope_freq_base_swa = hp.opt_f32(file, "rope.freq_base_swa", hp.rope_train.freq_base)?;
    hp.rope_freq_scale_swa = hp.rope_train.freq_scale;
    // RoPE on the sliding layers only.
    hp.nope_layers = hp.swa_layers.iter().map(|&s| !s).collect();
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let parts = LayerParts { pre_norms: false, qk_norm: Some(QkNorm::PerHead), post_norms: true, rope_freqs: true,
                             ..LayerParts::PRE_NORM };
    load_decoder(ld, hp, &parts)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
