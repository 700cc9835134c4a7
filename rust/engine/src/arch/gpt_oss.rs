//! gpt-oss: pre-norm blocks whose attention has biases and per-head sinks (a logit in each
//! softmax with no value), a sliding window on every other layer, YaRN RoPE (NEOX), and a
//! mixture of experts with a biased router, biased experts, weights from a softmax over the
//! chosen experts' logits, and the clamped SwiGLU of gpt-oss. The FFN's pre-norm is stored
//! as post_attention_norm.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, MoeGating};
use crate::kvstore::KvStore;
use crate::model::{load_decoder, LayerParts, Loader, Model, Weights};
use crate::ops::swiglu_oai;

pub const GPT_OSS: ArchInfo = ArchInfo { name: "gpt-oss", rope_neox: true, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu_oai };

fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    if hp.n_swa == 0 || hp.n_expert == 0 {
        return Err(file.error("gpt-oss needs attention.sliding_window and expert_count").into());
    }
    hp.load_swa_pattern(file, 2)?;
    hp.rope_freq_base_swa = hp.opt_f32(file, "rope.freq_base_swa", hp.rope.freq_base)?;
    hp.rope_freq_scale_swa = hp.rope.freq_scale;
    hp.moe_gating = MoeGating::SoftmaxOfChosen;
    hp.attn_scale = 1.0 / (hp.rope.n_dims as f32).sqrt();
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let parts = LayerParts { o_bias: true, sinks: true, ffn_bias: true, ffn_norm_name: "post_attention_norm.weight",
                             ..LayerParts::PRE_NORM };
    load_decoder(ld, hp, &parts)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
