//! The text models of Qwen's vision-language families: Qwen2-VL and Qwen2.5-VL (`qwen2vl`: the
//! qwen2 block, Q/K/V biases), Qwen3-VL (`qwen3vl`: the qwen3 block, per-head Q/K norms) and
//! Qwen3-VL-MoE (`qwen3vlmoe`: with qwen3moe's experts). They rotate with multi-axis RoPE
//! (`rope.dimension_sections`: consecutive sections for qwen2vl, interleaved for the Qwen3-VL
//! pair), so that an image's tokens carry 2-D positions; the Qwen3-VL pair also take DeepStack
//! rows (`n_deepstack_layers`): an image row holds the main embedding and one more per DeepStack
//! layer, added to the output of layers 0, 1 ... (llama.cpp's src/models/qwen2vl.cpp,
//! qwen3vl.cpp, qwen3vlmoe.cpp).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, Meta};
use crate::kvstore::KvStore;
use crate::model::{load_decoder, LayerParts, Loader, Model, QkNorm, Weights};
use crate::ops::{swiglu, Mrope};

pub const QWEN2VL: ArchInfo = ArchInfo { name: "qwen2vl", rope_neox: true, hparams: hparams_qwen2vl, load: load_qwen2vl, forward, encoder: false };
pub const QWEN3VL: ArchInfo = ArchInfo { name: "qwen3vl", rope_neox: true, hparams: hparams_qwen3vl, load: load_qwen3vl, forward, encoder: false };
pub const QWEN3VLMOE: ArchInfo =
    ArchInfo { name: "qwen3vlmoe", rope_neox: true, hparams: hparams_qwen3vlmoe, load: load_qwen3vlmoe, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

/// llama.cpp's qwen3vl graphs pass no second scales to build_ffn / build_moe_ffn.
const QWEN3VL_PARTS: LayerParts = LayerParts { qk_norm: Some(QkNorm::PerHead), ..LayerParts::PRE_NORM };

fn hparams_qwen2vl(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    hp.mrope = Some(read_mrope(hp, file, false)?);
    whole_heads_rotate(hp, file)
}

fn hparams_qwen3vl(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    hp.mrope = Some(read_mrope(hp, file, true)?);
    hp.n_deepstack = Meta { file, arch: &hp.arch }.opt_usize("n_deepstack_layers")?.unwrap_or(0);
    // llama.cpp adds each DeepStack part to a whole micro-batch's rows after its layer: after
    // the last layer, whose rows are only the outputs, its graph cannot (Qwen3-VL's are early)
    if hp.n_deepstack >= hp.n_layer {
        return Err(file.error(format!(
            "{}: n_deepstack_layers {} of {} blocks (DeepStack parts are added after the early blocks, not the last)",
            hp.arch, hp.n_deepstack, hp.n_layer)).into());
    }
    whole_heads_rotate(hp, file)
}

fn hparams_qwen3vlmoe(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    if hp.n_expert == 0 || hp.n_expert_used == 0 {
        return Err(file.error("n_expert and n_expert_used must be > 0 for QWEN3MOE").into());
    }
    if (Meta { file, arch: &hp.arch }).opt_usize("expert_feed_forward_length")?.is_none() {
        hp.n_ff_exp = hp.n_ff / hp.n_expert_used;
    }
    hparams_qwen3vl(hp, file)
}

/// These graphs assert that RoPE turns whole heads of equal key and value sizes.
fn whole_heads_rotate(hp: &HParams, file: &GgufFile) -> Result<()> {
    if hp.rope.n_dims != hp.head_dim_k || hp.head_dim_k != hp.head_dim_v {
        return Err(file.error(format!("{}: rope.dimension_count {} for heads of {} keys and {} values (llama.cpp asserts they agree)",
                                      hp.arch, hp.rope.n_dims, hp.head_dim_k, hp.head_dim_v)).into());
    }
    Ok(())
}

/// `rope.dimension_sections` (required, as llama.cpp reads it: 4 values, or one for all):
/// ggml asserts that some section of the first three is positive and that they fit a head.
/// `interleaved`: llama.cpp's rope type IMROPE (the Qwen3-VL and Qwen3.5 families) rather than
/// MROPE (Qwen2-VL).
pub(crate) fn read_mrope(hp: &HParams, file: &GgufFile, interleaved: bool) -> Result<Mrope> {
    let m = Meta { file, arch: &hp.arch };
    let key = m.key("rope.dimension_sections");
    let s = m.layer_values("rope.dimension_sections", 4)?.ok_or_else(|| file.error(format!("missing metadata key {key}")))?;
    if s[..3].iter().all(|&x| x == 0) || s.iter().sum::<usize>() > hp.head_dim_k {
        return Err(m.bad(&key, &format!("sections {s:?} for heads of {}", hp.head_dim_k)));
    }
    Ok(Mrope { sections: [s[0], s[1], s[2], s[3]], interleaved })
}

fn load_qwen2vl(ld: &Loader, hp: &HParams) -> Result<Weights> {
    if hp.n_expert > 0 {
        return Err(EngineError::Unsupported("a qwen2vl model with experts".into()));
    }
    load_decoder(ld, hp, &LayerParts { output_bias: true, ..LayerParts::PRE_NORM })
}

fn load_qwen3vl(ld: &Loader, hp: &HParams) -> Result<Weights> {
    if hp.n_expert > 0 {
        return Err(EngineError::Unsupported("a qwen3vl model with experts (qwen3vlmoe is the architecture of those)".into()));
    }
    load_decoder(ld, hp, &QWEN3VL_PARTS)
}

fn load_qwen3vlmoe(ld: &Loader, hp: &HParams) -> Result<Weights> {
    load_decoder(ld, hp, &QWEN3VL_PARTS)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
