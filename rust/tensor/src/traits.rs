//! The type-traits table: everything the engine needs to know about a tensor type.

use crate::GgmlType;

/// Converts `n` elements (a whole number of blocks) from a type's bytes to f32.
pub type ToF32 = fn(src: &[u8], dst: &mut [f32]);
/// Converts f32 values (a whole number of blocks) into a type's bytes.
pub type FromF32 = fn(src: &[f32], dst: &mut [u8]);
/// Dot product of `n` elements: a row of the weight type with a row of its `vec_dot_type`.
pub type VecDot = fn(n: usize, w: &[u8], x: &[u8]) -> f32;

pub struct TypeTraits {
    pub ty: GgmlType,
    pub block_size: usize,
    pub type_size: usize,
    pub to_f32: ToF32,
    /// Quantization from f32; used for activations (the vec_dot types) and the KV cache.
    pub from_f32: Option<FromF32>,
    /// The type activations are converted to before `vec_dot`.
    pub vec_dot_type: GgmlType,
    pub vec_dot: VecDot,
}

impl TypeTraits {
    /// Bytes of a row of `n` elements (n a multiple of block_size).
    pub fn row_bytes(&self, n: usize) -> usize { n / self.block_size * self.type_size }
}

fn f32_to_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes(s.try_into().unwrap());
    }
}
fn f32_from_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}
fn f32_vec_dot(n: usize, w: &[u8], x: &[u8]) -> f32 {
    // ggml accumulates F32 dot products in f64 in its scalar path (ggml_vec_dot_f32 uses
    // ggml_float for the leftovers) but in f32 lanes with SIMD; f32 lanes here.
    let mut acc = 0.0f32;
    for i in 0..n {
        let a = f32::from_le_bytes(w[4 * i..4 * i + 4].try_into().unwrap());
        let b = f32::from_le_bytes(x[4 * i..4 * i + 4].try_into().unwrap());
        acc += a * b;
    }
    acc
}

static TABLE: &[TypeTraits] = &[TypeTraits {
    ty: GgmlType::F32,
    block_size: 1,
    type_size: 4,
    to_f32: f32_to_f32,
    from_f32: Some(f32_from_f32),
    vec_dot_type: GgmlType::F32,
    vec_dot: f32_vec_dot,
}];

/// The traits of a type, or None when the kernels do not implement it.
pub fn traits(ty: GgmlType) -> Option<&'static TypeTraits> {
    TABLE.iter().find(|t| t.ty == ty)
}
