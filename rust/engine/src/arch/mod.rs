//! The architectures: one file each, composing the shared blocks (blocks.rs, the experts in
//! moe.rs), and one table row each.

pub(crate) mod blocks;
pub mod deepseek2;
pub(crate) mod latent;
pub mod gemma2;
pub mod bert;
pub mod cohere2;
pub mod ernie4_5;
pub mod exaone4;
pub mod falcon_h1;
pub mod gemma3;
pub mod gemma3n;
pub mod gemma4;
pub mod glm4_moe;
pub mod gpt_oss;
pub mod granite;
pub mod granite_hybrid;
pub mod lfm2;
pub mod llama;
pub mod llama4;
pub mod mamba2;
pub mod mistral3;
pub mod nemotron_h;
pub mod olmo2;
pub mod olmoe;
pub mod phi3;
pub(crate) mod ple;
pub mod qwen3;
pub mod qwen2moe;
pub mod qwen35;
pub mod qwenvl;
pub mod seed_oss;
pub mod smollm3;
pub mod starcoder2;

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{Loader, Model, Weights};

/// Runs a micro-batch through the model, storing K/V in the cache and writing the logits of
/// `ub.out_rows` (n_out rows of n_vocab).
pub type Forward = fn(&Model, &Weights, &mut Workspace, &mut KvStore, &UBatchView, &Threads, &mut [f32]);

/// One row per supported `general.architecture`.
pub struct ArchInfo {
    pub name: &'static str,
    /// RoPE NEOX mode (rotate halves) instead of adjacent pairs (llama_model_rope_type).
    pub rope_neox: bool,
    /// Reads the architecture's own metadata into the hyper-parameters.
    pub hparams: fn(&mut HParams, &GgufFile) -> Result<()>,
    /// Loads exactly the tensors the graph uses.
    pub load: fn(&Loader, &HParams) -> Result<Weights>,
    pub forward: Forward,
    /// Attention over the whole sequence without a cache, and no output head (BERT): the
    /// context computes embeddings only.
    pub encoder: bool,
}

pub const ARCHS: &[ArchInfo] = &[
    llama::LLAMA,
    llama::QWEN2,
    qwen3::QWEN3,
    qwen3::QWEN3MOE,
    gemma2::GEMMA2,
    gemma3::GEMMA3,
    gemma3n::GEMMA3N,
    gemma4::GEMMA4,
    phi3::PHI3,
    granite::GRANITE,
    olmo2::OLMO2,
    gpt_oss::GPT_OSS,
    bert::BERT,
    bert::NOMIC_BERT,
    mamba2::MAMBA2,
    granite_hybrid::GRANITE_HYBRID,
    falcon_h1::FALCON_H1,
    nemotron_h::NEMOTRON_H,
    nemotron_h::NEMOTRON_H_MOE,
    lfm2::LFM2,
    lfm2::LFM2MOE,
    qwen35::QWEN35,
    qwen35::QWEN35MOE,
    qwen35::QWEN3NEXT,
    qwenvl::QWEN2VL,
    qwenvl::QWEN3VL,
    qwenvl::QWEN3VLMOE,
    glm4_moe::GLM4MOE,
    llama4::LLAMA4,
    deepseek2::DEEPSEEK2,
    smollm3::SMOLLM3,
    mistral3::MISTRAL3,
    qwen2moe::QWEN2MOE,
    olmoe::OLMOE,
    exaone4::EXAONE4,
    seed_oss::SEED_OSS,
    ernie4_5::ERNIE4_5,
    ernie4_5::ERNIE4_5_MOE,
    cohere2::COHERE2,
    starcoder2::STARCODER2,
];

pub fn arch_info(name: &str) -> Result<&'static ArchInfo> {
    ARCHS.iter().find(|a| a.name == name).ok_or_else(|| {
        EngineError::Unsupported(format!("architecture '{name}' is not supported (supported: {})", known_names()))
    })
}

/// The names of the architectures the engine runs, for messages.
pub fn known_names() -> String {
    ARCHS.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

/// No metadata beyond the common keys.
pub(crate) fn no_extra_hparams(_: &mut HParams, _: &GgufFile) -> Result<()> { Ok(()) }
