//! AVX2 kernels of the i-quants against Q8_K activations, the arithmetic of ggml's AVX2
//! `ggml_vec_dot_iq*_q8_K` (`scalar::iquants`, their specification) or of llama.cpp's tiled
//! product (`TILED`). Each 32-element sub-block is decoded once for every token, straight into
//! registers: its unsigned grid magnitudes, their signs (operands of `_mm256_sign_epi8`:
//! negative bytes negate) and its 16-element group scales; per token the signs go onto the
//! activation, `maddubs` pairs magnitudes with it in
//! 16-bit words (at most 2 * 62 * 127: exact), `madd` by the group scales gives eight i32
//! lanes (element p in lane (p % 32) / 4).
//!
//! SAFETY (whole module): callers pass `nb` whole blocks readable at `w` and every `x[t]`
//! (checked by the safe wrappers in `simd::mod`) and call these only on CPUs with AVX2, FMA
//! and F16C (checked by the dispatch).

// The kernels' contract is the module's SAFETY paragraph above.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::x86::avx2::transpose_8x8_epi32;
use super::x86::{f16_1, hsum_epi32, hsum_ps, loadu, scale_halves};
use crate::scalar::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use crate::scalar::iquants::{iq1_m_d, iq1_m_scales16, iq1_s_scale_sign, IqKind, IQ1_M_BYTES, IQ1_S_BYTES};

/// For each sign byte, its eight bytes 1 or -1 (bit j set: byte j is -1), the operand of
/// `_mm256_sign_epi8` (ggml's keven_signs_q2xs and bit-selection masks alike).
const SIGN_BYTES: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut j = 0;
        while j < 8 {
            let byte: u64 = if i >> j & 1 != 0 { 0xff } else { 0x01 };
            t[i] |= byte << (8 * j);
            j += 1;
        }
        i += 1;
    }
    t
};

/// Entry i of a grid table by a plain scalar load: `read_volatile`, because LLVM would
/// otherwise turn a row of lookups into `vpgatherdd`/`vpgatherqq`, which on Intel CPUs with
/// the Gather Data Sampling microcode take about three times as long as the loads and
/// inserts (Cascade Lake: a 512-bit gather of eight u64 11.6 ns, eight loads and inserts
/// 3.4 ns; the IQ3 kinds' one-token products ran 3 to 4 times slower than IQ2_XXS's).
/// `i` must be below the table's length (the callers mask or build it in range).
#[inline(always)]
pub(crate) unsafe fn entry<T: Copy>(table: &[T], i: usize) -> T {
    debug_assert!(i < table.len());
    std::ptr::read_volatile(table.as_ptr().add(i))
}

/// The float steps: ggml's vec_dot or llama.cpp's tiled product.
pub const VEC_DOT: u8 = 0;
pub const TILED: u8 = 1;

/// For each 7-bit sign group, `SIGN_BYTES` of its completed sign byte (`KSIGNS_IQ2XS`, ggml's
/// `keven_signs_q2xs`): IQ2_XS's per-octet lookup.
const EVEN_SIGN_BYTES: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = SIGN_BYTES[KSIGNS_IQ2XS[i] as usize];
        i += 1;
    }
    t
};

/// The kinds by number, for the kernels' const parameter.
pub(crate) const fn kind(k: u8) -> IqKind {
    match k {
        0 => IqKind::Iq2Xxs,
        1 => IqKind::Iq2Xs,
        2 => IqKind::Iq2S,
        3 => IqKind::Iq3Xxs,
        _ => IqKind::Iq3S,
    }
}

#[inline(always)]
unsafe fn rd_u32_at(p: *const u8) -> u32 {
    std::ptr::read_unaligned(p as *const u32)
}

/// Four sign bytes at p (bit j of byte l set: element 8l + j negative) as 32 sign operands of
/// `_mm256_sign_epi8`, in vector arithmetic: each byte copied over its octet, its bit j
/// picked out (0 or 2^j), then 127 added with unsigned saturation: 127 (keep) or 128..255
/// (negative as i8: negate).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sign_bytes_of(p: *const u8) -> __m256i {
    let spread = _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let octets = _mm256_shuffle_epi8(_mm256_set1_epi32(rd_u32_at(p) as i32), spread);
    _mm256_adds_epu8(_mm256_and_si256(octets, bit), _mm256_set1_epi8(127))
}

/// 32 bytes of 7-bit sign groups (one a byte, bit 7 clear) completed with the parity bit that
/// makes each byte's count of negatives even: `KSIGNS_IQ2XS` by two 16-entry lookups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn even_signs(groups: __m256i) -> __m256i {
    // 0x80 for a nibble with an odd count of set bits.
    let odd = _mm256_broadcastsi128_si256(_mm_set_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0));
    let nibble = _mm256_set1_epi8(15);
    let lo = _mm256_shuffle_epi8(odd, _mm256_and_si256(groups, nibble));
    let hi = _mm256_shuffle_epi8(odd, _mm256_and_si256(_mm256_srli_epi16(groups, 4), nibble));
    _mm256_or_si256(groups, _mm256_xor_si256(lo, hi))
}

/// The eight aux words of IQ2_XXS or IQ3_XXS (per sub-block four 7-bit sign groups, then
/// the 4-bit scale in the top bits): the odd scales 2 s + 1 into `scales`, and the 32
/// completed sign bytes returned.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn aux_signs_scales(aux: __m256i, scales: &mut [i32; 8]) -> __m256i {
    _mm256_storeu_si256(scales.as_mut_ptr() as *mut __m256i, _mm256_or_si256(_mm256_srli_epi32(aux, 27), _mm256_set1_epi32(1)));
    // Group l (bits 7l..7l + 7) moved to byte l.
    let m = _mm256_set1_epi32(0x7f);
    let g0 = _mm256_and_si256(aux, m);
    let g1 = _mm256_and_si256(_mm256_slli_epi32(aux, 1), _mm256_slli_epi32(m, 8));
    let g2 = _mm256_and_si256(_mm256_slli_epi32(aux, 2), _mm256_slli_epi32(m, 16));
    let g3 = _mm256_and_si256(_mm256_slli_epi32(aux, 3), _mm256_slli_epi32(m, 24));
    even_signs(_mm256_or_si256(_mm256_or_si256(g0, g1), _mm256_or_si256(g2, g3)))
}

/// The block's sign bytes where a sub-block reads them as four bytes (byte 4 ib + l: octet l
/// of sub-block ib, bit j set: element j negative), and the odd scale 2 s + 1 of each
/// sub-block of the kinds with one scale per 32 (IQ2_XXS, IQ3_XXS; untouched for the others).
/// Returns, for IQ2_XS and IQ2_S (a 4-bit scale per 16 elements), the sixteen odd scales as
/// i16 lanes, the first halves' in the low 128 bits and the second halves' in the high, for
/// `sub_block_halves` to pick a sub-block's pair out of (zero for the other kinds).
/// IQ2_S and IQ3_S store the sign bytes as they are. IQ2_XXS and IQ3_XXS keep four 7-bit
/// groups and the scale in a u32 per sub-block: the groups are completed in vector arithmetic
/// for the whole block at once. IQ2_XS looks its groups up per octet in `sub_vectors`
/// instead (measured 3 % faster there than completing them here; the signs stay unset).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn block_signs<const KIND: u8>(b: *const u8, signs: &mut [u8; 32], scales: &mut [i32; 8]) -> __m256i {
    let bytes = match kind(KIND) {
        IqKind::Iq2Xxs => {
            // (index u32, aux u32) per sub-block: the odd dwords of 64 bytes.
            let odd_dwords = _mm256_set_epi32(7, 5, 3, 1, 7, 5, 3, 1);
            let first = _mm256_permutevar8x32_epi32(loadu(b.add(2)), odd_dwords);
            let second = _mm256_permutevar8x32_epi32(loadu(b.add(34)), odd_dwords);
            aux_signs_scales(_mm256_blend_epi32::<0xf0>(first, second), scales)
        }
        IqKind::Iq2Xs => return odd_halves(b.add(66)),
        IqKind::Iq3Xxs => aux_signs_scales(loadu(b.add(66)), scales),
        IqKind::Iq2S => {
            _mm256_storeu_si256(signs.as_mut_ptr() as *mut __m256i, loadu(b.add(34)));
            return odd_halves(b.add(74));
        }
        IqKind::Iq3S => loadu(b.add(74)),
    };
    _mm256_storeu_si256(signs.as_mut_ptr() as *mut __m256i, bytes);
    _mm256_setzero_si256()
}

/// IQ2_S's 32 10-bit grid indices of the block at b, in vector arithmetic: index 4 ib + l is
/// byte qs[4 ib + l] with bits 2l, 2l + 1 of qh[ib] above it (moved there by a multiply:
/// AVX2 has no per-lane 16-bit shift).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn iq2_s_indices(b: *const u8, out: &mut [u16; 32]) {
    let qh = _mm256_broadcastsi128_si256(_mm_loadl_epi64(b.add(66) as *const __m128i));
    let shifts = _mm256_set1_epi64x(0x0004_0010_0040_0100);
    let high = _mm256_set1_epi16(0x300);
    for half in 0..2 {
        let low = _mm256_cvtepu8_epi16(_mm_loadu_si128(b.add(2 + 16 * half) as *const __m128i));
        // u16 lane k of this half: qh[4 half + k / 4] in its low byte.
        let c = |k: i8| k + 4 * half as i8;
        let pick = _mm256_setr_epi8(
            c(0), -1, c(0), -1, c(0), -1, c(0), -1, c(1), -1, c(1), -1, c(1), -1, c(1), -1,
            c(2), -1, c(2), -1, c(2), -1, c(2), -1, c(3), -1, c(3), -1, c(3), -1, c(3), -1,
        );
        let bits = _mm256_and_si256(_mm256_mullo_epi16(_mm256_shuffle_epi8(qh, pick), shifts), high);
        _mm256_storeu_si256(out.as_mut_ptr().add(16 * half) as *mut __m256i, _mm256_or_si256(low, bits));
    }
}

/// Eight bytes of two 4-bit scales (sub-block ib's halves in byte ib) as the sixteen odd
/// scales 2 s + 1 in i16 lanes: low nibbles in the low 128 bits, high nibbles in the high.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn odd_halves(p: *const u8) -> __m256i {
    let packed = std::ptr::read_unaligned(p as *const i64);
    let nibbles = _mm_and_si128(_mm_set_epi64x(packed >> 4, packed), _mm_set1_epi8(15));
    _mm256_cvtepu8_epi16(_mm_add_epi8(_mm_add_epi8(nibbles, nibbles), _mm_set1_epi8(1)))
}

/// Sub-block ib's two odd half scales out of `odd_halves`: lane ib of each 128-bit half
/// copied over the half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sub_block_halves(halves: __m256i, ib: usize) -> __m256i {
    _mm256_shuffle_epi8(halves, _mm256_set1_epi16((2 * ib | (2 * ib + 1) << 8) as i16))
}

/// Sub-block `ib` of the block at b, decoded straight into registers: its 32 unsigned grid
/// magnitudes, their signs as bytes of 1 or -1 (the operand of `_mm256_sign_epi8`) and the
/// odd scales 2 s + 1 of its two 16-element halves as i16 lanes (`scalar::iquants::sub_block`
/// is the specification; this reads the bytes without bounds checks or a struct in memory).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn sub_vectors<const KIND: u8>(b: *const u8, ib: usize, signs: &[u8; 32], scales: &[i32; 8], halves: __m256i, indices: &[u16; 32]) -> (__m256i, __m256i, __m256i) {
    let odd = |s: u32| (2 * s + 1) as i16;
    let sign = || sign_bytes_of(signs.as_ptr().add(4 * ib));
    match kind(KIND) {
        IqKind::Iq2Xxs => {
            let g = |l: usize| entry(&IQ2XXS_GRID, *b.add(2 + 8 * ib + l) as usize) as i64;
            (_mm256_set_epi64x(g(3), g(2), g(1), g(0)), sign(), _mm256_set1_epi16(scales[ib] as i16))
        }
        IqKind::Iq2Xs => {
            let q = |l: usize| std::ptr::read_unaligned(b.add(2 + 8 * ib + 2 * l) as *const u16) as usize;
            let g = |l: usize| entry(&IQ2XS_GRID, q(l) & 511) as i64;
            let s = |l: usize| EVEN_SIGN_BYTES[q(l) >> 9] as i64;
            (_mm256_set_epi64x(g(3), g(2), g(1), g(0)), _mm256_set_epi64x(s(3), s(2), s(1), s(0)), sub_block_halves(halves, ib))
        }
        IqKind::Iq2S => {
            // Read back from memory one by one (LLVM would otherwise take the stored vector
            // apart with two-uop word extracts).
            let g = |l: usize| entry(&IQ2S_GRID, std::ptr::read_volatile(&indices[4 * ib + l]) as usize & 1023) as i64;
            (_mm256_set_epi64x(g(3), g(2), g(1), g(0)), sign(), sub_block_halves(halves, ib))
        }
        IqKind::Iq3Xxs => {
            let q = b.add(2 + 8 * ib);
            let g = |k: usize| entry(&IQ3XXS_GRID, *q.add(k) as usize) as i32;
            let grid = _mm256_set_epi32(g(7), g(6), g(5), g(4), g(3), g(2), g(1), g(0));
            (grid, sign(), _mm256_set1_epi16(scales[ib] as i16))
        }
        IqKind::Iq3S => {
            let (q, qh) = (b.add(2 + 8 * ib), *b.add(66 + ib) as usize);
            let g = |k: usize| entry(&IQ3S_GRID, *q.add(k) as usize | ((qh << (8 - k)) & 256)) as i32;
            let s = (*b.add(106 + ib / 2) as u32 >> (4 * (ib % 2))) & 15;
            let grid = _mm256_set_epi32(g(7), g(6), g(5), g(4), g(3), g(2), g(1), g(0));
            (grid, sign(), _mm256_set1_epi16(odd(s)))
        }
    }
}

/// The IQ1 grid octets of four 11-bit indices (octet l: entry `indices[l]`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn iq1_grid4(indices: [usize; 4]) -> __m256i {
    let g = |l: usize| entry(&IQ1S_GRID, indices[l] & 2047) as i64;
    _mm256_set_epi64x(g(3), g(2), g(1), g(0))
}

/// IQ1_S sub-block ib of the block at b: its 32 grid values (-1, 0, 1 as bytes). Plain
/// code rather than closures built by `array::from_fn`, which stayed out-of-line calls.
/// (The AVX-512 level computes the indices with `pdep` instead: `iquants_avx512::iq1_indices`.)
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn iq1_s_grid(b: *const u8, ib: usize) -> __m256i {
    let qs = b.add(2 + 4 * ib);
    // Three high index bits per octet, then the scale and the delta's sign.
    let qh = std::ptr::read_unaligned(b.add(34 + 2 * ib) as *const u16) as usize;
    let index = |l: usize| *qs.add(l) as usize | (((qh >> (3 * l)) & 7) << 8);
    iq1_grid4([index(0), index(1), index(2), index(3)])
}

/// IQ1_M's delta signs of a sub-block from its u16 of four qh nibbles (octet l's nibble l:
/// bits 0-2 the index's high part, bit 3 the delta's sign), as the operand of
/// `_mm256_sign_epi8`: bytes 1, or -1 where the octet's bit 3 is set (each nibble shifted
/// down to bit 0 of its quadword, then 0 - bit, or 1).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn iq1_m_delta(qh: usize) -> __m256i {
    let bits = _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(qh as i64), _mm256_set_epi64x(15, 11, 7, 3)), _mm256_set1_epi64x(1));
    _mm256_or_si256(_mm256_sub_epi64(_mm256_setzero_si256(), bits), _mm256_set1_epi8(1))
}

/// IQ1_M sub-block ib of the block at b: its 32 grid values (-1, 0, 1 as bytes) and each
/// element's delta sign (`iq1_m_delta`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn iq1_m_sub_block(b: *const u8, ib: usize) -> (__m256i, __m256i) {
    let qs = b.add(4 * ib);
    let qh = std::ptr::read_unaligned(b.add(32 + 2 * ib) as *const u16) as usize;
    let index = |l: usize| *qs.add(l) as usize | (((qh >> (4 * l)) & 7) << 8);
    (iq1_grid4([index(0), index(1), index(2), index(3)]), iq1_m_delta(qh))
}

/// `acc + madd(p, scales)` at the AVX2 level (the AVX-512 level fuses it: `vpdpwssd`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn madd_add(acc: __m256i, p: __m256i, scales: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, scales))
}

/// The one-row dot kernels of the i-quants (T tokens at once), stamped with a level's
/// `target_feature`s and its `madd_add` (this level's; the AVX-512 level has kernels of its
/// own, `iquants_avx512`, with the same exact i32 lanes): for each kind ggml's AVX2 vec_dot
/// and llama.cpp's tiled product.
macro_rules! iq_dot_kernels {
    ($features:literal) => {
        /// The dot of one weight row with T activation rows: per super-block `acc = fma(d * d_x,
        /// lanes, acc)` and `factor * hsum` at the end (vec_dot), or `r = isum * (d * factor)`,
        /// `one = fma(r, d_x, one)` (tiled). `BYTES` the block size, the f16 d first.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn iquant<const KIND: u8, const MODE: u8, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            let (bytes, factor) = (kind(KIND).bytes(), kind(KIND).factor());
            let mut acc = [_mm256_setzero_ps(); T];
            let mut one = [0f32; T];
            for i in 0..nb {
                let bw = w.add(i * bytes);
                // Each sub-block is decoded once into registers and used for every token.
                // Two sub-blocks a step, into two sums, as ggml: independent chains to overlap.
                let (mut signs, mut scales) = ([0u8; 32], [0i32; 8]);
                let halves = block_signs::<KIND>(bw, &mut signs, &mut scales);
                let mut indices = [0u16; 32];
                if kind(KIND) == IqKind::Iq2S {
                    iq2_s_indices(bw, &mut indices);
                }
                let mut sumi = [[_mm256_setzero_si256(); T]; 2];
                for ib in (0..8).step_by(2) {
                    let pair = [sub_vectors::<KIND>(bw, ib, &signs, &scales, halves, &indices), sub_vectors::<KIND>(bw, ib + 1, &signs, &scales, halves, &indices)];
                    for (h, (grid, signs, scales)) in pair.into_iter().enumerate() {
                        for t in 0..T {
                            let q8 = _mm256_sign_epi8(loadu(x[t].add(i * 292 + 4 + 32 * (ib + h))), signs);
                            sumi[h][t] = madd_add(sumi[h][t], _mm256_maddubs_epi16(grid, q8), scales);
                        }
                    }
                }
                let sumi: [__m256i; T] = std::array::from_fn(|t| _mm256_add_epi32(sumi[0][t], sumi[1][t]));
                let dw = f16_1(bw);
                for t in 0..T {
                    let dx = std::ptr::read_unaligned(x[t].add(i * 292) as *const f32);
                    if MODE == TILED {
                        one[t] = (hsum_epi32(sumi[t]) as f32 * (dw * factor)).mul_add(dx, one[t]);
                    } else {
                        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
                    }
                }
            }
            for t in 0..T {
                out[t] = if MODE == TILED { one[t] } else { factor * hsum_ps(acc[t]) };
            }
        }

        /// IQ1_S x Q8_K as ggml_vec_dot_iq1_s_q8_K (AVX2) or llama.cpp's tiled product
        /// (`scalar::iquants`): the grid (-1, 0, 1) decoded once for every token, signed products in
        /// 16-bit words, times the sub-block scale into eight lanes; the delta term an integer per
        /// block from the activation's sums.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn iq1_s_impl<const MODE: u8, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            let mut acc = [_mm256_setzero_ps(); T];
            let (mut acc1, mut one) = ([0f32; T], [0f32; T]);
            for i in 0..nb {
                let bw = w.add(i * IQ1_S_BYTES);
                let block = std::slice::from_raw_parts(bw, IQ1_S_BYTES);
                let mut grid = [_mm256_setzero_si256(); 8];
                let mut scale = [(0i32, 0i32); 8];
                for ib in 0..8 {
                    grid[ib] = iq1_s_grid(bw, ib);
                    scale[ib] = iq1_s_scale_sign(block, ib);
                }
                let dw = f16_1(bw);
                for t in 0..T {
                    let bx = x[t].add(i * 292);
                    let mut sumi = _mm256_setzero_si256();
                    let mut delta = 0i32;
                    for ib in 0..8 {
                        let q8 = loadu(bx.add(4 + 32 * ib));
                        let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(grid[ib], grid[ib]), _mm256_sign_epi8(q8, grid[ib]));
                        sumi = madd_add(sumi, p16, _mm256_set1_epi16(scale[ib].0 as i16));
                        let bsum = std::ptr::read_unaligned(bx.add(260 + 4 * ib) as *const i16) as i32 + std::ptr::read_unaligned(bx.add(262 + 4 * ib) as *const i16) as i32;
                        delta += bsum * scale[ib].1 * scale[ib].0;
                    }
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

        /// IQ1_M x Q8_K as ggml_vec_dot_iq1_m_q8_K (AVX2) or llama.cpp's tiled product
        /// (`scalar::iquants`): the grid and the delta signs decoded once for every token, each
        /// against the activation in 16-bit words times the group scales into eight lanes.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn iq1_m_impl<const MODE: u8, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            let (mut acc, mut acc_delta) = ([_mm256_setzero_ps(); T], [_mm256_setzero_ps(); T]);
            let mut one = [0f32; T];
            for i in 0..nb {
                let bw = w.add(i * IQ1_M_BYTES);
                let block = std::slice::from_raw_parts(bw, IQ1_M_BYTES);
                let (mut grid, mut delta, mut scales) = ([_mm256_setzero_si256(); 8], [_mm256_setzero_si256(); 8], [_mm256_setzero_si256(); 8]);
                let s16 = iq1_m_scales16(block);
                for ib in 0..8 {
                    (grid[ib], delta[ib]) = iq1_m_sub_block(bw, ib);
                    scales[ib] = scale_halves(s16[2 * ib] as i16, s16[2 * ib + 1] as i16);
                }
                let dw = iq1_m_d(block);
                for t in 0..T {
                    let bx = x[t].add(i * 292);
                    let (mut sumi, mut sumd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    for ib in 0..8 {
                        let q8 = loadu(bx.add(4 + 32 * ib));
                        let pg = _mm256_maddubs_epi16(_mm256_sign_epi8(grid[ib], grid[ib]), _mm256_sign_epi8(q8, grid[ib]));
                        let pd = _mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_sign_epi8(q8, delta[ib]));
                        sumi = madd_add(sumi, pg, scales[ib]);
                        sumd = madd_add(sumd, pd, scales[ib]);
                    }
                    let dx = std::ptr::read_unaligned(bx as *const f32);
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

        $crate::simd::iquants_avx2::iq_entry_points!($features:
            iq2_xxs = iquant::<0, VEC_DOT>, iq2_xxs_tiled = iquant::<0, TILED>,
            iq2_xs = iquant::<1, VEC_DOT>, iq2_xs_tiled = iquant::<1, TILED>,
            iq2_s = iquant::<2, VEC_DOT>, iq2_s_tiled = iquant::<2, TILED>,
            iq3_xxs = iquant::<3, VEC_DOT>, iq3_xxs_tiled = iquant::<3, TILED>,
            iq3_s = iquant::<4, VEC_DOT>, iq3_s_tiled = iquant::<4, TILED>,
            iq1_s = iq1_s_impl::<VEC_DOT>, iq1_s_tiled = iq1_s_impl::<TILED>,
            iq1_m = iq1_m_impl::<VEC_DOT>, iq1_m_tiled = iq1_m_impl::<TILED>
        );
    };
}

/// The public kernels of `iq_dot_kernels`, each a kind's kernel in one float order.
macro_rules! iq_entry_points {
    ($features:literal: $($name:ident = $imp:ident::<$($c:tt),*>),*) => {$(
        #[target_feature(enable = $features)]
        pub unsafe fn $name<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            $imp::<$($c,)* T>(nb, w, x, out)
        }
    )*};
}
pub(crate) use iq_entry_points;

iq_dot_kernels!("avx2,fma,f16c");

// ---------------------------------------------------------------- octets (many tokens)

/// The kinds of the octet kernels: `kind`'s five, then IQ1_S and IQ1_M.
pub const OCTET_IQ1_S: u8 = 5;
pub const OCTET_IQ1_M: u8 = 6;

/// Bytes `decode_octet_iq` writes per super-block of eight rows: the eight 32-element
/// chunks' signed values (256 bytes each, vector k holding bytes 4k..4k + 4 of row r in dword
/// lane r, as `x86::avx2::decode_octet`'s), the sixteen group scales (a vector per group:
/// row r's odd scale in i16 lanes 2r and 2r + 1), the rows' activation-bias corrections
/// (i32), then the rows' d times the kind's factor (f32).
pub const IQ_OCTET_BYTES: usize = 8 * 256 + 16 * 32 + 32 + 32;

/// Whether the kind's values are small enough (|v| <= 15) for four `maddubs` of biased
/// activations (at most 255) to add in i16 before the scale multiply: 4 * 2 * 255 * 15 <
/// 2^15. IQ3_S's magnitudes reach 15, IQ1's 8 * 1 + 1; the others reach 43 or 62.
pub const fn narrow_values(kind: u8) -> bool {
    kind >= 4
}

/// One block of a row as the octet kernels use it: each 32-element chunk's signed values
/// (IQ1: 8 * grid + delta sign, whose sum against the activation is the tiled product's
/// `8 * grid + delta`), the sixteen odd group scales, and d times the kind's factor.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn octet_row_block<const KIND: u8>(b: *const u8) -> ([__m256i; 8], [i16; 16], f32) {
    let mut v = [_mm256_setzero_si256(); 8];
    let mut scales = [0i16; 16];
    let eight = _mm256_set1_epi8(8);
    match KIND {
        OCTET_IQ1_S => {
            let block = std::slice::from_raw_parts(b, IQ1_S_BYTES);
            for (ib, chunk) in v.iter_mut().enumerate() {
                let (ls, sign) = iq1_s_scale_sign(block, ib);
                let grid = iq1_s_grid(b, ib);
                *chunk = _mm256_add_epi8(_mm256_sign_epi8(eight, grid), _mm256_set1_epi8(sign as i8));
                scales[2 * ib] = ls as i16;
                scales[2 * ib + 1] = ls as i16;
            }
            (v, scales, f16_1(b) * 0.125)
        }
        OCTET_IQ1_M => {
            let block = std::slice::from_raw_parts(b, IQ1_M_BYTES);
            for (ib, chunk) in v.iter_mut().enumerate() {
                let (grid, delta) = iq1_m_sub_block(b, ib);
                *chunk = _mm256_add_epi8(_mm256_sign_epi8(eight, grid), delta);
            }
            scales = iq1_m_scales16(block).map(|s| s as i16);
            (v, scales, iq1_m_d(block) * 0.125)
        }
        _ => {
            let (mut sign_bytes, mut sub_scales) = ([0u8; 32], [0i32; 8]);
            let halves = block_signs::<KIND>(b, &mut sign_bytes, &mut sub_scales);
            let mut indices = [0u16; 32];
            if kind(KIND) == IqKind::Iq2S {
                iq2_s_indices(b, &mut indices);
            }
            for (ib, chunk) in v.iter_mut().enumerate() {
                let (grid, signs, halves) = sub_vectors::<KIND>(b, ib, &sign_bytes, &sub_scales, halves, &indices);
                *chunk = _mm256_sign_epi8(grid, signs);
                scales[2 * ib] = _mm256_extract_epi16::<0>(halves) as i16;
                scales[2 * ib + 1] = _mm256_extract_epi16::<8>(halves) as i16;
            }
            (v, scales, f16_1(b) * kind(KIND).factor())
        }
    }
}

/// Block bytes of an octet kind.
pub const fn octet_block_bytes(kind_: u8) -> usize {
    match kind_ {
        OCTET_IQ1_S => IQ1_S_BYTES,
        OCTET_IQ1_M => IQ1_M_BYTES,
        _ => kind(kind_).bytes(),
    }
}

/// 128 * sum over groups of scale * (sum of the group's values): what the biased activations
/// (q + 128) add to a row's block sum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bias_correction(v: &[__m256i; 8], scales: &[i16; 16]) -> i32 {
    let ones = _mm256_set1_epi8(1);
    let mut sum = _mm256_setzero_si256();
    for (ib, chunk) in v.iter().enumerate() {
        let pairs = _mm256_maddubs_epi16(ones, *chunk);
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, scale_halves(scales[2 * ib], scales[2 * ib + 1])));
    }
    128 * hsum_epi32(sum)
}

/// Decodes nsb super-blocks of eight consecutive rows of octet kind KIND (row r at w + r *
/// row_bytes) into `IQ_OCTET_BYTES` a super-block at dst, for `octet_sums_iq`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn decode_octet_iq<const KIND: u8>(nsb: usize, w: *const u8, row_bytes: usize, dst: *mut u8) {
    let bytes = octet_block_bytes(KIND);
    for i in 0..nsb {
        let out = dst.add(i * IQ_OCTET_BYTES);
        let rows: [([__m256i; 8], [i16; 16], f32); 8] = std::array::from_fn(|r| octet_row_block::<KIND>(w.add(r * row_bytes + i * bytes)));
        for c in 0..8 {
            let chunk: [__m256i; 8] = std::array::from_fn(|r| rows[r].0[c]);
            for (k, v) in transpose_8x8_epi32(&chunk).iter().enumerate() {
                _mm256_storeu_si256(out.add(256 * c + 32 * k) as *mut __m256i, *v);
            }
        }
        for g in 0..16 {
            let lanes: [i16; 16] = std::array::from_fn(|l| rows[l / 2].1[g]);
            _mm256_storeu_si256(out.add(2048 + 32 * g) as *mut __m256i, _mm256_loadu_si256(lanes.as_ptr() as *const __m256i));
        }
        let corr: [i32; 8] = std::array::from_fn(|r| bias_correction(&rows[r].0, &rows[r].1));
        let d: [f32; 8] = std::array::from_fn(|r| rows[r].2);
        std::ptr::copy_nonoverlapping(corr.as_ptr() as *const u8, out.add(2560), 32);
        std::ptr::copy_nonoverlapping(d.as_ptr() as *const u8, out.add(2592), 32);
    }
}

/// Eight rows (an octet from `decode_octet_iq`) times 4 * Q Q8_K activation rows, llama.cpp's
/// tiled arithmetic (`scalar::iquants::tiled`) bit for bit: per super-block the exact integer
/// isum = sum of scale * value * activation, `r = float(isum) * d`, `acc = fma(r, d_x, acc)`.
/// The activations come biased (`biased[q][t]`: each row's quants + 128 as unsigned bytes,
/// 256 a block, see `SumsGemm::factors`) so that `maddubs` takes them as its unsigned operand
/// and the signed values as the other (|pair| <= 2 * 255 * 62 < 2^15); the bias's part of
/// the sum, a constant of the row's block, is subtracted at the block's end. `x[q][t]`: the
/// Q8_K rows, for their d. NARROW (`narrow_values`): a group's four multiplies add in i16.
/// out[(4 q + t) * ldo + r]: row r times token t of quad q.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn octet_sums_iq<const Q: usize, const NARROW: bool>(
    nsb: usize, octet: *const u8, x: [[*const u8; 4]; Q], biased: [[*const u8; 4]; Q], out: *mut f32, ldo: usize,
) {
    for q in 0..Q {
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in 0..nsb {
            let ob = octet.add(i * IQ_OCTET_BYTES);
            let mut isum = [_mm256_setzero_si256(); 4];
            for g in 0..16 {
                let (c, scale) = (g / 2, loadu(ob.add(2048 + 32 * g)));
                let mut narrow = [_mm256_setzero_si256(); 4];
                for k in 4 * (g % 2)..4 * (g % 2) + 4 {
                    let wk = loadu(ob.add(256 * c + 32 * k));
                    for t in 0..4 {
                        let xk = std::ptr::read_unaligned(biased[q][t].add(256 * i + 32 * c + 4 * k) as *const i32);
                        let p = _mm256_maddubs_epi16(_mm256_set1_epi32(xk), wk);
                        if NARROW {
                            narrow[t] = _mm256_add_epi16(narrow[t], p);
                        } else {
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, scale));
                        }
                    }
                }
                if NARROW {
                    for t in 0..4 {
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(narrow[t], scale));
                    }
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
