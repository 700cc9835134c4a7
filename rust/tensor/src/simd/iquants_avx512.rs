//! AVX-512 VNNI kernels of the i-quants against Q8_K activations, bit for bit those of the
//! AVX2 level (`iquants_avx2`) and so of `scalar::iquants`:
//! - the one-row kernels (one token, and four): two sub-blocks a 512-bit vector, the signs
//!   applied to the activation by a masked subtract from the sign bits as they lie, the
//!   group scales multiplied and added by `vpdpwssd`, the grid indices built in vectors and
//!   looked up by scalar loads (`iquants_avx2::entry`: no gathers);
//! - the octet product (many tokens): the octets `iquants_avx2::decode_octet_iq` writes,
//!   summed by `vpdpbusd` (see `octet_sums_iq`), two of them interleaved so that one 512-bit
//!   load holds sixteen rows (`octet_pair_sums_iq`).
//!
//! SAFETY (whole module): callers pass `nb` whole blocks readable at `w` and every `x[t]`
//! (checked by the safe wrappers in `simd::mod`) and call these only on CPUs with AVX-512
//! F, BW, VL and VNNI and BMI2 (checked by the dispatch).

// The kernels' contract is the module's SAFETY paragraph above.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::iquants_avx2::{entry, even_signs, iq2_s_indices, kind, IQ_OCTET_BYTES, TILED, VEC_DOT};
use super::x86::{f16_1, hsum_epi32, hsum_ps, loadu};
use crate::scalar::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::scalar::iquants::{IqKind, IQ1_M_BYTES, IQ1_S_BYTES};

// ---------------------------------------------------------------- one-row kernels (1 to 4 tokens)
//
// 64 elements (two sub-blocks, a "pair") a 512-bit step: the pair's unsigned magnitudes,
// the mask of its negative elements (applied to the activation by one masked subtract, in
// place of the AVX2 level's sign vectors) and its four group scales by 128-bit quarter; per
// token `maddubs` and `vpdpwssd` give sixteen i32 lanes, lane m of a pair holding the lane
// m % 8 of sub-block 2p + m / 8 of the AVX2 level (element p in lane (p % 32) / 4); the two
// halves added at the block's end are that level's eight exact lanes, so the float steps
// after them, and the results, are the same bits.

/// The eight octets `octet(0..8)` as one vector (octet k in bytes 8k..8k + 8).
#[inline(always)]
unsafe fn octets8(octet: impl Fn(usize) -> u64) -> __m512i {
    let g = |k: usize| octet(k) as i64;
    _mm512_set_epi64(g(7), g(6), g(5), g(4), g(3), g(2), g(1), g(0))
}

/// Pair p's group scales from the block's sixteen scale bytes (group g in byte g, copied to
/// every 128-bit lane): quarter q's i16 lanes take byte 4p + q (index bytes with bit 7 set
/// give the zero high bytes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn pair_scales(scale_bytes: __m512i, p: usize) -> __m512i {
    let quarter = |q: u64| ((0x8000 + q) * 0x0001_0001_0001_0001) as i64;
    let pick = _mm512_set_epi64(quarter(3), quarter(3), quarter(2), quarter(2), quarter(1), quarter(1), quarter(0), quarter(0));
    _mm512_shuffle_epi8(scale_bytes, _mm512_add_epi16(pick, _mm512_set1_epi16(4 * p as i16)))
}

/// Sixteen scale values (group g in byte g) as the odd 2 s + 1, in every 128-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn odd_scale_bytes(s: __m128i) -> __m512i {
    _mm512_broadcast_i32x4(_mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1)))
}

/// Eight bytes of two 4-bit scales (sub-block ib's halves in the nibbles of byte ib) as the
/// sixteen group scales: group 2 ib + h is nibble h of byte ib.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn nibble_scales(p: *const u8) -> __m512i {
    let packed = _mm_loadl_epi64(p as *const __m128i);
    let nibble = _mm_set1_epi8(15);
    let (lo, hi) = (_mm_and_si128(packed, nibble), _mm_and_si128(_mm_srli_epi16(packed, 4), nibble));
    odd_scale_bytes(_mm_unpacklo_epi8(lo, hi))
}

/// Eight sub-block scales (the low bytes of `s`'s i32 lanes) as the sixteen group scales,
/// each twice.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn sub_block_scales(s: __m256i) -> __m512i {
    let bytes = _mm256_cvtepi32_epi8(s);
    odd_scale_bytes(_mm_unpacklo_epi8(bytes, bytes))
}

/// The eight aux words of IQ2_XXS or IQ3_XXS (per sub-block four 7-bit sign groups, the
/// scale in the top 4 bits): the completed sign bytes into `signs`, the group scales returned.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn aux_signs_scales(aux: __m256i, signs: &mut [u8; 32]) -> __m512i {
    // Group l (bits 7l..7l + 7) moved to byte l.
    let m = _mm256_set1_epi32(0x7f);
    let g0 = _mm256_and_si256(aux, m);
    let g1 = _mm256_and_si256(_mm256_slli_epi32(aux, 1), _mm256_slli_epi32(m, 8));
    let g2 = _mm256_and_si256(_mm256_slli_epi32(aux, 2), _mm256_slli_epi32(m, 16));
    let g3 = _mm256_and_si256(_mm256_slli_epi32(aux, 3), _mm256_slli_epi32(m, 24));
    let groups = _mm256_or_si256(_mm256_or_si256(g0, g1), _mm256_or_si256(g2, g3));
    _mm256_storeu_si256(signs.as_mut_ptr() as *mut __m256i, even_signs(groups));
    sub_block_scales(_mm256_srli_epi32::<28>(aux))
}

/// The two 256-bit halves of a sum added: each pair's two sub-blocks' lanes together.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn fold(s: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s))
}

/// IQ3_S's 64 9-bit grid indices of the block at b: byte qs[k] with bit k of the qh bytes
/// (a 64-bit mask) as the 9th.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn iq3_s_indices(b: *const u8, out: &mut [u16; 64]) {
    let high = std::ptr::read_unaligned(b.add(66) as *const u64);
    for half in 0..2 {
        let low = _mm512_cvtepu8_epi16(loadu(b.add(2 + 32 * half)));
        let index = _mm512_mask_add_epi16(low, (high >> (32 * half)) as __mmask32, low, _mm512_set1_epi16(256));
        _mm512_storeu_si512(out.as_mut_ptr().add(32 * half) as *mut _, index);
    }
}

/// IQ1_M's 32 11-bit grid indices of the block at b: index k is byte qs[k] with the low
/// three bits of nibble k % 2 of qh byte k / 2 above it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn iq1_m_indices(b: *const u8, out: &mut [u16; 32]) {
    let qh = _mm_loadu_si128(b.add(32) as *const __m128i);
    let seven = _mm_set1_epi8(7);
    let (lo, hi) = (_mm_and_si128(qh, seven), _mm_and_si128(_mm_srli_epi16(qh, 4), seven));
    // The high parts of indices 0..16 and 16..32, one a byte.
    let high = [_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)];
    for (h, high) in high.into_iter().enumerate() {
        let qs = _mm_loadu_si128(b.add(16 * h) as *const __m128i);
        _mm_storeu_si128(out.as_mut_ptr().add(16 * h) as *mut __m128i, _mm_unpacklo_epi8(qs, high));
        _mm_storeu_si128(out.as_mut_ptr().add(16 * h + 8) as *mut __m128i, _mm_unpackhi_epi8(qs, high));
    }
}

/// IQ1 grid octets (-1, 0, 1 bytes) as a pair's magnitudes and negative mask.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn iq1_magnitudes(grid: __m512i) -> (__m512i, __mmask64) {
    (_mm512_abs_epi8(grid), _mm512_movepi8_mask(grid))
}

/// What the pairs of a block are decoded from, computed once a block: the sixteen group
/// scales (`odd_scale_bytes`), the kinds' completed sign bytes (IQ2_XXS, IQ2_XS, IQ3_XXS;
/// IQ2_S and IQ3_S keep theirs in the block) and grid indices (IQ2_S, IQ3_S).
struct BlockState {
    scale_bytes: __m512i,
    signs: [u8; 32],
    indices: [u16; 64],
}

/// The `BlockState` of a block of one of `iquants_avx2::kind`'s five kinds
/// (`scalar::iquants::sub_block` is the specification).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn block_state<const KIND: u8>(b: *const u8) -> BlockState {
    let mut st = BlockState { scale_bytes: _mm512_setzero_si512(), signs: [0; 32], indices: [0; 64] };
    st.scale_bytes = match kind(KIND) {
        IqKind::Iq2Xxs => {
            // (index u32, aux u32) per sub-block: the odd dwords of 64 bytes.
            let odd_dwords = _mm256_set_epi32(7, 5, 3, 1, 7, 5, 3, 1);
            let first = _mm256_permutevar8x32_epi32(loadu(b.add(2)), odd_dwords);
            let second = _mm256_permutevar8x32_epi32(loadu(b.add(34)), odd_dwords);
            aux_signs_scales(_mm256_blend_epi32::<0xf0>(first, second), &mut st.signs)
        }
        IqKind::Iq2Xs => {
            // 32 u16: a 9-bit index, 7 sign bits.
            let groups = _mm512_cvtepi16_epi8(_mm512_srli_epi16::<9>(_mm512_loadu_si512(b.add(2) as *const _)));
            _mm256_storeu_si256(st.signs.as_mut_ptr() as *mut __m256i, even_signs(groups));
            nibble_scales(b.add(66))
        }
        IqKind::Iq2S => {
            iq2_s_indices(b, (&mut st.indices[..32]).try_into().unwrap());
            nibble_scales(b.add(74))
        }
        IqKind::Iq3Xxs => aux_signs_scales(loadu(b.add(66)), &mut st.signs),
        IqKind::Iq3S => {
            iq3_s_indices(b, &mut st.indices);
            // Four bytes of two sub-block scales: sub-block 2j + h in nibble h of byte j.
            let packed = _mm_cvtsi32_si128(std::ptr::read_unaligned(b.add(106) as *const i32));
            let nibble = _mm_set1_epi8(15);
            let per_sub_block = _mm_unpacklo_epi8(_mm_and_si128(packed, nibble), _mm_and_si128(_mm_srli_epi16(packed, 4), nibble));
            odd_scale_bytes(_mm_unpacklo_epi8(per_sub_block, per_sub_block))
        }
    };
    st
}

/// Pair p (elements 64p..64p + 64, sub-blocks 2p and 2p + 1) of a block of a grid kind: its
/// unsigned magnitudes and the mask of its negative elements (bit j of sign byte 8p + l:
/// element 8l + j, as the bytes lie). Always inlined into the kernels (whose features its
/// intrinsics then take): as a call of its own, four a block, it spilled every pair.
#[inline(always)]
unsafe fn grid_pair<const KIND: u8>(b: *const u8, st: &BlockState, p: usize) -> (__m512i, __mmask64) {
    // Stored indices read back one by one (see `iquants_avx2::sub_vectors`).
    let index = |k: usize| std::ptr::read_volatile(&st.indices[k]) as usize;
    let (grid, signs) = match kind(KIND) {
        // Octet k of the pair: sub-block 2p + k / 4, index byte k % 4.
        IqKind::Iq2Xxs => (octets8(|k| entry(&IQ2XXS_GRID, *b.add(2 + 16 * p + 8 * (k / 4) + k % 4) as usize)), st.signs.as_ptr()),
        IqKind::Iq2Xs => {
            let q = |k: usize| std::ptr::read_unaligned(b.add(2 + 2 * k) as *const u16) as usize & 511;
            (octets8(|k| entry(&IQ2XS_GRID, q(8 * p + k))), st.signs.as_ptr())
        }
        IqKind::Iq2S => (octets8(|k| entry(&IQ2S_GRID, index(8 * p + k) & 1023)), b.add(34)),
        IqKind::Iq3Xxs => {
            let g = |k: usize| entry(&IQ3XXS_GRID, *b.add(2 + k) as usize) as u64;
            (octets8(|k| g(16 * p + 2 * k) | g(16 * p + 2 * k + 1) << 32), st.signs.as_ptr())
        }
        IqKind::Iq3S => {
            let g = |k: usize| entry(&IQ3S_GRID, index(k) & 511) as u64;
            (octets8(|k| g(16 * p + 2 * k) | g(16 * p + 2 * k + 1) << 32), b.add(74))
        }
    };
    (grid, std::ptr::read_unaligned(signs.add(8 * p) as *const u64))
}

/// `sums[t] += maddubs(grid, activation signed by neg) times the scales` for the 64 quants of
/// pair p at each `q8[t]` (a block's 256). The callers keep one `sums` for the even pairs and
/// one for the odd (independent chains to overlap), each named: indexed by `p % 2` in a loop
/// LLVM does not unroll, they stayed in memory.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn add_pair<const T: usize>(sums: &mut [__m512i; T], p: usize, grid: __m512i, neg: __mmask64, scales: __m512i, q8: [*const u8; T]) {
    for t in 0..T {
        let x = _mm512_loadu_si512(q8[t].add(64 * p) as *const _);
        let signed = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
        sums[t] = _mm512_dpwssd_epi32(sums[t], _mm512_maddubs_epi16(grid, signed), scales);
    }
}

/// The quants of block i of each activation row.
#[inline(always)]
fn block_quants<const T: usize>(x: &[*const u8; T], i: usize) -> [*const u8; T] {
    std::array::from_fn(|t| x[t].wrapping_add(i * 292 + 4))
}

/// The dot of one weight row of a grid kind with T activation rows, as
/// `iquants_avx2::iq_dot_kernels`' `iquant` (the same lanes, the same float steps).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn iquant<const KIND: u8, const MODE: u8, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
    let (bytes, factor) = (kind(KIND).bytes(), kind(KIND).factor());
    let mut acc = [_mm256_setzero_ps(); T];
    let mut one = [0f32; T];
    for i in 0..nb {
        let bw = w.add(i * bytes);
        let st = block_state::<KIND>(bw);
        let q8 = block_quants(&x, i);
        let (mut even, mut odd) = ([_mm512_setzero_si512(); T], [_mm512_setzero_si512(); T]);
        for p in (0..4).step_by(2) {
            let (grid, neg) = grid_pair::<KIND>(bw, &st, p);
            add_pair(&mut even, p, grid, neg, pair_scales(st.scale_bytes, p), q8);
            let (grid, neg) = grid_pair::<KIND>(bw, &st, p + 1);
            add_pair(&mut odd, p + 1, grid, neg, pair_scales(st.scale_bytes, p + 1), q8);
        }
        let dw = f16_1(bw);
        for t in 0..T {
            let lanes = fold(_mm512_add_epi32(even[t], odd[t]));
            let dx = std::ptr::read_unaligned(x[t].add(i * 292) as *const f32);
            if MODE == TILED {
                one[t] = (hsum_epi32(lanes) as f32 * (dw * factor)).mul_add(dx, one[t]);
            } else {
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(lanes), acc[t]);
            }
        }
    }
    for t in 0..T {
        out[t] = if MODE == TILED { one[t] } else { factor * hsum_ps(acc[t]) };
    }
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

/// IQ1_S x Q8_K as `iquants_avx2`'s `iq1_s_impl`: the grid's lanes as the grid kinds', the
/// delta term an exact integer per block (the bsums times each sub-block's scale and delta
/// sign).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn iq1_s_impl<const MODE: u8, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
    let mut acc = [_mm256_setzero_ps(); T];
    let (mut acc1, mut one) = ([0f32; T], [0f32; T]);
    for i in 0..nb {
        let bw = w.add(i * IQ1_S_BYTES);
        // The eight qh words: three 3-bit index parts, the scale in bits 12..15, the delta's
        // sign in bit 15.
        let qh = _mm_loadu_si128(bw.add(34) as *const __m128i);
        let odd_scales = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7)), 1), _mm_set1_epi16(1));
        let scale_bytes = _mm512_broadcast_i32x4(_mm_unpacklo_epi8(_mm_packus_epi16(odd_scales, odd_scales), _mm_packus_epi16(odd_scales, odd_scales)));
        let q8 = block_quants(&x, i);
        let pair = |p: usize| {
            let sub = |h: usize| {
                let ib = 2 * p + h;
                let qh = std::ptr::read_unaligned(bw.add(34 + 2 * ib) as *const u16) as u64;
                iq1_indices(bw.add(2 + 4 * ib), qh, 0x0700_0700_0700_0700)
            };
            let (lo, hi) = (sub(0), sub(1));
            iq1_magnitudes(octets8(|k| entry(&IQ1S_GRID, if k < 4 { lo[k] } else { hi[k - 4] } & 2047)))
        };
        let (mut even, mut odd) = ([_mm512_setzero_si512(); T], [_mm512_setzero_si512(); T]);
        for p in (0..4).step_by(2) {
            let (grid, neg) = pair(p);
            add_pair(&mut even, p, grid, neg, pair_scales(scale_bytes, p), q8);
            let (grid, neg) = pair(p + 1);
            add_pair(&mut odd, p + 1, grid, neg, pair_scales(scale_bytes, p + 1), q8);
        }
        // Each sub-block's scale, negated where its delta sign is (qh | 1 is never 0, which
        // would zero it), in the i16 lanes of its two bsums.
        let signed = _mm_sign_epi16(odd_scales, _mm_or_si128(qh, _mm_set1_epi16(1)));
        let coef = _mm256_set_m128i(_mm_unpackhi_epi16(signed, signed), _mm_unpacklo_epi16(signed, signed));
        let dw = f16_1(bw);
        for t in 0..T {
            let bx = x[t].add(i * 292);
            let sumi = fold(_mm512_add_epi32(even[t], odd[t]));
            let delta = hsum_epi32(_mm256_madd_epi16(loadu(bx.add(260)), coef));
            let dx = std::ptr::read_unaligned(bx as *const f32);
            if MODE == TILED {
                one[t] = ((8 * hsum_epi32(sumi) + delta) as f32 * (dw * 0.125)).mul_add(dx, one[t]);
            } else {
                let d = dx * dw;
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[t]);
                acc1[t] = d.mul_add(delta as f32, acc1[t]);
            }
        }
    }
    for t in 0..T {
        out[t] = if MODE == TILED { one[t] } else { hsum_ps(acc[t]) + 0.125 * acc1[t] };
    }
}

/// IQ1_M's sixteen group scales and its d: four u16 of 3-bit scales in bits 0..12 and the
/// f16 d's nibbles in the top four.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn iq1_m_scales_d(b: *const u8) -> (__m512i, f32) {
    let sc = std::ptr::read_unaligned(b.add(48) as *const u64);
    let fields = _pext_u64(sc, 0x0fff_0fff_0fff_0fff);
    let spread = |f: u64| _pdep_u64(f, 0x0707_0707_0707_0707) as i64;
    let scale_bytes = odd_scale_bytes(_mm_set_epi64x(spread(fields >> 24), spread(fields & 0xff_ffff)));
    let d_bits = _pext_u64(sc, 0xf000_f000_f000_f000);
    (scale_bytes, _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(d_bits as i32))))
}

/// IQ1_M x Q8_K as `iquants_avx2`'s `iq1_m_impl`: the grid's lanes and the deltas' lanes
/// (the activation signed by each octet's delta sign, in pairs, times the group scales).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn iq1_m_impl<const MODE: u8, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
    let (mut acc, mut acc_delta) = ([_mm256_setzero_ps(); T], [_mm256_setzero_ps(); T]);
    let mut one = [0f32; T];
    let ones = _mm512_set1_epi8(1);
    for i in 0..nb {
        let bw = w.add(i * IQ1_M_BYTES);
        let mut indices = [0u16; 32];
        iq1_m_indices(bw, &mut indices);
        let (scale_bytes, dw) = iq1_m_scales_d(bw);
        let q8 = block_quants(&x, i);
        // The grid's sums and the deltas' sums: two chains a token.
        let (mut sums, mut deltas) = ([_mm512_setzero_si512(); T], [_mm512_setzero_si512(); T]);
        for p in 0..4 {
            let g = |k: usize| entry(&IQ1S_GRID, std::ptr::read_volatile(&indices[8 * p + k]) as usize & 2047);
            let (grid, neg) = iq1_magnitudes(octets8(g));
            // Octet k of the pair: nibble k % 2 of qh byte 4p + k / 2; its bit 3 the delta's
            // sign, spread over the octet's eight mask bits.
            let qh = std::ptr::read_unaligned(bw.add(32 + 4 * p) as *const u32) as u64;
            let delta = _pdep_u64(_pext_u64(qh, 0x8888_8888), 0x0101_0101_0101_0101) * 0xff;
            let scales = pair_scales(scale_bytes, p);
            add_pair(&mut sums, p, grid, neg, scales, q8);
            add_pair(&mut deltas, p, ones, delta, scales, q8);
        }
        for t in 0..T {
            let sumi = fold(sums[t]);
            let sumd = fold(deltas[t]);
            let dx = std::ptr::read_unaligned(x[t].add(i * 292) as *const f32);
            if MODE == TILED {
                one[t] = ((8 * hsum_epi32(sumi) + hsum_epi32(sumd)) as f32 * (dw * 0.125)).mul_add(dx, one[t]);
            } else {
                let d = _mm256_set1_ps(dx * dw);
                acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[t]);
                acc_delta[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumd), acc_delta[t]);
            }
        }
    }
    for t in 0..T {
        out[t] = if MODE == TILED { one[t] } else { hsum_ps(acc[t]) + 0.125 * hsum_ps(acc_delta[t]) };
    }
}

super::iquants_avx2::iq_entry_points!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,bmi2":
    iq2_xxs = iquant::<0, VEC_DOT>, iq2_xxs_tiled = iquant::<0, TILED>,
    iq2_xs = iquant::<1, VEC_DOT>, iq2_xs_tiled = iquant::<1, TILED>,
    iq2_s = iquant::<2, VEC_DOT>, iq2_s_tiled = iquant::<2, TILED>,
    iq3_xxs = iquant::<3, VEC_DOT>, iq3_xxs_tiled = iquant::<3, TILED>,
    iq3_s = iquant::<4, VEC_DOT>, iq3_s_tiled = iquant::<4, TILED>,
    iq1_s = iq1_s_impl::<VEC_DOT>, iq1_s_tiled = iq1_s_impl::<TILED>,
    iq1_m = iq1_m_impl::<VEC_DOT>, iq1_m_tiled = iq1_m_impl::<TILED>
);

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

/// Interleaves two octets `decode_octet_iq` wrote one after the other at `octets`
/// (`octet_bytes` each) into the layout `octet_pair_sums_iq` reads: each 32-byte vector of
/// the first octet followed by the same vector of the second, so that one 512-bit load
/// holds sixteen rows (the first octet's in the low 256 bits). `scratch` holds a copy.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn interleave_octets(octets: *mut u8, octet_bytes: usize, scratch: &mut Vec<u8>) {
    scratch.clear();
    scratch.extend_from_slice(std::slice::from_raw_parts(octets, 2 * octet_bytes));
    let (first, second) = (scratch.as_ptr(), scratch.as_ptr().add(octet_bytes));
    for v in 0..octet_bytes / 32 {
        let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(loadu(first.add(32 * v))), loadu(second.add(32 * v)));
        _mm512_storeu_si512(octets.add(64 * v) as *mut _, both);
    }
}

/// `octet_sums_iq` for R pairs of octets (R = 1 or 2), each interleaved by
/// `interleave_octets` (sixteen consecutive rows), the second `pair_bytes` after the first
/// (thirty-two consecutive rows): each vector holds sixteen rows against a token's broadcast
/// bytes, and a pass over the weights takes eight tokens (one pair) or four (two pairs), so
/// that each broadcast serves R multiplies and each 512-bit load of weights 8 / R: the same
/// exact isum per output and the same float steps, so the same bits.
/// out[(4 q + t) * ldo + 16 p + r]: row r (0..16) of pair p times token t of quad q.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn octet_pair_sums_iq<const Q: usize, const PER32: bool, const R: usize>(
    nsb: usize, octets: *const u8, pair_bytes: usize, x: [[*const u8; 4]; Q], biased: [[*const u8; 4]; Q], out: *mut f32, ldo: usize,
) {
    let mut q = 0;
    while R == 1 && q + 2 <= Q {
        token_pass::<8, PER32, R>(nsb, octets, pair_bytes, std::array::from_fn(|t| x[q + t / 4][t % 4]), std::array::from_fn(|t| biased[q + t / 4][t % 4]), out.add(4 * q * ldo), ldo);
        q += 2;
    }
    for q in q..Q {
        token_pass::<4, PER32, R>(nsb, octets, pair_bytes, x[q], biased[q], out.add(4 * q * ldo), ldo);
    }
}

/// One pass of `octet_pair_sums_iq` over the weights for T tokens: out[t * ldo + 16 p + r].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn token_pass<const T: usize, const PER32: bool, const R: usize>(
    nsb: usize, octets: *const u8, pair_bytes: usize, x: [*const u8; T], biased: [*const u8; T], out: *mut f32, ldo: usize,
) {
    // The four-byte steps (k: bytes 4k..4k + 4 of the block) one scale covers.
    let span = if PER32 { 8 } else { 4 };
    let at = |p: usize, i: usize, offset: usize| _mm512_loadu_si512(octets.add(p * pair_bytes + 2 * (i * IQ_OCTET_BYTES + offset)) as *const _);
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for i in 0..nsb {
        let mut isum = [[_mm512_setzero_si512(); T]; R];
        for first in (0..64).step_by(span) {
            // The group's scale vector holds row r's scale in both i16 halves of dword r.
            let scale: [__m512i; R] = std::array::from_fn(|p| _mm512_srli_epi32::<16>(at(p, i, 2048 + 32 * (first / 4))));
            let mut part = [[_mm512_setzero_si512(); T]; R];
            for k in first..first + span {
                let wk: [__m512i; R] = std::array::from_fn(|p| at(p, i, 32 * k));
                for t in 0..T {
                    let xk = _mm512_set1_epi32(std::ptr::read_unaligned(biased[t].add(256 * i + 4 * k) as *const i32));
                    for p in 0..R {
                        part[p][t] = _mm512_dpbusd_epi32(part[p][t], xk, wk[p]);
                    }
                }
            }
            for p in 0..R {
                for t in 0..T {
                    isum[p][t] = _mm512_add_epi32(isum[p][t], _mm512_mullo_epi32(part[p][t], scale[p]));
                }
            }
        }
        for p in 0..R {
            let corr = at(p, i, 2560);
            let d = _mm512_castsi512_ps(at(p, i, 2592));
            for t in 0..T {
                let r = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[p][t], corr)), d);
                acc[p][t] = _mm512_fmadd_ps(r, _mm512_set1_ps(*(x[t].add(i * 292) as *const f32)), acc[p][t]);
            }
        }
    }
    for p in 0..R {
        for t in 0..T {
            _mm512_storeu_ps(out.add(t * ldo + 16 * p), acc[p][t]);
        }
    }
}
