//! F32, F16 and BF16: conversions and ggml's generic dot products, which sum the f32
//! products in f64 (`ggml_float`).

use crate::util::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, rd_f32};

pub fn f32_to_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = rd_f32(s, 0);
    }
}

pub fn f32_from_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

/// ggml_vec_dot_f32 (generic): f32 products accumulated in f64.
pub fn vec_dot_f32(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in w[..4 * n].chunks_exact(4).zip(x[..4 * n].chunks_exact(4)) {
        sum += (rd_f32(a, 0) * rd_f32(b, 0)) as f64;
    }
    sum as f32
}

fn halves(b: &[u8]) -> impl Iterator<Item = u16> + '_ {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]))
}

pub fn f16_to_f32_row(src: &[u8], dst: &mut [f32]) {
    for (d, h) in dst.iter_mut().zip(halves(src)) {
        *d = f16_to_f32(h);
    }
}

pub fn f16_from_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f32_to_f16(*s).to_le_bytes());
    }
}

/// ggml_vec_dot_f16 (generic). The product of two halves is exact in f32.
pub fn vec_dot_f16(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in halves(&w[..2 * n]).zip(halves(&x[..2 * n])) {
        sum += (f16_to_f32(a) * f16_to_f32(b)) as f64;
    }
    sum as f32
}

pub fn bf16_to_f32_row(src: &[u8], dst: &mut [f32]) {
    for (d, h) in dst.iter_mut().zip(halves(src)) {
        *d = bf16_to_f32(h);
    }
}

pub fn bf16_from_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f32_to_bf16(*s).to_le_bytes());
    }
}

/// ggml_vec_dot_bf16 (generic). The product of two bf16 values is exact in f32.
pub fn vec_dot_bf16(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in halves(&w[..2 * n]).zip(halves(&x[..2 * n])) {
        sum += (bf16_to_f32(a) * bf16_to_f32(b)) as f64;
    }
    sum as f32
}

/// The bf16 products w[i] * x[i] (f32: exact unless they underflow) for i in `range`.
fn bf16_products<'a>(w: &'a [u8], x: &'a [u8], range: std::ops::Range<usize>) -> impl Iterator<Item = f32> + 'a {
    halves(&w[2 * range.start..2 * range.end]).zip(halves(&x[2 * range.start..2 * range.end])).map(|(a, b)| bf16_to_f32(a) * bf16_to_f32(b))
}

/// `n` bf16 products from i0 on added into `lanes` f32 accumulators, product i into
/// accumulator (i - i0) % lanes (ggml's `add(mul(w, x), c)`).
fn bf16_lane_sums<const L: usize>(w: &[u8], x: &[u8], i0: usize, n: usize, acc: &mut [f32; L]) {
    for (k, p) in bf16_products(w, x, i0..i0 + n).enumerate() {
        acc[k % L] += p;
    }
}

/// The tail of ggml_vec_dot_bf16 (elements from `from` on, each product added in f64),
/// then the f32 result.
fn bf16_tail(n: usize, w: &[u8], x: &[u8], from: usize, mut sum: f64) -> f32 {
    for p in bf16_products(w, x, from..n) {
        sum += p as f64;
    }
    sum as f32
}

/// ggml_vec_dot_bf16 as its AVX2 build computes it: chunks of 32 into four accumulators of
/// eight lanes (elements 8k..8k + 8 of a chunk into accumulator k), `(c1 + c3) + (c2 + c4)`,
/// `hsum_float_8`, then into f64 with the tail.
pub fn vec_dot_bf16_avx2(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let whole = n / 32 * 32;
    let mut c = [[0f32; 8]; 4];
    for i in (0..whole).step_by(32) {
        for (k, acc) in c.iter_mut().enumerate() {
            bf16_lane_sums(w, x, i + 8 * k, 8, acc);
        }
    }
    let sum: [f32; 8] = std::array::from_fn(|l| (c[0][l] + c[2][l]) + (c[1][l] + c[3][l]));
    bf16_tail(n, w, x, whole, super::lanes::hsum_float_8(&sum) as f64)
}

/// `_mm512_reduce_add_ps` as GCC's header computes it: upper 256 bits onto the lower,
/// upper 128 onto the lower, lanes 2-3 onto 0-1, lane 1 onto lane 0.
pub fn reduce_add_16(c: &[f32; 16]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|l| c[l + 8] + c[l]);
    let t6: [f32; 4] = std::array::from_fn(|l| t3[l + 4] + t3[l]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// ggml_vec_dot_bf16 as its AVX-512F build without AVX512_BF16 computes it: chunks of 32
/// into two accumulators of sixteen lanes, each reduced (`reduce_add_16`) and added in f64,
/// then the tail.
pub fn vec_dot_bf16_avx512(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let whole = n / 32 * 32;
    let mut c = [[0f32; 16]; 2];
    for i in (0..whole).step_by(32) {
        for (k, acc) in c.iter_mut().enumerate() {
            bf16_lane_sums(w, x, i + 16 * k, 16, acc);
        }
    }
    let sum = 0.0f64 + reduce_add_16(&c[0]) as f64 + reduce_add_16(&c[1]) as f64;
    bf16_tail(n, w, x, whole, sum)
}
