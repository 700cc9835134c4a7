//! The 256-element super-block types: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K and IQ4_XS.
//! Dequantizers follow ggml-quants.c; dot products follow the AVX2 `ggml_vec_dot_*_q8_K` of
//! ggml-cpu/arch/x86/quants.c (what llama.cpp runs on x86) including their float summation
//! order: exact integer sums per super-block in eight lanes (see [`super::lanes`]), one FMA
//! per lane and super-block, `hsum_float_8` at the end.

use super::lanes::{fma_lanes, hsum_float_4, hsum_float_8};
use super::legacy::KVALUES_IQ4NL;
use crate::util::{nearest_int, rd_f16, rd_f32, rd_i16, rd_u32};

pub const QK_K: usize = 256;
pub const Q2_K_BYTES: usize = 84;
pub const Q3_K_BYTES: usize = 110;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;
pub const Q8_K_BYTES: usize = 292;
pub const IQ4_XS_BYTES: usize = 136;

pub(crate) fn blocks<'a>(src: &'a [u8], dst: &'a mut [f32], bytes: usize) -> impl Iterator<Item = (&'a [u8], &'a mut [f32])> {
    src.chunks_exact(bytes).zip(dst.chunks_exact_mut(QK_K))
}

pub(crate) fn pairs<'a>(w: &'a [u8], x: &'a [u8], wbytes: usize, n: usize) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
    w.chunks_exact(wbytes).zip(x.chunks_exact(Q8_K_BYTES)).take(n / QK_K)
}

/// The activation's quants of a Q8_K block.
#[inline(always)]
pub(crate) fn q8k_qs(b: &[u8]) -> &[u8] {
    &b[4..4 + QK_K]
}

#[inline(always)]
fn q8k_bsum(b: &[u8], j: usize) -> i32 {
    rd_i16(b, 4 + QK_K + 2 * j) as i32
}

/// The i32 lanes of ggml's AVX2 k-quant dots: the weights are loaded 32 at a time in
/// element order, so element p lands in lane (p % 32) / 4, its product with the activation
/// weighted by the scale of its 16-element group (`scales16`, each 32-element sub-block's
/// scale given twice).
pub(crate) fn x86_lanes(a: &[i8; QK_K], q8: &[u8], scales16: &[i32; 16]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (g, (a32, q32)) in a.chunks_exact(32).zip(q8.chunks_exact(32)).enumerate() {
        for (k, (a4, q4)) in a32.chunks_exact(4).zip(q32.chunks_exact(4)).enumerate() {
            let dot: i32 = a4.iter().zip(q4).map(|(&w, &y)| w as i32 * y as i8 as i32).sum();
            lanes[k] += scales16[2 * g + k / 4] * dot;
        }
    }
    lanes
}

/// The lanes of `_mm256_madd_epi16(v16, bsums)` over the 16 group sums of a Q8_K block:
/// lane k = v[2k] * bsum[2k] + v[2k + 1] * bsum[2k + 1].
fn bsum_lanes(by: &[u8], v: impl Fn(usize) -> i32) -> [i32; 8] {
    std::array::from_fn(|k| v(2 * k) * q8k_bsum(by, 2 * k) + v(2 * k + 1) * q8k_bsum(by, 2 * k + 1))
}

// ---------------------------------------------------------------- Q2_K
// scales[16] | qs[64] | d | dmin

pub fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, Q2_K_BYTES) {
        let d = rd_f16(b, 80);
        let min = rd_f16(b, 82);
        let mut out = 0;
        let mut is = 0;
        for half in 0..2 {
            let q = &b[16 + 32 * half..16 + 32 * half + 32];
            for shift in [0, 2, 4, 6] {
                for part in 0..2 {
                    let sc = b[is];
                    is += 1;
                    let dl = d * (sc & 0x0f) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for l in 0..16 {
                        y[out] = dl * ((q[16 * part + l] >> shift) & 3) as f32 - ml;
                        out += 1;
                    }
                }
            }
        }
    }
}

/// The 256 2-bit values of a Q2_K block, in element order.
fn q2_k_values(b: &[u8]) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for half in 0..2 {
        let q2 = &b[16 + 32 * half..48 + 32 * half];
        for (g, shift) in [0, 2, 4, 6].into_iter().enumerate() {
            for (l, &q) in q2.iter().enumerate() {
                a[128 * half + 32 * g + l] = ((q >> shift) & 3) as i8;
            }
        }
    }
    a
}

/// ggml_vec_dot_q2_K_q8_K on AVX2: per super-block, first the mins, `acc = fma(-d_x * dmin,
/// madd(mins, bsums), acc)`, then the scaled quants, `acc = fma(d_x * d, lanes, acc)`.
pub fn vec_dot_q2_k_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, by) in pairs(w, x, Q2_K_BYTES, n) {
        let sc = &bw[0..16];
        let yd = rd_f32(by, 0);
        let mins = bsum_lanes(by, |j| (sc[j] >> 4) as i32);
        fma_lanes(&mut acc, -yd * rd_f16(bw, 82), &mins);
        let lanes = x86_lanes(&q2_k_values(bw), q8k_qs(by), &std::array::from_fn(|j| (sc[j] & 0x0f) as i32));
        fma_lanes(&mut acc, yd * rd_f16(bw, 80), &lanes);
    }
    hsum_float_8(&acc)
}

// ---------------------------------------------------------------- Q3_K
// hmask[32] | qs[64] | scales[12] | d

/// The sixteen 6-bit scales of a Q3_K block (still offset by 32).
pub fn q3_k_scales(packed: &[u8]) -> [i8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let a = [rd_u32(packed, 0), rd_u32(packed, 4), rd_u32(packed, 8)];
    let tmp = a[2];
    let aux = [
        (a[0] & KMASK2) | (((tmp) & KMASK1) << 4),
        (a[1] & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a[0] >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a[1] >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, v) in aux.iter().enumerate() {
        for (k, byte) in v.to_le_bytes().iter().enumerate() {
            out[4 * i + k] = *byte as i8;
        }
    }
    out
}

/// The 256 signed 3-bit values of a Q3_K block, in element order.
fn q3_k_values(b: &[u8]) -> [i8; QK_K] {
    let hm = &b[0..32];
    let mut a = [0i8; QK_K];
    let mut m = 1u8;
    for half in 0..2 {
        let q3 = &b[32 + 32 * half..64 + 32 * half];
        for shift in [0, 2, 4, 6] {
            let base = 128 * half + 16 * shift;
            for l in 0..32 {
                a[base + l] = ((q3[l] >> shift) & 3) as i8 - if hm[l] & m != 0 { 0 } else { 4 };
            }
            m <<= 1;
        }
    }
    a
}

pub fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, Q3_K_BYTES) {
        let d_all = rd_f16(b, 108);
        let scales = q3_k_scales(&b[96..108]);
        let a = q3_k_values(b);
        for (i, v) in y.iter_mut().enumerate() {
            let dl = d_all * (scales[i / 16] as i32 - 32) as f32;
            *v = dl * a[i] as f32;
        }
    }
}

/// ggml_vec_dot_q3_K_q8_K on AVX2: `acc = fma(d_x * d, lanes, acc)` per super-block.
pub fn vec_dot_q3_k_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, by) in pairs(w, x, Q3_K_BYTES, n) {
        let scales = q3_k_scales(&bw[96..108]);
        let lanes = x86_lanes(&q3_k_values(bw), q8k_qs(by), &scales.map(|s| s as i32 - 32));
        fma_lanes(&mut acc, rd_f32(by, 0) * rd_f16(bw, 108), &lanes);
    }
    hsum_float_8(&acc)
}

// ---------------------------------------------------------------- Q4_K / Q5_K scales

/// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..8).
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The 4 lanes of ggml's Q4_K min product, `_mm_madd_epi16(mins, hadd(bsums))`: lane k =
/// min[2k] * bsum32[2k] + min[2k + 1] * bsum32[2k + 1], bsum32[j] the activation sum over
/// sub-block j (two 16-element group sums).
fn q4_k_min_lanes(by: &[u8], scales: &[u8]) -> [i32; 4] {
    let term = |j: usize| scale_min_k4(j, scales).1 as i32 * (q8k_bsum(by, 2 * j) + q8k_bsum(by, 2 * j + 1));
    std::array::from_fn(|k| term(2 * k) + term(2 * k + 1))
}

/// The scaled-quant lanes of a Q4_K or Q5_K super-block (`values` its 256 unsigned levels).
fn kx_lanes(bw: &[u8], by: &[u8], values: impl Fn(&[u8]) -> [i8; QK_K]) -> [i32; 8] {
    let scales = &bw[4..16];
    x86_lanes(&values(bw), q8k_qs(by), &std::array::from_fn(|j| scale_min_k4(j / 2, scales).0 as i32))
}

// ---------------------------------------------------------------- Q4_K
// d | dmin | scales[12] | qs[128]

fn q4_k_values(b: &[u8]) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for j in 0..4 {
        let q = &b[16 + 32 * j..48 + 32 * j];
        for l in 0..32 {
            a[64 * j + l] = (q[l] & 0x0f) as i8;
            a[64 * j + 32 + l] = (q[l] >> 4) as i8;
        }
    }
    a
}

pub fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, Q4_K_BYTES) {
        let d = rd_f16(b, 0);
        let min = rd_f16(b, 2);
        let scales = &b[4..16];
        for j in 0..4 {
            let q = &b[16 + 32 * j..48 + 32 * j];
            let (sc1, m1) = scale_min_k4(2 * j, scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            for l in 0..32 {
                y[64 * j + l] = d1 * (q[l] & 0x0f) as f32 - m1;
                y[64 * j + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// ggml_vec_dot_q4_K_q8_K on AVX2: the scaled quants in eight lanes, `acc = fma(d_x * d,
/// lanes, acc)`; the mins in a 4-lane accumulator, `acc_m = fma(-d_x * dmin, min lanes,
/// acc_m)`; the result `hsum_float_8(acc)` plus acc_m reduced.
pub fn vec_dot_q4_k_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut acc_m = [0.0f32; 4];
    for (bw, by) in pairs(w, x, Q4_K_BYTES, n) {
        let yd = rd_f32(by, 0);
        let dmin = -yd * rd_f16(bw, 2);
        for (a, m) in acc_m.iter_mut().zip(q4_k_min_lanes(by, &bw[4..16])) {
            *a = dmin.mul_add(m as f32, *a);
        }
        fma_lanes(&mut acc, yd * rd_f16(bw, 0), &kx_lanes(bw, by, q4_k_values));
    }
    hsum_float_8(&acc) + hsum_float_4(&acc_m)
}

// ---------------------------------------------------------------- Q5_K
// d | dmin | scales[12] | qh[32] | qs[128]

fn q5_k_values(b: &[u8]) -> [i8; QK_K] {
    let qh = &b[16..48];
    let mut a = [0i8; QK_K];
    for j in 0..4 {
        let q = &b[48 + 32 * j..80 + 32 * j];
        let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
        for l in 0..32 {
            a[64 * j + l] = ((q[l] & 0x0f) + if qh[l] & u1 != 0 { 16 } else { 0 }) as i8;
            a[64 * j + 32 + l] = ((q[l] >> 4) + if qh[l] & u2 != 0 { 16 } else { 0 }) as i8;
        }
    }
    a
}

pub fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, Q5_K_BYTES) {
        let d = rd_f16(b, 0);
        let min = rd_f16(b, 2);
        let scales = &b[4..16];
        let a = q5_k_values(b);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, scales);
            let (dl, ml) = (d * sc as f32, min * m as f32);
            for l in 0..32 {
                y[32 * j + l] = dl * a[32 * j + l] as f32 - ml;
            }
        }
    }
}

/// ggml_vec_dot_q5_K_q8_K on AVX2: the scaled quants as Q4_K; the mins as one integer per
/// super-block, `summs = fma(-d_x * dmin, float(sum), summs)` (GCC contracts ggml's
/// `summs += dmin * sum`), added after the reduction.
pub fn vec_dot_q5_k_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (bw, by) in pairs(w, x, Q5_K_BYTES, n) {
        let yd = rd_f32(by, 0);
        let mins: i32 = q4_k_min_lanes(by, &bw[4..16]).iter().sum();
        summs = (-yd * rd_f16(bw, 2)).mul_add(mins as f32, summs);
        fma_lanes(&mut acc, yd * rd_f16(bw, 0), &kx_lanes(bw, by, q5_k_values));
    }
    hsum_float_8(&acc) + summs
}

// ---------------------------------------------------------------- Q6_K
// ql[128] | qh[64] | scales[16] (i8) | d

fn q6_k_values(b: &[u8]) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..160 + 32 * half];
        let base = 128 * half;
        for l in 0..32 {
            a[base + l] = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i8 - 32;
            a[base + l + 32] = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            a[base + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            a[base + l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    a
}

pub fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, Q6_K_BYTES) {
        let d = rd_f16(b, 208);
        let a = q6_k_values(b);
        for (i, v) in y.iter_mut().enumerate() {
            *v = d * b[192 + i / 16] as i8 as f32 * a[i] as f32;
        }
    }
}

/// ggml_vec_dot_q6_K_q8_K on AVX2: the unsigned 6-bit levels against the activations in the
/// usual lanes, minus 32 * madd(bsums, scales) (whose lane k covers sub-blocks 2k and 2k + 1,
/// not the same elements), then `acc = fma(d_x * d, lanes, acc)`.
pub fn vec_dot_q6_k_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, by) in pairs(w, x, Q6_K_BYTES, n) {
        let scale = |j: usize| bw[192 + j] as i8 as i32;
        let unsigned = q6_k_values(bw).map(|v| v + 32);
        let mut lanes = x86_lanes(&unsigned, q8k_qs(by), &std::array::from_fn(scale));
        for (l, s) in lanes.iter_mut().zip(bsum_lanes(by, scale)) {
            *l -= s << 5;
        }
        fma_lanes(&mut acc, rd_f32(by, 0) * rd_f16(bw, 208), &lanes);
    }
    hsum_float_8(&acc)
}

// ---------------------------------------------------------------- Q8_K
// d (f32) | qs[256] | bsums[16] (i16)

pub fn dequantize_q8_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, Q8_K_BYTES) {
        let d = rd_f32(b, 0);
        for (v, q) in y.iter_mut().zip(q8k_qs(b)) {
            *v = d * *q as i8 as f32;
        }
    }
}

/// quantize_row_q8_K_ref: scale -127/max (max the signed value of largest magnitude),
/// nearest_int rounding, d = 1/iscale stored as f32, plus the 16 group sums.
pub fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q8_K_BYTES)) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            // ggml leaves bsums unset here; zero is what they sum to.
            b.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (j, &v) in x.iter().enumerate() {
            b[4 + j] = nearest_int(iscale * v).min(127) as i8 as u8;
        }
        for j in 0..16 {
            let sum: i32 = b[4 + 16 * j..4 + 16 * j + 16].iter().map(|&q| q as i8 as i32).sum();
            b[4 + QK_K + 2 * j..4 + QK_K + 2 * j + 2].copy_from_slice(&(sum as i16).to_le_bytes());
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

// ---------------------------------------------------------------- IQ4_XS
// d | scales_h (u16) | scales_l[4] | qs[128]

fn iq4_xs_scale(b: &[u8], ib: usize) -> i32 {
    let scales_h = u16::from_le_bytes([b[2], b[3]]) as i32;
    (((b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f) as i32 | (((scales_h >> (2 * ib)) & 3) << 4)) - 32
}

pub fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, IQ4_XS_BYTES) {
        let d = rd_f16(b, 0);
        for ib in 0..8 {
            let dl = d * iq4_xs_scale(b, ib) as f32;
            let qs = &b[8 + 16 * ib..24 + 16 * ib];
            for j in 0..16 {
                y[32 * ib + j] = dl * KVALUES_IQ4NL[(qs[j] & 0x0f) as usize] as f32;
                y[32 * ib + 16 + j] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}

/// ggml_vec_dot_iq4_xs_q8_K on AVX2: the scaled levels in the usual lanes, `acc = fma(d *
/// d_x, lanes, acc)` per super-block.
pub fn vec_dot_iq4_xs_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, by) in pairs(w, x, IQ4_XS_BYTES, n) {
        let mut values = [0i8; QK_K];
        for (ib, v) in values.chunks_exact_mut(32).enumerate() {
            for (j, &q) in bw[8 + 16 * ib..24 + 16 * ib].iter().enumerate() {
                v[j] = KVALUES_IQ4NL[(q & 0x0f) as usize];
                v[j + 16] = KVALUES_IQ4NL[(q >> 4) as usize];
            }
        }
        let lanes = x86_lanes(&values, q8k_qs(by), &std::array::from_fn(|j| iq4_xs_scale(bw, j / 2)));
        fma_lanes(&mut acc, rd_f16(bw, 0) * rd_f32(by, 0), &lanes);
    }
    hsum_float_8(&acc)
}
