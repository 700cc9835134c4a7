//! Mistral 3 (Ministral 3): the llama block (optional output and FFN biases, `rope_freqs` or
//! LongRoPE factors, the FFN's second scales) with YaRN RoPE of the file's betas and Llama 4's attention temperature: Q
//! of a token at position p multiplied by log(floor(p / n_ctx_orig) + 1) · temperature_scale + 1
//! after RoPE (llama_model_mistral3's graph).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{AttnTemperature, HParams, RopeScaling};
use crate::kvstore::KvStore;
use crate::model::{load_decoder, LayerParts, Loader, Model, Weights};
use crate::ops::swiglu;

pub const MISTRAL3: ArchInfo = ArchInfo { name: "mistral3", rope_neox: false, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

/// llama_model_mistral3::load_arch_hparams. The YaRN betas and log multiplier
/// (rope.scaling.yarn_beta_fast / _slow / yarn_log_multiplier) are read with the common RoPE
/// keys (hparams::rope_params).
fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    if hp.rope.n_dims != hp.head_dim_k || hp.head_dim_k != hp.head_dim_v {
        return Err(file.error(format!("mistral3: rope dims {}, key and value heads {} and {} must be equal",
                                      hp.rope.n_dims, hp.head_dim_k, hp.head_dim_v)).into());
    }
    let scale = hp.opt_f32(file, "attention.temperature_scale", 0.0)?;
    if scale != 0.0 {
        // The temperature steps every n_ctx_orig_yarn positions.
        let floor_scale = hp.rope_train.n_ctx_orig;
        if floor_scale == 0 {
            return Err(file.error("invalid n_ctx_orig_yarn for attention temperature scaling").into());
        }
        hp.attn_temp = Some(AttnTemperature { scale, offset: 0.0, floor_scale });
    }
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    if hp.n_expert > 0 {
        // llama.cpp's mistral3 experts load shared experts its graph never applies.
        return Err(crate::error::EngineError::Unsupported("a mistral3 model with experts".into()));
    }
    // llama.cpp reads LongRoPE's factors for a LongRoPE model and `rope_freqs` otherwise.
    let long_rope = hp.rope_train.scaling == RopeScaling::LongRope;
    let parts = LayerParts { o_bias: true, ffn_bias: true, rope_freqs: !long_rope, long_rope, ffn_scales: true,
                             ..LayerParts::PRE_NORM };
    load_decoder(ld, hp, &parts)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
