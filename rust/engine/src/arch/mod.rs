//! The architectures: one file each, written against the shared ops, and one table row each.

mod blocks;
pub mod gemma3;
pub mod llama;

use crate::error::{EngineError, Result};

/// How an architecture's graph is built; each variant names the file that implements it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Graph {
    /// llama.rs: pre-norm decoder, SwiGLU FFN (llama, qwen2, ...).
    Llama,
    /// gemma3.rs: scaled embeddings, Q/K norms, post norms, GeGLU, interleaved sliding window.
    Gemma3,
}

/// One row per supported `general.architecture`.
pub struct ArchInfo {
    pub name: &'static str,
    pub graph: Graph,
    /// RoPE NEOX mode (rotate halves) instead of adjacent pairs.
    pub rope_neox: bool,
}

pub const ARCHS: &[ArchInfo] = &[
    ArchInfo { name: "llama", graph: Graph::Llama, rope_neox: false },
    ArchInfo { name: "qwen2", graph: Graph::Llama, rope_neox: true },
    ArchInfo { name: "gemma3", graph: Graph::Gemma3, rope_neox: true },
];

pub fn arch_info(name: &str) -> Result<&'static ArchInfo> {
    ARCHS.iter().find(|a| a.name == name).ok_or_else(|| {
        let known: Vec<_> = ARCHS.iter().map(|a| a.name).collect();
        EngineError::Unsupported(format!("architecture '{name}' is not supported (supported: {})", known.join(", ")))
    })
}
