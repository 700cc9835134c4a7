//! Tensor types and kernels: one table entry per ggml type (block size, bytes per block,
//! to_f32, from_f32, the activation type it pairs with, vec_dot), quantized matrices viewed
//! in place in the model file, and the threaded matrix product.
//!
//! Numerics follow ggml where agreement with llama.cpp depends on it: a matrix product first
//! quantizes the activations to the weight type's partner (`vec_dot_type`: Q8_0 for the
//! 32-element blocks, Q8_K for the k-quants, F16 for F16 ...) and then takes integer or
//! reduced-precision dot products exactly as ggml's `vec_dot` does.

pub mod attn;
pub mod attn_avx2;
pub mod attn_inv;
pub mod dispatch;
pub mod full_attn;
pub mod gemm;
pub mod glu;
pub mod matmul;
pub mod packed;
pub mod scalar;
pub mod simd;
pub mod ssm;
pub mod threads;
pub mod traits;
pub mod util;

pub use ferrollama_gguf::GgmlType;
pub use full_attn::{cross_attention, full_attention, full_attention_scaled};
pub use gemm::gemm;
pub use matmul::{matmul, MatmulScratch, PackJob, QMatrix, WeightBytes, TILED_TOKENS};
pub use threads::{SendPtr, Threads};
pub use dispatch::Isa;
pub use traits::{traits, TypeTraits};

/// A tensor type the kernels do not implement, or data of the wrong size.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("tensor type {0} is not supported")]
    Unsupported(GgmlType),
    #[error("{0}")]
    Shape(String),
}
