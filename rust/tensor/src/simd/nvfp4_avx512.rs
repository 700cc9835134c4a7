//! AVX-512 VNNI product of many tokens for NVFP4 against Q8_0 activations, bit for bit
//! `scalar::nvfp4` (ggml_vec_dot_nvfp4_q8_0 on AVX2): per 32-element half block eight i32
//! lanes (element p in lane p / 4) through ggml's sign trick, each lane times its sub-block's
//! scale times the activation's d (`fma(d_w * d_x, lanes, acc)`), `hsum_float_8` at the end.
//!
//! Eight rows are decoded once per product (`decode_octet_nvfp4`): vector m of a block holds
//! each row's levels of elements 8m..8m + 8 (row r at qword r), ggml lanes 2a and 2a + 1 of
//! half m / 4 (a = m % 4), so that one `vpdpbusd` of the levels' magnitudes against the
//! token's eight quants there, broadcast and negated where the level is negative (in 8
//! bits, as `vpsignb`), gives those two lanes of the eight rows; the lane FMAs and the
//! horizontal sums are then vertical operations (`q1q2_avx512::hsum8_rows`).
//!
//! SAFETY (whole module): callers pass `nb` whole blocks readable at every pointer (checked by
//! `simd::SumsGemm`) and call these only on CPUs with AVX-512 F, BW, VL and VNNI (checked by
//! the dispatch).

// The kernels' contract is the module's SAFETY paragraph above.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::q1q2_avx512::hsum8_rows;
use super::x86::loadu;
use crate::scalar::nvfp4::{ue4m3_to_f32_half, NVFP4_BYTES};

const Q8_0_BYTES: usize = 34;

/// Bytes `decode_octet_nvfp4` writes per block of eight rows: eight vectors of levels (vector
/// m: row r's levels of elements 8m..8m + 8 at qword r), then per sub-block s the rows'
/// scales (ue4m3, halved, as ggml converts them) as f32, each twice (row r in lanes 2r and
/// 2r + 1).
pub const NV_OCTET_BYTES: usize = 8 * 64 + 4 * 64;

/// Decodes nb blocks of eight consecutive NVFP4 rows (row r at w + r * row_bytes) into
/// `NV_OCTET_BYTES` a block at dst, for `octet_sums_nvfp4`. Sub-block s's elements 0..8 are
/// the low nibbles of its eight bytes, 8..16 the high ones: vectors 2s and 2s + 1.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn decode_octet_nvfp4(nb: usize, w: *const u8, row_bytes: usize, dst: *mut u8) {
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(crate::scalar::legacy::KVALUES_MXFP4.as_ptr() as *const __m128i));
    let nibble = _mm256_set1_epi8(0x0f);
    let mut levels = [[0u64; 4]; 2];
    for b in 0..nb {
        let block = |r: usize| w.add(r * row_bytes + b * NVFP4_BYTES);
        let out = dst.add(b * NV_OCTET_BYTES);
        for r in 0..8 {
            let bytes = loadu(block(r).add(4));
            let low = _mm256_shuffle_epi8(table, _mm256_and_si256(bytes, nibble));
            let high = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), nibble));
            _mm256_storeu_si256(levels[0].as_mut_ptr() as *mut __m256i, low);
            _mm256_storeu_si256(levels[1].as_mut_ptr() as *mut __m256i, high);
            for s in 0..4 {
                for (half, l) in levels.iter().enumerate() {
                    std::ptr::write_unaligned(out.add(64 * (2 * s + half) + 8 * r) as *mut u64, l[s]);
                }
            }
        }
        for s in 0..4 {
            let scales: [f32; 16] = std::array::from_fn(|l| ue4m3_to_f32_half(*block(l / 2).add(s)));
            _mm512_storeu_ps(out.add(8 * 64 + 64 * s) as *mut f32, _mm512_loadu_ps(scales.as_ptr()));
        }
    }
}

/// Eight NVFP4 rows (an octet from `decode_octet_nvfp4`, nb blocks) times 4 * Q Q8_0
/// activation rows, bit for bit the row dot: out[(4 q + t) * ldo + r] is row r times token t
/// of quad q. `d[q]`: the quad's Q8_0 scales as f32 (Q8_0 block b of token t at 4 b + t).
/// The four tokens of a quad share each vector's magnitudes and signs.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn octet_sums_nvfp4<const Q: usize>(nb: usize, octet: *const u8, x: [[*const u8; 4]; Q], d: [*const f32; Q], out: *mut f32, ldo: usize) {
    for q in 0..Q {
        let mut acc = [[_mm512_setzero_ps(); 4]; 4];
        for i in 0..nb {
            let ob = octet.add(i * NV_OCTET_BYTES);
            for h in 0..2 {
                let sub_scales = [0, 1].map(|k| _mm512_loadu_ps(ob.add(8 * 64 + 64 * (2 * h + k)) as *const f32));
                let mut scales = [[_mm512_setzero_ps(); 2]; 4];
                for (t, s) in scales.iter_mut().enumerate() {
                    let dx = _mm512_set1_ps(*d[q].add(4 * (2 * i + h) + t));
                    *s = [_mm512_mul_ps(sub_scales[0], dx), _mm512_mul_ps(sub_scales[1], dx)];
                }
                for a in 0..4 {
                    let levels = _mm512_loadu_si512(ob.add(64 * (4 * h + a)) as *const _);
                    let (magnitudes, negative) = (_mm512_abs_epi8(levels), _mm512_movepi8_mask(levels));
                    for t in 0..4 {
                        let xm = _mm512_set1_epi64(std::ptr::read_unaligned(x[q][t].add((2 * i + h) * Q8_0_BYTES + 2 + 8 * a) as *const i64));
                        let signed = _mm512_mask_sub_epi8(xm, negative, _mm512_setzero_si512(), xm);
                        let lanes = _mm512_dpbusd_epi32(_mm512_setzero_si512(), magnitudes, signed);
                        acc[t][a] = _mm512_fmadd_ps(scales[t][a / 2], _mm512_cvtepi32_ps(lanes), acc[t][a]);
                    }
                }
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.add((4 * q + t) * ldo), hsum8_rows(acc));
        }
    }
}
