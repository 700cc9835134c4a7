//! Phi-3: the llama block with Q, K and V in one matrix (or three), gate and up in one
//! `ffn_up` of 2 n_ff rows, Q scaled after RoPE (NEOX), and LongRoPE's frequency factors
//! (`rope_factors_long` for contexts per sequence above the original one, else `_short`).
//! llama.cpp runs Phi-3 without its sliding window (disabled there for every Phi-3 file).

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

pub const PHI3: ArchInfo = ArchInfo { name: "phi3", rope_neox: true, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: true, act: swiglu };

fn hparams(hp: &mut HParams, _file: &GgufFile) -> Result<()> {
    // llama.cpp reads phi3.attention.sliding_window and then turns the window off.
    hp.n_swa = 0;
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    load_decoder(ld, hp, &LayerParts { fused_gate_up: true, long_rope: true, ..LayerParts::PRE_NORM })
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
