//! The llama family: pre-norm decoder blocks with RoPE attention and a SwiGLU FFN. `llama`
//! (Llama 2/3.x, Mistral, SmolLM2; Mixtral with `expert_count`) may carry Llama 3's
//! `rope_freqs` factors and biases; `qwen2` adds Q/K/V biases and rotates NEOX-style.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::{no_extra_hparams, ArchInfo};
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{load_decoder, LayerParts, Loader, Model, Weights};
use crate::ops::swiglu;

pub const LLAMA: ArchInfo = ArchInfo { name: "llama", rope_neox: false, hparams: llama_hparams, load: load_llama, forward, encoder: false };
pub const QWEN2: ArchInfo = ArchInfo { name: "qwen2", rope_neox: true, hparams: no_extra_hparams, load: load_qwen2, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

fn llama_hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    // llama.cpp refuses a llama model that rotates only part of each head.
    if hp.rope.n_dims != hp.head_dim_k {
        return Err(file.error(format!("invalid n_rot: {}, expected {}", hp.rope.n_dims, hp.head_dim_k)).into());
    }
    Ok(())
}

fn load_llama(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let parts = LayerParts { o_bias: true, ffn_bias: true, rope_freqs: true, long_rope: true, ffn_scales: true, ..LayerParts::PRE_NORM };
    load_decoder(ld, hp, &parts)
}

fn load_qwen2(ld: &Loader, hp: &HParams) -> Result<Weights> {
    load_decoder(ld, hp, &LayerParts::PRE_NORM)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
