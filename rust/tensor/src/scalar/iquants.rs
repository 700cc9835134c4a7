//! The i-quants of 2 to 3 bits: weights as indices into ggml's grids of 4 or 8 magnitudes
//! (`iq_grids`), with signs and small sub-block scales, paired with Q8_K activations.
//! Dequantizers follow ggml-quants.c; dot products follow the AVX2 `ggml_vec_dot_*_q8_K` of
//! ggml-cpu/arch/x86/quants.c: each block's signed values against the activation in eight
//! i32 lanes (element p in lane (p % 32) / 4, times its sub-block scale, see
//! `kquants::x86_lanes`), one FMA per lane and super-block, `hsum_float_8`, the type's
//! constant factor last. The `tiled_*` dots are llama.cpp's tiled product's (8 or more
//! tokens, `scalar::tiled`): the same integers, one accumulator.

use super::iq_grids::{IQ2XXS_GRID, KSIGNS_IQ2XS};
use super::kquants::{blocks, pairs, q8k_qs, x86_lanes, QK_K};
use super::lanes::{fma_lanes, hsum_float_8};
use super::tiled::{tiled_dot, Block};
use crate::util::{rd_f16, rd_f32, rd_u32};

/// IQ2_XXS: d | per 32 elements two u32: four grid indices (bytes), then four 7-bit sign
/// groups and a 4-bit scale in the top bits.
pub const IQ2_XXS_BYTES: usize = 66;

/// The eight signed values of a grid entry: byte j of `grid` negated where bit j of the sign
/// byte is set.
#[inline(always)]
fn signed_octet(grid: u64, signs: u8) -> [i8; 8] {
    std::array::from_fn(|j| {
        let v = (grid >> (8 * j)) as u8 as i8;
        if signs >> j & 1 != 0 { -v } else { v }
    })
}

/// The 256 signed grid values of an IQ2_XXS block and its eight 4-bit sub-block scales.
pub fn iq2_xxs_values(b: &[u8]) -> ([i8; QK_K], [u8; 8]) {
    let mut v = [0i8; QK_K];
    let mut scales = [0u8; 8];
    for (ib, sub) in v.chunks_exact_mut(32).enumerate() {
        let (idx, aux) = (rd_u32(b, 2 + 8 * ib), rd_u32(b, 6 + 8 * ib));
        for (l, oct) in sub.chunks_exact_mut(8).enumerate() {
            let grid = IQ2XXS_GRID[(idx >> (8 * l)) as u8 as usize];
            oct.copy_from_slice(&signed_octet(grid, KSIGNS_IQ2XS[(aux >> (7 * l)) as usize & 127]));
        }
        scales[ib] = (aux >> 28) as u8;
    }
    (v, scales)
}

pub fn dequantize_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, IQ2_XXS_BYTES) {
        let d = rd_f16(b, 0);
        let (v, scales) = iq2_xxs_values(b);
        for (ib, (ys, vs)) in y.chunks_exact_mut(32).zip(v.chunks_exact(32)).enumerate() {
            let db = d * (0.5 + scales[ib] as f32) * 0.25;
            for (y, &q) in ys.iter_mut().zip(vs) {
                // ggml: db * grid * (sign ? -1 : 1), the sign exact.
                *y = db * q.unsigned_abs() as f32 * if q < 0 { -1.0 } else { 1.0 };
            }
        }
    }
}

/// The odd sub-block multipliers 2 * scale + 1 of the 16-element groups (each 32-element
/// sub-block's twice).
fn odd_scales16(scales: &[u8; 8]) -> [i32; 16] {
    std::array::from_fn(|g| 2 * scales[g / 2] as i32 + 1)
}

/// ggml_vec_dot_iq2_xxs_q8_K on AVX2: `acc = fma(d * d_x, lanes, acc)` per super-block,
/// the result 0.125 times `hsum_float_8`.
pub fn vec_dot_iq2_xxs_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in pairs(w, x, IQ2_XXS_BYTES, n) {
        let (v, scales) = iq2_xxs_values(bw);
        fma_lanes(&mut acc, rd_f16(bw, 0) * rd_f32(bx, 0), &x86_lanes(&v, q8k_qs(bx), &odd_scales16(&scales)));
    }
    0.125 * hsum_float_8(&acc)
}

/// IQ2_XXS as llama.cpp's tiled product: d * 0.125 per super-block.
pub fn tiled_iq2_xxs_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    tiled_dot(n, w, x, IQ2_XXS_BYTES, |bw, bx| {
        let (v, scales) = iq2_xxs_values(bw);
        let isum = x86_lanes(&v, q8k_qs(bx), &odd_scales16(&scales)).iter().sum();
        Block { isum, d: rd_f16(bw, 0) * 0.125, min: None }
    })
}
