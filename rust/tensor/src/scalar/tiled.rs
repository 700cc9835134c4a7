//! Dot products with the arithmetic of llama.cpp's tiled k-quant matrix product
//! (ggml-cpu/tiled/tiled.cpp and tiled-kernel.cpp, `ggml_compute_forward_mul_mat_tiled`).
//!
//! On x86 llama.cpp computes a product of a Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS or i-quant
//! matrix (one it did not repack; the i-quants' tiled dots are in `scalar::iquants`) with 8 or
//! more activation rows through that kernel instead of `ggml_vec_dot_*`. Per output it keeps
//! ONE float accumulator over the super-blocks: the block's exact integer sum of scaled
//! products `isum` (and, for the types with mins, the exact `imin` = sum of min * activation
//! group sum) becomes
//! `r = float(isum) * d` (`r = fma(-dmin, float(imin), r)`), then `acc = fma(r, d_x, acc)`
//! (GCC contracts the kernel's `buf + r * d_x`; its AVX2 variant writes the FMA itself).
//! The integers are those of the `vec_dot` kernels; only the float steps differ.

use super::kquants::{q3_k_scales, scale_min_k4, QK_K, Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_K_BYTES, IQ4_XS_BYTES};
use super::legacy::KVALUES_IQ4NL;
use crate::util::{rd_f16, rd_f32, rd_i16};

/// What one super-block contributes: the exact sums, the weight's d (and dmin).
pub(crate) struct Block {
    pub isum: i32,
    pub d: f32,
    pub min: Option<(i32, f32)>,
}

/// The tiled kernel's float steps over a row: one accumulator, one FMA per super-block.
pub(crate) fn tiled_dot(n: usize, w: &[u8], x: &[u8], wbytes: usize, block: impl Fn(&[u8], &[u8]) -> Block) -> f32 {
    let mut acc = 0.0f32;
    for (bw, bx) in w.chunks_exact(wbytes).zip(x.chunks_exact(Q8_K_BYTES)).take(n / QK_K) {
        let b = block(bw, bx);
        let mut r = b.isum as f32 * b.d;
        if let Some((imin, dmin)) = b.min {
            r = (-dmin).mul_add(imin as f32, r);
        }
        acc = r.mul_add(rd_f32(bx, 0), acc);
    }
    acc
}

/// The activation's quant p of a Q8_K block.
#[inline(always)]
fn q8(bx: &[u8], p: usize) -> i32 {
    bx[4 + p] as i8 as i32
}

/// The sum of the activation's 16-element group g.
#[inline(always)]
fn bsum16(bx: &[u8], g: usize) -> i32 {
    rd_i16(bx, 4 + QK_K + 2 * g) as i32
}

/// sum over sub-blocks of `scale(s)` times the sub-block's dot of `value(p)` with the
/// activation, sub-blocks of `sub` elements.
fn scaled_sum(bx: &[u8], sub: usize, scale: impl Fn(usize) -> i32, value: impl Fn(usize) -> i32) -> i32 {
    (0..QK_K / sub).map(|s| scale(s) * (sub * s..sub * (s + 1)).map(|p| value(p) * q8(bx, p)).sum::<i32>()).sum()
}

/// Q2_K: 2-bit values, 16-element scales and mins (low and high nibble of each byte).
pub fn vec_dot_q2_k_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    tiled_dot(n, w, x, Q2_K_BYTES, |bw, bx| {
        let value = |p: usize| ((bw[16 + 32 * (p / 128) + p % 32] >> (2 * ((p / 32) % 4))) & 3) as i32;
        let imin = (0..16).map(|s| (bw[s] >> 4) as i32 * bsum16(bx, s)).sum();
        Block { isum: scaled_sum(bx, 16, |s| (bw[s] & 0x0f) as i32, value), d: rd_f16(bw, 80), min: Some((imin, rd_f16(bw, 82))) }
    })
}

/// Q3_K: 3-bit values (4 subtracted where the high bit is clear), 16-element scales.
pub fn vec_dot_q3_k_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    tiled_dot(n, w, x, Q3_K_BYTES, |bw, bx| {
        let scales = q3_k_scales(&bw[96..108]);
        let value = |p: usize| {
            let (half, g, l) = (p / 128, (p / 32) % 4, p % 32);
            let low = ((bw[32 + 32 * half + l] >> (2 * g)) & 3) as i32;
            low - if bw[l] & (1 << (4 * half + g)) != 0 { 0 } else { 4 }
        };
        Block { isum: scaled_sum(bx, 16, |s| scales[s] as i32 - 32, value), d: rd_f16(bw, 108), min: None }
    })
}

/// The min sum of Q4_K and Q5_K: min of each 32-element sub-block times the activation's
/// sum over it.
fn kx_imin(bw: &[u8], bx: &[u8]) -> i32 {
    (0..8).map(|s| scale_min_k4(s, &bw[4..16]).1 as i32 * (bsum16(bx, 2 * s) + bsum16(bx, 2 * s + 1))).sum()
}

/// Q4_K: 4-bit values, 32-element 6-bit scales and mins.
pub fn vec_dot_q4_k_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    tiled_dot(n, w, x, Q4_K_BYTES, |bw, bx| {
        let value = |p: usize| {
            let q = bw[16 + 32 * (p / 64) + p % 32];
            (if (p / 32) % 2 == 0 { q & 0x0f } else { q >> 4 }) as i32
        };
        let isum = scaled_sum(bx, 32, |s| scale_min_k4(s, &bw[4..16]).0 as i32, value);
        Block { isum, d: rd_f16(bw, 0), min: Some((kx_imin(bw, bx), rd_f16(bw, 2))) }
    })
}

/// Q5_K: Q4_K's layout plus a fifth bit per element.
pub fn vec_dot_q5_k_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    tiled_dot(n, w, x, Q5_K_BYTES, |bw, bx| {
        let value = |p: usize| {
            let (j, upper, l) = (p / 64, (p / 32) % 2, p % 32);
            let q = bw[48 + 32 * j + l];
            let low = if upper == 0 { q & 0x0f } else { q >> 4 };
            (low + if bw[16 + l] & (1 << (2 * j + upper)) != 0 { 16 } else { 0 }) as i32
        };
        let isum = scaled_sum(bx, 32, |s| scale_min_k4(s, &bw[4..16]).0 as i32, value);
        Block { isum, d: rd_f16(bw, 0), min: Some((kx_imin(bw, bx), rd_f16(bw, 2))) }
    })
}

/// Q6_K: 6-bit values minus 32, 16-element signed scales.
pub fn vec_dot_q6_k_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    tiled_dot(n, w, x, Q6_K_BYTES, |bw, bx| {
        let value = |p: usize| {
            let (half, g, l) = (p / 128, (p / 32) % 4, p % 32);
            let ql = bw[64 * half + 32 * (g % 2) + l];
            let low = if g < 2 { ql & 0x0f } else { ql >> 4 };
            let high = (bw[128 + 32 * half + l] >> (2 * g)) & 3;
            (low | (high << 4)) as i32 - 32
        };
        Block { isum: scaled_sum(bx, 16, |s| bw[192 + s] as i8 as i32, value), d: rd_f16(bw, 208), min: None }
    })
}

/// IQ4_XS: non-linear 4-bit levels, 32-element 6-bit scales.
pub fn vec_dot_iq4_xs_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    tiled_dot(n, w, x, IQ4_XS_BYTES, |bw, bx| {
        let scales_h = u16::from_le_bytes([bw[2], bw[3]]) as i32;
        let scale = |s: usize| (((bw[4 + s / 2] >> (4 * (s % 2))) & 0x0f) as i32 | (((scales_h >> (2 * s)) & 3) << 4)) - 32;
        let value = |p: usize| {
            let q = bw[8 + 16 * (p / 32) + p % 16];
            KVALUES_IQ4NL[if p % 32 < 16 { q & 0x0f } else { q >> 4 } as usize] as i32
        };
        Block { isum: scaled_sum(bx, 32, scale, value), d: rd_f16(bw, 0), min: None }
    })
}
