//! AVX-512 VNNI kernels of the ternary types TQ1_0 and TQ2_0 against Q8_K activations, bit
//! for bit those of the AVX2 level (`ternary_avx2`) and so of `scalar::ternary` (ggml's AVX2
//! `ggml_vec_dot_tq*_q8_K` arithmetic: eight i32 lanes per super-block, element p in lane
//! (p % 32) / 4, minus the activation's group sums 2k and 2k + 1 in lane k, one FMA per lane
//! and super-block, `hsum_float_8`). The lanes are exact integers, so any instruction that
//! sums the same products gives them; only the float steps are repeated in order.
//! - one token (and four, and eight rows): a super-block's trits decoded two 32-element
//!   chunks to a 512-bit vector, summed against the activation's 64 contiguous bytes by
//!   `vpdpbusd` (the unsigned trits times the signed quants), the two halves added;
//! - many tokens (`octet_sums_tq`, `octet_pair_sums_tq`): eight (sixteen) rows decoded once
//!   per product into trits transposed by four-byte groups (`decode_octet_tq`), each token's
//!   broadcast four-byte groups multiplied by `vpdpbusd` into eight accumulators, one per
//!   lane k, for all the rows at once; the eight lanes' FMAs and `hsum_float_8` are then
//!   vertical operations on vectors of rows.
//!
//! SAFETY (whole module): callers pass `nb` whole blocks readable at `w` and every `x[t]`
//! (checked by the safe wrappers in `simd::mod`) and call these only on CPUs with AVX-512
//! F, BW, VL and VNNI (checked by the dispatch).

// The kernels' contract is the module's SAFETY paragraph above.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::x86::{f16_1, hsum_ps, loadu};

/// Bytes of one TQ1_0 and one TQ2_0 block, and of a Q8_K block.
const TQ1_BYTES: usize = 54;
const TQ2_BYTES: usize = 66;
const Q8K_BYTES: usize = 292;

/// The trits (0, 1, 2) of 64 bytes that each hold one in their top bits as a fraction of
/// 256: `ternary_avx2::top_trits` on 512 bits, as instructions for the same reason (LLVM
/// widens the averages).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn top_trits(q: __m512i) -> __m512i {
    let t: __m512i;
    // A named scratch output: `out(zmm_reg) _` gets an invalid register name from LLVM.
    let _half: __m512i;
    // SAFETY: register arithmetic only (AVX-512 BW, enabled here); no memory, no flags.
    std::arch::asm!(
        "vpsubusb {t}, {q}, {one}",
        "vpavgb {half}, {t}, {zero}",
        "vpavgb {t}, {t}, {half}",
        "vpsrlw {t}, {t}, 6",
        "vpandq {t}, {t}, {three}",
        q = in(zmm_reg) q,
        one = in(zmm_reg) _mm512_set1_epi8(1),
        zero = in(zmm_reg) _mm512_setzero_si512(),
        three = in(zmm_reg) _mm512_set1_epi8(3),
        t = out(zmm_reg) t,
        half = out(zmm_reg) _half,
        options(pure, nomem, nostack, preserves_flags),
    );
    t
}

/// Each byte times 9 (mod 256): (b << 3 within the byte) + b.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn times9(b: __m512i) -> __m512i {
    _mm512_add_epi8(_mm512_and_si512(_mm512_slli_epi16::<3>(b), _mm512_set1_epi8(-8)), b)
}

/// Bytes of the 128-bit lanes 1 and 3, and of the upper 256 bits.
const ODD_LANES: u64 = 0xffff_0000_ffff_0000;
const HIGH_HALF: u64 = 0xffff_ffff_0000_0000;

/// The 256 trits of a TQ1_0 block in element order, two 32-element chunks a vector (the
/// chunks of `ternary_avx2::tq1_0_trits`: bytes 0..31 times 1, 3, 9, 27, 81; bytes 32..47
/// times 1, 3, 9, 27, 81 two a chunk; the four bytes 48..51 times 1, 3, 9, 27).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tq1_0_trits(b: *const u8) -> [__m512i; 4] {
    let q = _mm512_broadcast_i64x4(loadu(b));
    let q01 = _mm512_mask_add_epi8(q, HIGH_HALF, q, _mm512_add_epi8(q, q));
    let q23 = times9(q01);
    let q4 = times9(q23);
    // r0 in each 128-bit lane, times 1, 3, 9, 27 (chunks 5 and 6), then 81 in lane 2.
    let r = _mm512_broadcast_i32x4(_mm_loadu_si128(b.add(32) as *const __m128i));
    let r = _mm512_mask_add_epi8(r, ODD_LANES, r, _mm512_add_epi8(r, r));
    let r = _mm512_mask_mov_epi8(r, HIGH_HALF, times9(r));
    let r81 = _mm512_extracti32x4_epi32::<2>(times9(r));
    let qh = _mm256_cvtepu8_epi16(_mm_set1_epi32(std::ptr::read_unaligned(b.add(48) as *const i32)));
    let qh = _mm256_and_si256(_mm256_mullo_epi16(qh, _mm256_set_epi16(27, 27, 27, 27, 9, 9, 9, 9, 3, 3, 3, 3, 1, 1, 1, 1)), _mm256_set1_epi16(0xff));
    let r5 = _mm_packus_epi16(_mm256_castsi256_si128(qh), _mm256_extracti128_si256::<1>(qh));
    let r45 = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(r81), r5);
    let chunks45 = _mm512_inserti64x4::<1>(q4, _mm512_castsi512_si256(r));
    let chunks67 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm512_extracti64x4_epi64::<1>(r)), r45);
    [top_trits(q01), top_trits(q23), top_trits(chunks45), top_trits(chunks67)]
}

/// The 256 2-bit values of a TQ2_0 block in element order, two chunks a vector: chunk c < 4
/// is bits 2c of bytes 0..31, chunk 4 + c bits 2c of bytes 32..63.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tq2_0_trits(b: *const u8) -> [__m512i; 4] {
    let (h0, h1) = (_mm512_broadcast_i64x4(loadu(b)), _mm512_broadcast_i64x4(loadu(b.add(32))));
    let (s01, s23) = (_mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0), _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4));
    let three = _mm512_set1_epi8(3);
    let bits = |h: __m512i, s: __m512i| _mm512_and_si512(_mm512_srlv_epi64(h, s), three);
    [bits(h0, s01), bits(h0, s23), bits(h1, s01), bits(h1, s23)]
}

/// The trits of a block of TQ1_0 (`TQ1`) or TQ2_0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_trits<const TQ1: bool>(b: *const u8) -> [__m512i; 4] {
    if TQ1 { tq1_0_trits(b) } else { tq2_0_trits(b) }
}

/// Minus the group sums 2k + 2k + 1 of a Q8_K block (bx) in lane k.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn minus_group_pairs(bx: *const u8) -> __m256i {
    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(loadu(bx.add(260)), _mm256_set1_epi16(1)))
}

/// One super-block's eight lanes for one token: the trits against the quants, the two
/// chunks of each vector in its two halves, added, minus the group sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_lanes(trits: &[__m512i; 4], bx: *const u8) -> __m256i {
    let mut sum = _mm512_zextsi256_si512(minus_group_pairs(bx));
    for (m, t) in trits.iter().enumerate() {
        sum = _mm512_dpbusd_epi32(sum, *t, _mm512_loadu_si512(bx.add(4 + 64 * m) as *const _));
    }
    _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64::<1>(sum))
}

/// The eight float lanes of one weight row against T activation rows, before their
/// horizontal sums (`ternary_avx2::row_lanes`'s float steps).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn row_lanes<const TQ1: bool, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T]) -> [__m256; T] {
    let bytes = if TQ1 { TQ1_BYTES } else { TQ2_BYTES };
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..nb {
        let bw = w.add(i * bytes);
        let trits = block_trits::<TQ1>(bw);
        let dw = _mm256_set1_ps(f16_1(bw.add(bytes - 2)));
        for t in 0..T {
            let bx = x[t].add(i * Q8K_BYTES);
            let d = _mm256_mul_ps(_mm256_set1_ps(std::ptr::read_unaligned(bx as *const f32)), dw);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_lanes(&trits, bx)), d, acc[t]);
        }
    }
    acc
}

/// The dot of one weight row with T activation rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn ternary<const TQ1: bool, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
    let acc = row_lanes::<TQ1, T>(nb, w, x);
    for t in 0..T {
        out[t] = hsum_ps(acc[t]);
    }
}

/// TQ1_0 x Q8_K as ggml_vec_dot_tq1_0_q8_K (AVX2 arithmetic).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn tq1_0<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
    ternary::<true, T>(nb, w, x, out)
}

/// TQ2_0 x Q8_K as ggml_vec_dot_tq2_0_q8_K (AVX2 arithmetic).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn tq2_0<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
    ternary::<false, T>(nb, w, x, out)
}

/// out[r] = weight row r (eight consecutive rows of `row_bytes`) times one activation row,
/// bit for bit `ternary::<TQ1, 1>` of each: the rows one after another (one memory stream),
/// their eight horizontal sums done together (`ternary_avx2::hsums8`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn ternary_rows8<const TQ1: bool>(nb: usize, w: *const u8, row_bytes: usize, x: *const u8, out: &mut [f32; 8]) {
    let mut acc = [_mm256_setzero_ps(); 8];
    for (r, a) in acc.iter_mut().enumerate() {
        *a = row_lanes::<TQ1, 1>(nb, w.add(r * row_bytes), [x])[0];
    }
    _mm256_storeu_ps(out.as_mut_ptr(), super::ternary_avx2::hsums8(&acc));
}

/// Eight TQ1_0 rows x one Q8_K row (`ternary_rows8`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn tq1_0_rows8(nb: usize, w: *const u8, row_bytes: usize, x: *const u8, out: &mut [f32; 8]) {
    ternary_rows8::<true>(nb, w, row_bytes, x, out)
}

/// Eight TQ2_0 rows x one Q8_K row (`ternary_rows8`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn tq2_0_rows8(nb: usize, w: *const u8, row_bytes: usize, x: *const u8, out: &mut [f32; 8]) {
    ternary_rows8::<false>(nb, w, row_bytes, x, out)
}

/// Bytes `decode_octet_tq` writes per super-block of eight rows: 32 vectors of trits
/// (vector m: row r's trits 8m..8m + 8, the four-byte groups 2m and 2m + 1, in dwords 2r and
/// 2r + 1), then the rows' d as f32, each twice (row r in lanes 2r and 2r + 1).
pub const TQ_OCTET_BYTES: usize = 32 * 64 + 16 * 4;

/// Decodes nb super-blocks of eight consecutive rows of TQ1_0 (`TQ1`) or TQ2_0 (row r at
/// w + r * row_bytes) into `TQ_OCTET_BYTES` a super-block at dst, for `octet_sums_tq`. Done
/// once per product and row range.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn decode_octet_tq<const TQ1: bool>(nb: usize, w: *const u8, row_bytes: usize, dst: *mut u8) {
    let bytes = if TQ1 { TQ1_BYTES } else { TQ2_BYTES };
    let mut trits = [0u64; 32];
    for b in 0..nb {
        let block = |r: usize| w.add(r * row_bytes + b * bytes);
        let out = dst.add(b * TQ_OCTET_BYTES);
        for r in 0..8 {
            for (m, v) in block_trits::<TQ1>(block(r)).iter().enumerate() {
                _mm512_storeu_si512(trits.as_mut_ptr().add(8 * m) as *mut _, *v);
            }
            // Eight bytes (two groups) of the row into each vector, at qword r.
            for (m, t) in trits.iter().enumerate() {
                std::ptr::write_unaligned(out.add(64 * m + 8 * r) as *mut u64, *t);
            }
        }
        let d: [f32; 16] = std::array::from_fn(|l| f16_1(block(l / 2).add(bytes - 2)));
        _mm512_storeu_ps(out.add(32 * 64) as *mut f32, _mm512_loadu_ps(d.as_ptr()));
    }
}

/// What the octet kernel needs of four Q8_K activation rows x[t] of nb blocks, per block b
/// and token t: minus the group sums 2k and 2k + 1 at corr[(4 b + t) * 8 + k].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn tq_tile_factors(nb: usize, x: [*const u8; 4], corr: *mut i32) {
    for b in 0..nb {
        for (t, xt) in x.iter().enumerate() {
            _mm256_storeu_si256(corr.add((4 * b + t) * 8) as *mut __m256i, minus_group_pairs(xt.add(b * Q8K_BYTES)));
        }
    }
}

/// Tokens whose products share each load of an octet's trits in `octet_sums_tq` (their 16
/// vector accumulators fill half the registers).
const TOKENS_TOGETHER: usize = 4;

/// Eight TQ1_0 or TQ2_0 rows (an octet from `decode_octet_tq`) times 4 * Q Q8_K activation
/// rows (`tq_tile_factors` of quad q in corr[q]), bit for bit the row dot: out[(4 q + t) *
/// ldo + r] is row r times token t of quad q. Vector m's groups 2m and 2m + 1 against the
/// token's eight bytes there broadcast (`vpdpbusd`) go to ggml lanes 2a and 2a + 1, a = m % 4:
/// four accumulators per token hold the eight lanes of the eight rows, pairs of lanes side
/// by side, so the lane FMAs and `hsum_float_8` are vertical operations but for the last
/// addition of each row (odd lanes onto even).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn octet_sums_tq<const Q: usize>(nb: usize, octet: *const u8, x: [[*const u8; 4]; Q], corr: [*const i32; Q], out: *mut f32, ldo: usize) {
    const T: usize = TOKENS_TOGETHER;
    let bcast_q = |p: *const u8| _mm512_set1_epi64(std::ptr::read_unaligned(p as *const i64));
    for q in 0..Q {
        for first in (0..4).step_by(T) {
            // acc[t][a]: ggml lanes 2a and 2a + 1 of each row, as floats across blocks.
            let mut acc = [[_mm512_setzero_ps(); 4]; T];
            for i in 0..nb {
                let ob = octet.add(i * TQ_OCTET_BYTES);
                let bx: [*const u8; T] = std::array::from_fn(|t| x[q][first + t].add(i * Q8K_BYTES));
                let mut lanes = [[_mm512_setzero_si512(); 4]; T];
                for (t, lanes) in lanes.iter_mut().enumerate() {
                    let c = corr[q].add((4 * i + first + t) * 8) as *const u8;
                    for (a, l) in lanes.iter_mut().enumerate() {
                        *l = bcast_q(c.add(8 * a));
                    }
                }
                for c in 0..8 {
                    for a in 0..4 {
                        let m = 4 * c + a;
                        let wm = _mm512_loadu_si512(ob.add(64 * m) as *const _);
                        for t in 0..T {
                            lanes[t][a] = _mm512_dpbusd_epi32(lanes[t][a], wm, bcast_q(bx[t].add(4 + 8 * m)));
                        }
                    }
                }
                let dw = _mm512_loadu_ps(ob.add(32 * 64) as *const f32);
                for t in 0..T {
                    let d = _mm512_mul_ps(_mm512_set1_ps(std::ptr::read_unaligned(bx[t] as *const f32)), dw);
                    for a in 0..4 {
                        acc[t][a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes[t][a]), d, acc[t][a]);
                    }
                }
            }
            for (t, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add((4 * q + first + t) * ldo), super::q1q2_avx512::hsum8_rows(acc));
            }
        }
    }
}
