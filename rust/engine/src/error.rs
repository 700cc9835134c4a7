//! The engine's errors; the bindings map each variant to a Python exception.

use ferrollama_gguf::GgufError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A malformed file.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// An architecture, tensor type or tokenizer the engine lacks.
    #[error("{0}")]
    Unsupported(String),
    /// A decode that could not run (the cache is as it was before the call).
    #[error("{0}")]
    Decode(String),
    /// A wrong argument value.
    #[error("{0}")]
    InvalidArgument(String),
    /// A state blob or session file that cannot be restored.
    #[error("{0}")]
    State(String),
}

pub type Result<T> = std::result::Result<T, EngineError>;
