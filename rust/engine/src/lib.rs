//! The model runtime: a model loaded from GGUF, a context holding the KV cache, and decode.
//!
//! Data flows one way: file → `Model` (hyper-parameters, weights as views into the map,
//! vocabulary) → `Context::decode(&Batch)` (validate, split into micro-batches, place them in
//! the cache all or none, run the architecture's forward pass) → logits.

pub mod actstats;
pub mod arch;
pub mod attention;
pub mod batch;
pub mod context;
pub mod error;
pub mod graph;
pub mod hparams;
pub mod kvstore;
pub mod lora;
pub mod model;
mod moe;
pub mod ops;
pub mod recurrent;
pub mod split;
pub mod state;
pub mod vision;
mod weights;

pub use batch::Batch;
pub use context::{Context, ContextParams};
pub use error::{EngineError, Result};
pub use model::Model;
