//! The 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL and MXFP4.
//! Dequantizers and `_ref` quantizers follow ggml-quants.c; dot products follow the AVX2
//! `ggml_vec_dot_*` of ggml-cpu/arch/x86/quants.c (what llama.cpp runs on x86), float
//! operation for float operation, through the lane emulation of [`super::lanes`].

use super::lanes::{add_lanes, fma_lanes, hsum_float_8};
use crate::util::{rd_f16, rd_u32, roundf, wr_f16};

pub const QK: usize = 32;
pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;
pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;
pub const Q8_0_BYTES: usize = 34;
pub const Q8_1_BYTES: usize = 36;
pub const IQ4_NL_BYTES: usize = 18;
/// MXFP4: one E8M0 exponent byte, then 16 bytes of E2M1 nibbles.
pub const MXFP4_BYTES: usize = 17;

/// The 16 non-linear levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// The 16 E2M1 (FP4) values doubled, so that they are integers (ggml's kvalues_mxfp4): the
/// block's scale is half its E8M0 exponent to make up for it.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

fn blocks<'a>(src: &'a [u8], dst: &'a mut [f32], bytes: usize) -> impl Iterator<Item = (&'a [u8], &'a mut [f32])> {
    src.chunks_exact(bytes).zip(dst.chunks_exact_mut(QK))
}

/// Absolute maximum and the signed value that has it (first one on ties), as the
/// `amax < fabsf(v)` loops of ggml.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inverse_or_zero(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// The eight i32 lanes of one 32-element block product (`mul_sum_i8_pairs_float` and
/// friends): lane k sums the products of elements 4k..4k+3 of the weights `w` and the
/// activation's 32 quants `q`.
#[inline(always)]
pub(crate) fn block_lanes(w: &[i8; QK], q: &[u8]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (l, (w4, q4)) in lanes.iter_mut().zip(w.chunks_exact(4).zip(q.chunks_exact(4))) {
        *l = w4.iter().zip(q4).map(|(&a, &b)| a as i32 * b as i8 as i32).sum();
    }
    lanes
}

/// The 32 nibbles of the 16 bytes at `qs` as levels: low nibbles are elements 0..15, high
/// nibbles 16..31, each mapped through `level`.
#[inline(always)]
fn nibbles(qs: &[u8], level: impl Fn(u8) -> i8) -> [i8; QK] {
    let mut v = [0i8; QK];
    for j in 0..16 {
        v[j] = level(qs[j] & 0x0f);
        v[j + 16] = level(qs[j] >> 4);
    }
    v
}

/// The dot products whose block scale is the product of the two f16 `d`s (at byte 0 of
/// either block) and that have no other float term: ggml's AVX2 Q8_0, Q4_0 and Q5_0 dots,
/// `acc = fma(d_w * d_x, lanes, acc)` per block, then `hsum_float_8`. `values` decodes a
/// weight block.
fn lanes_dot32(n: usize, w: &[u8], x: &[u8], wbytes: usize, values: impl Fn(&[u8]) -> [i8; QK]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in w.chunks_exact(wbytes).zip(x.chunks_exact(Q8_0_BYTES)).take(n / QK) {
        let lanes = block_lanes(&values(bw), &bx[2..]);
        fma_lanes(&mut acc, rd_f16(bw, 0) * rd_f16(bx, 0), &lanes);
    }
    hsum_float_8(&acc)
}

/// The Q4_1 and Q5_1 dots (ggml_vec_dot_q4_1_q8_1, ggml_vec_dot_q5_1_q8_1 on AVX2): the
/// lanes as `lanes_dot32`, and the min terms m_w * s_x in one float, `summs = fma(m, s,
/// summs)` (GCC contracts ggml's `summs += m * s`), added after the reduction.
fn lanes_dot32_min(n: usize, w: &[u8], x: &[u8], wbytes: usize, values: impl Fn(&[u8]) -> [i8; QK]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (bw, bx) in w.chunks_exact(wbytes).zip(x.chunks_exact(Q8_1_BYTES)).take(n / QK) {
        summs = rd_f16(bw, 2).mul_add(rd_f16(bx, 2), summs);
        let lanes = block_lanes(&values(bw), &bx[4..]);
        fma_lanes(&mut acc, rd_f16(bw, 0) * rd_f16(bx, 0), &lanes);
    }
    hsum_float_8(&acc) + summs
}

// ---------------------------------------------------------------- Q4_0

pub fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, Q4_0_BYTES) {
        let d = rd_f16(b, 0);
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
            y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

pub fn quantize_q4_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q4_0_BYTES)) {
        let (_, max) = signed_absmax(x);
        let d = max / -8.0;
        let id = inverse_or_zero(d);
        wr_f16(b, 0, d);
        for j in 0..16 {
            let xi0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let xi1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            b[2 + j] = xi0 | (xi1 << 4);
        }
    }
}

pub fn vec_dot_q4_0_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    lanes_dot32(n, w, x, Q4_0_BYTES, |b| nibbles(&b[2..18], |q| q as i8 - 8))
}

// ---------------------------------------------------------------- Q4_1

pub fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, Q4_1_BYTES) {
        let d = rd_f16(b, 0);
        let m = rd_f16(b, 2);
        for j in 0..16 {
            let q = b[4 + j];
            y[j] = (q & 0x0f) as f32 * d + m;
            y[j + 16] = (q >> 4) as f32 * d + m;
        }
    }
}

pub fn quantize_q4_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q4_1_BYTES)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inverse_or_zero(d);
        wr_f16(b, 0, d);
        wr_f16(b, 2, min);
        for j in 0..16 {
            let xi0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let xi1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            b[4 + j] = xi0 | (xi1 << 4);
        }
    }
}

pub fn vec_dot_q4_1_q8_1(n: usize, w: &[u8], x: &[u8]) -> f32 {
    lanes_dot32_min(n, w, x, Q4_1_BYTES, |b| nibbles(&b[4..20], |q| q as i8))
}

// ---------------------------------------------------------------- Q5_0

/// The fifth bits of elements j and j + 16, moved to bit 4.
#[inline(always)]
fn q5_high_bits(qh: u32, j: usize) -> (u8, u8) {
    ((((qh >> j) << 4) & 0x10) as u8, ((qh >> (j + 12)) & 0x10) as u8)
}

pub fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, Q5_0_BYTES) {
        let d = rd_f16(b, 0);
        let qh = rd_u32(b, 2);
        for j in 0..16 {
            let (h0, h1) = q5_high_bits(qh, j);
            let q = b[6 + j];
            y[j] = (((q & 0x0f) | h0) as i32 - 16) as f32 * d;
            y[j + 16] = (((q >> 4) | h1) as i32 - 16) as f32 * d;
        }
    }
}

fn pack_q5(xi: impl Fn(usize) -> u8, qs: &mut [u8]) -> u32 {
    let mut qh = 0u32;
    for j in 0..16 {
        let (xi0, xi1) = (xi(j), xi(j + 16));
        qs[j] = (xi0 & 0x0f) | ((xi1 & 0x0f) << 4);
        qh |= (((xi0 & 0x10) >> 4) as u32) << j;
        qh |= (((xi1 & 0x10) >> 4) as u32) << (j + 16);
    }
    qh
}

pub fn quantize_q5_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q5_0_BYTES)) {
        let (_, max) = signed_absmax(x);
        let d = max / -16.0;
        let id = inverse_or_zero(d);
        wr_f16(b, 0, d);
        let qh = pack_q5(|j| ((x[j] * id + 16.5) as i8).min(31) as u8, &mut b[6..22]);
        b[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

/// The 32 five-bit values of a Q5 block (nibbles at `qs`, fifth bits in `qh`), minus `offset`.
#[inline(always)]
fn q5_values(qh: u32, qs: &[u8], offset: i8) -> [i8; QK] {
    let mut v = nibbles(qs, |q| q as i8);
    for (j, x) in v.iter_mut().enumerate() {
        *x = (*x | (((qh >> j) & 1) << 4) as i8) - offset;
    }
    v
}

pub fn vec_dot_q5_0_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    lanes_dot32(n, w, x, Q5_0_BYTES, |b| q5_values(rd_u32(b, 2), &b[6..22], 16))
}

// ---------------------------------------------------------------- Q5_1

pub fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, Q5_1_BYTES) {
        let d = rd_f16(b, 0);
        let m = rd_f16(b, 2);
        let qh = rd_u32(b, 4);
        for j in 0..16 {
            let (h0, h1) = q5_high_bits(qh, j);
            let q = b[8 + j];
            y[j] = ((q & 0x0f) | h0) as f32 * d + m;
            y[j + 16] = ((q >> 4) | h1) as f32 * d + m;
        }
    }
}

pub fn quantize_q5_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q5_1_BYTES)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inverse_or_zero(d);
        wr_f16(b, 0, d);
        wr_f16(b, 2, min);
        let qh = pack_q5(|j| ((x[j] - min) * id + 0.5) as u8, &mut b[8..24]);
        b[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

pub fn vec_dot_q5_1_q8_1(n: usize, w: &[u8], x: &[u8]) -> f32 {
    lanes_dot32_min(n, w, x, Q5_1_BYTES, |b| q5_values(rd_u32(b, 4), &b[8..24], 0))
}

// ---------------------------------------------------------------- Q8_0

pub fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, Q8_0_BYTES) {
        let d = rd_f16(b, 0);
        for j in 0..QK {
            y[j] = b[2 + j] as i8 as f32 * d;
        }
    }
}

fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() })
}

/// quantize_row_q8_0_ref: d = amax/127, q = roundf(x * (1/d)) (ties away from zero).
pub fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let d = absmax(x) / 127.0;
        let id = inverse_or_zero(d);
        wr_f16(b, 0, d);
        for j in 0..QK {
            b[2 + j] = roundf(x[j] * id) as i8 as u8;
        }
    }
}

/// The activation quantizer of ggml's x86 CPU backend (quantize_row_q8_0 with AVX2/AVX-512,
/// which llama.cpp runs on this architecture for activations and Q8_0 KV caches):
/// d = amax/127 stored as f16, q = round-half-even(x * (127/amax)).
pub fn quantize_q8_0_act(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = absmax(x);
        wr_f16(b, 0, amax / 127.0);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for j in 0..QK {
            b[2 + j] = (x[j] * id).round_ties_even() as i32 as i8 as u8;
        }
    }
}

pub fn vec_dot_q8_0_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    lanes_dot32(n, w, x, Q8_0_BYTES, |b| std::array::from_fn(|j| b[2 + j] as i8))
}

// ---------------------------------------------------------------- Q8_1

/// Q8_1 has no dequantizer in ggml (it only ever holds activations); this is the
/// natural one, q * d.
pub fn dequantize_q8_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, Q8_1_BYTES) {
        let d = rd_f16(b, 0);
        for j in 0..QK {
            y[j] = b[4 + j] as i8 as f32 * d;
        }
    }
}

/// quantize_row_q8_1_ref: as Q8_0 plus s = sum(q) * d.
pub fn quantize_q8_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_1_BYTES)) {
        let d = absmax(x) / 127.0;
        let id = inverse_or_zero(d);
        wr_f16(b, 0, d);
        let mut sum = 0i32;
        for j in 0..QK {
            let q = roundf(x[j] * id) as i8;
            b[4 + j] = q as u8;
            sum += q as i32;
        }
        wr_f16(b, 2, sum as f32 * d);
    }
}

/// ggml's x86 quantize_row_q8_1 (see `quantize_q8_0_act`).
pub fn quantize_q8_1_act(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_1_BYTES)) {
        let amax = absmax(x);
        let d = amax / 127.0;
        wr_f16(b, 0, d);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for j in 0..QK {
            let q = (x[j] * id).round_ties_even() as i32 as i8;
            b[4 + j] = q as u8;
            sum += q as i32;
        }
        wr_f16(b, 2, d * sum as f32);
    }
}

// ---------------------------------------------------------------- IQ4_NL

pub fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, IQ4_NL_BYTES) {
        let d = rd_f16(b, 0);
        for j in 0..16 {
            y[j] = d * KVALUES_IQ4NL[(b[2 + j] & 0x0f) as usize] as f32;
            y[j + 16] = d * KVALUES_IQ4NL[(b[2 + j] >> 4) as usize] as f32;
        }
    }
}

/// ggml_vec_dot_iq4_nl_q8_0 on AVX2: see `paired_dot32`.
pub fn vec_dot_iq4_nl_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let values = |b: &[u8]| nibbles(&b[2..18], |q| KVALUES_IQ4NL[q as usize]);
    paired_dot32(n, w, x, IQ4_NL_BYTES, values, |b| rd_f16(b, 0))
}

/// The AVX2 dots of the non-linear 4-bit types (ggml_vec_dot_iq4_nl_q8_0,
/// ggml_vec_dot_mxfp4_q8_0): blocks in pairs, the even ones into one accumulator and the odd
/// ones into another, `acc = fma(d_x * d_w, lanes, acc)`, summed lane-wise before
/// `hsum_float_8`; an odd last block is added afterwards as `sumf + d * sumi` (two roundings:
/// GCC does not contract it there). `values` decodes a weight block, `scale` reads its d.
fn paired_dot32(n: usize, w: &[u8], x: &[u8], wbytes: usize, values: impl Fn(&[u8]) -> [i8; QK], scale: impl Fn(&[u8]) -> f32) -> f32 {
    let nb = n / QK;
    let mut acc = [[0.0f32; 8]; 2];
    let pairs = w.chunks_exact(wbytes).zip(x.chunks_exact(Q8_0_BYTES)).take(nb / 2 * 2);
    for (i, (bw, bx)) in pairs.enumerate() {
        let lanes = block_lanes(&values(bw), &bx[2..]);
        fma_lanes(&mut acc[i % 2], rd_f16(bx, 0) * scale(bw), &lanes);
    }
    let mut sumf = hsum_float_8(&add_lanes(&acc[0], &acc[1]));
    if nb % 2 == 1 {
        let (bw, bx) = (&w[(nb - 1) * wbytes..], &x[(nb - 1) * Q8_0_BYTES..]);
        let sumi: i32 = block_lanes(&values(bw), &bx[2..]).iter().sum();
        sumf += rd_f16(bx, 0) * scale(bw) * sumi as f32;
    }
    sumf
}

// ---------------------------------------------------------------- MXFP4
// e (E8M0) | qs[16]

/// ggml_e8m0_to_fp32_half: 2^(e - 128), the E8M0 scale halved (the levels are doubled).
/// e = 0 and 1 give the subnormals 2^-128 and 2^-127.
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { ((e - 1) as u32) << 23 };
    f32::from_bits(bits)
}

/// The 32 levels of an MXFP4 block (doubled E2M1 values), in element order.
pub fn mxfp4_values(b: &[u8]) -> [i8; QK] {
    nibbles(&b[1..17], |q| KVALUES_MXFP4[q as usize])
}

pub fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, MXFP4_BYTES) {
        let d = e8m0_to_f32_half(b[0]);
        for (v, q) in y.iter_mut().zip(mxfp4_values(b)) {
            *v = q as f32 * d;
        }
    }
}

/// quantize_row_mxfp4_ref: the exponent floor(log2(amax)) - 2 (so that amax / 2^e < 8, the
/// largest E2M1 value being 6), each value the level nearest to it (the first on ties).
pub fn quantize_mxfp4(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(MXFP4_BYTES)) {
        let amax = x.iter().fold(0.0f32, |m, v| if m < v.abs() { v.abs() } else { m });
        let e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0) as u8 } else { 0 };
        let d = e8m0_to_f32_half(e);
        let nearest = |v: f32| {
            let err = |i: usize| (KVALUES_MXFP4[i] as f32 * d - v).abs();
            (1..16).fold(0, |best, i| if err(i) < err(best) { i } else { best }) as u8
        };
        b[0] = e;
        for j in 0..16 {
            b[1 + j] = nearest(x[j]) | (nearest(x[j + 16]) << 4);
        }
    }
}

/// ggml_vec_dot_mxfp4_q8_0 on AVX2: IQ4_NL's arithmetic (`paired_dot32`) with the E8M0 scale.
pub fn vec_dot_mxfp4_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    paired_dot32(n, w, x, MXFP4_BYTES, mxfp4_values, |b| e8m0_to_f32_half(b[0]))
}

/// The index of the level of `values` (sorted, 16 of them) nearest to `x`, as ggml's
/// best_index_int8: binary search, then the nearer neighbour (the upper one on a tie).
pub fn best_index_int8(values: &[i8], x: f32) -> usize {
    let n = values.len();
    if x <= values[0] as f32 {
        return 0;
    }
    if x >= values[n - 1] as f32 {
        return n - 1;
    }
    let (mut ml, mut mu) = (0usize, n - 1);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < values[mav] as f32 { mu = mav } else { ml = mav }
    }
    if x - (values[mu - 1] as f32) < values[mu] as f32 - x { mu - 1 } else { mu }
}
