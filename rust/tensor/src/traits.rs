//! The type-traits table: everything the engine needs to know about a tensor type.
//!
//! One entry per implemented type, built once per process for the instruction set chosen
//! by [`crate::dispatch::active_isa`]. `*_scalar` fields always hold the portable kernels.

use std::sync::OnceLock;

use crate::dispatch::{active_isa, Isa};
use crate::scalar::{float, iq1quantize as iq1, iq2quantize as iq2q, iq3quantize as iq3, iquants as iq, kquantize as kq, kquants as k, legacy as l, nvfp4 as nv, q1q2, ternary as tq, tiled};
use crate::GgmlType;

/// Converts `n` elements (a whole number of blocks) from a type's bytes to f32.
pub type ToF32 = fn(src: &[u8], dst: &mut [f32]);
/// Converts f32 values (a whole number of blocks) into a type's bytes.
pub type FromF32 = fn(src: &[f32], dst: &mut [u8]);
/// Dot product of `n` elements: a row of the weight type with a row of its `vec_dot_type`.
pub type VecDot = fn(n: usize, w: &[u8], x: &[u8]) -> f32;
/// Dot products of one weight row with four activation rows (`x[t * x_stride..]`, t < 4),
/// each bit-identical to `vec_dot` of that row: the weights are decoded once for four tokens.
pub type VecDotX4 = fn(n: usize, w: &[u8], x: &[u8], x_stride: usize, out: &mut [f32; 4]);

/// What the kernels know about one tensor type.
pub struct TypeTraits {
    pub ty: GgmlType,
    /// Elements per block.
    pub block_size: usize,
    /// Bytes per block.
    pub type_size: usize,
    pub to_f32: ToF32,
    /// Quantization from f32 as llama.cpp's CPU backend does it at run time: used for
    /// activations (the vec_dot types) and the KV cache. For weight types it is the
    /// reference quantizer (`from_f32_ref`).
    pub from_f32: Option<FromF32>,
    /// ggml's deterministic reference quantizer (`quantize_row_*_ref`, or for IQ4 what
    /// llama-quantize writes without an importance matrix): for writing model files.
    pub from_f32_ref: Option<FromF32>,
    /// The type activations are converted to before `vec_dot`.
    pub vec_dot_type: GgmlType,
    /// The fastest dot product for this CPU.
    pub vec_dot: VecDot,
    /// The same over four activation rows, where a kernel exists.
    pub vec_dot_x4: Option<VecDotX4>,
    /// The portable dot product (the specification): ggml's x86 AVX2 `ggml_vec_dot_*`
    /// arithmetic for the quantized types (see `scalar::lanes`), plain loops for the floats.
    pub vec_dot_scalar: VecDot,
    /// For Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS and the i-quants (`scalar::iquants`): each output of llama.cpp's tiled k-quant
    /// matrix product, which it runs instead of `vec_dot` on x86 for products with 8 or more
    /// activation rows and a matrix it did not repack (`scalar::tiled`). Same integers as
    /// `vec_dot`, one float accumulator instead of eight lanes.
    /// For Q8_0 and Q5_0, ferrollama's products of 8 or more tokens (llama.cpp keeps
    /// `vec_dot`'s lanes there): the same one accumulator, fed each block's exact integer sum
    /// (`scalar::repacked`), which its packed kernels compute with a third of the operations.
    pub vec_dot_tiled: Option<VecDot>,
    /// The same over four activation rows, where a kernel exists.
    pub vec_dot_tiled_x4: Option<VecDotX4>,
    /// The portable `vec_dot_tiled` (the specification).
    pub vec_dot_tiled_scalar: Option<VecDot>,
    /// For Q4_0, IQ4_NL, MXFP4 and Q4_K: each output of llama.cpp's repacked x86 kernels, which it
    /// runs for matrices whose row count is a multiple of 8 (`scalar::repacked`). Same
    /// integers as `vec_dot`, one float accumulator (two for Q4_K) instead of eight lanes.
    pub vec_dot_repacked: Option<VecDot>,
    /// The same over four activation rows, where a kernel exists.
    pub vec_dot_repacked_x4: Option<VecDotX4>,
    /// The portable `vec_dot_repacked` (the specification).
    pub vec_dot_repacked_scalar: Option<VecDot>,
    /// The instruction set `vec_dot` and `from_f32` were chosen for.
    pub isa: Isa,
}

impl TypeTraits {
    /// Bytes of a row of `n` elements (n a multiple of block_size).
    pub fn row_bytes(&self, n: usize) -> usize {
        n / self.block_size * self.type_size
    }
}

/// The scalar description of one type: (type, to_f32, runtime from_f32, reference
/// from_f32, vec_dot_type, portable vec_dot).
type Row = (GgmlType, ToF32, Option<FromF32>, Option<FromF32>, GgmlType, VecDot);

fn scalar_rows() -> Vec<Row> {
    use GgmlType as T;
    vec![
        (T::F32, float::f32_to_f32, Some(float::f32_from_f32), Some(float::f32_from_f32), T::F32, float::vec_dot_f32),
        (T::F16, float::f16_to_f32_row, Some(float::f16_from_f32), Some(float::f16_from_f32), T::F16, float::vec_dot_f16),
        (T::BF16, float::bf16_to_f32_row, Some(float::bf16_from_f32), Some(float::bf16_from_f32), T::BF16, float::vec_dot_bf16),
        (T::Q4_0, l::dequantize_q4_0, Some(l::quantize_q4_0), Some(l::quantize_q4_0), T::Q8_0, l::vec_dot_q4_0_q8_0),
        (T::Q4_1, l::dequantize_q4_1, Some(l::quantize_q4_1), Some(l::quantize_q4_1), T::Q8_1, l::vec_dot_q4_1_q8_1),
        (T::Q5_0, l::dequantize_q5_0, Some(l::quantize_q5_0), Some(l::quantize_q5_0), T::Q8_0, l::vec_dot_q5_0_q8_0),
        (T::Q5_1, l::dequantize_q5_1, Some(l::quantize_q5_1), Some(l::quantize_q5_1), T::Q8_1, l::vec_dot_q5_1_q8_1),
        (T::Q8_0, l::dequantize_q8_0, Some(l::quantize_q8_0_act), Some(l::quantize_q8_0), T::Q8_0, l::vec_dot_q8_0_q8_0),
        (T::Q8_1, l::dequantize_q8_1, Some(l::quantize_q8_1_act), Some(l::quantize_q8_1), T::Q8_1, q8_1_self_dot),
        (T::Q2_K, k::dequantize_q2_k, Some(kq::quantize_q2_k), Some(kq::quantize_q2_k), T::Q8_K, k::vec_dot_q2_k_q8_k),
        (T::Q3_K, k::dequantize_q3_k, Some(kq::quantize_q3_k), Some(kq::quantize_q3_k), T::Q8_K, k::vec_dot_q3_k_q8_k),
        (T::Q4_K, k::dequantize_q4_k, Some(kq::quantize_q4_k), Some(kq::quantize_q4_k), T::Q8_K, k::vec_dot_q4_k_q8_k),
        (T::Q5_K, k::dequantize_q5_k, Some(kq::quantize_q5_k), Some(kq::quantize_q5_k), T::Q8_K, k::vec_dot_q5_k_q8_k),
        (T::Q6_K, k::dequantize_q6_k, Some(kq::quantize_q6_k), Some(kq::quantize_q6_k), T::Q8_K, k::vec_dot_q6_k_q8_k),
        (T::Q8_K, k::dequantize_q8_k, Some(k::quantize_q8_k), Some(k::quantize_q8_k), T::Q8_K, q8_k_self_dot),
        (T::IQ4_NL, l::dequantize_iq4_nl, Some(kq::quantize_iq4_nl_row), Some(kq::quantize_iq4_nl), T::Q8_0, l::vec_dot_iq4_nl_q8_0),
        (T::MXFP4, l::dequantize_mxfp4, Some(l::quantize_mxfp4), Some(l::quantize_mxfp4), T::Q8_0, l::vec_dot_mxfp4_q8_0),
        (T::NVFP4, nv::dequantize_nvfp4, Some(nv::quantize_nvfp4), Some(nv::quantize_nvfp4), T::Q8_0, nv::vec_dot_nvfp4_q8_0),
        (T::Q1_0, q1q2::dequantize_q1_0, Some(q1q2::quantize_q1_0), Some(q1q2::quantize_q1_0), T::Q8_0, q1q2::vec_dot_q1_0_q8_0),
        (T::Q2_0, q1q2::dequantize_q2_0, Some(q1q2::quantize_q2_0), Some(q1q2::quantize_q2_0), T::Q8_0, q1q2::vec_dot_q2_0_q8_0),
        (T::TQ1_0, tq::dequantize_tq1_0, Some(tq::quantize_tq1_0), Some(tq::quantize_tq1_0), T::Q8_K, tq::vec_dot_tq1_0_q8_k),
        (T::TQ2_0, tq::dequantize_tq2_0, Some(tq::quantize_tq2_0), Some(tq::quantize_tq2_0), T::Q8_K, tq::vec_dot_tq2_0_q8_k),
        (T::IQ2_XXS, iq::dequantize_iq2_xxs, None, None, T::Q8_K, iq::vec_dot_iq2_xxs_q8_k),
        (T::IQ2_XS, iq::dequantize_iq2_xs, None, None, T::Q8_K, iq::vec_dot_iq2_xs_q8_k),
        (T::IQ2_S, iq::dequantize_iq2_s, None, Some(iq2q::quantize_iq2_s), T::Q8_K, iq::vec_dot_iq2_s_q8_k),
        (T::IQ3_XXS, iq::dequantize_iq3_xxs, None, Some(iq3::quantize_iq3_xxs), T::Q8_K, iq::vec_dot_iq3_xxs_q8_k),
        (T::IQ3_S, iq::dequantize_iq3_s, None, Some(iq3::quantize_iq3_s), T::Q8_K, iq::vec_dot_iq3_s_q8_k),
        (T::IQ1_S, iq::dequantize_iq1_s, None, None, T::Q8_K, iq::vec_dot_iq1_s_q8_k),
        (T::IQ1_M, iq::dequantize_iq1_m, None, Some(iq1::quantize_iq1_m), T::Q8_K, iq::vec_dot_iq1_m_q8_k),
        (T::IQ4_XS, k::dequantize_iq4_xs, Some(kq::quantize_iq4_xs), Some(kq::quantize_iq4_xs), T::Q8_K, k::vec_dot_iq4_xs_q8_k),
    ]
}

/// The portable per-output arithmetic of llama.cpp's tiled k-quant product, for its types,
/// and of ferrollama's many-token Q8_0 and Q5_0 products.
fn scalar_tiled(ty: GgmlType) -> Option<VecDot> {
    use GgmlType as T;
    Some(match ty {
        T::Q8_0 => crate::scalar::repacked::vec_dot_q8_0_q8_0_blocks,
        T::Q5_0 => crate::scalar::repacked::vec_dot_q5_0_q8_0_blocks,
        T::Q2_K => tiled::vec_dot_q2_k_q8_k,
        T::Q3_K => tiled::vec_dot_q3_k_q8_k,
        T::Q4_K => tiled::vec_dot_q4_k_q8_k,
        T::Q5_K => tiled::vec_dot_q5_k_q8_k,
        T::Q6_K => tiled::vec_dot_q6_k_q8_k,
        T::IQ4_XS => tiled::vec_dot_iq4_xs_q8_k,
        T::IQ2_XXS => iq::tiled_iq2_xxs_q8_k,
        T::IQ2_XS => iq::tiled_iq2_xs_q8_k,
        T::IQ2_S => iq::tiled_iq2_s_q8_k,
        T::IQ3_XXS => iq::tiled_iq3_xxs_q8_k,
        T::IQ3_S => iq::tiled_iq3_s_q8_k,
        T::IQ1_S => iq::tiled_iq1_s_q8_k,
        T::IQ1_M => iq::tiled_iq1_m_q8_k,
        _ => return None,
    })
}

/// The portable per-output arithmetic of llama.cpp's repacked kernels, for its types.
fn scalar_repacked(ty: GgmlType) -> Option<VecDot> {
    use crate::scalar::repacked as rp;
    Some(match ty {
        GgmlType::Q4_0 => rp::vec_dot_q4_0_q8_0,
        GgmlType::IQ4_NL => rp::vec_dot_iq4_nl_q8_0,
        GgmlType::MXFP4 => rp::vec_dot_mxfp4_q8_0,
        GgmlType::Q4_K => rp::vec_dot_q4_k_q8_k,
        _ => return None,
    })
}

/// Q8_1 and Q8_K are activation types only; ggml has no dot product of two of them. This
/// one (integer sums per block, scaled by both d) lets the table stay total.
fn q8_1_self_dot(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.chunks_exact(l::Q8_1_BYTES).zip(x.chunks_exact(l::Q8_1_BYTES)).take(n / l::QK) {
        let sumi: i32 = a[4..].iter().zip(&b[4..]).map(|(&p, &q)| p as i8 as i32 * q as i8 as i32).sum();
        sumf += sumi as f32 * (crate::util::rd_f16(a, 0) * crate::util::rd_f16(b, 0));
    }
    sumf
}

fn q8_k_self_dot(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.chunks_exact(k::Q8_K_BYTES).zip(x.chunks_exact(k::Q8_K_BYTES)).take(n / k::QK_K) {
        let sumi: i32 = a[4..4 + k::QK_K].iter().zip(&b[4..4 + k::QK_K]).map(|(&p, &q)| p as i8 as i32 * q as i8 as i32).sum();
        sumf += sumi as f32 * (crate::util::rd_f32(a, 0) * crate::util::rd_f32(b, 0));
    }
    sumf
}

/// Builds the table for `isa`: the scalar rows with SIMD kernels substituted where they exist.
pub fn build_table(isa: Isa) -> Vec<TypeTraits> {
    scalar_rows()
        .into_iter()
        .map(|(ty, to_f32, from_f32, from_f32_ref, vec_dot_type, vec_dot_scalar)| {
            let simd = crate::simd::kernels_for(ty, isa);
            let tiled_scalar = scalar_tiled(ty);
            TypeTraits {
                ty,
                block_size: ty.block_size(),
                type_size: ty.type_size(),
                to_f32,
                from_f32: simd.from_f32.or(from_f32),
                from_f32_ref,
                vec_dot_type,
                vec_dot: simd.vec_dot.unwrap_or(vec_dot_scalar),
                vec_dot_x4: simd.vec_dot_x4,
                vec_dot_scalar,
                vec_dot_tiled: simd.vec_dot_tiled.or(tiled_scalar),
                vec_dot_tiled_x4: simd.vec_dot_tiled_x4,
                vec_dot_tiled_scalar: tiled_scalar,
                vec_dot_repacked: simd.vec_dot_repacked.or(scalar_repacked(ty)),
                vec_dot_repacked_x4: simd.vec_dot_repacked_x4,
                vec_dot_repacked_scalar: scalar_repacked(ty),
                isa,
            }
        })
        .collect()
}

/// The traits of a type, or None when the kernels do not implement it.
pub fn traits(ty: GgmlType) -> Option<&'static TypeTraits> {
    static TABLE: OnceLock<Vec<TypeTraits>> = OnceLock::new();
    TABLE.get_or_init(|| build_table(active_isa())).iter().find(|t| t.ty == ty)
}
