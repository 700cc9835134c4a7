//! AVX-512 VNNI kernels of Q1_0 and Q2_0 against Q8_0 activations: the one-token kernels of
//! `q1q2_avx2` stamped with this level's features and VNNI's lane sums, and the octet
//! products below. Q2_0's many-token product, bit for bit
//! `scalar::q1q2::vec_dot_q2_0_q8_0` (ggml's generic kernel as x86 runs it): per block the
//! exact integer sum s_k of each sub-block of 32 (codes times quants minus the quants' sum:
//! the codes' offset of 1), then `sumi = (0 + d_x0 * s_0) + d_x1 * s_1` and
//! `sumf += d_w * sumi`, each a vertical operation on a vector of eight rows.
//!
//! Eight rows are decoded once per product (`decode_octet_q2_0`): vector m of a block holds
//! each row's codes of elements 8m..8m + 8 (two four-byte groups, row r at qword r), so the
//! token's eight quants there, broadcast, meet every row's in one `vpdpbusd`; the two dwords
//! of a row are added at the end of a sub-block (exact).
//!
//! SAFETY (whole module): callers pass `nb` whole blocks readable at every pointer (checked by
//! `simd::SumsGemm`) and call these only on CPUs with AVX-512 F, BW, VL and VNNI (checked by
//! the dispatch).

// The kernels' contract is the module's SAFETY paragraph above.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::x86::{f16_1, hsum_ps, loadu, prefetch_next_rows};

/// The eight i32 lanes of 32 bytes: lane k the sum of bytes 4k..4k+3 (`vpdpbusd` by ones).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn lanes_of_bytes(v: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), v)
}

/// The eight i32 lanes of one sub-block: codes times quants minus the quants (`vpdpbusd`
/// onto minus the quants' lanes; the same exact integers as the AVX2 level's 16-bit sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q2_0_lanes(codes: __m256i, q: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), lanes_of_bytes(q)), codes, q)
}

super::q1q2_avx2::q1q2_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");

const Q2_0_BYTES: usize = 18;
const Q8_0_BYTES: usize = 34;

/// Bytes `decode_octet_q2_0` writes per block of eight rows: eight vectors of codes (vector
/// m: row r's codes of elements 8m..8m + 8 at qword r), then the rows' d as f32, each twice
/// (row r in lanes 2r and 2r + 1).
pub const Q2_OCTET_BYTES: usize = 8 * 64 + 16 * 4;

/// The 64 codes (0..3) of a Q2_0 block's 16 code bytes at `qs`, in element order: element j
/// is bits 2 (j % 4) of byte j / 4. Each byte is repeated four times, then each copy keeps
/// its own pair of bits, as 0/1 for the low bit plus 0/2 for the high one.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q2_0_codes_64(qs: *const u8) -> __m512i {
    let bytes = _mm512_broadcast_i32x4(_mm_loadu_si128(qs as *const __m128i));
    // 128-bit lane l: bytes 4l..4l + 4, each four times.
    let repeat = _mm512_set_epi32(
        0x0f0f_0f0f, 0x0e0e_0e0e, 0x0d0d_0d0d, 0x0c0c_0c0c, 0x0b0b_0b0b, 0x0a0a_0a0a, 0x0909_0909, 0x0808_0808,
        0x0707_0707, 0x0606_0606, 0x0505_0505, 0x0404_0404, 0x0303_0303, 0x0202_0202, 0x0101_0101, 0x0000_0000,
    );
    let e = _mm512_shuffle_epi8(bytes, repeat);
    let low = _mm512_min_epu8(_mm512_and_si512(e, _mm512_set1_epi32(0x4010_0401)), _mm512_set1_epi8(1));
    let high = _mm512_min_epu8(_mm512_and_si512(e, _mm512_set1_epi32(0x8020_0802u32 as i32)), _mm512_set1_epi8(2));
    _mm512_add_epi8(low, high)
}

/// Decodes nb blocks of eight consecutive Q2_0 rows (row r at w + r * row_bytes) into
/// `Q2_OCTET_BYTES` a block at dst, for `octet_sums_q2_0`. Done once per product and row
/// range.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn decode_octet_q2_0(nb: usize, w: *const u8, row_bytes: usize, dst: *mut u8) {
    let mut codes = [0u64; 8];
    for b in 0..nb {
        let block = |r: usize| w.add(r * row_bytes + b * Q2_0_BYTES);
        let out = dst.add(b * Q2_OCTET_BYTES);
        for r in 0..8 {
            _mm512_storeu_si512(codes.as_mut_ptr() as *mut _, q2_0_codes_64(block(r).add(2)));
            for (m, c) in codes.iter().enumerate() {
                std::ptr::write_unaligned(out.add(64 * m + 8 * r) as *mut u64, *c);
            }
        }
        let d: [f32; 16] = std::array::from_fn(|l| f16_1(block(l / 2)));
        _mm512_storeu_ps(out.add(8 * 64) as *mut f32, _mm512_loadu_ps(d.as_ptr()));
    }
}

/// Eight bytes at p in every qword.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn bcast_q(p: *const u8) -> __m512i {
    _mm512_set1_epi64(std::ptr::read_unaligned(p as *const i64))
}

/// Eight Q2_0 rows (an octet from `decode_octet_q2_0`, nb blocks) times 4 * Q Q8_0 activation
/// rows, bit for bit the row dot: out[(4 q + t) * ldo + r] is row r times token t of quad q.
/// `d[q]`, `corr[q]`: the quad's Q8_0 scales as f32 and minus its sub-blocks' quant sums
/// (`x86::avx2::sums_tile_factors` with offset 1; sub-block s of token t at 4 s + t). The
/// four tokens of a quad share each load of the codes.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn octet_sums_q2_0<const Q: usize>(
    nb: usize, octet: *const u8, x: [[*const u8; 4]; Q], d: [*const f32; Q], corr: [*const i32; Q], out: *mut f32, ldo: usize,
) {
    for q in 0..Q {
        let mut sumf = [_mm512_setzero_ps(); 4];
        for i in 0..nb {
            let ob = octet.add(i * Q2_OCTET_BYTES);
            // sums[t][s]: sub-block s of token t, row r's in dwords 2r (from minus the quants'
            // sum) and 2r + 1.
            let mut sums = [[_mm512_setzero_si512(); 2]; 4];
            for (t, sums) in sums.iter_mut().enumerate() {
                for (s, v) in sums.iter_mut().enumerate() {
                    *v = _mm512_set1_epi64(*corr[q].add(4 * (2 * i + s) + t) as u32 as i64);
                }
            }
            for m in 0..8 {
                let (s, wm) = (m / 4, _mm512_loadu_si512(ob.add(64 * m) as *const _));
                for t in 0..4 {
                    let xm = x[q][t].add((2 * i + s) * Q8_0_BYTES + 2 + 8 * (m % 4));
                    sums[t][s] = _mm512_dpbusd_epi32(sums[t][s], wm, bcast_q(xm));
                }
            }
            let dw = _mm512_loadu_ps(ob.add(8 * 64) as *const f32);
            for t in 0..4 {
                let mut sumi = _mm512_setzero_ps();
                for s in 0..2 {
                    // Both dwords of a row: its total (exact).
                    let total = _mm512_add_epi32(sums[t][s], _mm512_shuffle_epi32::<0b10_11_00_01>(sums[t][s]));
                    let dx = _mm512_set1_ps(*d[q].add(4 * (2 * i + s) + t));
                    sumi = _mm512_add_ps(sumi, _mm512_mul_ps(dx, _mm512_cvtepi32_ps(total)));
                }
                sumf[t] = _mm512_add_ps(sumf[t], _mm512_mul_ps(dw, sumi));
            }
        }
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
        for (t, sumf) in sumf.iter().enumerate() {
            _mm256_storeu_ps(out.add((4 * q + t) * ldo), _mm512_castps512_ps256(_mm512_permutexvar_ps(even, *sumf)));
        }
    }
}

const Q1_0_BYTES: usize = 18;

/// Bytes `decode_octet_q1_0` writes per block of eight rows: 16 masks (mask m: bit 8r + e set
/// where row r's element 8m + e is negative, that is its sign bit clear), then the rows' d
/// as f32, each twice (row r in lanes 2r and 2r + 1).
pub const Q1_OCTET_BYTES: usize = 16 * 8 + 16 * 4;

/// Decodes nb blocks of eight consecutive Q1_0 rows (row r at w + r * row_bytes) into
/// `Q1_OCTET_BYTES` a block at dst, for `octet_sums_q1_0`: elements 8m..8m + 8 of a row are
/// its sign byte m, so mask m is those bytes of the eight rows, inverted.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn decode_octet_q1_0(nb: usize, w: *const u8, row_bytes: usize, dst: *mut u8) {
    for b in 0..nb {
        let block = |r: usize| w.add(r * row_bytes + b * Q1_0_BYTES);
        let out = dst.add(b * Q1_OCTET_BYTES);
        for m in 0..16 {
            let signs = (0..8).fold(0u64, |mask, r| mask | (*block(r).add(2 + m) as u64) << (8 * r));
            std::ptr::write_unaligned(out.add(8 * m) as *mut u64, !signs);
        }
        let d: [f32; 16] = std::array::from_fn(|l| f16_1(block(l / 2)));
        _mm512_storeu_ps(out.add(16 * 8) as *mut f32, _mm512_loadu_ps(d.as_ptr()));
    }
}

/// Tokens of a quad whose products share each load of a mask in `octet_sums_q1_0` (their
/// 24 vector accumulators fill most of the registers).
const Q1_TOKENS_TOGETHER: usize = 2;

/// Eight Q1_0 rows (an octet from `decode_octet_q1_0`, nb blocks) times 4 * Q Q8_0 activation
/// rows, bit for bit the row dot (ggml's AVX2 arithmetic): out[(4 q + t) * ldo + r] is row r
/// times token t of quad q. `d[q]`: the quad's Q8_0 scales as f32 (sub-block s of token t at
/// 4 s + t). Vector m of a token's quants (eight broadcast, negated in 8 bits where the
/// mask says, as ggml's `(q ^ m) - m`, -128 staying -128) summed in fours by `vpdpbusd`
/// against ones gives ggml lanes 2a and 2a + 1 (a = m % 4) of sub-block m / 4 for the eight
/// rows, pairs of lanes side by side: the lane FMAs and `hsum_float_8` are vertical.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn octet_sums_q1_0<const Q: usize>(nb: usize, octet: *const u8, x: [[*const u8; 4]; Q], d: [*const f32; Q], out: *mut f32, ldo: usize) {
    const T: usize = Q1_TOKENS_TOGETHER;
    let ones = _mm512_set1_epi8(1);
    for q in 0..Q {
        for first in (0..4).step_by(T) {
            let mut acc = [[_mm512_setzero_ps(); 4]; T];
            for i in 0..nb {
                let ob = octet.add(i * Q1_OCTET_BYTES);
                let mut block = [[_mm512_setzero_ps(); 4]; T];
                for k in 0..4 {
                    let mut lanes = [[_mm512_setzero_si512(); 4]; T];
                    for a in 0..4 {
                        let m = 4 * k + a;
                        let negate: __mmask64 = std::ptr::read_unaligned(ob.add(8 * m) as *const u64);
                        for (t, lanes) in lanes.iter_mut().enumerate() {
                            let xm = bcast_q(x[q][first + t].add((4 * i + k) * Q8_0_BYTES + 2 + 8 * a));
                            let signed = _mm512_mask_sub_epi8(xm, negate, _mm512_setzero_si512(), xm);
                            lanes[a] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, signed);
                        }
                    }
                    for t in 0..T {
                        let dx = _mm512_set1_ps(*d[q].add(4 * (4 * i + k) + first + t));
                        for a in 0..4 {
                            let l = _mm512_cvtepi32_ps(lanes[t][a]);
                            block[t][a] = if k == 0 { _mm512_mul_ps(dx, l) } else { _mm512_fmadd_ps(dx, l, block[t][a]) };
                        }
                    }
                }
                let dw = _mm512_loadu_ps(ob.add(16 * 8) as *const f32);
                for t in 0..T {
                    for a in 0..4 {
                        acc[t][a] = _mm512_fmadd_ps(dw, block[t][a], acc[t][a]);
                    }
                }
            }
            for (t, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add((4 * q + first + t) * ldo), hsum8_rows(acc));
            }
        }
    }
}

/// `hsum_float_8` of eight rows whose lanes 2a and 2a + 1 are in acc[a] (row r's in lanes
/// 2r and 2r + 1): lanes k + 4 onto k (accumulators a + 2 onto a), (0 + 2) + (1 + 3) (even
/// lanes onto even, then the odd sums onto the even), the rows' results in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn hsum8_rows(acc: &[__m512; 4]) -> __m256 {
    let pairs = _mm512_add_ps(_mm512_add_ps(acc[2], acc[0]), _mm512_add_ps(acc[3], acc[1]));
    let rows = _mm512_add_ps(pairs, _mm512_permute_ps::<0b10_11_00_01>(pairs));
    _mm512_castps512_ps256(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0), rows))
}
