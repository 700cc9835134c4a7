//! Dot products with the arithmetic of llama.cpp's repacked x86 kernels (ggml-cpu/arch/x86/
//! repack.cpp, `gemv/gemm_q4_0_8x8_q8_0`, `..._iq4_nl_8x8_q8_0`, `..._q4_K_8x8_q8_K`): on
//! AVX2/AVX-512 CPUs llama.cpp repacks Q4_0, IQ4_NL, MXFP4 and Q4_K matrices whose row count is a
//! multiple of 8 and computes every output as ONE float accumulator per row, updated once per
//! block with the block's exact integer sum: `acc = fma(float(isum), d_w * d_x, acc)`.
//! (The plain `vec_dot` kernels instead keep 8 lane-wise partial sums, which rounds
//! differently.) Q4_K keeps a second accumulator for the mins and returns `acc - acc_min`.
//!
//! These are the specification of the packed kernels for those types and the per-row
//! fallback where a matrix is not packed.
//!
//! ferrollama computes Q8_0 and Q5_0 products of 8 or more tokens with the same arithmetic
//! (its own choice, see `crate::packed`): `vec_dot_q8_0_q8_0_blocks`, `..._q5_0_...`.

use crate::scalar::kquants::{scale_min_k4, QK_K, Q4_K_BYTES, Q8_K_BYTES};
use crate::scalar::legacy::{e8m0_to_f32_half, IQ4_NL_BYTES, KVALUES_IQ4NL, KVALUES_MXFP4, MXFP4_BYTES, Q4_0_BYTES, Q5_0_BYTES, Q8_0_BYTES, QK};
use crate::util::{rd_f16, rd_f32, rd_i16, rd_u32};

/// One float accumulator over 32-element blocks: `value(b, j)` is weight j of block b, whose
/// scale is the f16 at its byte 0.
fn one_acc_dot32(n: usize, w: &[u8], x: &[u8], wbytes: usize, value: impl Fn(&[u8], usize) -> i32) -> f32 {
    one_acc_dot32_scaled(n, w, x, wbytes, value, |b| rd_f16(b, 0))
}

/// `one_acc_dot32` with the weight block's scale read by `scale`.
fn one_acc_dot32_scaled(n: usize, w: &[u8], x: &[u8], wbytes: usize, value: impl Fn(&[u8], usize) -> i32, scale: impl Fn(&[u8]) -> f32) -> f32 {
    let mut acc = 0.0f32;
    for (bw, bx) in w.chunks_exact(wbytes).zip(x.chunks_exact(Q8_0_BYTES)).take(n / QK) {
        let isum: i32 = (0..QK).map(|j| value(bw, j) * bx[2 + j] as i8 as i32).sum();
        let d = scale(bw) * rd_f16(bx, 0);
        acc = (isum as f32).mul_add(d, acc);
    }
    acc
}

/// Element j's nibble of a block whose 16 bytes of nibbles start at byte 2.
fn nibble(b: &[u8], j: usize) -> usize {
    nibble_of(&b[2..], j)
}

/// Element j's nibble of the 16 bytes `qs`: low nibbles are elements 0..15.
fn nibble_of(qs: &[u8], j: usize) -> usize {
    if j < 16 { (qs[j] & 0x0f) as usize } else { (qs[j - 16] >> 4) as usize }
}

/// Q4_0 x Q8_0 as llama.cpp's repacked kernels compute it.
pub fn vec_dot_q4_0_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    one_acc_dot32(n, w, x, Q4_0_BYTES, |b, j| nibble(b, j) as i32 - 8)
}

/// IQ4_NL x Q8_0 as llama.cpp's repacked kernels compute it.
pub fn vec_dot_iq4_nl_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    one_acc_dot32(n, w, x, IQ4_NL_BYTES, |b, j| KVALUES_IQ4NL[nibble(b, j)] as i32)
}

/// MXFP4 x Q8_0 as llama.cpp's repacked kernels compute it (`gemv_q4_b32_8x8_q8_0_lut_avx`,
/// the scale the E8M0 exponent's).
pub fn vec_dot_mxfp4_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    one_acc_dot32_scaled(n, w, x, MXFP4_BYTES, |b, j| KVALUES_MXFP4[nibble_of(&b[1..], j)] as i32, |b| e8m0_to_f32_half(b[0]))
}

/// Q8_0 x Q8_0 with one accumulator (ferrollama's products of 8 or more tokens).
pub fn vec_dot_q8_0_q8_0_blocks(n: usize, w: &[u8], x: &[u8]) -> f32 {
    one_acc_dot32(n, w, x, Q8_0_BYTES, |b, j| b[2 + j] as i8 as i32)
}

/// Q5_0 x Q8_0 with one accumulator (ferrollama's products of 8 or more tokens).
pub fn vec_dot_q5_0_q8_0_blocks(n: usize, w: &[u8], x: &[u8]) -> f32 {
    one_acc_dot32(n, w, x, Q5_0_BYTES, |b, j| {
        let high = ((rd_u32(b, 2) >> j) & 1) << 4;
        let low = if j < 16 { b[6 + j] & 0x0f } else { b[6 + j - 16] >> 4 };
        (low as u32 | high) as i32 - 16
    })
}

/// Q4_K x Q8_K as llama.cpp's repacked kernels compute it: per super-block the exact
/// integers sum_j scale_j * (q4 . q8)_j and sum_j min_j * bsum32_j, each added to its own
/// accumulator with one fma.
pub fn vec_dot_q4_k_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut acc_min) = (0.0f32, 0.0f32);
    for (bw, bx) in w.chunks_exact(Q4_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)).take(n / QK_K) {
        let scales = &bw[4..16];
        let (mut isum, mut imin) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, scales);
            let qs = &bw[16 + 32 * (j / 2)..48 + 32 * (j / 2)];
            let dot: i32 = (0..32)
                .map(|i| {
                    let q = if j % 2 == 0 { qs[i] & 0x0f } else { qs[i] >> 4 };
                    q as i32 * bx[4 + 32 * j + i] as i8 as i32
                })
                .sum();
            isum += sc as i32 * dot;
            let bsum32 = rd_i16(bx, 4 + QK_K + 4 * j) as i32 + rd_i16(bx, 4 + QK_K + 4 * j + 2) as i32;
            imin += m as i32 * bsum32;
        }
        let dx = rd_f32(bx, 0);
        acc = (isum as f32).mul_add(rd_f16(bw, 0) * dx, acc);
        acc_min = (imin as f32).mul_add(rd_f16(bw, 2) * dx, acc_min);
    }
    acc - acc_min
}
