//! NVFP4 x Q8_0 on AVX2, the arithmetic of ggml_vec_dot_nvfp4_q8_0 (`scalar::nvfp4`, the
//! specification): the block decoding shared by the T-token kernel (`x86::nvfp4`) and the
//! eight-row one-token kernel here.
//!
//! SAFETY (whole module): callers pass whole blocks readable at every pointer (checked by the
//! safe wrappers in `simd::mod`) and call these only on CPUs with AVX2, FMA and F16C (checked
//! by the dispatch).

// The kernels' contract is the module's SAFETY paragraph above.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::x86::{f16x8, hsum_ps, loadu, prefetch_next_rows};
use crate::scalar::nvfp4::{ue4m3_to_f32_half, NVFP4_BYTES};

const Q8_0_BYTES: usize = 34;

/// The doubled E2M1 levels as a byte table for `_mm256_shuffle_epi8` (both lanes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn level_table() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(crate::scalar::legacy::KVALUES_MXFP4.as_ptr() as *const __m128i))
}

/// The 32 levels of half `h` of the block at `bw` in element order: sub-block 2h's 16 (its
/// bytes' low nibbles, then their high ones) in the low lane, 2h + 1's in the high one. Each
/// 64-bit group of nibble bytes is copied twice and the copy shifted by 4 bits, so that
/// masking keeps the low nibbles of one and the high nibbles of the other.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn half_levels(bw: *const u8, h: usize, table: __m256i) -> __m256i {
    let bytes = _mm256_castsi128_si256(_mm_loadu_si128(bw.add(4 + 16 * h) as *const __m128i));
    let doubled = _mm256_permute4x64_epi64::<0b01_01_00_00>(bytes);
    let nibbles = _mm256_and_si256(_mm256_srlv_epi64(doubled, _mm256_setr_epi64x(0, 4, 0, 4)), _mm256_set1_epi8(0x0f));
    _mm256_shuffle_epi8(table, nibbles)
}

/// Half `h`'s sub-block scales: lanes 0-3 sub-block 2h's, lanes 4-7 sub-block 2h + 1's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn half_scales(bw: *const u8, h: usize) -> __m256 {
    _mm256_set_m128(_mm_set1_ps(ue4m3_to_f32_half(*bw.add(2 * h + 1))), _mm_set1_ps(ue4m3_to_f32_half(*bw.add(2 * h))))
}

/// The eight i32 lanes of 32 signed levels times 32 activation quants, through the sign
/// trick of ggml's `mul_sum_i8_pairs_float` (the same lanes, -128 included).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn signed_lanes(levels: __m256i, q: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(levels, levels), _mm256_sign_epi8(q, levels));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// The four sub-block scales of the block at `bw` (ue4m3, as ggml_ue4m3_to_fp32: halved) in
/// vector arithmetic: the byte's low seven bits moved to an f32's exponent and mantissa fields
/// (exponent bias 7 for 127) and scaled by 2^119, exact for the normal and the subnormal
/// codes alike; 0x7f (NaN) gives 0 as in ggml, and bit 7 is ignored as there.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_scales(bw: *const u8) -> __m128 {
    let bytes = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(std::ptr::read_unaligned(bw as *const i32)));
    let fields = _mm_and_si128(_mm_slli_epi32::<20>(bytes), _mm_set1_epi32(0x7f << 20));
    let value = _mm_mul_ps(_mm_castsi128_ps(fields), _mm_castsi128_ps(_mm_set1_epi32((127 + 119) << 23)));
    _mm_andnot_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(bytes, _mm_set1_epi32(0x7f))), value)
}

/// Lanes of the eight-row kernel's sums: its lane j holds ggml's lane `PERMUTED_LANES[j]` (a
/// permutation that is its own inverse), see `nvfp4_rows8`.
const PERMUTED_LANES: [i32; 8] = [0, 1, 4, 5, 2, 3, 6, 7];

/// Eight consecutive NVFP4 rows (row r at w + r * row_bytes) times one Q8_0 activation row,
/// each row's accumulator as ggml_vec_dot_nvfp4_q8_0 computes it (`acc = fma(d_w * d_x,
/// lanes, acc)` per half block, `hsum_float_8`): the same bits as the one-row kernel, with
/// the work that does not depend on the row done once for the eight rows:
/// - a block's 32 nibble bytes are split into low and high nibbles as they lie, and the
///   lanes of the two halves taken 128 bits from each: lane j of a half holds ggml's lane
///   `PERMUTED_LANES[j]`, so the activation's quants are permuted once (64-bit groups) to
///   meet them and the accumulators are put back in ggml's order before the sum;
/// - levels are made unsigned by an offset of 12 (`maddubs` takes unsigned bytes): the
///   lanes are the products' minus 12 times the activation's lane sums, computed once. For
///   the quantizer's activations (-127..127) these are the lanes of ggml's sign trick;
/// - the four ue4m3 scales are converted in one vector (`block_scales`) and multiplied by
///   the activation's scales together (ggml's scalar products, the same roundings).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn nvfp4_rows8(nb: usize, w: *const u8, row_bytes: usize, x: *const u8, out: &mut [f32; 8]) {
    let offset = _mm256_set1_epi8(12);
    let table = _mm256_castsi256_si128(_mm256_add_epi8(level_table(), offset));
    let (nibble, ones) = (_mm_set1_epi8(0x0f), _mm256_set1_epi16(1));
    let mut acc = [_mm256_setzero_ps(); 8];
    for i in 0..nb {
        prefetch_next_rows(w, row_bytes, NVFP4_BYTES, i);
        let bx = x.add(2 * i * Q8_0_BYTES);
        let q = [0, 1].map(|h| _mm256_permute4x64_epi64::<0b11_01_10_00>(loadu(bx.add(h * Q8_0_BYTES + 2))));
        let offsets = q.map(|q| _mm256_madd_epi16(_mm256_maddubs_epi16(offset, q), ones));
        let dx = {
            let halves = std::ptr::read_unaligned(bx as *const u16) as i32 | (std::ptr::read_unaligned(bx.add(Q8_0_BYTES) as *const u16) as i32) << 16;
            // [dx0, dx0, dx1, dx1]: the activation block of each sub-block's scale.
            _mm_cvtph_ps(_mm_unpacklo_epi16(_mm_cvtsi32_si128(halves), _mm_cvtsi32_si128(halves)))
        };
        for (r, acc) in acc.iter_mut().enumerate() {
            let bw = w.add(r * row_bytes + i * NVFP4_BYTES);
            let products = _mm_mul_ps(block_scales(bw), dx);
            let both = _mm256_set_m128(products, products);
            // Half h's scales by lane, in the lanes' pattern [a, a, b, b, a, a, b, b] (a, b
            // the products of sub-blocks 2h and 2h + 1).
            let scales = [_mm256_shuffle_ps::<0b01_01_00_00>(both, both), _mm256_shuffle_ps::<0b11_11_10_10>(both, both)];
            for h in 0..2 {
                // In 128 bits, then one insert: the cross-lane permutes this replaces are
                // the slowest operations on CPUs with 128-bit vector units.
                let bytes = _mm_loadu_si128(bw.add(4 + 16 * h) as *const __m128i);
                let low = _mm_shuffle_epi8(table, _mm_and_si128(bytes, nibble));
                let high = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(bytes), nibble));
                let levels = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(low), high);
                let sums = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(levels, q[h]), ones), offsets[h]);
                *acc = _mm256_fmadd_ps(scales[h], _mm256_cvtepi32_ps(sums), *acc);
            }
        }
    }
    let lanes = _mm256_loadu_si256(PERMUTED_LANES.as_ptr() as *const __m256i);
    for (o, acc) in out.iter_mut().zip(acc) {
        *o = hsum_ps(_mm256_permutevar8x32_ps(acc, lanes));
    }
}

/// Two NVFP4 rows times four Q8_0 activation rows: out[r][t] bit for bit the row dot of
/// row r and token t (one accumulator each, as the four-token kernel `x86::nvfp4`), each
/// half block decoded once for the four tokens and each activation scale converted once
/// for the two rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn nvfp4_2x4(nb: usize, w: [*const u8; 2], x: [*const u8; 4], out: &mut [[f32; 4]; 2]) {
    let table = level_table();
    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
    for i in 0..nb {
        for h in 0..2 {
            let bw = [w[0].add(i * NVFP4_BYTES), w[1].add(i * NVFP4_BYTES)];
            let levels = [half_levels(bw[0], h, table), half_levels(bw[1], h, table)];
            let dw = [half_scales(bw[0], h), half_scales(bw[1], h)];
            for t in 0..4 {
                let bx = x[t].add((2 * i + h) * Q8_0_BYTES);
                let (dx, q) = (f16x8(bx), loadu(bx.add(2)));
                for r in 0..2 {
                    let lanes = signed_lanes(levels[r], q);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), _mm256_cvtepi32_ps(lanes), acc[r][t]);
                }
            }
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        for (o, acc) in o.iter_mut().zip(acc) {
            *o = hsum_ps(acc);
        }
    }
}
