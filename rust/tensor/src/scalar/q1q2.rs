//! The 1- and 2-bit legacy types Q1_0 (128 signs and one f16 scale) and Q2_0 (64 two-bit
//! values and one f16 scale), paired with Q8_0 activations. Dequantizers and `_ref`
//! quantizers follow ggml-quants.c (ggml's quantize_q1_0/q2_0 ignore importance weights: with
//! or without them they run the reference quantizer row by row). The dot products are what
//! llama.cpp runs on x86:
//! - Q1_0: the AVX2 `ggml_vec_dot_q1_0_q8_0` of ggml-cpu/arch/x86/quants.c: per 128-element
//!   block, the four Q8_0 sub-blocks' signed quants in eight i32 lanes each (element p in lane
//!   (p % 32) / 4), `acc_block = d_x0 * lanes0`, then `fma(d_xk, lanes_k, acc_block)`, then
//!   `acc = fma(d_w, acc_block, acc)` and `hsum_float_8`;
//! - Q2_0: x86 has no kernel of its own, so ggml-cpu/quants.c's generic one, which GCC compiled
//!   without contraction (its machine code: `vmulss` then `vaddss`): per sub-block of 32 the
//!   exact integer sum, `sumi += d_x * sumi_block`, then per block `sumf += d_w * sumi`.

use super::lanes::{fma_lanes, hsum_float_8};
use super::legacy::{QK, Q8_0_BYTES};
use crate::util::{rd_f16, roundf, wr_f16};

/// Elements of a Q1_0 block.
pub const QK1_0: usize = 128;
/// Q1_0: d (f16) | 16 bytes of signs, element j in bit j % 8 of byte j / 8 (set: +d).
pub const Q1_0_BYTES: usize = 18;
/// Elements of a Q2_0 block.
pub const QK2_0: usize = 64;
/// Q2_0: d (f16) | 16 bytes of 2-bit codes, element j in bits 2 (j % 4) of byte j / 4; code c
/// stands for (c - 1) d.
pub const Q2_0_BYTES: usize = 18;

// ---------------------------------------------------------------- Q1_0

/// Whether element j of a Q1_0 block (its 16 sign bytes `qs`) is +d.
#[inline(always)]
fn positive(qs: &[u8], j: usize) -> bool {
    (qs[j / 8] >> (j % 8)) & 1 == 1
}

pub fn dequantize_q1_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q1_0_BYTES).zip(dst.chunks_exact_mut(QK1_0)) {
        let d = rd_f16(b, 0);
        for (j, v) in y.iter_mut().enumerate() {
            *v = if positive(&b[2..], j) { d } else { -d };
        }
    }
}

/// quantize_row_q1_0_ref: d = the mean absolute value (summed in element order), a bit per
/// element set for x >= 0.
pub fn quantize_q1_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK1_0).zip(dst.chunks_exact_mut(Q1_0_BYTES)) {
        let sum_abs = x.iter().fold(0.0f32, |s, v| s + v.abs());
        wr_f16(b, 0, sum_abs / QK1_0 as f32);
        for (byte, x8) in b[2..].iter_mut().zip(x.chunks_exact(8)) {
            *byte = x8.iter().enumerate().fold(0, |q, (k, &v)| q | (((v >= 0.0) as u8) << k));
        }
    }
}

/// The eight i32 lanes of one Q8_0 sub-block against 32 signs (`bits`, four bytes): each
/// quant negated where its bit is clear, as ggml's `(q ^ m) - m` in 8 bits (-128 stays -128).
#[inline(always)]
fn signed_lanes(bits: &[u8], q: &[u8]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (p, &qp) in q[..QK].iter().enumerate() {
        let v = qp as i8;
        let signed = if positive(bits, p) { v } else { v.wrapping_neg() };
        lanes[p / 4] += signed as i32;
    }
    lanes
}

/// ggml_vec_dot_q1_0_q8_0 on AVX2.
pub fn vec_dot_q1_0_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in w.chunks_exact(Q1_0_BYTES).zip(x.chunks_exact(4 * Q8_0_BYTES)).take(n / QK1_0) {
        let mut acc_block = [0.0f32; 8];
        for (k, sub) in bx.chunks_exact(Q8_0_BYTES).enumerate() {
            let lanes = signed_lanes(&bw[2 + 4 * k..6 + 4 * k], &sub[2..]);
            let d = rd_f16(sub, 0);
            if k == 0 {
                acc_block = std::array::from_fn(|l| d * lanes[l] as f32);
            } else {
                fma_lanes(&mut acc_block, d, &lanes);
            }
        }
        let d = rd_f16(bw, 0);
        for (a, b) in acc.iter_mut().zip(acc_block) {
            *a = d.mul_add(b, *a);
        }
    }
    hsum_float_8(&acc)
}

// ---------------------------------------------------------------- Q2_0

/// The 2-bit code of element j of a Q2_0 block (its 16 code bytes `qs`).
#[inline(always)]
fn code(qs: &[u8], j: usize) -> u8 {
    (qs[j / 4] >> (2 * (j % 4))) & 3
}

pub fn dequantize_q2_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q2_0_BYTES).zip(dst.chunks_exact_mut(QK2_0)) {
        let d = rd_f16(b, 0);
        for (j, v) in y.iter_mut().enumerate() {
            *v = (code(&b[2..], j) as i32 - 1) as f32 * d;
        }
    }
}

/// quantize_row_q2_0_ref: d = the absolute maximum, code roundf(x / d) + 1 clamped to 0..3.
pub fn quantize_q2_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK2_0).zip(dst.chunks_exact_mut(Q2_0_BYTES)) {
        let amax = x.iter().fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
        let id = if amax > 0.0 { 1.0 / amax } else { 0.0 };
        wr_f16(b, 0, amax);
        for (byte, x4) in b[2..].iter_mut().zip(x.chunks_exact(4)) {
            *byte = x4.iter().enumerate().fold(0, |q, (k, &v)| {
                let c = (roundf(v * id) as i32 + 1).clamp(0, 3) as u8;
                q | (c << (2 * k))
            });
        }
    }
}

/// The exact integer sum of one Q8_0 sub-block's quants times the values (code - 1) of the 32
/// codes in `qs` (eight bytes).
#[inline(always)]
pub fn q2_0_sub_block_sum(qs: &[u8], q: &[u8]) -> i32 {
    q[..QK].iter().enumerate().map(|(p, &v)| (code(qs, p) as i32 - 1) * v as i8 as i32).sum()
}

/// ggml_vec_dot_q2_0_q8_0 (the generic kernel, as compiled for x86).
pub fn vec_dot_q2_0_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, bx) in w.chunks_exact(Q2_0_BYTES).zip(x.chunks_exact(2 * Q8_0_BYTES)).take(n / QK2_0) {
        let mut sumi = 0.0f32;
        for (k, sub) in bx.chunks_exact(Q8_0_BYTES).enumerate() {
            sumi += rd_f16(sub, 0) * q2_0_sub_block_sum(&bw[2 + 8 * k..10 + 8 * k], &sub[2..]) as f32;
        }
        sumf += rd_f16(bw, 0) * sumi;
    }
    sumf
}
