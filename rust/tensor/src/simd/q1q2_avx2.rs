//! AVX2 kernels of Q1_0 and Q2_0 against Q8_0 activations, the arithmetic of
//! `scalar::q1q2` (their specification), each weight block decoded once for every token:
//! - Q1_0: ggml's AVX2 kernel, the signs applied to the quants in 8 bits, summed into eight
//!   i32 lanes per sub-block of 32, one multiply then three FMAs per block into a block
//!   accumulator, one FMA into the row's;
//! - Q2_0: the exact integer sum of each sub-block (codes times quants, minus the quants'
//!   sum: the codes' offset of 1), reduced for four blocks at once, then ggml's scalar float
//!   steps in its order.
//!
//! SAFETY (whole module): callers pass `nb` whole blocks readable at `w` and every `x[t]`
//! (checked by the safe wrappers in `simd::mod`) and call these only on CPUs with AVX2, FMA
//! and F16C (checked by the dispatch).

// The kernels' contract is the module's SAFETY paragraph above.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::x86::{f16_1, hsum_ps, loadu, prefetch_next_rows};

const Q1_0_BYTES: usize = 18;
const Q2_0_BYTES: usize = 18;
const Q8_0_BYTES: usize = 34;
/// The eight i32 lanes of 32 bytes: lane k the sum of bytes 4k..4k+3 (maddubs + madd).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes_of_bytes(v: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1))
}

/// The eight i32 lanes of one sub-block: codes times quants minus the quants, in 16 bits
/// (at most 3 * 128 * 2 + 256 in magnitude: exact for every byte), then paired.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_0_lanes(codes: __m256i, q: __m256i) -> __m256i {
    let products = _mm256_maddubs_epi16(codes, q);
    let quants = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
    _mm256_madd_epi16(_mm256_sub_epi16(products, quants), _mm256_set1_epi16(1))
}

/// The kernels of Q1_0 and Q2_0 for one instruction-set level, compiled with its
/// `target_feature`s and its `lanes_of_bytes` and `q2_0_lanes` (the same exact i32 lanes at
/// every level; `q1q2_avx512` stamps them with VNNI's).
macro_rules! q1q2_kernels {
    ($features:literal) => {
        /// Per byte of the 32 elements whose signs are the 32 bits `bits`: -1 where the bit is clear
        /// (the quant is negated), +1 where it is set: `_mm256_sign_epi8`'s operand, which negates in
        /// 8 bits as ggml's `(q ^ m) - m` does.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn signs(bits: u32) -> __m256i {
            let byte_of_bit = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), byte_of_bit);
            let clear = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), _mm256_setzero_si256());
            _mm256_or_si256(clear, _mm256_set1_epi8(1))
        }

        /// A Q8_0 sub-block's signed quants' lanes as floats.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q1_0_sub_block(sx: *const u8, sign: __m256i) -> __m256 {
            _mm256_cvtepi32_ps(lanes_of_bytes(_mm256_sign_epi8(loadu(sx.add(2)), sign)))
        }

        /// The f16 scales of the four Q8_0 sub-blocks at `bx` (one Q1_0 block's activations) as f32,
        /// converted together: the four halves gathered in a general register, one conversion,
        /// then broadcast lane by lane (the same values as one conversion each).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q8_0_scales4(bx: *const u8) -> [__m256; 4] {
            let mut packed = 0u64;
            for k in 0..4 {
                packed |= (std::ptr::read_unaligned(bx.add(k * Q8_0_BYTES) as *const u16) as u64) << (16 * k);
            }
            let mut d = [0f32; 4];
            _mm_storeu_ps(d.as_mut_ptr(), _mm_cvtph_ps(_mm_cvtsi64_si128(packed as i64)));
            [_mm256_broadcast_ss(&d[0]), _mm256_broadcast_ss(&d[1]), _mm256_broadcast_ss(&d[2]), _mm256_broadcast_ss(&d[3])]
        }

        /// Q1_0 x Q8_0 as ggml_vec_dot_q1_0_q8_0 (AVX2), for T activation rows.
        #[target_feature(enable = $features)]
        pub unsafe fn q1_0<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            let mut acc = [_mm256_setzero_ps(); T];
            let mut sign = [_mm256_setzero_si256(); 4];
            for i in 0..nb {
                let bw = w.add(i * Q1_0_BYTES);
                // A loop, not a closure: closures do not inherit the target features.
                for (k, s) in sign.iter_mut().enumerate() {
                    *s = signs(std::ptr::read_unaligned(bw.add(2 + 4 * k) as *const u32));
                }
                let dw = _mm256_set1_ps(f16_1(bw));
                for t in 0..T {
                    let bx = x[t].add(i * 4 * Q8_0_BYTES);
                    let mut block = _mm256_mul_ps(_mm256_set1_ps(f16_1(bx)), q1_0_sub_block(bx, sign[0]));
                    for (k, &sign_k) in sign.iter().enumerate().skip(1) {
                        // One conversion per scale here: converting the four together measured slower.
                        let sx = bx.add(k * Q8_0_BYTES);
                        block = _mm256_fmadd_ps(_mm256_set1_ps(f16_1(sx)), q1_0_sub_block(sx, sign_k), block);
                    }
                    acc[t] = _mm256_fmadd_ps(dw, block, acc[t]);
                }
            }
            for t in 0..T {
                out[t] = hsum_ps(acc[t]);
            }
        }

        /// One Q1_0 row times four Q8_0 activation rows, bit for bit `q1_0::<4>`, with the
        /// activations' sub-block scales given as f32 (`dx[4 * s + t]`: sub-block s of token t, see
        /// `simd::q8_0_tile_scales`), converted once per tile of tokens for all the rows rather than
        /// once per row: each is then one broadcast load. Each block's signs are expanded once for
        /// the four tokens.
        #[target_feature(enable = $features)]
        pub unsafe fn q1_0_x4_scaled(nb: usize, w: *const u8, x: [*const u8; 4], dx: *const f32, out: &mut [f32; 4]) {
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut sign = [_mm256_setzero_si256(); 4];
            for i in 0..nb {
                let bw = w.add(i * Q1_0_BYTES);
                for (k, s) in sign.iter_mut().enumerate() {
                    *s = signs(std::ptr::read_unaligned(bw.add(2 + 4 * k) as *const u32));
                }
                let dw = _mm256_set1_ps(f16_1(bw));
                let d = dx.add(16 * i);
                for t in 0..4 {
                    let bx = x[t].add(i * 4 * Q8_0_BYTES);
                    let mut block = _mm256_mul_ps(_mm256_broadcast_ss(&*d.add(t)), q1_0_sub_block(bx, sign[0]));
                    for (k, &sign_k) in sign.iter().enumerate().skip(1) {
                        let lanes = q1_0_sub_block(bx.add(k * Q8_0_BYTES), sign_k);
                        block = _mm256_fmadd_ps(_mm256_broadcast_ss(&*d.add(4 * k + t)), lanes, block);
                    }
                    acc[t] = _mm256_fmadd_ps(dw, block, acc[t]);
                }
            }
            for t in 0..4 {
                out[t] = hsum_ps(acc[t]);
            }
        }

        /// Sub-block k of a Q1_0 block (`bw`) against its Q8_0 block (`bx`, the block's first):
        /// the signed quants' eight lanes as floats.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q1_0_signed_lanes(bw: *const u8, bx: *const u8, k: usize) -> __m256 {
            q1_0_sub_block(bx.add(k * Q8_0_BYTES), signs(std::ptr::read_unaligned(bw.add(2 + 4 * k) as *const u32)))
        }

        /// Eight consecutive Q1_0 rows (row r at w + r * row_bytes) times one Q8_0 activation row,
        /// each row's accumulators as ggml_vec_dot_q1_0_q8_0 computes them (the same bits as `q1_0`),
        /// with the activation's four scales per block converted and broadcast once for the eight
        /// rows.
        #[target_feature(enable = $features)]
        pub unsafe fn q1_0_rows8(nb: usize, w: *const u8, row_bytes: usize, x: *const u8, out: &mut [f32; 8]) {
            let mut acc = [_mm256_setzero_ps(); 8];
            for i in 0..nb {
                prefetch_next_rows(w, row_bytes, Q1_0_BYTES, i);
                let bx = x.add(i * 4 * Q8_0_BYTES);
                let dx = q8_0_scales4(bx);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let bw = w.add(r * row_bytes + i * Q1_0_BYTES);
                    // A loop and a function, not closures: closures do not inherit the target features.
                    let mut block = _mm256_mul_ps(dx[0], q1_0_signed_lanes(bw, bx, 0));
                    for (k, &d) in dx.iter().enumerate().skip(1) {
                        block = _mm256_fmadd_ps(d, q1_0_signed_lanes(bw, bx, k), block);
                    }
                    *acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_1(bw)), block, *acc);
                }
            }
            for (o, acc) in out.iter_mut().zip(acc) {
                *o = hsum_ps(acc);
            }
        }

        /// The 2-bit codes (0..3) of a Q2_0 block's two sub-blocks of 32, in element order.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q2_0_codes(qs: *const u8) -> [__m256i; 2] {
            let bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs as *const __m128i));
            // Each byte holds four elements: repeat it four times, then keep each copy's own pair
            // of bits, as 0/1 for the low bit plus 0/2 for the high one.
            let repeat = _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
            let second = _mm256_add_epi8(repeat, _mm256_set1_epi8(8));
            [own_bits(_mm256_shuffle_epi8(bytes, repeat)), own_bits(_mm256_shuffle_epi8(bytes, second))]
        }

        /// Byte 4m + j of `e`'s code: bits 2j and 2j + 1, as 0/1 plus 0/2.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn own_bits(e: __m256i) -> __m256i {
            let low_bit = _mm256_set1_epi32(0x4010_0401);
            let high_bit = _mm256_set1_epi32(0x8020_0802u32 as i32);
            let low = _mm256_min_epu8(_mm256_and_si256(e, low_bit), _mm256_set1_epi8(1));
            _mm256_add_epi8(low, _mm256_min_epu8(_mm256_and_si256(e, high_bit), _mm256_set1_epi8(2)))
        }

        /// The sums of each of eight vectors' eight i32 lanes, in order.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn sums_of_8(v: &[__m256i; 8]) -> __m256i {
            let low = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
            let high = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
            _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(low, high), _mm256_permute2x128_si256::<0x31>(low, high))
        }

        /// Blocks whose sub-block sums one `sums_of_8` reduces.
        const Q2_0_GROUP: usize = 4;

        /// The f16 scales of `subs` (at most 8) consecutive Q8_0 sub-blocks at `bx`, as f32 (lanes past
        /// `subs` zero: their memory is not read).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q8_0_scales(bx: *const u8, subs: usize) -> __m256 {
            let offsets = _mm256_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238);
            let valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(subs as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            let words = _mm256_mask_i32gather_epi32::<1>(_mm256_setzero_si256(), bx as *const i32, offsets, valid);
            // The low half of each dword, packed into 128 bits.
            let low_halves = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
            let packed = _mm256_permute4x64_epi64::<0b1000>(_mm256_shuffle_epi8(words, low_halves));
            _mm256_cvtph_ps(_mm256_castsi256_si128(packed))
        }

        /// The exact integer sums of the `2 * blocks` sub-blocks of one token (`bx`, its first
        /// Q8_0 sub-block) against the group's codes, as f32 (lanes past them zero).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q2_0_group_sums(codes: &[__m256i; 2 * Q2_0_GROUP], bx: *const u8, blocks: usize) -> __m256 {
            let mut lanes = [_mm256_setzero_si256(); 2 * Q2_0_GROUP];
            if blocks == Q2_0_GROUP {
                // A constant bound: the eight lanes stay in registers.
                for (j, l) in lanes.iter_mut().enumerate() {
                    *l = q2_0_lanes(codes[j], loadu(bx.add(j * Q8_0_BYTES + 2)));
                }
            } else {
                for (j, l) in lanes.iter_mut().enumerate().take(2 * blocks) {
                    *l = q2_0_lanes(codes[j], loadu(bx.add(j * Q8_0_BYTES + 2)));
                }
            }
            _mm256_cvtepi32_ps(sums_of_8(&lanes))
        }

        /// Q2_0 x Q8_0 as ggml's generic ggml_vec_dot_q2_0_q8_0 (what x86 runs), for T activation
        /// rows: per block `sumi = 0 + d_x0 * s0`, `sumi += d_x1 * s1`, `sumf += d_w * sumi`. The
        /// products and the per-block sums of a group of blocks are lane-wise vector operations (the
        /// same roundings); only the additions into `sumf` are serial, in block order.
        #[target_feature(enable = $features)]
        pub unsafe fn q2_0<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            let mut sumf = [0.0f32; T];
            let mut codes = [_mm256_setzero_si256(); 2 * Q2_0_GROUP];
            let mut dw = [0u16; Q2_0_GROUP];
            for first in (0..nb).step_by(Q2_0_GROUP) {
                let blocks = (nb - first).min(Q2_0_GROUP);
                for b in 0..blocks {
                    let bw = w.add((first + b) * Q2_0_BYTES);
                    [codes[2 * b], codes[2 * b + 1]] = q2_0_codes(bw.add(2));
                    dw[b] = std::ptr::read_unaligned(bw as *const u16);
                }
                let dw4 = _mm_cvtph_ps(_mm_loadl_epi64(dw.as_ptr() as *const __m128i));
                for t in 0..T {
                    let bx = x[t].add(first * 2 * Q8_0_BYTES);
                    let products = _mm256_mul_ps(q8_0_scales(bx, 2 * blocks), q2_0_group_sums(&codes, bx, blocks));
                    // Sub-blocks 2b and 2b + 1 of each block side by side: (0 + even) + odd.
                    let pairs = _mm256_permutevar8x32_ps(products, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
                    let even = _mm256_castps256_ps128(pairs);
                    let sumi = _mm_add_ps(_mm_add_ps(_mm_setzero_ps(), even), _mm256_extractf128_ps::<1>(pairs));
                    let mut terms = [0.0f32; Q2_0_GROUP];
                    _mm_storeu_ps(terms.as_mut_ptr(), _mm_mul_ps(dw4, sumi));
                    for term in terms.iter().take(blocks) {
                        sumf[t] += *term;
                    }
                }
            }
            *out = sumf;
        }
    };
}
pub(crate) use q1q2_kernels;

q1q2_kernels!("avx2,fma,f16c");
