//! The ternary types TQ1_0 and TQ2_0 (BitNet-style weights of -1, 0, 1 times one scale per
//! 256 elements), paired with Q8_K activations. Dequantizers and `_ref` quantizers follow
//! ggml-quants.c; the dot products follow the AVX2 `ggml_vec_dot_tq*_q8_K` of
//! ggml-cpu/arch/x86/quants.c: the stored trits (0, 1, 2) times the activations in eight i32
//! lanes (element p in lane (p % 32) / 4), minus the activation's 16-element group sums
//! (groups 2k and 2k + 1 in lane k: the trit's offset of 1), then per super-block
//! `acc = fma(float(lane), d_x * d, acc)` and `hsum_float_8`. (ggml writes `add(mul(..),
//! acc)`; GCC contracts it, which the fixtures of ggml's own results confirm.)

use super::kquants::{QK_K, Q8_K_BYTES};
use super::lanes::{fma_lanes, hsum_float_8};
use crate::util::{rd_f16, rd_f32, rd_i16, wr_f16};

/// TQ1_0: qs[48] (five trits a byte, base 3, scaled to 0..255) | qh[4] (four trits a byte) | d.
pub const TQ1_0_BYTES: usize = 54;
/// TQ2_0: qs[64] (four 2-bit trits a byte) | d.
pub const TQ2_0_BYTES: usize = 66;

/// Trit n of a TQ1_0 byte: the byte times 3^n (mod 256) holds it in its top bits as a
/// fraction of 256; times 3 over 256 reads it (ggml's `((uint16_t) q * 3) >> 8`).
#[inline(always)]
fn trit(byte: u8, n: usize) -> u8 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let q = byte.wrapping_mul(POW3[n]);
    ((q as u16 * 3) >> 8) as u8
}

/// The 256 stored trits (0, 1, 2: the value plus one) of a TQ1_0 block, in element order:
/// 32 bytes of five trits (element 32n + m is trit n of byte m), 16 more bytes (element
/// 160 + 16n + m), then the four bytes of four (element 240 + 4n + j).
pub fn tq1_0_trits(b: &[u8]) -> [u8; QK_K] {
    let mut t = [0u8; QK_K];
    for n in 0..5 {
        for m in 0..32 {
            t[32 * n + m] = trit(b[m], n);
        }
        for m in 0..16 {
            t[160 + 16 * n + m] = trit(b[32 + m], n);
        }
    }
    for n in 0..4 {
        for j in 0..4 {
            t[240 + 4 * n + j] = trit(b[48 + j], n);
        }
    }
    t
}

/// The 256 stored 2-bit values (0..3, the value plus one) of a TQ2_0 block, in element order:
/// element 128h + 32l + m is bits 2l of byte 32h + m.
pub fn tq2_0_trits(b: &[u8]) -> [u8; QK_K] {
    let mut t = [0u8; QK_K];
    for (p, v) in t.iter_mut().enumerate() {
        *v = (b[32 * (p / 128) + p % 32] >> (2 * ((p / 32) % 4))) & 3;
    }
    t
}

fn dequantize_trits(src: &[u8], dst: &mut [f32], bytes: usize, trits: fn(&[u8]) -> [u8; QK_K]) {
    for (b, y) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, bytes - 2);
        for (v, t) in y.iter_mut().zip(trits(b)) {
            *v = (t as i32 - 1) as f32 * d;
        }
    }
}

pub fn dequantize_tq1_0(src: &[u8], dst: &mut [f32]) {
    dequantize_trits(src, dst, TQ1_0_BYTES, tq1_0_trits)
}

pub fn dequantize_tq2_0(src: &[u8], dst: &mut [f32]) {
    dequantize_trits(src, dst, TQ2_0_BYTES, tq2_0_trits)
}

/// The scale (the absolute maximum) and each value's trit plus one, lroundf(x / amax) + 1.
fn ternary_levels(x: &[f32]) -> (f32, [u8; QK_K]) {
    let amax = x.iter().fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() });
    let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
    (amax, std::array::from_fn(|p| ((x[p] * id).round() as i32 + 1) as u8))
}

/// Base-3 digits, most significant first, scaled so that `trit` reads them back: the ceiling
/// of q * 256 / 243.
fn pack_trits(digits: impl Iterator<Item = u8>) -> u8 {
    let q = digits.fold(0u16, |q, t| q * 3 + t as u16);
    (q * 256).div_ceil(243) as u8
}

/// quantize_row_tq1_0_ref.
pub fn quantize_tq1_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(TQ1_0_BYTES)) {
        let (d, t) = ternary_levels(x);
        for m in 0..32 {
            b[m] = pack_trits((0..5).map(|n| t[32 * n + m]));
        }
        for m in 0..16 {
            b[32 + m] = pack_trits((0..5).map(|n| t[160 + 16 * n + m]));
        }
        for j in 0..4 {
            // Four trits and a zero: the first in the most significant place.
            b[48 + j] = pack_trits((0..4).map(|n| t[240 + 4 * n + j]).chain([0]));
        }
        wr_f16(b, 52, d);
    }
}

/// quantize_row_tq2_0_ref.
pub fn quantize_tq2_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(TQ2_0_BYTES)) {
        let (d, t) = ternary_levels(x);
        for (j, byte) in b[..64].iter_mut().enumerate() {
            let base = 128 * (j / 32) + j % 32;
            *byte = (0..4).fold(0, |q, l| q | (t[base + 32 * l] & 3) << (2 * l));
        }
        wr_f16(b, 64, d);
    }
}

/// The eight i32 lanes of ggml's AVX2 ternary dots for one super-block: the stored trits
/// against the activation quants, element p in lane (p % 32) / 4, minus the activation's
/// group sums 2k and 2k + 1 in lane k.
pub fn ternary_lanes(trits: &[u8; QK_K], bx: &[u8]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (p, &t) in trits.iter().enumerate() {
        lanes[(p % 32) / 4] += t as i32 * bx[4 + p] as i8 as i32;
    }
    for (k, l) in lanes.iter_mut().enumerate() {
        *l -= rd_i16(bx, 4 + QK_K + 4 * k) as i32 + rd_i16(bx, 4 + QK_K + 4 * k + 2) as i32;
    }
    lanes
}

fn ternary_dot(n: usize, w: &[u8], x: &[u8], bytes: usize, trits: fn(&[u8]) -> [u8; QK_K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in w.chunks_exact(bytes).zip(x.chunks_exact(Q8_K_BYTES)).take(n / QK_K) {
        fma_lanes(&mut acc, rd_f32(bx, 0) * rd_f16(bw, bytes - 2), &ternary_lanes(&trits(bw), bx));
    }
    hsum_float_8(&acc)
}

/// ggml_vec_dot_tq1_0_q8_K on AVX2.
pub fn vec_dot_tq1_0_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    ternary_dot(n, w, x, TQ1_0_BYTES, tq1_0_trits)
}

/// ggml_vec_dot_tq2_0_q8_K on AVX2.
pub fn vec_dot_tq2_0_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    ternary_dot(n, w, x, TQ2_0_BYTES, tq2_0_trits)
}
