//! AVX2 kernels of the ternary types TQ1_0 and TQ2_0 against Q8_K activations, the
//! arithmetic of ggml's AVX2 `ggml_vec_dot_tq*_q8_K` (`scalar::ternary`, their
//! specification): the stored trits decoded once per super-block for every token, products
//! summed in 16-bit words (at most 8 * 2 * 3 * 128 in magnitude: exact), the activation's
//! group sums subtracted, words paired into eight i32 lanes, one FMA per lane and super-block.
//!
//! SAFETY (whole module): callers pass `nb` whole blocks readable at `w` and every `x[t]`
//! (checked by the safe wrappers in `simd::mod`) and call these only on CPUs with AVX2, FMA
//! and F16C (checked by the dispatch).

// The kernels' contract is the module's SAFETY paragraph above.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::x86::{f16_1, hsum_ps, loadu};

/// The trits (0, 1, 2) of 32 bytes that each hold one in their top bits as a fraction of
/// 256: ggml's `(q * 3) >> 8` through averages, ((q - 1) + (q - 1 + 1) / 2 + 1) / 2 >> 6.
/// Written as instructions: LLVM rewrites the averages into wider arithmetic (a zero operand
/// into max, shift and mask; the outer average into 16-bit halves), twice the instructions.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn top_trits(q: __m256i) -> __m256i {
    let t: __m256i;
    // SAFETY: register arithmetic only (AVX2, enabled here); no memory, no flags.
    std::arch::asm!(
        "vpsubusb {t}, {q}, {one}",
        "vpavgb {half}, {t}, {zero}",
        "vpavgb {t}, {t}, {half}",
        "vpsrlw {t}, {t}, 6",
        "vpand {t}, {t}, {three}",
        q = in(ymm_reg) q,
        one = in(ymm_reg) _mm256_set1_epi8(1),
        zero = in(ymm_reg) _mm256_setzero_si256(),
        three = in(ymm_reg) _mm256_set1_epi8(3),
        t = out(ymm_reg) t,
        half = out(ymm_reg) _,
        options(pure, nomem, nostack, preserves_flags),
    );
    t
}

/// Each byte times 9 (mod 256), without 8-bit multiplies: (b << 3 within the byte) + b.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn times9(b: __m256i) -> __m256i {
    _mm256_add_epi8(_mm256_and_si256(_mm256_slli_epi16::<3>(b), _mm256_set1_epi8(-8)), b)
}

/// The 256 trits of a TQ1_0 block as eight vectors of 32, in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tq1_0_trits(b: *const u8) -> [__m256i; 8] {
    // Bytes 0..31 times 1, 3, 9, 27, 81: elements 0..159.
    let q0 = loadu(b);
    let q1 = _mm256_add_epi8(q0, _mm256_add_epi8(q0, q0));
    let (q2, q3) = (times9(q0), times9(q1));
    let q4 = times9(q2);
    // Bytes 32..47 times the same, two powers a vector (elements 160..239), then the four
    // bytes of four trits times 1, 3, 9, 27 (elements 240..255).
    let r0 = _mm256_broadcastsi128_si256(_mm_loadu_si128(b.add(32) as *const __m128i));
    let r1 = _mm256_add_epi8(r0, _mm256_add_epi8(r0, r0));
    let (r2, r3) = (times9(r0), times9(r1));
    let r4 = times9(r2);
    let qh = _mm256_cvtepu8_epi16(_mm_set1_epi32(std::ptr::read_unaligned(b.add(48) as *const i32)));
    let qh = _mm256_and_si256(_mm256_mullo_epi16(qh, _mm256_set_epi16(27, 27, 27, 27, 9, 9, 9, 9, 3, 3, 3, 3, 1, 1, 1, 1)), _mm256_set1_epi16(0xff));
    let r5 = _mm_packus_epi16(_mm256_castsi256_si128(qh), _mm256_extracti128_si256::<1>(qh));
    let r01 = _mm256_permute2x128_si256::<0x20>(r0, r1);
    let r23 = _mm256_permute2x128_si256::<0x20>(r2, r3);
    let r45 = _mm256_inserti128_si256::<1>(r4, r5);
    let mut t = [q0, q1, q2, q3, q4, r01, r23, r45];
    // A loop, not a closure: closures do not inherit the target features.
    for v in t.iter_mut() {
        *v = top_trits(*v);
    }
    t
}

/// The 256 2-bit values of a TQ2_0 block as eight vectors of 32, in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tq2_0_trits(b: *const u8) -> [__m256i; 8] {
    let (h0, h1) = (loadu(b), loadu(b.add(32)));
    let mut t = [
        h0, _mm256_srli_epi16::<2>(h0), _mm256_srli_epi16::<4>(h0), _mm256_srli_epi16::<6>(h0),
        h1, _mm256_srli_epi16::<2>(h1), _mm256_srli_epi16::<4>(h1), _mm256_srli_epi16::<6>(h1),
    ];
    for v in t.iter_mut() {
        *v = _mm256_and_si256(*v, _mm256_set1_epi8(3));
    }
    t
}

/// One super-block's eight lanes for one token: trits times quants in 16-bit words, minus
/// the group sums, words paired.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_lanes(trits: &[__m256i; 8], bx: *const u8) -> __m256i {
    let mut sum16 = _mm256_setzero_si256();
    for (c, t) in trits.iter().enumerate() {
        sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(*t, loadu(bx.add(4 + 32 * c))));
    }
    let sum16 = _mm256_sub_epi16(sum16, loadu(bx.add(4 + 256)));
    _mm256_madd_epi16(sum16, _mm256_set1_epi16(1))
}

/// The eight float lanes of one weight row against T activation rows, of TQ1_0 (`TQ1`) or
/// TQ2_0, before their horizontal sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_lanes<const TQ1: bool, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T]) -> [__m256; T] {
    let bytes = if TQ1 { 54 } else { 66 };
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..nb {
        let bw = w.add(i * bytes);
        let t8 = if TQ1 { tq1_0_trits(bw) } else { tq2_0_trits(bw) };
        let dw = _mm256_set1_ps(f16_1(bw.add(bytes - 2)));
        for t in 0..T {
            let bx = x[t].add(i * 292);
            // The activation's scale broadcast from memory, times the weight's in every lane:
            // the same product as in scalar, one instruction fewer per token.
            let d = _mm256_mul_ps(_mm256_set1_ps(std::ptr::read_unaligned(bx as *const f32)), dw);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_lanes(&t8, bx)), d, acc[t]);
        }
    }
    acc
}

/// The dot of one weight row with T activation rows, of TQ1_0 (`TQ1`) or TQ2_0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ternary<const TQ1: bool, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
    let acc = row_lanes::<TQ1, T>(nb, w, x);
    for t in 0..T {
        out[t] = hsum_ps(acc[t]);
    }
}

/// [p's low half, q's low half] + [p's high half, q's high half]: `hsum_ps`'s first step
/// of two vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fold_halves(p: __m256, q: __m256) -> __m256 {
    _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(p, q), _mm256_permute2f128_ps::<0x31>(p, q))
}

/// Per 128-bit half, [p0 + p2, p1 + p3, q0 + q2, q1 + q3]: `hsum_ps`'s second step.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fold_pairs(p: __m256, q: __m256) -> __m256 {
    _mm256_add_ps(_mm256_shuffle_ps::<0x44>(p, q), _mm256_shuffle_ps::<0xee>(p, q))
}

/// The horizontal sums of eight vectors, each bit for bit `hsum_ps` (the same additions of
/// the same operands), as one vector in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsums8(a: &[__m256; 8]) -> __m256 {
    // Halves: rows 0-3 in the low 128 bits, rows 4-7 in the high.
    let (r04, r15, r26, r37) = (fold_halves(a[0], a[4]), fold_halves(a[1], a[5]), fold_halves(a[2], a[6]), fold_halves(a[3], a[7]));
    _mm256_hadd_ps(fold_pairs(r04, r15), fold_pairs(r26, r37))
}

/// out[r] = the dot of weight row r (eight consecutive rows of `row_bytes`) with one
/// activation row, bit for bit `ternary::<TQ1, 1>` of each: the rows one after another (one
/// memory stream), their eight horizontal sums done together.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ternary_rows8<const TQ1: bool>(nb: usize, w: *const u8, row_bytes: usize, x: *const u8, out: &mut [f32; 8]) {
    let mut acc = [_mm256_setzero_ps(); 8];
    for (r, a) in acc.iter_mut().enumerate() {
        *a = row_lanes::<TQ1, 1>(nb, w.add(r * row_bytes), [x])[0];
    }
    _mm256_storeu_ps(out.as_mut_ptr(), hsums8(&acc));
}

/// Eight TQ1_0 rows x one Q8_K row (`ternary_rows8`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tq1_0_rows8(nb: usize, w: *const u8, row_bytes: usize, x: *const u8, out: &mut [f32; 8]) {
    ternary_rows8::<true>(nb, w, row_bytes, x, out)
}

/// Eight TQ2_0 rows x one Q8_K row (`ternary_rows8`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tq2_0_rows8(nb: usize, w: *const u8, row_bytes: usize, x: *const u8, out: &mut [f32; 8]) {
    ternary_rows8::<false>(nb, w, row_bytes, x, out)
}

/// TQ1_0 x Q8_K as ggml_vec_dot_tq1_0_q8_K (AVX2).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tq1_0<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
    ternary::<true, T>(nb, w, x, out)
}

/// TQ2_0 x Q8_K as ggml_vec_dot_tq2_0_q8_K (AVX2).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tq2_0<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
    ternary::<false, T>(nb, w, x, out)
}
