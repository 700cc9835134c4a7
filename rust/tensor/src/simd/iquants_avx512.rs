//! AVX-512 VNNI kernels of the i-quants against Q8_K activations, bit for bit those of the
//! AVX2 level (`iquants_avx2`, whose decoding they share) and so of `scalar::iquants`:
//! - the one-row kernels (one token, and four): `iquants_avx2::iq_dot_kernels` stamped with
//!   this level's features, each group-scale multiply and add fused into one `vpdpwssd`;
//! - the octet product (many tokens): the octets `iquants_avx2::decode_octet_iq` writes,
//!   summed by `vpdpbusd` (see `octet_sums_iq`).
//!
//! The vectors stay 256 bits wide: on Zen 4 a 512-bit operation takes two 256-bit slots, so
//! the gain is in the fused multiply-adds, and the octet layout stays that of the AVX2 level.
//!
//! SAFETY (whole module): callers pass `nb` whole blocks readable at `w` and every `x[t]`
//! (checked by the safe wrappers in `simd::mod`) and call these only on CPUs with AVX-512
//! F, BW, VL and VNNI and BMI2 (checked by the dispatch).

// The kernels' contract is the module's SAFETY paragraph above.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::iquants_avx2::{block_signs, iq1_grid4, iq1_m_sub_block, iq2_s_indices, kind, sub_vectors, IQ_OCTET_BYTES, TILED, VEC_DOT};
use super::x86::{f16_1, hsum_epi32, hsum_ps, loadu, scale_halves};
use crate::scalar::iquants::{iq1_m_d, iq1_m_scales16, iq1_s_scale_sign, IqKind, IQ1_M_BYTES, IQ1_S_BYTES};

/// `acc + madd(p, scales)` in one instruction (the same exact i32 lanes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn madd_add(acc: __m256i, p: __m256i, scales: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, p, scales)
}

/// The four 11-bit IQ1 grid indices of an octet group: the index bytes at qs (u32) as the
/// low bytes of four u16 lanes and the 3-bit high parts (`high`'s bits in `mask`) above
/// them, deposited by `pdep` (fast on every CPU with AVX-512; microcoded on Zen 1 to 3, which
/// run the AVX2 level's shifts).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn iq1_indices(qs: *const u8, high: u64, mask: u64) -> [usize; 4] {
    let packed = _pdep_u64(std::ptr::read_unaligned(qs as *const u32) as u64, 0x00ff_00ff_00ff_00ff) | _pdep_u64(high, mask);
    [packed as u16 as usize, (packed >> 16) as u16 as usize, (packed >> 32) as u16 as usize, (packed >> 48) as usize]
}

/// `iquants_avx2::iq1_s_grid` with the indices from `iq1_indices` (IQ1_M keeps the AVX2
/// level's `iq1_m_sub_block`: with `pdep` its one-token product measured 35 % slower).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn iq1_s_grid(b: *const u8, ib: usize) -> __m256i {
    let qh = std::ptr::read_unaligned(b.add(34 + 2 * ib) as *const u16) as u64;
    iq1_grid4(iq1_indices(b.add(2 + 4 * ib), qh, 0x0700_0700_0700_0700))
}

super::iquants_avx2::iq_dot_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2");

/// Whether an octet kind has one scale per 32-element sub-block (both of its groups' scales
/// equal: IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S), so that a sub-block's products are summed whole
/// before the multiply; IQ2_XS, IQ2_S and IQ1_M scale each 16 elements.
pub const fn scale_per_32(kind: u8) -> bool {
    matches!(kind, 0 | 3 | 4 | 5)
}

/// `iquants_avx2::octet_sums_iq` with VNNI, the same octets and biased activations: each
/// group's (PER32: sub-block's) four-byte products against a token's broadcast biased bytes
/// summed by `vpdpbusd` straight into i32 (at most 32 * 255 * 62 in magnitude: exact), then
/// times the row's odd scale (`vpmulld`) into the block's sum: the same exact isum, then
/// the same float steps (`r = float(isum - bias) * d`, `acc = fma(r, d_x, acc)`), so every
/// output is bit for bit llama.cpp's tiled product (`scalar::iquants::tiled`).
/// out[(4 q + t) * ldo + r]: row r times token t of quad q.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn octet_sums_iq<const Q: usize, const PER32: bool>(
    nsb: usize, octet: *const u8, x: [[*const u8; 4]; Q], biased: [[*const u8; 4]; Q], out: *mut f32, ldo: usize,
) {
    // The four-byte steps (k: bytes 4k..4k + 4 of the block) one scale covers.
    let span = if PER32 { 8 } else { 4 };
    for q in 0..Q {
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in 0..nsb {
            let ob = octet.add(i * IQ_OCTET_BYTES);
            let mut isum = [_mm256_setzero_si256(); 4];
            for first in (0..64).step_by(span) {
                // The group's scale vector holds row r's scale in both i16 halves of dword r.
                let scale = _mm256_srli_epi32::<16>(loadu(ob.add(2048 + 32 * (first / 4))));
                // Two sums a token (even and odd k): eight independent chains of `vpdpbusd`.
                let mut part = [[_mm256_setzero_si256(); 4]; 2];
                for k in first..first + span {
                    // Chunk k / 8's vector k % 8: 256 (k / 8) + 32 (k % 8) = 32 k.
                    let wk = loadu(ob.add(32 * k));
                    for t in 0..4 {
                        let xk = std::ptr::read_unaligned(biased[q][t].add(256 * i + 4 * k) as *const i32);
                        part[k % 2][t] = _mm256_dpbusd_epi32(part[k % 2][t], _mm256_set1_epi32(xk), wk);
                    }
                }
                for t in 0..4 {
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(_mm256_add_epi32(part[0][t], part[1][t]), scale));
                }
            }
            let corr = loadu(ob.add(2560));
            let d = _mm256_loadu_ps(ob.add(2592) as *const f32);
            for t in 0..4 {
                let r = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], corr)), d);
                acc[t] = _mm256_fmadd_ps(r, _mm256_broadcast_ss(&*(x[q][t].add(i * 292) as *const f32)), acc[t]);
            }
        }
        for t in 0..4 {
            _mm256_storeu_ps(out.add((4 * q + t) * ldo), acc[t]);
        }
    }
}

/// The 32 bytes at p (low half) and at p + apart (high half).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn side_by_side(p: *const u8, apart: usize) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(loadu(p)), loadu(p.add(apart)))
}

/// `octet_sums_iq` for two octets side by side (the octet `decode_octet_iq` wrote at `octet`
/// and the next one, `octet_bytes` on: sixteen consecutive rows), each vector holding the
/// sixteen rows (the first octet's in the low 256 bits) against a token's broadcast bytes:
/// half the multiplies of two `octet_sums_iq` calls, 64 products each. The same exact isum
/// per output and the same float steps, so the same bits. out[(4 q + t) * ldo + r]: row r
/// (0..16) times token t of quad q.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn octet_pair_sums_iq<const Q: usize, const PER32: bool>(
    nsb: usize, octet: *const u8, octet_bytes: usize, x: [[*const u8; 4]; Q], biased: [[*const u8; 4]; Q], out: *mut f32, ldo: usize,
) {
    let span = if PER32 { 8 } else { 4 };
    let both = |i: usize, at: usize| side_by_side(octet.add(i * IQ_OCTET_BYTES + at), octet_bytes);
    for q in 0..Q {
        let mut acc = [_mm512_setzero_ps(); 4];
        for i in 0..nsb {
            let mut isum = [_mm512_setzero_si512(); 4];
            for first in (0..64).step_by(span) {
                let scale = _mm512_srli_epi32::<16>(both(i, 2048 + 32 * (first / 4)));
                let mut part = [[_mm512_setzero_si512(); 4]; 2];
                for k in first..first + span {
                    let wk = both(i, 32 * k);
                    for t in 0..4 {
                        let xk = std::ptr::read_unaligned(biased[q][t].add(256 * i + 4 * k) as *const i32);
                        part[k % 2][t] = _mm512_dpbusd_epi32(part[k % 2][t], _mm512_set1_epi32(xk), wk);
                    }
                }
                for t in 0..4 {
                    isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(_mm512_add_epi32(part[0][t], part[1][t]), scale));
                }
            }
            let corr = both(i, 2560);
            let d = _mm512_castsi512_ps(both(i, 2592));
            for t in 0..4 {
                let r = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[t], corr)), d);
                acc[t] = _mm512_fmadd_ps(r, _mm512_set1_ps(*(x[q][t].add(i * 292) as *const f32)), acc[t]);
            }
        }
        for t in 0..4 {
            _mm512_storeu_ps(out.add((4 * q + t) * ldo), acc[t]);
        }
    }
}
