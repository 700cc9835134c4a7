//! x86-64 kernels. `x86_kernels!` stamps out one copy per instruction-set level, each
//! compiled with that level's `target_feature`s; the levels differ in `dot_u8i8` (AVX2's
//! maddubs+madd or AVX-512 VNNI's vpdpbusd, the same exact integers) and in the width of
//! the float dot products.
//!
//! Kernels taking `[*const u8; T]` compute T activation rows against one weight row, with
//! the per-token float operations identical whatever T is, so a matrix product gives the
//! same bits whether it runs one token or four at a time.
//!
//! SAFETY (whole module): callers pass `nb` whole blocks readable at `w` and every `x[t]`
//! (checked by the safe wrappers in `simd::mod`), and only call a level's functions on a
//! CPU that has its features (checked by the dispatch).

use std::arch::x86_64::*;

/// An f16 scale broadcast to all 8 lanes. Used where a scalar conversion would let the
/// compiler merge the f16 into a live register (a single-lane insert) and chain every
/// block of the loop on the previous one.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16x8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(std::ptr::read_unaligned(p as *const u16) as i16))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16x4(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_set1_epi16(std::ptr::read_unaligned(p as *const u16) as i16))
}

/// One f16 as f32 through F16C (the software conversion branches on the exponent).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_1(p: *const u8) -> f32 {
    _mm_cvtss_f32(f16x4(p))
}

/// The tail of ggml_vec_dot_bf16 from element `from` on (each product added in f64), then
/// the f32 result (`scalar::float`'s specifications).
#[inline]
unsafe fn bf16_tail(n: usize, w: *const u8, x: *const u8, from: usize, mut sum: f64) -> f32 {
    let bf16 = |p: *const u8, i: usize| f32::from_bits((std::ptr::read_unaligned(p.add(2 * i) as *const u16) as u32) << 16);
    for i in from..n {
        sum += (bf16(w, i) * bf16(x, i)) as f64;
    }
    sum as f32
}

/// ggml's hsum_float_8: upper half onto lower half, then lanes 2-3 onto 0-1, then lane 1
/// onto lane 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum_ps(x: __m256) -> f32 {
    let mut r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_ps128(x: __m128) -> f32 {
    let r = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn loadu(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// 32 nibbles (16 bytes) to 32 bytes: low nibbles first, then high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// The sum of the eight i32 lanes (integer: any order gives the same value).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum_epi32(x: __m256i) -> i32 {
    hsum_epi32x4(_mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_epi32x4(r: __m128i) -> i32 {
    let r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
    _mm_cvtsi128_si32(_mm_add_epi32(r, _mm_shuffle_epi32(r, 0b01)))
}

/// The f32 scale of a Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8k_d(bx: *const u8) -> f32 {
    std::ptr::read_unaligned(bx as *const f32)
}

/// A 16-element sub-block scale per 128-bit half: `lo` for bytes 0..15, `hi` for 16..31.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scale_halves(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

/// 32 bits to 32 bytes of 0xFF (bit set) or 0x00.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let x32 = std::ptr::read_unaligned(p as *const u32);
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Quantizes 32 floats to Q8_0 the way ggml's x86 quantize_row_q8_0 does: d = amax/127
/// (stored f16), q = round-half-even(x * 127/amax).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_block_q8_0(x: *const f32, y: *mut u8) {
    let v = [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))];
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_andnot_ps(sign, v[0]);
    for vi in &v[1..] {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
    }
    let mut m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    let amax = _mm_cvtss_f32(m4);
    let d = amax / 127.0;
    let dh = _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(d), _MM_FROUND_TO_NEAREST_INT), 0) as u16;
    std::ptr::write_unaligned(y as *mut u16, dh);
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let mut i = [_mm256_setzero_si256(); 4];
    for k in 0..4 {
        i[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    let (i0, i1, i2, i3) = (i[0], i[1], i[2], i[3]);
    let p01 = _mm256_packs_epi32(i0, i1);
    let p23 = _mm256_packs_epi32(i2, i3);
    let p = _mm256_packs_epi16(p01, p23);
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(y.add(2) as *mut __m256i, p);
}

/// Quantizes 256 floats to Q8_K exactly as quantize_row_q8_K_ref.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_block_q8_k(x: *const f32, y: *mut u8) {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for k in 0..32 {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x.add(8 * k))));
    }
    let mut m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    let amax = _mm_cvtss_f32(m4);
    if amax == 0.0 {
        std::ptr::write_bytes(y, 0, 292);
        return;
    }
    // The signed value of the first element of largest magnitude, as the scalar loop finds it.
    let mut max = 0.0f32;
    for j in 0..256 {
        let v = *x.add(j);
        if v.abs() == amax {
            max = v;
            break;
        }
    }
    let iscale = -127.0 / max;
    let vs = _mm256_set1_ps(iscale);
    let qs = y.add(4);
    for k in 0..8 {
        let mut q = [_mm256_setzero_si256(); 4];
        for o in 0..4 {
            q[o] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x.add(32 * k + 8 * o)), vs));
        }
        let p01 = _mm256_packs_epi32(q[0], q[1]);
        let p23 = _mm256_packs_epi32(q[2], q[3]);
        let p = _mm256_packs_epi16(p01, p23);
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // nearest_int(v) is at most 127 in magnitude here; MIN(127, v) is a no-op.
        _mm256_storeu_si256(qs.add(32 * k) as *mut __m256i, p);
        // Group sums of 16: widen to i16 and add pairs down to one i32 per group.
        let wide_lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(p));
        let wide_hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(p, 1));
        let ones = _mm256_set1_epi16(1);
        for (g, wide) in [wide_lo, wide_hi].into_iter().enumerate() {
            let s = _mm256_madd_epi16(wide, ones);
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01));
            let sum = _mm_cvtsi128_si32(s) as i16;
            std::ptr::write_unaligned(y.add(4 + 256 + 2 * (2 * k + g)) as *mut i16, sum);
        }
    }
    std::ptr::write_unaligned(y as *mut f32, 1.0 / iscale);
}

/// The eight 6-bit scales and mins of a Q4_K or Q5_K block (bw: the block), as bytes.
/// Inlined into each kernel (a call per super-block costs as much as the block's products).
#[inline(always)]
unsafe fn scales_mins_k4(bw: *const u8) -> ([u8; 8], [u8; 8]) {
    let mut bytes = [0u8; 16];
    _mm_storeu_si128(bytes.as_mut_ptr() as *mut __m128i, scales_mins_k4_16(bw.add(4)));
    let (sc, mn) = bytes.split_at(8);
    (sc.try_into().expect("8 bytes"), mn.try_into().expect("8 bytes"))
}

/// The eight 6-bit scales then the eight mins of a Q4_K or Q5_K block (12 bytes at `packed`)
/// as 16 bytes, with the 32-bit shifts and masks of ggml's AVX2 kernels (four at a time).
#[inline(always)]
unsafe fn scales_mins_k4_16(packed: *const u8) -> __m128i {
    let word = |k: usize| std::ptr::read_unaligned(packed.add(4 * k) as *const u32);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let (low6, low4, low2) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    let scales_hi = (w2 & low4) | (((w0 >> 6) & low2) << 4);
    let mins_hi = ((w2 >> 4) & low4) | (((w1 >> 6) & low2) << 4);
    _mm_set_epi32(mins_hi as i32, (w1 & low6) as i32, scales_hi as i32, (w0 & low6) as i32)
}

/// For the eight-row one-token kernels, before block `b` of eight rows of `row_bytes` at `w`
/// (blocks of `block_bytes`): asks for the share of the next eight rows (one contiguous span)
/// that block's work covers, so that they come from memory while these are multiplied; eight
/// interleaved row streams do not start the hardware prefetchers (4864x896 MXFP4, one
/// thread: 0.90 ms without, 0.56 ms with).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn prefetch_next_rows(w: *const u8, row_bytes: usize, block_bytes: usize, b: usize) {
    let (next, share) = (w.wrapping_add(8 * row_bytes), 8 * block_bytes);
    for line in 0..share.div_ceil(64) {
        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(b * share + 64 * line) as *const i8);
    }
}

/// Eight i32 vectors to one vector of their eight lane totals, in order (integers: any
/// order of additions gives the same totals).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn totals8(p: &[__m256i; 8]) -> __m256i {
    let h = [_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]), _mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7])];
    // g0 lanes: p0..p3's sums over their low 128 bits, then over their high 128 bits.
    let (g0, g1) = (_mm256_hadd_epi32(h[0], h[1]), _mm256_hadd_epi32(h[2], h[3]));
    let fold = |g: __m256i| _mm_add_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256::<1>(g));
    _mm256_set_m128i(fold(g1), fold(g0))
}

/// Signed-by-signed i8 products summed in fours into i32 lanes, through the unsigned-by-
/// signed `dot_u8i8` of the level: |x| * (y with x's sign). Exact while y != -128.
macro_rules! dot_i8_signed {
    ($x:expr, $y:expr) => {{
        let (x, y) = ($x, $y);
        dot_u8i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
    }};
}

/// The float steps of a k-quant kernel (`kacc_add`): ggml's `vec_dot`, llama.cpp's tiled
/// matrix product, or its repacked kernels.
const VEC_DOT: u8 = 0;
const TILED: u8 = 1;
const REPACKED: u8 = 2;

/// For each k-quant kernel `imp`, the public `name` (vec_dot order) and `tiled` entry points.
macro_rules! k_orders {
    ($features:literal, $($name:ident $tiled:ident $imp:ident),*) => {$(
        #[target_feature(enable = $features)]
        pub unsafe fn $name<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            $imp::<VEC_DOT, T>(nb, w, x, out)
        }
        #[target_feature(enable = $features)]
        pub unsafe fn $tiled<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            $imp::<TILED, T>(nb, w, x, out)
        }
    )*};
}

macro_rules! x86_kernels {
    ($features:literal) => {
        use super::*;

        /// Decodes one legacy 32-element weight block to 32 signed bytes.
        /// KIND: 0 = Q8_0, 1 = Q4_0, 2 = Q5_0, 3 = IQ4_NL, 4 = MXFP4.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn decode32<const KIND: u8>(b: *const u8) -> __m256i {
            match KIND {
                0 => loadu(b.add(2)),
                1 => _mm256_sub_epi8(bytes_from_nibbles_32(b.add(2)), _mm256_set1_epi8(8)),
                2 => {
                    let lo = bytes_from_nibbles_32(b.add(6));
                    // Elements whose fifth bit is clear are (q | 0xF0) = q - 16 as i8.
                    let hi = _mm256_andnot_si256(bytes_from_bits_32(b.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
                    _mm256_or_si256(lo, hi)
                }
                3 => {
                    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(crate::scalar::legacy::KVALUES_IQ4NL.as_ptr() as *const __m128i));
                    _mm256_shuffle_epi8(table, bytes_from_nibbles_32(b.add(2)))
                }
                _ => {
                    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(crate::scalar::legacy::KVALUES_MXFP4.as_ptr() as *const __m128i));
                    _mm256_shuffle_epi8(table, bytes_from_nibbles_32(b.add(1)))
                }
            }
        }

        /// The scale of a 32-element weight block: the f16 at byte 0, or MXFP4's halved E8M0
        /// exponent (KIND 4).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn block_scale<const KIND: u8>(b: *const u8) -> f32 {
            if KIND == 4 { crate::scalar::legacy::e8m0_to_f32_half(*b) } else { f16_1(b) }
        }

        /// Legacy 32-element block dot against Q8_0 activations.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dot_blocks32<const KIND: u8, const T: usize>(nb: usize, w: *const u8, wbytes: usize, x: [*const u8; T], out: &mut [f32; T]) {
            let mut acc = [_mm256_setzero_ps(); T];
            for i in 0..nb {
                let bw = w.add(i * wbytes);
                let q = decode32::<KIND>(bw);
                let dw = f16x8(bw);
                for t in 0..T {
                    let bx = x[t].add(i * 34);
                    let s = dot_i8_signed!(q, loadu(bx.add(2)));
                    acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, f16x8(bx)), _mm256_cvtepi32_ps(s), acc[t]);
                }
            }
            for t in 0..T {
                out[t] = hsum_ps(acc[t]);
            }
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q8_0<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            dot_blocks32::<0, T>(nb, w, 34, x, out)
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q4_0<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            dot_blocks32::<1, T>(nb, w, 18, x, out)
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q5_0<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            dot_blocks32::<2, T>(nb, w, 22, x, out)
        }

        /// Legacy 32-element block dot with one accumulator: the block's exact integer sum,
        /// then acc = fma(float(isum), d_w * d_x, acc) (`scalar::repacked::one_acc_dot32`).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dot_blocks32_sums<const KIND: u8, const T: usize>(nb: usize, w: *const u8, wbytes: usize, x: [*const u8; T], out: &mut [f32; T]) {
            let mut acc = [0f32; T];
            let mut first = 0;
            if T == 1 {
                // One token: eight blocks' integer sums reduced together, then their fmas in
                // block order as below (the same roundings, an eighth of the horizontal sums).
                let mut isums = [0i32; 8];
                while first + 8 <= nb {
                    let (bw, bx) = (w.add(first * wbytes), x[0].add(first * 34));
                    _mm256_storeu_si256(isums.as_mut_ptr() as *mut __m256i, block_sums8::<KIND>(bw, wbytes, bx));
                    for (b, isum) in isums.iter().enumerate() {
                        let dw = block_scale::<KIND>(bw.add(b * wbytes));
                        acc[0] = (*isum as f32).mul_add(dw * f16_1(bx.add(b * 34)), acc[0]);
                    }
                    first += 8;
                }
            }
            for i in first..nb {
                let bw = w.add(i * wbytes);
                let q = decode32::<KIND>(bw);
                let dw = block_scale::<KIND>(bw);
                for t in 0..T {
                    let bx = x[t].add(i * 34);
                    let isum = hsum_epi32(dot_i8_signed!(q, loadu(bx.add(2))));
                    acc[t] = (isum as f32).mul_add(dw * f16_1(bx), acc[t]);
                }
            }
            *out = acc;
        }

        /// The exact integer sums of eight consecutive blocks against their Q8_0 activation
        /// blocks, lane b block b: each block's eight lanes, then their totals together.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn block_sums8<const KIND: u8>(w: *const u8, wbytes: usize, x: *const u8) -> __m256i {
            let mut lanes = [_mm256_setzero_si256(); 8];
            for (b, l) in lanes.iter_mut().enumerate() {
                *l = dot_i8_signed!(decode32::<KIND>(w.add(b * wbytes)), loadu(x.add(b * 34 + 2)));
            }
            totals8(&lanes)
        }

        /// Q8_0 with one accumulator (ferrollama's products of 8 or more tokens).
        #[target_feature(enable = $features)]
        pub unsafe fn q8_0_tiled<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            dot_blocks32_sums::<0, T>(nb, w, 34, x, out)
        }

        /// Q4_0 as llama.cpp's repacked kernels compute it (`scalar::repacked`).
        #[target_feature(enable = $features)]
        pub unsafe fn q4_0_repacked<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            dot_blocks32_sums::<1, T>(nb, w, 18, x, out)
        }

        /// IQ4_NL as llama.cpp's repacked kernels compute it (`scalar::repacked`).
        #[target_feature(enable = $features)]
        pub unsafe fn iq4_nl_repacked<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            dot_blocks32_sums::<3, T>(nb, w, 18, x, out)
        }

        /// MXFP4 as llama.cpp's repacked kernels compute it (`scalar::repacked`).
        #[target_feature(enable = $features)]
        pub unsafe fn mxfp4_repacked<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            dot_blocks32_sums::<4, T>(nb, w, 17, x, out)
        }

        /// Q4_K as llama.cpp's repacked kernels compute it (`scalar::repacked`).
        #[target_feature(enable = $features)]
        pub unsafe fn q4_k_repacked<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            q4_k_impl::<REPACKED, T>(nb, w, x, out)
        }

        /// Q5_0 with one accumulator (ferrollama's products of 8 or more tokens).
        #[target_feature(enable = $features)]
        pub unsafe fn q5_0_tiled<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            dot_blocks32_sums::<2, T>(nb, w, 22, x, out)
        }

        /// IQ4_NL x Q8_0 as ggml_vec_dot_iq4_nl_q8_0 (AVX2), see `paired_blocks32`.
        #[target_feature(enable = $features)]
        pub unsafe fn iq4_nl<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            paired_blocks32::<3, T>(nb, w, 18, x, out)
        }

        /// MXFP4 x Q8_0 as ggml_vec_dot_mxfp4_q8_0 (AVX2), see `paired_blocks32`.
        #[target_feature(enable = $features)]
        pub unsafe fn mxfp4<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            paired_blocks32::<4, T>(nb, w, 17, x, out)
        }

        /// NVFP4 x Q8_0 as ggml_vec_dot_nvfp4_q8_0 (AVX2, `scalar::nvfp4`): each 32-element
        /// half of a block (two sub-blocks) against its Q8_0 block, each 128-bit half of the
        /// lanes scaled by its sub-block's scale, one accumulator.
        #[target_feature(enable = $features)]
        pub unsafe fn nvfp4<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            use crate::simd::nvfp4_avx2::{half_levels, half_scales, level_table};
            let table = level_table();
            let mut acc = [_mm256_setzero_ps(); T];
            for i in 0..nb {
                let bw = w.add(i * 36);
                for h in 0..2 {
                    let q = half_levels(bw, h, table);
                    // Each sub-block's scale times the activation's d lane by lane (ggml's
                    // scalar products, the same roundings).
                    let dw = half_scales(bw, h);
                    for t in 0..T {
                        let bx = x[t].add((2 * i + h) * 34);
                        let scales = _mm256_mul_ps(dw, f16x8(bx));
                        // ggml's sign trick (`nvfp4_avx2::signed_lanes`) on the level's products.
                        let s = dot_i8_signed!(q, loadu(bx.add(2)));
                        acc[t] = _mm256_fmadd_ps(scales, _mm256_cvtepi32_ps(s), acc[t]);
                    }
                }
            }
            for t in 0..T {
                out[t] = hsum_ps(acc[t]);
            }
        }

        /// The non-linear 4-bit types (IQ4_NL, MXFP4) as ggml's AVX2 dots: blocks in pairs, the
        /// even ones into one accumulator and the odd ones into another, added lane-wise before
        /// hsum_float_8; an odd last block is added as `sumf + d * sumi` (two roundings: GCC
        /// does not fuse it).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn paired_blocks32<const KIND: u8, const T: usize>(nb: usize, w: *const u8, wbytes: usize, x: [*const u8; T], out: &mut [f32; T]) {
            let mut acc = [[_mm256_setzero_ps(); T]; 2];
            let mut i = 0;
            while i + 1 < nb {
                for (k, acc) in acc.iter_mut().enumerate() {
                    let bw = w.add((i + k) * wbytes);
                    let q = decode32::<KIND>(bw);
                    let dw = if KIND == 4 { _mm256_set1_ps(block_scale::<KIND>(bw)) } else { f16x8(bw) };
                    for t in 0..T {
                        let bx = x[t].add((i + k) * 34);
                        let s = dot_i8_signed!(q, loadu(bx.add(2)));
                        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(f16x8(bx), dw), _mm256_cvtepi32_ps(s), acc[t]);
                    }
                }
                i += 2;
            }
            for t in 0..T {
                out[t] = hsum_ps(_mm256_add_ps(acc[0][t], acc[1][t]));
            }
            if i < nb {
                let bw = w.add(i * wbytes);
                let q = decode32::<KIND>(bw);
                for t in 0..T {
                    let bx = x[t].add(i * 34);
                    let sumi = hsum_epi32(dot_i8_signed!(q, loadu(bx.add(2))));
                    out[t] += f16_1(bx) * block_scale::<KIND>(bw) * sumi as f32;
                }
            }
        }

        /// Q4_1 and Q5_1 x Q8_1 as ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q5_1_q8_1 (AVX2): the
        /// unsigned levels against the activations in eight lanes, `acc = fma(d_w * d_x, lanes,
        /// acc)`; the min terms in one float, `summs = fma(m_w, s_x, summs)` (GCC contracts
        /// ggml's `summs += m * s`), added after hsum_float_8.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dot_blocks32_min<const Q5: bool, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            let wbytes = if Q5 { 24 } else { 20 };
            let mut acc = [_mm256_setzero_ps(); T];
            let mut summs = [0.0f32; T];
            for i in 0..nb {
                let bw = w.add(i * wbytes);
                let q = if Q5 {
                    let fifth = _mm256_and_si256(bytes_from_bits_32(bw.add(4)), _mm256_set1_epi8(0x10));
                    _mm256_or_si256(bytes_from_nibbles_32(bw.add(8)), fifth)
                } else {
                    bytes_from_nibbles_32(bw.add(4))
                };
                let (dw, mw) = (f16x8(bw), f16_1(bw.add(2)));
                for t in 0..T {
                    let bx = x[t].add(i * 36);
                    summs[t] = mw.mul_add(f16_1(bx.add(2)), summs[t]);
                    let s = dot_u8i8(q, loadu(bx.add(4)));
                    acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, f16x8(bx)), _mm256_cvtepi32_ps(s), acc[t]);
                }
            }
            for t in 0..T {
                out[t] = hsum_ps(acc[t]) + summs[t];
            }
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q4_1<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            dot_blocks32_min::<false, T>(nb, w, x, out)
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q5_1<const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            dot_blocks32_min::<true, T>(nb, w, x, out)
        }

        /// The mins of one k-quant super-block for one token, as the type folds them in,
        /// with the weight's dmin in every lane.
        #[derive(Clone, Copy)]
        enum Mins {
            /// Q3_K, Q6_K, IQ4_XS.
            None,
            /// Q2_K: madd(mins, bsums) in eight lanes, into the main lanes before the quants.
            Lanes(__m256i, __m256),
            /// Q4_K: four lanes with their own accumulator.
            Lanes4(__m128i, __m256),
            /// Q5_K: one integer into a scalar.
            Total(i32, __m256),
        }

        /// The float side of a k-quant dot for one token (the integers are the same either
        /// way): `ggml_vec_dot_*_q8_K`'s eight lanes plus the type's min accumulator, or the
        /// one accumulator of llama.cpp's tiled matrix product (see `scalar::tiled`).
        #[derive(Clone, Copy)]
        struct KAcc {
            lanes: __m256,
            mins4: __m128,
            summs: f32,
            one: f32,
            /// The mins' accumulator of the repacked order.
            one_min: f32,
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn kacc_new() -> KAcc {
            KAcc { lanes: _mm256_setzero_ps(), mins4: _mm_setzero_ps(), summs: 0.0, one: 0.0, one_min: 0.0 }
        }

        /// Adds one super-block: `bx` the activation block (its f32 scale d_x first), `dw` the
        /// weight's d in every lane, `sumi` the lanes of scaled quants. vec_dot: `lanes =
        /// fma(d_x * d, sumi, lanes)`, the mins first as the type does (scaled by -d_x * dmin);
        /// tiled: `r = float(isum) * d`, `r = fma(-dmin, float(imin), r)`, `one = fma(r, d_x,
        /// one)`; repacked (llama.cpp's repacked Q4_K, `scalar::repacked`): `one = fma(float(isum),
        /// d * d_x, one)`, `one_min = fma(float(imin), dmin * d_x, one_min)`, the output their
        /// difference. The scales stay vectors until needed: a scalar f16 conversion merges into a
        /// live register and chains each block on the previous one.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn kacc_add<const MODE: u8>(a: &mut KAcc, bx: *const u8, dw: __m256, sumi: __m256i, mins: Mins) {
            let imin = || match mins {
                Mins::None => None,
                Mins::Lanes(p, dmin) => Some((hsum_epi32(p), dmin)),
                Mins::Lanes4(p, dmin) => Some((hsum_epi32x4(p), dmin)),
                Mins::Total(sum, dmin) => Some((sum, dmin)),
            };
            if MODE == REPACKED {
                let dx = q8k_d(bx);
                a.one = (hsum_epi32(sumi) as f32).mul_add(_mm256_cvtss_f32(dw) * dx, a.one);
                if let Some((imin, dmin)) = imin() {
                    a.one_min = (imin as f32).mul_add(_mm256_cvtss_f32(dmin) * dx, a.one_min);
                }
                return;
            }
            if MODE == TILED {
                let mut r = hsum_epi32(sumi) as f32 * _mm256_cvtss_f32(dw);
                if let Some((imin, dmin)) = imin() {
                    r = (-_mm256_cvtss_f32(dmin)).mul_add(imin as f32, r);
                }
                a.one = r.mul_add(q8k_d(bx), a.one);
                return;
            }
            let yd = _mm256_broadcast_ss(&*(bx as *const f32));
            // -(d_x * dmin) == (-d_x) * dmin, ggml's `-y[i].d * dmin`.
            let neg_dmin = |dmin: __m256| _mm256_xor_ps(_mm256_mul_ps(yd, dmin), _mm256_set1_ps(-0.0));
            match mins {
                Mins::None => {}
                Mins::Lanes(p, dmin) => a.lanes = _mm256_fmadd_ps(neg_dmin(dmin), _mm256_cvtepi32_ps(p), a.lanes),
                Mins::Lanes4(p, dmin) => a.mins4 = _mm_fmadd_ps(_mm256_castps256_ps128(neg_dmin(dmin)), _mm_cvtepi32_ps(p), a.mins4),
                Mins::Total(sum, dmin) => a.summs = _mm256_cvtss_f32(neg_dmin(dmin)).mul_add(sum as f32, a.summs),
            }
            a.lanes = _mm256_fmadd_ps(_mm256_mul_ps(yd, dw), _mm256_cvtepi32_ps(sumi), a.lanes);
        }

        /// madd(mins, hadd(bsums)) of ggml's Q4_K and Q5_K kernels: lane k = min[2k] *
        /// bsum32[2k] + min[2k + 1] * bsum32[2k + 1] (bsum32: the activation's sum over a
        /// 32-element sub-block).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn min_lanes_k4(mins: __m128i, bx: *const u8) -> __m128i {
            let bsums = loadu(bx.add(260));
            let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
            _mm_madd_epi16(mins, q8s)
        }

        /// Q4_K x Q8_K as ggml_vec_dot_q4_K_q8_K (AVX2), or in the tiled order.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q4_k_impl<const MODE: u8, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            let mut acc = [kacc_new(); T];
            let m4 = _mm256_set1_epi8(0x0f);
            for i in 0..nb {
                let bw = w.add(i * 144);
                let (sc, mn) = scales_mins_k4(bw);
                let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr() as *const __m128i));
                let mut sumi = [_mm256_setzero_si256(); T];
                for j in 0..4 {
                    let scale_l = _mm256_set1_epi16(sc[2 * j] as i16);
                    let scale_h = _mm256_set1_epi16(sc[2 * j + 1] as i16);
                    let q4bits = loadu(bw.add(16 + 32 * j));
                    let q4l = _mm256_and_si256(q4bits, m4);
                    let q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits), m4);
                    for t in 0..T {
                        let q8 = x[t].add(i * 292 + 4 + 64 * j);
                        let pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, loadu(q8)));
                        let ph = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, loadu(q8.add(32))));
                        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
                    }
                }
                let (dw, dmin) = (f16x8(bw), f16x8(bw.add(2)));
                for t in 0..T {
                    let bx = x[t].add(i * 292);
                    kacc_add::<MODE>(&mut acc[t], bx, dw, sumi[t], Mins::Lanes4(min_lanes_k4(mins, bx), dmin));
                }
            }
            for t in 0..T {
                out[t] = match MODE {
                    TILED => acc[t].one,
                    REPACKED => acc[t].one - acc[t].one_min,
                    _ => hsum_ps(acc[t].lanes) + hsum_ps128(acc[t].mins4),
                };
            }
        }

        /// Q6_K x Q8_K as ggml_vec_dot_q6_K_q8_K (AVX2), or in the tiled order: unsigned 6-bit
        /// levels against the activations, minus 32 * madd(scales, bsums) (whose lane k covers
        /// 16-element groups 2k and 2k + 1).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q6_k_impl<const MODE: u8, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            let mut acc = [kacc_new(); T];
            let m4 = _mm256_set1_epi8(0x0f);
            let m2 = _mm256_set1_epi8(0x03);
            for i in 0..nb {
                let bw = w.add(i * 210);
                let scales = bw.add(192) as *const i8;
                let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(scales as *const __m128i));
                let mut sumi = [_mm256_setzero_si256(); T];
                for t in 0..T {
                    let bsums = loadu(x[t].add(i * 292 + 260));
                    sumi[t] = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bsums)));
                }
                for h in 0..2 {
                    let ql0 = loadu(bw.add(64 * h));
                    let ql1 = loadu(bw.add(64 * h + 32));
                    let qh = loadu(bw.add(128 + 32 * h));
                    let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m2));
                    let h2 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(qh), m2));
                    let h4 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(qh), m2));
                    let h6 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(qh), m2));
                    let q = [
                        _mm256_or_si256(_mm256_and_si256(ql0, m4), h0),
                        _mm256_or_si256(_mm256_and_si256(ql1, m4), h2),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4), h4),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4), h6),
                    ];
                    for g in 0..4 {
                        let sc = scale_halves(*scales.add(8 * h + 2 * g) as i16, *scales.add(8 * h + 2 * g + 1) as i16);
                        for t in 0..T {
                            let q8 = loadu(x[t].add(i * 292 + 4 + 128 * h + 32 * g));
                            let p = _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q[g], q8));
                            sumi[t] = _mm256_add_epi32(sumi[t], p);
                        }
                    }
                }
                let dw = f16x8(bw.add(208));
                for t in 0..T {
                    kacc_add::<MODE>(&mut acc[t], x[t].add(i * 292), dw, sumi[t], Mins::None);
                }
            }
            for t in 0..T {
                out[t] = if MODE == TILED { acc[t].one } else { hsum_ps(acc[t].lanes) };
            }
        }

        /// The four 2-bit planes of 32 bytes (shifts 0, 2, 4, 6): elements 32g..32g+31 of a
        /// 128-element half of a Q2_K or Q3_K block.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn planes2(bits: __m256i) -> [__m256i; 4] {
            let m3 = _mm256_set1_epi8(3);
            [
                _mm256_and_si256(bits, m3),
                _mm256_and_si256(_mm256_srli_epi16::<2>(bits), m3),
                _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m3),
                _mm256_and_si256(_mm256_srli_epi16::<6>(bits), m3),
            ]
        }

        /// Q2_K x Q8_K as ggml_vec_dot_q2_K_q8_K (AVX2), or in the tiled order: the mins as
        /// madd(mins, bsums) lanes (vec_dot: into the lanes first, scaled by -d_x * dmin), then
        /// the scaled quants in eight lanes (lane k: bytes 4k..4k+3 of each 32-element group).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q2_k_impl<const MODE: u8, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            let mut acc = [kacc_new(); T];
            for i in 0..nb {
                let bw = w.add(i * 84);
                let packed = _mm_loadu_si128(bw as *const __m128i);
                let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), _mm_set1_epi8(0x0f)));
                let mut sumi = [_mm256_setzero_si256(); T];
                for j in 0..2 {
                    let q2 = planes2(loadu(bw.add(16 + 32 * j)));
                    for g in 0..4 {
                        let s = 8 * j + 2 * g;
                        let sc = scale_halves((*bw.add(s) & 0x0f) as i16, (*bw.add(s + 1) & 0x0f) as i16);
                        for t in 0..T {
                            let q8 = loadu(x[t].add(i * 292 + 4 + 128 * j + 32 * g));
                            sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q2[g], q8)));
                        }
                    }
                }
                let (dw, dmin) = (f16x8(bw.add(80)), f16x8(bw.add(82)));
                for t in 0..T {
                    let bx = x[t].add(i * 292);
                    let prod = _mm256_madd_epi16(mins, loadu(bx.add(260)));
                    kacc_add::<MODE>(&mut acc[t], bx, dw, sumi[t], Mins::Lanes(prod, dmin));
                }
            }
            for t in 0..T {
                out[t] = if MODE == TILED { acc[t].one } else { hsum_ps(acc[t].lanes) };
            }
        }

        /// Q3_K x Q8_K as ggml_vec_dot_q3_K_q8_K (AVX2), or in the tiled order: low bits and
        /// the subtracted 4 (where the high bit is clear) multiplied separately (two maddubs,
        /// then a subtraction), the scales applied per 16-element half.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q3_k_impl<const MODE: u8, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            let mut acc = [kacc_new(); T];
            let (zero, four) = (_mm256_setzero_si256(), _mm256_set1_epi8(4));
            for i in 0..nb {
                let bw = w.add(i * 110);
                let scales = crate::scalar::kquants::q3_k_scales(std::slice::from_raw_parts(bw.add(96), 12));
                let hbits = loadu(bw);
                let mut sumi = [_mm256_setzero_si256(); T];
                for j in 0..2 {
                    let lo = planes2(loadu(bw.add(32 + 32 * j)));
                    for g in 0..4 {
                        let bit = _mm256_set1_epi8((1u8 << (4 * j + g)) as i8);
                        let hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), zero), four);
                        let s = 8 * j + 2 * g;
                        let sc = scale_halves(scales[s] as i16 - 32, scales[s + 1] as i16 - 32);
                        for t in 0..T {
                            let q8 = loadu(x[t].add(i * 292 + 4 + 128 * j + 32 * g));
                            let p = _mm256_sub_epi16(_mm256_maddubs_epi16(lo[g], q8), _mm256_maddubs_epi16(hi, q8));
                            sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(sc, p));
                        }
                    }
                }
                let dw = f16x8(bw.add(108));
                for t in 0..T {
                    kacc_add::<MODE>(&mut acc[t], x[t].add(i * 292), dw, sumi[t], Mins::None);
                }
            }
            for t in 0..T {
                out[t] = if MODE == TILED { acc[t].one } else { hsum_ps(acc[t].lanes) };
            }
        }

        /// Q5_K x Q8_K as ggml_vec_dot_q5_K_q8_K (AVX2), or in the tiled order: the scaled
        /// 5-bit levels in eight lanes; the mins as one integer per super-block (vec_dot:
        /// `summs = fma(-d_x * dmin, float(sum), summs)`, GCC's contraction of ggml's `summs +=
        /// dmin * sum`, added after hsum_float_8).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q5_k_impl<const MODE: u8, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            let mut acc = [kacc_new(); T];
            let (m4, sixteen) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(16));
            for i in 0..nb {
                let bw = w.add(i * 176);
                let (sc, mn) = scales_mins_k4(bw);
                let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr() as *const __m128i));
                let hbits = loadu(bw.add(16));
                let mut sumi = [_mm256_setzero_si256(); T];
                for j in 0..4 {
                    let q5bits = loadu(bw.add(48 + 32 * j));
                    let (bit_l, bit_h) = (_mm256_set1_epi8((1u8 << (2 * j)) as i8), _mm256_set1_epi8((2u8 << (2 * j)) as i8));
                    let fifth = |bit: __m256i| _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), bit), sixteen);
                    let q5l = _mm256_or_si256(_mm256_and_si256(q5bits, m4), fifth(bit_l));
                    let q5h = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q5bits), m4), fifth(bit_h));
                    let (sl, sh) = (_mm256_set1_epi16(sc[2 * j] as i16), _mm256_set1_epi16(sc[2 * j + 1] as i16));
                    for t in 0..T {
                        let q8 = x[t].add(i * 292 + 4 + 64 * j);
                        let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(q5l, loadu(q8)));
                        let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(q5h, loadu(q8.add(32))));
                        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
                    }
                }
                let (dw, dmin) = (f16x8(bw), f16x8(bw.add(2)));
                for t in 0..T {
                    let bx = x[t].add(i * 292);
                    let imin = hsum_epi32x4(min_lanes_k4(mins, bx));
                    kacc_add::<MODE>(&mut acc[t], bx, dw, sumi[t], Mins::Total(imin, dmin));
                }
            }
            for t in 0..T {
                out[t] = if MODE == TILED { acc[t].one } else { hsum_ps(acc[t].lanes) + acc[t].summs };
            }
        }

        /// IQ4_XS x Q8_K as ggml_vec_dot_iq4_xs_q8_K (AVX2), or in the tiled order: the levels
        /// looked up 32 at a time, signed products summed in i16 pairs, times the 32-element
        /// scale into eight lanes.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn iq4_xs_impl<const MODE: u8, const T: usize>(nb: usize, w: *const u8, x: [*const u8; T], out: &mut [f32; T]) {
            let mut acc = [kacc_new(); T];
            let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(crate::scalar::legacy::KVALUES_IQ4NL.as_ptr() as *const __m128i));
            for i in 0..nb {
                let bw = w.add(i * 136);
                let scales_h = std::ptr::read_unaligned(bw.add(2) as *const u16) as i32;
                let mut sumi = [_mm256_setzero_si256(); T];
                for ib in 0..8 {
                    let q = _mm256_shuffle_epi8(table, bytes_from_nibbles_32(bw.add(8 + 16 * ib)));
                    let ls = ((*bw.add(4 + ib / 2) >> (4 * (ib % 2))) & 0x0f) as i32 | (((scales_h >> (2 * ib)) & 3) << 4);
                    let sc = _mm256_set1_epi16((ls - 32) as i16);
                    let aq = _mm256_sign_epi8(q, q);
                    for t in 0..T {
                        let q8 = loadu(x[t].add(i * 292 + 4 + 32 * ib));
                        let p16 = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(q8, q));
                        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p16, sc));
                    }
                }
                let dw = f16x8(bw);
                for t in 0..T {
                    kacc_add::<MODE>(&mut acc[t], x[t].add(i * 292), dw, sumi[t], Mins::None);
                }
            }
            for t in 0..T {
                out[t] = if MODE == TILED { acc[t].one } else { hsum_ps(acc[t].lanes) };
            }
        }

        // The k-quant kernels in `ggml_vec_dot_*_q8_K`'s order (`NAME`) and in the order of
        // llama.cpp's tiled matrix product (`NAME_tiled`).
        k_orders!($features,
            q2_k q2_k_tiled q2_k_impl,
            q3_k q3_k_tiled q3_k_impl,
            q4_k q4_k_tiled q4_k_impl,
            q5_k q5_k_tiled q5_k_impl,
            q6_k q6_k_tiled q6_k_impl,
            iq4_xs iq4_xs_tiled iq4_xs_impl);

        /// Q8_0 activation quantizer (ggml x86 semantics), `nb` blocks.
        #[target_feature(enable = $features)]
        pub unsafe fn quantize_q8_0(nb: usize, x: *const f32, y: *mut u8) {
            for i in 0..nb {
                quantize_block_q8_0(x.add(32 * i), y.add(34 * i));
            }
        }

        /// f32 -> f16 (round to nearest even, as ggml's F16C conversion), `n` values.
        #[target_feature(enable = $features)]
        pub unsafe fn f16_from_f32(n: usize, x: *const f32, y: *mut u8) {
            let mut i = 0;
            while i + 8 <= n {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.add(i)));
                _mm_storeu_si128(y.add(2 * i) as *mut __m128i, h);
                i += 8;
            }
            while i < n {
                let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(*x.add(i)));
                std::ptr::write_unaligned(y.add(2 * i) as *mut u16, _mm_extract_epi16::<0>(h) as u16);
                i += 1;
            }
        }

        /// Q8_K quantizer (quantize_row_q8_K_ref), `nb` blocks.
        #[target_feature(enable = $features)]
        pub unsafe fn quantize_q8_k(nb: usize, x: *const f32, y: *mut u8) {
            for i in 0..nb {
                quantize_block_q8_k(x.add(256 * i), y.add(292 * i));
            }
        }

        /// The offset that makes a kind's levels unsigned for `rows8_one_token`, where `maddubs`
        /// pairs stay exact (2 * 255 * 128 would not: at most 2 * 24 * 128 here): Q4_0's stored
        /// nibbles (`unsigned_offset`), MXFP4's levels + 12. The block's integer sum is then the
        /// unsigned one minus offset times the activation's block sum, one subtraction for the
        /// eight rows instead of the sign trick's two extra operations per row. IQ4_NL's levels
        /// (-127..113) keep the sign trick (0).
        const fn rows8_offset(kind: u8) -> i32 {
            if kind == 4 { 12 } else { super::avx2::unsigned_offset(kind) }
        }

        /// A block's levels plus `rows8_offset` as unsigned bytes (Q4_0, MXFP4).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn rows8_unsigned<const KIND: u8>(b: *const u8) -> __m256i {
            if KIND != 4 {
                return super::avx2::decode32_unsigned::<KIND>(b);
            }
            // KVALUES_MXFP4 + 12.
            let table = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
            _mm256_shuffle_epi8(table, bytes_from_nibbles_32(b.add(1)))
        }

        /// Eight consecutive weight rows (row r at w + r * row_bytes) times one Q8_0 activation
        /// row with one accumulator per row, as `dot_blocks32_sums` computes each (llama.cpp's
        /// repacked gemv): per block the rows' exact integer sums (`totals8`), then one vector
        /// FMA for the eight rows, acc = fma(float(isum), d_w * d_x, acc), lane r row r. A block
        /// of activations is loaded once for the eight rows, and there is no horizontal sum per
        /// row and block. KIND as `decode32` (the repacked kinds 1, 3, 4).
        #[target_feature(enable = $features)]
        unsafe fn rows8_one_token<const KIND: u8>(nb: usize, w: *const u8, row_bytes: usize, wbytes: usize, x: *const u8, out: &mut [f32; 8]) {
            let mut acc = _mm256_setzero_ps();
            let mut lanes = [_mm256_setzero_si256(); 8];
            let mut scales = [0f32; 8];
            for b in 0..nb {
                prefetch_next_rows(w, row_bytes, wbytes, b);
                let xb = loadu(x.add(b * 34 + 2));
                for (r, (l, d)) in lanes.iter_mut().zip(scales.iter_mut()).enumerate() {
                    let bw = w.add(r * row_bytes + b * wbytes);
                    *l = match rows8_offset(KIND) {
                        0 => dot_i8_signed!(decode32::<KIND>(bw), xb),
                        _ => dot_u8i8(rows8_unsigned::<KIND>(bw), xb),
                    };
                    *d = block_scale::<KIND>(bw);
                }
                let mut isum = totals8(&lanes);
                if rows8_offset(KIND) != 0 {
                    let ones = _mm256_set1_epi8(1);
                    let x_sum = hsum_epi32(dot_u8i8(ones, xb));
                    isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(rows8_offset(KIND) * x_sum));
                }
                let dd = _mm256_mul_ps(_mm256_loadu_ps(scales.as_ptr()), _mm256_set1_ps(f16_1(x.add(b * 34))));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc);
            }
            _mm256_storeu_ps(out.as_mut_ptr(), acc);
        }

        /// `rows8_one_token` of each repacked kind, with the `simd::rows8_dot!` signature.
        #[target_feature(enable = $features)]
        pub unsafe fn q4_0_repacked_rows8(nb: usize, w: *const u8, row_bytes: usize, x: *const u8, out: &mut [f32; 8]) {
            rows8_one_token::<1>(nb, w, row_bytes, 18, x, out)
        }
        #[target_feature(enable = $features)]
        pub unsafe fn iq4_nl_repacked_rows8(nb: usize, w: *const u8, row_bytes: usize, x: *const u8, out: &mut [f32; 8]) {
            rows8_one_token::<3>(nb, w, row_bytes, 18, x, out)
        }
        #[target_feature(enable = $features)]
        pub unsafe fn mxfp4_repacked_rows8(nb: usize, w: *const u8, row_bytes: usize, x: *const u8, out: &mut [f32; 8]) {
            rows8_one_token::<4>(nb, w, row_bytes, 17, x, out)
        }
    };
}

pub mod avx2 {
    use std::arch::x86_64::*;

    /// 8 bf16 at p as f32 (ggml's AVX2 `LOAD`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn bf16x8(p: *const u8) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i))))
    }

    /// BF16 dot as ggml_vec_dot_bf16's AVX2 build (`scalar::float::vec_dot_bf16_avx2`, its
    /// specification): four accumulators of eight lanes, `add(mul(w, x), c)`, combined as
    /// `(c1 + c3) + (c2 + c4)`, `hsum_float_8`, the tail in f64.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn bf16(n: usize, w: *const u8, x: *const u8) -> f32 {
        let mut c = [_mm256_setzero_ps(); 4];
        let whole = n / 32 * 32;
        for i in (0..whole).step_by(32) {
            for (k, c) in c.iter_mut().enumerate() {
                let at = 2 * (i + 8 * k);
                *c = _mm256_add_ps(_mm256_mul_ps(bf16x8(w.add(at)), bf16x8(x.add(at))), *c);
            }
        }
        let sum = _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]));
        super::bf16_tail(n, w, x, whole, hsum_ps(sum) as f64)
    }

    /// Unsigned-by-signed byte products summed in fours (maddubs, then madd by ones).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_u8i8(a: __m256i, b: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
    }

    x86_kernels!("avx2,fma,f16c");

    /// Weight kinds of `sums_2xq` that are decoded unsigned (the stored level, 0..15 or 0..31)
    /// and corrected by `offset` times the activation's block sum; the others (Q8_0, IQ4_NL)
    /// are signed and go through the sign trick.
    pub const fn unsigned_offset(kind: u8) -> i32 {
        match kind {
            1 => 8,
            2 => 16,
            _ => 0,
        }
    }

    /// A legacy block's levels as unsigned bytes: Q4_0 0..15, Q5_0 0..31.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn decode32_unsigned<const KIND: u8>(b: *const u8) -> __m256i {
        if KIND == 1 {
            return bytes_from_nibbles_32(b.add(2));
        }
        let high = _mm256_and_si256(bytes_from_bits_32(b.add(2)), _mm256_set1_epi8(0x10));
        _mm256_or_si256(bytes_from_nibbles_32(b.add(6)), high)
    }

    /// What `sums_2xq` needs of four Q8_0 activation rows, per block b: their d as f32 at
    /// d[4b + t] and, for a kind with an unsigned offset, the correction to add to a block's
    /// sum of products, -offset * (sum of the block's quants), at corr[4b + t]. Computed
    /// once per tile of four tokens for all rows.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn sums_tile_factors(nb: usize, x: [*const u8; 4], offset: i32, d: *mut f32, corr: *mut i32) {
        let ones = _mm256_set1_epi8(1);
        for b in 0..nb {
            for t in 0..4 {
                let bx = x[t].add(b * 34);
                *d.add(4 * b + t) = f16_1(bx);
                *corr.add(4 * b + t) = if offset == 0 { 0 } else { -offset * hsum_epi32(dot_u8i8(ones, loadu(bx.add(2)))) };
            }
        }
    }

    /// Eight vectors of `maddubs` pair sums (i16) to one vector of their eight lane totals
    /// (i32), in order. The first two levels add in i16, which is exact when every pair sum
    /// is at most 7936 in magnitude (8 of them stay within i16): levels 0..31 times
    /// activations -128..127, the unsigned kinds' bound. Two `madd`s instead of eight, which
    /// matters because on AVX2 the multiplier port is what a block's sums wait on.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn totals8_i16(p: &[__m256i; 8]) -> __m256i {
        let h = [_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]), _mm256_hadd_epi16(p[4], p[5]), _mm256_hadd_epi16(p[6], p[7])];
        let ones = _mm256_set1_epi16(1);
        // Per 128-bit half: two partial sums of each of p0..p3 (p4..p7), then their i32 sums.
        let lo = _mm256_madd_epi16(_mm256_hadd_epi16(h[0], h[1]), ones);
        let hi = _mm256_madd_epi16(_mm256_hadd_epi16(h[2], h[3]), ones);
        _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(lo, hi), _mm256_permute2x128_si256::<0x31>(lo, hi))
    }

    /// Two weight rows (w[0], w[1]) times 4 * Q Q8_0 activation rows with one accumulator
    /// per output, `scalar::repacked::one_acc_dot32`'s arithmetic bit for bit: per block the
    /// exact integer sum isum, then acc = fma(float(isum), d_w * d_x, acc). Each quad of four
    /// tokens' eight outputs' sums of a block are reduced together (`totals8`) and their
    /// eight accumulators updated by one vector FMA, lane r * 4 + t for row r and token t of
    /// the quad; a block's weights are decoded once for all 4 * Q tokens. `d`, `corr`: from
    /// `sums_tile_factors` (one call per quad, d[q], corr[q]) with `unsigned_offset(KIND)`.
    /// KIND as `decode32`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn sums_2xq<const KIND: u8, const Q: usize>(
        nb: usize, w: [*const u8; 2], wbytes: usize, x: [[*const u8; 4]; Q], d: [*const f32; Q], corr: [*const i32; Q], out: &mut [[[f32; 4]; 2]; Q],
    ) {
        let mut acc = [_mm256_setzero_ps(); Q];
        for b in 0..nb {
            let (b0, b1) = (w[0].add(b * wbytes), w[1].add(b * wbytes));
            let unsigned = unsigned_offset(KIND) != 0;
            let (q0, q1) = if unsigned {
                (decode32_unsigned::<KIND>(b0), decode32_unsigned::<KIND>(b1))
            } else {
                (decode32::<KIND>(b0), decode32::<KIND>(b1))
            };
            let dw = _mm256_set_m128(_mm_set1_ps(block_scale::<KIND>(b1)), _mm_set1_ps(block_scale::<KIND>(b0)));
            for q in 0..Q {
                let mut p = [_mm256_setzero_si256(); 8];
                let isum = if unsigned {
                    for t in 0..4 {
                        let xt = loadu(x[q][t].add(b * 34 + 2));
                        (p[t], p[4 + t]) = (_mm256_maddubs_epi16(q0, xt), _mm256_maddubs_epi16(q1, xt));
                    }
                    let sums = totals8_i16(&p);
                    _mm256_add_epi32(sums, _mm256_broadcastsi128_si256(_mm_loadu_si128(corr[q].add(4 * b) as *const __m128i)))
                } else {
                    for t in 0..4 {
                        let xt = loadu(x[q][t].add(b * 34 + 2));
                        (p[t], p[4 + t]) = (dot_i8_signed!(q0, xt), dot_i8_signed!(q1, xt));
                    }
                    totals8(&p)
                };
                let dd = _mm256_mul_ps(dw, _mm256_broadcast_ps(&*(d[q].add(4 * b) as *const __m128)));
                acc[q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[q]);
            }
        }
        for q in 0..Q {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[q]);
            for r in 0..2 {
                out[q][r].copy_from_slice(&lanes[4 * r..4 * r + 4]);
            }
        }
    }


    /// The f16 at `at(r)` of eight rows as f32, one row per lane (the rows' d or dmin).
    #[inline(always)]
    unsafe fn f16x8_rows(at: impl Fn(usize) -> *const u8) -> __m256 {
        let h = |r: usize| std::ptr::read_unaligned(at(r) as *const i16);
        _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)))
    }

    /// Eight rows of sixteen i16 (element g in lane g), each element duplicated into a dword
    /// and transposed: ([g0..g3 | g8..g11], [g4..g7 | g12..g15]) by vector, each vector one
    /// element of the eight rows (row r's copy in lanes 2r and 2r + 1).
    #[inline(always)]
    unsafe fn transpose_duplicated(wide: &[__m256i; 8]) -> ([__m256i; 8], [__m256i; 8]) {
        (transpose_8x8_epi32(&std::array::from_fn(|r| _mm256_unpacklo_epi16(wide[r], wide[r]))),
         transpose_8x8_epi32(&std::array::from_fn(|r| _mm256_unpackhi_epi16(wide[r], wide[r]))))
    }

    /// Bytes `decode_octet` writes per block of eight rows: the rows' 32 levels transposed
    /// into eight vectors (vector k holds bytes 4k..4k+4 of row r in dword lane r), then the
    /// rows' eight d as f32.
    pub const OCTET_BLOCK_BYTES: usize = 8 * 32 + 8 * 4;

    /// Transposes eight rows of eight dwords: out[k] lane r = rows[r] lane k.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn transpose_8x8_epi32(r: &[__m256i; 8]) -> [__m256i; 8] {
        let t = [
            _mm256_unpacklo_epi32(r[0], r[1]), _mm256_unpackhi_epi32(r[0], r[1]),
            _mm256_unpacklo_epi32(r[2], r[3]), _mm256_unpackhi_epi32(r[2], r[3]),
            _mm256_unpacklo_epi32(r[4], r[5]), _mm256_unpackhi_epi32(r[4], r[5]),
            _mm256_unpacklo_epi32(r[6], r[7]), _mm256_unpackhi_epi32(r[6], r[7]),
        ];
        // u[k] (k < 4): dword k (low half) and k + 4 (high half) of rows 0..3; u[4 + k]: rows 4..7.
        let u = [
            _mm256_unpacklo_epi64(t[0], t[2]), _mm256_unpackhi_epi64(t[0], t[2]),
            _mm256_unpacklo_epi64(t[1], t[3]), _mm256_unpackhi_epi64(t[1], t[3]),
            _mm256_unpacklo_epi64(t[4], t[6]), _mm256_unpackhi_epi64(t[4], t[6]),
            _mm256_unpacklo_epi64(t[5], t[7]), _mm256_unpackhi_epi64(t[5], t[7]),
        ];
        [
            _mm256_permute2x128_si256::<0x20>(u[0], u[4]), _mm256_permute2x128_si256::<0x20>(u[1], u[5]),
            _mm256_permute2x128_si256::<0x20>(u[2], u[6]), _mm256_permute2x128_si256::<0x20>(u[3], u[7]),
            _mm256_permute2x128_si256::<0x31>(u[0], u[4]), _mm256_permute2x128_si256::<0x31>(u[1], u[5]),
            _mm256_permute2x128_si256::<0x31>(u[2], u[6]), _mm256_permute2x128_si256::<0x31>(u[3], u[7]),
        ]
    }

    /// Decodes nb blocks of eight consecutive weight rows (row r at w + r * row_bytes) of a
    /// legacy kind (KIND as `decode32`) into `OCTET_BLOCK_BYTES` a block at dst, for
    /// `octet_sums` (unsigned kinds, levels as stored) or `octet_sums_signed`. Done once per
    /// matrix product and row range, so that every token tile reads levels ready to multiply.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn decode_octet<const KIND: u8>(nb: usize, w: *const u8, row_bytes: usize, wbytes: usize, dst: *mut u8) {
        for b in 0..nb {
            let block = |r: usize| w.add(r * row_bytes + b * wbytes);
            let out = dst.add(b * OCTET_BLOCK_BYTES);
            if unsigned_offset(KIND) == 0 {
                let rows: [__m256i; 8] = std::array::from_fn(|r| decode32::<KIND>(block(r)));
                for (k, v) in transpose_8x8_epi32(&rows).iter().enumerate() {
                    _mm256_storeu_si256(out.add(32 * k) as *mut __m256i, *v);
                }
            } else {
                for (k, v) in unsigned_octet_levels::<KIND>(block).iter().enumerate() {
                    _mm256_storeu_si256(out.add(32 * k) as *mut __m256i, *v);
                }
            }
            let d = if KIND == 4 { _mm256_loadu_ps(std::array::from_fn::<f32, 8, _>(|r| block_scale::<KIND>(block(r))).as_ptr()) } else { f16x8_rows(block) };
            _mm256_storeu_ps(out.add(256) as *mut f32, d);
        }
    }

    /// The transposed levels (vector k: levels 4k..4k+4 of row r in dword lane r) of one block
    /// of eight rows of an unsigned kind (Q4_0, Q5_0), transposed before they are unpacked:
    /// a level byte j holds levels j and j + 16 in its nibbles, so the rows' nibble bytes
    /// transposed as dwords (a 4 x 4 transposition of rows r and r + 4 side by side) give
    /// vectors k and k + 4 at once; Q5_0's fifth bits come from the rows' qh words side by
    /// side, byte k / 2 of each spread over its dword.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unsigned_octet_levels<const KIND: u8>(block: impl Fn(usize) -> *const u8) -> [__m256i; 8] {
        let qs_at = if KIND == 1 { 2 } else { 6 };
        let side = |r: usize| _mm256_loadu2_m128i(block(r + 4).add(qs_at) as *const __m128i, block(r).add(qs_at) as *const __m128i);
        let (a0, a1, a2, a3) = (side(0), side(1), side(2), side(3));
        let (t0, t1) = (_mm256_unpacklo_epi32(a0, a1), _mm256_unpackhi_epi32(a0, a1));
        let (t2, t3) = (_mm256_unpacklo_epi32(a2, a3), _mm256_unpackhi_epi32(a2, a3));
        let bytes = [_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)];
        let m4 = _mm256_set1_epi8(0x0f);
        let mut levels: [__m256i; 8] = std::array::from_fn(|k| {
            let v = if k < 4 { bytes[k] } else { _mm256_srli_epi16::<4>(bytes[k - 4]) };
            _mm256_and_si256(v, m4)
        });
        if KIND == 2 {
            let qh = |r: usize| std::ptr::read_unaligned(block(r).add(2) as *const i32);
            let words = _mm256_setr_epi32(qh(0), qh(1), qh(2), qh(3), qh(4), qh(5), qh(6), qh(7));
            let (low_bits, high_bits) = (_mm256_set1_epi32(0x0804_0201), _mm256_set1_epi32(0x8040_2010u32 as i32));
            for (k, v) in levels.iter_mut().enumerate() {
                // Bits 4k..4k+4 are nibble k % 2 of byte k / 2: that byte in all four bytes
                // of its dword, then one bit a byte.
                let at = (k / 2) as i8;
                let spread = _mm256_shuffle_epi8(words, _mm256_setr_epi8(
                    at, at, at, at, 4 + at, 4 + at, 4 + at, 4 + at, 8 + at, 8 + at, 8 + at, 8 + at, 12 + at, 12 + at, 12 + at, 12 + at,
                    at, at, at, at, 4 + at, 4 + at, 4 + at, 4 + at, 8 + at, 8 + at, 8 + at, 8 + at, 12 + at, 12 + at, 12 + at, 12 + at));
                let bit = if k % 2 == 0 { low_bits } else { high_bits };
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
                *v = _mm256_or_si256(*v, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
            }
        }
        levels
    }

    /// Eight weight rows (an octet from `decode_octet`) times 4 * Q Q8_0 activation rows,
    /// `scalar::repacked::one_acc_dot32`'s arithmetic bit for bit, like `sums_2xq`:
    /// out[(4 q + t) * ldo + r] is row r times token t of quad q. A token's block sums for all eight rows come
    /// out of eight multiplies against its four-byte groups broadcast, one row per lane, so
    /// no horizontal reduction is needed; four multiplies' pair sums add in i16, exact for
    /// the unsigned kinds (|pair| <= 2 * 31 * 128 = 7936, four of them < 2^15).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn octet_sums<const Q: usize>(
        nb: usize, octet: *const u8, x: [[*const u8; 4]; Q], d: [*const f32; Q], corr: [*const i32; Q], out: *mut f32, ldo: usize,
    ) {
        let ones = _mm256_set1_epi16(1);
        for q in 0..Q {
            let mut acc = [_mm256_setzero_ps(); 4];
            for b in 0..nb {
                let ob = octet.add(b * OCTET_BLOCK_BYTES);
                let mut wk = [_mm256_setzero_si256(); 8];
                for (k, v) in wk.iter_mut().enumerate() {
                    *v = _mm256_loadu_si256(ob.add(32 * k) as *const __m256i);
                }
                let dw = _mm256_loadu_ps(ob.add(256) as *const f32);
                for t in 0..4 {
                    let xq = x[q][t].add(b * 34 + 2) as *const i32;
                    let m = |k: usize| _mm256_maddubs_epi16(wk[k], _mm256_set1_epi32(std::ptr::read_unaligned(xq.add(k))));
                    let lo = _mm256_add_epi16(_mm256_add_epi16(m(0), m(1)), _mm256_add_epi16(m(2), m(3)));
                    let hi = _mm256_add_epi16(_mm256_add_epi16(m(4), m(5)), _mm256_add_epi16(m(6), m(7)));
                    let isum = _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
                    let isum = _mm256_add_epi32(isum, _mm256_set1_epi32(*corr[q].add(4 * b + t)));
                    let dd = _mm256_mul_ps(dw, _mm256_set1_ps(*d[q].add(4 * b + t)));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[t]);
                }
            }
            for t in 0..4 {
                _mm256_storeu_ps(out.add((4 * q + t) * ldo), acc[t]);
            }
        }
    }

    /// `octet_sums` for the signed kinds (an octet from `decode_octet`): each
    /// multiply is |w| times the activation with w's sign (exact: activations never reach
    /// -128), its pair sums (at most 2 * 128 * 127) widened to i32 at once. The magnitudes
    /// are taken here, once a quad, not stored by the decoding: at 8 tokens that halved the
    /// decoding's time (its stores) for 2 % more here.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn octet_sums_signed<const Q: usize>(nb: usize, octet: *const u8, x: [[*const u8; 4]; Q], d: [*const f32; Q], out: *mut f32, ldo: usize) {
        let ones = _mm256_set1_epi16(1);
        for q in 0..Q {
            let mut acc = [_mm256_setzero_ps(); 4];
            for b in 0..nb {
                let ob = octet.add(b * OCTET_BLOCK_BYTES);
                let mut isum = [_mm256_setzero_si256(); 4];
                for k in 0..8 {
                    let wk = loadu(ob.add(32 * k));
                    let ak = _mm256_sign_epi8(wk, wk);
                    for t in 0..4 {
                        let xk = std::ptr::read_unaligned(x[q][t].add(b * 34 + 2 + 4 * k) as *const i32);
                        let signed = _mm256_sign_epi8(_mm256_set1_epi32(xk), wk);
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(ak, signed), ones));
                    }
                }
                let dw = _mm256_loadu_ps(ob.add(256) as *const f32);
                for t in 0..4 {
                    let dd = _mm256_mul_ps(dw, _mm256_set1_ps(*d[q].add(4 * b + t)));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), dd, acc[t]);
                }
            }
            for t in 0..4 {
                _mm256_storeu_ps(out.add((4 * q + t) * ldo), acc[t]);
            }
        }
    }

    /// Bytes `decode_octet_q4_k` writes per super-block of eight rows: the eight
    /// sub-blocks' levels (256 bytes each, transposed as `decode_octet`'s), the scales (a
    /// vector per sub-block j: row r's scale in i16 lanes 2r and 2r + 1), the mins (a vector
    /// per pair p of sub-blocks: row r's mins 2p and 2p + 1 in i16 lanes 2r and 2r + 1),
    /// then the rows' d and dmin as f32.
    pub const Q4K_OCTET_BYTES: usize = 8 * 256 + 8 * 32 + 4 * 32 + 2 * 32;

    /// Decodes nsb super-blocks of eight consecutive Q4_K rows (row r at w + r * row_bytes)
    /// into `Q4K_OCTET_BYTES` a super-block at dst, for `octet_sums_q4_k`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn decode_octet_q4_k(nsb: usize, w: *const u8, row_bytes: usize, dst: *mut u8) {
        let m4 = _mm256_set1_epi8(0x0f);
        for i in 0..nsb {
            let out = dst.add(i * Q4K_OCTET_BYTES);
            let row = |r: usize| w.add(r * row_bytes + i * 144);
            // Sub-blocks 2p and 2p + 1: the low and high nibbles of bytes 16 + 32p.. of each
            // row, one sub-block of the eight rows at a time into the transposition.
            for j in 0..8 {
                let rows: [__m256i; 8] = std::array::from_fn(|r| {
                    let bits = loadu(row(r).add(16 + 32 * (j / 2)));
                    _mm256_and_si256(if j % 2 == 0 { bits } else { _mm256_srli_epi16::<4>(bits) }, m4)
                });
                for (k, v) in transpose_8x8_epi32(&rows).iter().enumerate() {
                    _mm256_storeu_si256(out.add(256 * j + 32 * k) as *mut __m256i, *v);
                }
            }
            // Row r's scales and mins as i16 (scale j in lane j, min j in lane 8 + j): dword
            // 4 + p is the min pair p, so the transposition's vectors 4.. are the min
            // vectors; duplicated, the first four vectors of each half are the scale vectors.
            let wide: [__m256i; 8] = std::array::from_fn(|r| _mm256_cvtepu8_epi16(scales_mins_k4_16(row(r).add(4))));
            let pairs = transpose_8x8_epi32(&wide);
            for p in 0..4 {
                _mm256_storeu_si256(out.add(2304 + 32 * p) as *mut __m256i, pairs[4 + p]);
            }
            let (lo, hi) = transpose_duplicated(&wide);
            for k in 0..4 {
                _mm256_storeu_si256(out.add(2048 + 32 * k) as *mut __m256i, lo[k]);
                _mm256_storeu_si256(out.add(2048 + 32 * (4 + k)) as *mut __m256i, hi[k]);
            }
            _mm256_storeu_ps(out.add(2432) as *mut f32, f16x8_rows(row));
            _mm256_storeu_ps(out.add(2464) as *mut f32, f16x8_rows(|r| row(r).add(2)));
        }
    }

    /// Eight Q4_K rows (an octet from `decode_octet_q4_k`) times 4 * Q Q8_K activation rows,
    /// `scalar::repacked::vec_dot_q4_k_q8_k`'s arithmetic bit for bit: per super-block the
    /// exact integers isum = sum_j scale_j * (q4 . q8)_j and imin = sum_j min_j * bsum32_j,
    /// then acc = fma(float(isum), d * d_x, acc), acc_min = fma(float(imin), dmin * d_x,
    /// acc_min); out[(4 q + t) * ldo + r] = acc - acc_min of row r and token t of quad q.
    /// A sub-block's eight multiplies add in i16: |pair| <= 2 * 15 * 128, sixteen < 2^15.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn octet_sums_q4_k<const Q: usize>(nsb: usize, octet: *const u8, x: [[*const u8; 4]; Q], out: *mut f32, ldo: usize) {
        for q in 0..Q {
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut acc_min = [_mm256_setzero_ps(); 4];
            for i in 0..nsb {
                let ob = octet.add(i * Q4K_OCTET_BYTES);
                let mut isum = [_mm256_setzero_si256(); 4];
                for j in 0..8 {
                    let mut wk = [_mm256_setzero_si256(); 8];
                    for (k, v) in wk.iter_mut().enumerate() {
                        *v = _mm256_loadu_si256(ob.add(256 * j + 32 * k) as *const __m256i);
                    }
                    let scale = _mm256_loadu_si256(ob.add(2048 + 32 * j) as *const __m256i);
                    for t in 0..4 {
                        let xq = x[q][t].add(i * 292 + 4 + 32 * j) as *const i32;
                        let m = |k: usize| _mm256_maddubs_epi16(wk[k], _mm256_set1_epi32(std::ptr::read_unaligned(xq.add(k))));
                        let lo = _mm256_add_epi16(_mm256_add_epi16(m(0), m(1)), _mm256_add_epi16(m(2), m(3)));
                        let hi = _mm256_add_epi16(_mm256_add_epi16(m(4), m(5)), _mm256_add_epi16(m(6), m(7)));
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_add_epi16(lo, hi), scale));
                    }
                }
                let (d, dmin) = (_mm256_loadu_ps(ob.add(2432) as *const f32), _mm256_loadu_ps(ob.add(2464) as *const f32));
                for t in 0..4 {
                    let bx = x[q][t].add(i * 292);
                    // bsum32_j = bsums[2j] + bsums[2j + 1], each at most 32 * 128 in magnitude.
                    let bsums = loadu(bx.add(260));
                    let b32 = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256::<1>(bsums));
                    let b32 = _mm256_broadcastsi128_si256(b32);
                    let mins = |p: usize| _mm256_loadu_si256(ob.add(2304 + 32 * p) as *const __m256i);
                    let imin = _mm256_add_epi32(
                        _mm256_add_epi32(
                            _mm256_madd_epi16(mins(0), _mm256_shuffle_epi32::<0x00>(b32)),
                            _mm256_madd_epi16(mins(1), _mm256_shuffle_epi32::<0x55>(b32)),
                        ),
                        _mm256_add_epi32(
                            _mm256_madd_epi16(mins(2), _mm256_shuffle_epi32::<0xAA>(b32)),
                            _mm256_madd_epi16(mins(3), _mm256_shuffle_epi32::<0xFF>(b32)),
                        ),
                    );
                    let dx = _mm256_broadcast_ss(&*(bx as *const f32));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, dx), acc[t]);
                    acc_min[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin, dx), acc_min[t]);
                }
            }
            for t in 0..4 {
                _mm256_storeu_ps(out.add((4 * q + t) * ldo), _mm256_sub_ps(acc[t], acc_min[t]));
            }
        }
    }

    /// Bytes `decode_octet_q6_k` writes per super-block of eight rows: the eight 32-element
    /// chunks' levels (0..63, 256 bytes each, transposed as `decode_octet`'s), the scales (a
    /// vector per 16-element group g: row r's scale in i16 lanes 2r and 2r + 1), the scale
    /// pairs of the bsums correction (a vector per lane k: row r's scales 2k and 2k + 1 in
    /// i16 lanes 2r and 2r + 1), then the rows' d as f32.
    pub const Q6K_OCTET_BYTES: usize = 8 * 256 + 16 * 32 + 8 * 32 + 32;

    /// Decodes nsb super-blocks of eight consecutive Q6_K rows (row r at w + r * row_bytes)
    /// into `Q6K_OCTET_BYTES` a super-block at dst, for `octet_sums_q6_k`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn decode_octet_q6_k(nsb: usize, w: *const u8, row_bytes: usize, dst: *mut u8) {
        let (m4, m2) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x03));
        for i in 0..nsb {
            let out = dst.add(i * Q6K_OCTET_BYTES);
            let row = |r: usize| w.add(r * row_bytes + i * 210);
            // Chunk 4h + j: nibble j / 2 of ql bytes 64h + 32 (j % 2).., high bits 2j..2j + 2
            // of qh bytes 32h... One chunk of the eight rows at a time, straight from the
            // rows (L1 after the first chunk) into the transposition: no copy on the stack.
            for h in 0..2 {
                for j in 0..4 {
                    let rows: [__m256i; 8] = std::array::from_fn(|r| {
                        let (ql, qh) = (loadu(row(r).add(64 * h + 32 * (j % 2))), loadu(row(r).add(128 + 32 * h)));
                        let low = if j < 2 { ql } else { _mm256_srli_epi16::<4>(ql) };
                        let high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32)), m2);
                        _mm256_or_si256(_mm256_and_si256(low, m4), _mm256_slli_epi16::<4>(high))
                    });
                    for (k, v) in transpose_8x8_epi32(&rows).iter().enumerate() {
                        _mm256_storeu_si256(out.add(256 * (4 * h + j) + 32 * k) as *mut __m256i, *v);
                    }
                }
            }
            // Row r's sixteen scales as i16 (element g in lane g): their dword k is the pair
            // (2k, 2k + 1), so the transposition gives the pair vectors; duplicated, it gives
            // the scale vectors.
            let wide: [__m256i; 8] = std::array::from_fn(|r| _mm256_cvtepi8_epi16(_mm_loadu_si128(row(r).add(192) as *const __m128i)));
            for (k, v) in transpose_8x8_epi32(&wide).iter().enumerate() {
                _mm256_storeu_si256(out.add(2560 + 32 * k) as *mut __m256i, *v);
            }
            let (lo, hi) = transpose_duplicated(&wide);
            for k in 0..8 {
                let g_lo = if k < 4 { k } else { 4 + k };
                _mm256_storeu_si256(out.add(2048 + 32 * g_lo) as *mut __m256i, lo[k]);
                _mm256_storeu_si256(out.add(2048 + 32 * (g_lo + 4)) as *mut __m256i, hi[k]);
            }
            _mm256_storeu_ps(out.add(2816) as *mut f32, f16x8_rows(|r| row(r).add(208)));
        }
    }

    /// Eight Q6_K rows (an octet from `decode_octet_q6_k`) times 4 * Q Q8_K activation rows,
    /// ggml_vec_dot_q6_K_q8_K's AVX2 arithmetic (the `q6_k` kernel's) bit for bit. That
    /// kernel keeps eight lanes per output: lane k sums, over the 32-element chunks c,
    /// scale(2c + k / 4) * (levels . activations) of the chunk's bytes 4k..4k + 4, minus 32 *
    /// (sc[2k] bsum[2k] + sc[2k + 1] bsum[2k + 1]), and per super-block lanes = fma(d_x * d,
    /// float(lane), lanes); the output is hsum_float_8 of the lanes. Here vector k holds
    /// lane k of the eight rows, so a whole lane is summed before the next starts (one
    /// integer accumulator per token) and the final sums are the same additions in the same
    /// order across vectors. out[(4 q + t) * ldo + r]: row r times token t of quad q.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn octet_sums_q6_k<const Q: usize>(nsb: usize, octet: *const u8, x: [[*const u8; 4]; Q], out: *mut f32, ldo: usize) {
        for q in 0..Q {
            let mut lanes = [[_mm256_setzero_ps(); 8]; 4];
            for i in 0..nsb {
                let ob = octet.add(i * Q6K_OCTET_BYTES);
                let dw = _mm256_loadu_ps(ob.add(2816) as *const f32);
                let mut dd = [_mm256_setzero_ps(); 4];
                for t in 0..4 {
                    dd[t] = _mm256_mul_ps(_mm256_broadcast_ss(&*(x[q][t].add(i * 292) as *const f32)), dw);
                }
                for k in 0..8 {
                    let mut lane = [_mm256_setzero_si256(); 4];
                    for c in 0..8 {
                        let wk = _mm256_loadu_si256(ob.add(256 * c + 32 * k) as *const __m256i);
                        let scale = _mm256_loadu_si256(ob.add(2048 + 32 * (2 * c + k / 4)) as *const __m256i);
                        for t in 0..4 {
                            let xk = std::ptr::read_unaligned(x[q][t].add(i * 292 + 4 + 32 * c + 4 * k) as *const i32);
                            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wk, _mm256_set1_epi32(xk)), scale);
                            lane[t] = _mm256_add_epi32(lane[t], p);
                        }
                    }
                    let pair = _mm256_loadu_si256(ob.add(2560 + 32 * k) as *const __m256i);
                    for t in 0..4 {
                        let bsums = std::ptr::read_unaligned(x[q][t].add(i * 292 + 260 + 4 * k) as *const i32);
                        let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(pair, _mm256_set1_epi32(bsums)));
                        let sumi = _mm256_sub_epi32(lane[t], corr);
                        lanes[t][k] = _mm256_fmadd_ps(dd[t], _mm256_cvtepi32_ps(sumi), lanes[t][k]);
                    }
                }
            }
            for t in 0..4 {
                // hsum_float_8 per row: ((l4 + l0) + (l6 + l2)) + ((l5 + l1) + (l7 + l3)).
                let a = &lanes[t];
                let even = _mm256_add_ps(_mm256_add_ps(a[4], a[0]), _mm256_add_ps(a[6], a[2]));
                let odd = _mm256_add_ps(_mm256_add_ps(a[5], a[1]), _mm256_add_ps(a[7], a[3]));
                _mm256_storeu_ps(out.add((4 * q + t) * ldo), _mm256_add_ps(even, odd));
            }
        }
    }

    /// F16 dot: four 8-lane FMA accumulators, then the tail, each product exact in f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16(n: usize, w: *const u8, x: *const u8) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for k in 0..4 {
                let a = _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * (i + 8 * k)) as *const __m128i));
                let b = _mm256_cvtph_ps(_mm_loadu_si128(x.add(2 * (i + 8 * k)) as *const __m128i));
                acc[k] = _mm256_fmadd_ps(a, b, acc[k]);
            }
            i += 32;
        }
        let mut sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        while i < n {
            sum += crate::util::f16_to_f32(std::ptr::read_unaligned(w.add(2 * i) as *const u16))
                * crate::util::f16_to_f32(std::ptr::read_unaligned(x.add(2 * i) as *const u16));
            i += 1;
        }
        sum
    }

    /// F32 dot: four 8-lane FMA accumulators, then the tail.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f32(n: usize, w: *const u8, x: *const u8) -> f32 {
        let (w, x) = (w as *const f32, x as *const f32);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for k in 0..4 {
                acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(i + 8 * k)), _mm256_loadu_ps(x.add(i + 8 * k)), acc[k]);
            }
            i += 32;
        }
        let mut sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        while i < n {
            sum += std::ptr::read_unaligned(w.add(i)) * std::ptr::read_unaligned(x.add(i));
            i += 1;
        }
        sum
    }
}

pub mod avx512 {
    use std::arch::x86_64::*;

    use super::loadu;

    /// Unsigned-by-signed byte products summed in fours in one VNNI instruction.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dot_u8i8(a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
    }

    x86_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");

    /// The activation bytes of a 256-bit vector with the sign of w's bytes (`vpsignb`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn signed_by_256(x: __m256i, w: __m256i) -> __m256i {
        _mm256_sign_epi8(x, w)
    }

    /// `signed_by_256` on 512 bits, which have no `vpsignb`: negated where w < 0 (where
    /// w == 0 x stays, and its product with |w| = 0 is 0 all the same).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn signed_by_512(x: __m512i, w: __m512i) -> __m512i {
        _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x)
    }

    /// An octet's 32 bytes at p (`apart` unused: see `pair_at`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn octet_at(p: *const u8, _apart: usize) -> __m256i {
        loadu(p)
    }

    /// Two octets' 32 bytes, at p (low half) and p + apart (high half).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pair_at(p: *const u8, apart: usize) -> __m512i {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(loadu(p)), loadu(p.add(apart)))
    }

    /// The signed legacy kinds' octet kernel (`avx2::octet_sums_signed`) with VNNI, on
    /// vectors of eight rows (one octet) or sixteen (two side by side).
    macro_rules! octet_signed_kernel {
        ($name:ident, $si:ty, $ps:ty, $load:ident, $zero_si:ident, $zero_ps:ident, $abs:ident, $signed_by:ident, $set1_epi32:ident, $set1_ps:ident,
         $dpbusd:ident, $mul:ident, $fma:ident, $cvt:ident, $cast_ps:ident, $store:ident, $doc:literal) => {
            #[doc = $doc]
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            pub unsafe fn $name<const Q: usize>(
                nb: usize, octet: *const u8, octet_bytes: usize, x: [[*const u8; 4]; Q], d: [*const f32; Q], out: *mut f32, ldo: usize,
            ) {
                use super::avx2::OCTET_BLOCK_BYTES;
                for q in 0..Q {
                    let mut acc = [$zero_ps(); 4];
                    for b in 0..nb {
                        let ob = octet.add(b * OCTET_BLOCK_BYTES);
                        let mut isum = [$zero_si(); 4];
                        for k in 0..8 {
                            let wk = $load(ob.add(32 * k), octet_bytes);
                            let ak = $abs(wk);
                            for t in 0..4 {
                                let xk = std::ptr::read_unaligned(x[q][t].add(b * 34 + 2 + 4 * k) as *const i32);
                                isum[t] = $dpbusd(isum[t], ak, $signed_by($set1_epi32(xk), wk));
                            }
                        }
                        let dw = $cast_ps($load(ob.add(256), octet_bytes));
                        for t in 0..4 {
                            let dd = $mul(dw, $set1_ps(*d[q].add(4 * b + t)));
                            acc[t] = $fma($cvt(isum[t]), dd, acc[t]);
                        }
                    }
                    for t in 0..4 {
                        $store(out.add((4 * q + t) * ldo), acc[t]);
                    }
                }
            }
        };
    }

    octet_signed_kernel!(octet_sums_signed, __m256i, __m256, octet_at, _mm256_setzero_si256, _mm256_setzero_ps, _mm256_abs_epi8, signed_by_256,
        _mm256_set1_epi32, _mm256_set1_ps, _mm256_dpbusd_epi32, _mm256_mul_ps, _mm256_fmadd_ps, _mm256_cvtepi32_ps, _mm256_castsi256_ps, _mm256_storeu_ps,
        "`avx2::octet_sums_signed` (Q8_0, IQ4_NL, MXFP4) with `vpdpbusd`: |w| times the activation with w's sign summed in fours straight into \
         i32 (exact: activations never reach -128), the same isum and float steps. `octet_bytes` unused.");

    octet_signed_kernel!(octet_pair_sums_signed, __m512i, __m512, pair_at, _mm512_setzero_si512, _mm512_setzero_ps, _mm512_abs_epi8, signed_by_512,
        _mm512_set1_epi32, _mm512_set1_ps, _mm512_dpbusd_epi32, _mm512_mul_ps, _mm512_fmadd_ps, _mm512_cvtepi32_ps, _mm512_castsi512_ps, _mm512_storeu_ps,
        "`octet_sums_signed` on two octets side by side (the octet at `octet` and the next one, `octet_bytes` on: sixteen consecutive rows), \
         row r of 0..16 in lane r: out[(4 q + t) * ldo + r].");

    /// 16 bf16 at p as f32 (ggml's AVX-512F `LOAD`: widened and shifted into the top half).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn bf16x16(p: *const u8) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(loadu(p))))
    }

    /// `scalar::float::reduce_add_16` (GCC's `_mm512_reduce_add_ps`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn reduce_add_16(c: __m512) -> f32 {
        let t3 = _mm256_add_ps(_mm512_extractf32x8_ps::<1>(c), _mm512_castps512_ps256(c));
        let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
        let t8 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
        _mm_cvtss_f32(_mm_add_ss(t8, _mm_movehdup_ps(t8)))
    }

    /// BF16 dot as ggml_vec_dot_bf16's AVX-512F build without AVX512_BF16
    /// (`scalar::float::vec_dot_bf16_avx512`, its specification): two accumulators of
    /// sixteen lanes, `add(mul(w, x), c)`, each reduced and added in f64, the tail in f64.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn bf16(n: usize, w: *const u8, x: *const u8) -> f32 {
        let mut c = [_mm512_setzero_ps(); 2];
        let whole = n / 32 * 32;
        for i in (0..whole).step_by(32) {
            for (k, c) in c.iter_mut().enumerate() {
                let at = 2 * (i + 16 * k);
                *c = _mm512_add_ps(_mm512_mul_ps(bf16x16(w.add(at)), bf16x16(x.add(at))), *c);
            }
        }
        let sum = 0.0f64 + reduce_add_16(c[0]) as f64 + reduce_add_16(c[1]) as f64;
        super::bf16_tail(n, w, x, whole, sum)
    }

    /// F16 dot with 16-lane accumulators.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn f16(n: usize, w: *const u8, x: *const u8) -> f32 {
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        while i + 64 <= n {
            for k in 0..4 {
                let a = _mm512_cvtph_ps(_mm256_loadu_si256(w.add(2 * (i + 16 * k)) as *const __m256i));
                let b = _mm512_cvtph_ps(_mm256_loadu_si256(x.add(2 * (i + 16 * k)) as *const __m256i));
                acc[k] = _mm512_fmadd_ps(a, b, acc[k]);
            }
            i += 64;
        }
        let mut sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
        while i < n {
            sum += crate::util::f16_to_f32(std::ptr::read_unaligned(w.add(2 * i) as *const u16))
                * crate::util::f16_to_f32(std::ptr::read_unaligned(x.add(2 * i) as *const u16));
            i += 1;
        }
        sum
    }

    /// F32 dot with 16-lane accumulators.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn f32(n: usize, w: *const u8, x: *const u8) -> f32 {
        let (w, x) = (w as *const f32, x as *const f32);
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        while i + 64 <= n {
            for k in 0..4 {
                acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(w.add(i + 16 * k)), _mm512_loadu_ps(x.add(i + 16 * k)), acc[k]);
            }
            i += 64;
        }
        let mut sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
        while i < n {
            sum += std::ptr::read_unaligned(w.add(i)) * std::ptr::read_unaligned(x.add(i));
            i += 1;
        }
        sum
    }
}
