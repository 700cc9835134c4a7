//! AVX2 kernels over packed 16-row groups (see `crate::packed` for the layout and the
//! arithmetic each type must reproduce), for CPUs without AVX-512 VNNI. A 256-bit vector
//! holds the same four weights of eight rows, so each group runs as two halves of eight
//! rows: lane l of a block is the first 32 bytes of the plane's 64 for rows 0..7 and the
//! last 32 for rows 8..15.
//!
//! Q8_0, Q5_0 and Q4_K: their products of several tokens decoded eight rows at a time from
//! the rows in place (a transposition, and a prefetch the kernels waited on); packed, a
//! matrix is read as it lies, front to back. Q8_0 weights are stored as they are
//! (`packed::q8_0_offset`) and multiplied with ggml's sign trick, exact because activations
//! never reach -128. Q5_0 levels (0..31) and Q4_K nibbles are unsigned and multiplied as
//! they are; activation corrections take Q5_0's 16 and Q4_K's mins back out.
//!
//! SAFETY (whole module): as `packed_x86`: `KernelArgs` points at a packed matrix with at
//! least g + 1 groups, activations for the tokens asked and outputs for them, and these
//! functions are only reached on CPUs with AVX2, FMA and F16C (`packed::kernels`).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::packed_x86::{at, NextGroup};
use crate::packed::{KernelArgs, KindKernels, PackKind};

/// The kernels for `kind`, if this module has them.
pub fn kernels(kind: PackKind) -> Option<KindKernels> {
    match kind {
        PackKind::Q8_0 => Some(KindKernels { tile: 1, tiled: legacy_lanes::<0>, single: legacy_lanes::<0>, many: Some(q8_0_many) }),
        PackKind::Q5_0 => Some(KindKernels { tile: 1, tiled: legacy_lanes::<1>, single: legacy_lanes::<1>, many: Some(q5_0_many) }),
        PackKind::Q4K => Some(KindKernels { tile: 4, tiled: q4_k_tile::<4>, single: q4_k_tile::<1>, many: Some(q4_k_many) }),
        _ => None,
    }
}

/// Rows 8h..8h + 8 of lane l of Q8_0 block b, signed bytes (row r's four in dword r).
#[inline(always)]
unsafe fn q8_lane(a: &KernelArgs, base: *const u8, b: usize, l: usize, h: usize) -> __m256i {
    _mm256_loadu_si256(at(a, base, b, 1).add(l * 64 + h * 32) as *const __m256i)
}

/// The eight f16 scales of rows 8h..8h + 8 of block b as f32 (Q8_0 and Q5_0: plane 0).
#[inline(always)]
unsafe fn q8_scales(a: &KernelArgs, base: *const u8, b: usize, h: usize) -> __m256 {
    half_scales(at(a, base, b, 0), h)
}

/// The eight f16 scales of rows 8h..8h + 8 from a block's scales plane, as f32.
#[inline(always)]
unsafe fn half_scales(scales: *const u8, h: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(scales.add(h * 16) as *const __m128i))
}

/// The activation dword (4 quants) at byte `off` of token t's row, in every lane.
#[inline(always)]
unsafe fn act4(a: &KernelArgs, t: usize, off: usize) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(a.qs.add(t * a.cols + off) as *const i32))
}

#[inline(always)]
unsafe fn act_d(a: &KernelArgs, t: usize, b: usize) -> __m256 {
    _mm256_set1_ps(*a.d.add(t * a.nb + b))
}

/// The signed products of |w| and x with w's sign, summed in fours: eight rows' lane sums.
#[inline(always)]
unsafe fn lane_sums(abs_w: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1))
}

/// acc + x as a VPADDD that LLVM does not reassociate: otherwise it regroups the sums of a
/// block token by token, keeps the eight lanes' weights (and their magnitudes) live across
/// the tokens and spills them (15 % slower than the lane by lane order, which needs two).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_in_order(acc: __m256i, x: __m256i) -> __m256i {
    let mut r = acc;
    std::arch::asm!("vpaddd {r}, {r}, {x}", r = inout(ymm_reg) r, x = in(ymm_reg) x, options(pure, nomem, nostack, preserves_flags));
    r
}

/// The low (or `high`) nibbles of v's bytes.
#[inline(always)]
unsafe fn nibbles(v: __m256i, high: bool) -> __m256i {
    let m4 = _mm256_set1_epi8(0x0f);
    if high { _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4) } else { _mm256_and_si256(v, m4) }
}

#[inline(always)]
unsafe fn store(a: &KernelArgs, g: usize, h: usize, t: usize, v: __m256) {
    _mm256_storeu_ps(a.out.add(t * a.out_stride + g * 16 + h * 8), v);
}

/// ggml's vec_dot for Q8_0 (KIND 0) or Q5_0 (KIND 1) on one token: eight lane accumulators
/// per output, each fused multiply-added once per block with d_w * d_x, then hsum_float_8's
/// order, lane-wise over the eight rows of a half: ((x0 + x4) + (x2 + x6)) + ((x1 + x5) +
/// (x3 + x7)). Q5_0's levels (0..31) times the activation plus the lane's correction is the
/// exact lane sum of (level - 16) * x.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_lanes<const KIND: u8>(a: &KernelArgs, g: usize, t: usize) {
    let base = a.w.add(g * a.group_bytes);
    // One half at a time: its eight accumulators and the operands fit the 16 registers;
    // the second pass finds the group in cache.
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); 8];
        for b in 0..a.nb {
            let ds = _mm256_mul_ps(q8_scales(a, base, b, h), act_d(a, t, b));
            let (qs, bits) = (at(a, base, b, 1), at(a, base, b, 2));
            for (l, acc_l) in acc.iter_mut().enumerate() {
                let x = act4(a, t, b * 32 + 4 * l);
                let s = if KIND == 0 {
                    let w = q8_lane(a, base, b, l, h);
                    lane_sums(_mm256_sign_epi8(w, w), w, x)
                } else {
                    let products = _mm256_maddubs_epi16(q5_levels(qs, bits, l, h), x);
                    _mm256_add_epi32(_mm256_madd_epi16(products, _mm256_set1_epi16(1)), lane_correction(a, t, b, l))
                };
                *acc_l = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(s), *acc_l);
            }
        }
        let r = [_mm256_add_ps(acc[4], acc[0]), _mm256_add_ps(acc[5], acc[1]), _mm256_add_ps(acc[6], acc[2]), _mm256_add_ps(acc[7], acc[3])];
        store(a, g, h, t, _mm256_add_ps(_mm256_add_ps(r[0], r[2]), _mm256_add_ps(r[1], r[3])));
    }
}

/// One float accumulator per output for tokens t0..t0 + T of half h, updated once per block
/// with the block's exact integer sum: acc = fma(float(isum), d_w * d_x, acc)
/// (`scalar::repacked::vec_dot_q8_0_q8_0_blocks`). Each weight vector serves the T tokens.
#[inline(always)]
unsafe fn q8_0_block_sums<const T: usize, const AHEAD: bool>(a: &KernelArgs, base: *const u8, g: usize, h: usize, t0: usize) {
    let mut acc = [_mm256_setzero_ps(); T];
    let next = NextGroup::after(a, g);
    for b in 0..a.nb {
        if AHEAD {
            next.fetch(b);
        }
        let mut isum = [_mm256_setzero_si256(); T];
        for l in 0..8 {
            let w = q8_lane(a, base, b, l, h);
            let abs_w = _mm256_sign_epi8(w, w);
            for (t, s) in isum.iter_mut().enumerate() {
                *s = add_in_order(*s, lane_sums(abs_w, w, act4(a, t0 + t, b * 32 + 4 * l)));
            }
        }
        let dw = q8_scales(a, base, b, h);
        for (t, acc_t) in acc.iter_mut().enumerate() {
            *acc_t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, act_d(a, t0 + t, b)), *acc_t);
        }
    }
    for (t, acc_t) in acc.iter().enumerate() {
        store(a, g, h, t0 + t, *acc_t);
    }
}

/// Runs `$sums::<T, AHEAD>(a, base, g, h, t)` over tokens t0..t1 of each half of group g in
/// passes of `$widest` (8 or 4) tokens, then four, two and one, AHEAD on the group's first
/// pass only: that pass also fetches the next group (`packed_x86::NextGroup`).
macro_rules! token_passes {
    ($sums:ident, $widest:expr, $a:expr, $base:expr, $g:expr, $t0:expr, $t1:expr) => {
        for h in 0..2 {
            let mut t = $t0;
            while t < $t1 {
                let first = h == 0 && t == $t0;
                t += match ($t1 - t, first) {
                    (8.., true) if $widest >= 8 => { $sums::<8, true>($a, $base, $g, h, t); 8 }
                    (8.., false) if $widest >= 8 => { $sums::<8, false>($a, $base, $g, h, t); 8 }
                    (4.., true) => { $sums::<4, true>($a, $base, $g, h, t); 4 }
                    (4.., false) => { $sums::<4, false>($a, $base, $g, h, t); 4 }
                    (2.., true) => { $sums::<2, true>($a, $base, $g, h, t); 2 }
                    (2.., false) => { $sums::<2, false>($a, $base, $g, h, t); 2 }
                    (_, true) => { $sums::<1, true>($a, $base, $g, h, t); 1 }
                    (_, false) => { $sums::<1, false>($a, $base, $g, h, t); 1 }
                };
            }
        }
    };
}

/// Q8_0 over tokens t0..t1 (products of `TILED_TOKENS` tokens or more: one accumulator), in
/// passes of eight tokens: each lane's weights and their magnitudes (VPSIGNB, which shares
/// Zen 3's two multiply pipes with the products) then serve eight tokens instead of four.
/// Gemma's 640 x 262144 output head at 8 tokens, 2 threads: 16.2-16.9 -> 13.9-15.1 ms.
/// (Q4_K and Q5_0 gain nothing from eight: measured, they stay at four.)
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_many(a: &KernelArgs, g: usize, t0: usize, t1: usize) {
    token_passes!(q8_0_block_sums, 8, a, a.w.add(g * a.group_bytes), g, t0, t1);
}

/// Rows 8h..8h + 8 of lane l of a Q5_0 block as levels 0..31 (the quant + 16), from the
/// block's qs and bits planes: the lane's nibbles (low nibbles of the qs plane's lane l for
/// l < 4, high ones of lane l - 4) and its fifth bits, bit l of the bits plane's bytes
/// (`packed::q5_0_bits_by_row`) moved to bit 4 (a 16-bit shift moves each byte's own bits to
/// bit 4: the bits crossing between the bytes land elsewhere and are masked off).
#[inline(always)]
unsafe fn q5_levels(qs: *const u8, bits: *const u8, l: usize, h: usize) -> __m256i {
    let nibbles = nibbles(_mm256_loadu_si256(qs.add((l & 3) * 64 + h * 32) as *const __m256i), l >= 4);
    let bits = _mm256_loadu_si256(bits.add(h * 32) as *const __m256i);
    let at_bit4 = match l {
        0 => _mm256_slli_epi16::<4>(bits),
        1 => _mm256_slli_epi16::<3>(bits),
        2 => _mm256_slli_epi16::<2>(bits),
        3 => _mm256_slli_epi16::<1>(bits),
        4 => bits,
        5 => _mm256_srli_epi16::<1>(bits),
        6 => _mm256_srli_epi16::<2>(bits),
        _ => _mm256_srli_epi16::<3>(bits),
    };
    _mm256_or_si256(nibbles, _mm256_and_si256(at_bit4, _mm256_set1_epi8(0x10)))
}

/// The lane correction -16 * (sum of token t's quants 4l..4l+3 of block b), broadcast.
#[inline(always)]
unsafe fn lane_correction(a: &KernelArgs, t: usize, b: usize, l: usize) -> __m256i {
    _mm256_set1_epi32(*a.aux.add((t * a.nb + b) * a.aux_per_block + l))
}

/// Token t's corrections of Q5_0 block b in the 16-bit words of `q5_0_block_isum`'s sums
/// (-16 times the sum of its quants 4l, 4l + 1 in the low word, of 4l + 2, 4l + 3 in the
/// high one, over the lanes l), broadcast.
#[inline(always)]
unsafe fn word_corrections(a: &KernelArgs, t: usize, b: usize) -> __m256i {
    _mm256_set1_epi32(*a.aux.add((t * a.nb + b) * a.aux_per_block + crate::packed::Q5_0_WORD_CORRECTIONS))
}

/// The exact sums, for eight rows, of (level - 16) * x over a Q5_0 block: the levels' eight
/// lanes `w` times the activation dwords `x(l)`. The eight products of pairs go into one
/// 16-bit word per pair position with the correction `corr` (`word_corrections`); the adds
/// wrap, but each word's true value, sixteen products of |level - 16| <= 16 and |x| <= 127,
/// is within 16 * 16 * 127 = 32512, so what the words hold is that value. One `madd` then
/// adds a row's two words. (Two words of four lanes each, widened and added in 32 bits, with
/// the correction after: 4-8 % slower products of eight tokens.)
#[inline(always)]
unsafe fn q5_0_block_isum(w: &[__m256i; 8], x: impl Fn(usize) -> __m256i, corr: __m256i) -> __m256i {
    let m = |l: usize| _mm256_maddubs_epi16(w[l], x(l));
    let lo = _mm256_add_epi16(_mm256_add_epi16(m(0), m(1)), _mm256_add_epi16(m(2), m(3)));
    let hi = _mm256_add_epi16(_mm256_add_epi16(m(4), m(5)), _mm256_add_epi16(m(6), m(7)));
    _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(lo, hi), corr), _mm256_set1_epi16(1))
}

/// Bytes of a decoded Q5_0 half-group block: eight lanes of levels (32 bytes each), then the
/// eight rows' d as f32.
const EXPANDED_BLOCK: usize = 8 * 32 + 8 * 4;

thread_local! {
    /// Per-thread buffer for decoded groups.
    static EXPANDED: std::cell::RefCell<Vec<__m256i>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Tokens t0..t0 + T of half h over its decoded blocks (`EXPANDED_BLOCK` each from `e`),
/// one accumulator per output (`scalar::repacked::vec_dot_q5_0_q8_0_blocks`): per block the
/// exact sum of (level - 16) * x (`q5_0_block_isum`), then acc = fma(float(isum), d_w * d_x,
/// acc).
#[inline(always)]
unsafe fn q5_0_block_sums<const T: usize>(a: &KernelArgs, e: *const u8, g: usize, h: usize, t0: usize) {
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..a.nb {
        let eb = e.add(b * EXPANDED_BLOCK);
        let w: [__m256i; 8] = std::array::from_fn(|l| _mm256_loadu_si256(eb.add(32 * l) as *const __m256i));
        let dw = _mm256_loadu_ps(eb.add(256) as *const f32);
        for (t, acc_t) in acc.iter_mut().enumerate() {
            let isum = q5_0_block_isum(&w, |l| act4(a, t0 + t, b * 32 + 4 * l), word_corrections(a, t0 + t, b));
            *acc_t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, act_d(a, t0 + t, b)), *acc_t);
        }
    }
    for (t, acc_t) in acc.iter().enumerate() {
        store(a, g, h, t0 + t, *acc_t);
    }
}

/// Writes `zero` into every slot, hidden from LLVM: only the tokens' accumulators are
/// zeroed, and a zeroed array (or a zeroing loop LLVM recognizes) was a memset call per
/// group (0.6 % of Qwen's 8-token step).
#[inline(always)]
fn opaque_zeros<T: Copy>(slots: &mut [MaybeUninit<T>], zero: T) {
    let zero = std::hint::black_box(zero);
    for slot in slots {
        slot.write(zero);
    }
}

/// Most tokens `q5_0_few` takes at once: its accumulators, two per token, live on the stack.
const FEW_TOKENS: usize = 16;

/// Q5_0 over a few tokens t0..t1 (at most `FEW_TOKENS`; one accumulator per output, the
/// arithmetic of `q5_0_block_sums`), block by block: each half block decoded into levels in
/// registers and multiplied by every token before the next is read, its accumulators in
/// memory (L1). A decode step's eight tokens spend little work per weight, and a separate
/// decoding pass over the group waited on its loads with nothing else to do.
#[inline(always)]
unsafe fn q5_0_few(a: &KernelArgs, g: usize, t0: usize, t1: usize) {
    let base = a.w.add(g * a.group_bytes);
    let next = NextGroup::after(a, g);
    let mut acc = [[MaybeUninit::<__m256>::uninit(); FEW_TOKENS]; 2];
    for acc_h in &mut acc {
        opaque_zeros(&mut acc_h[..t1 - t0], _mm256_setzero_ps());
    }
    for b in 0..a.nb {
        next.fetch(b);
        let (scales, qs, bits) = (at(a, base, b, 0), at(a, base, b, 1), at(a, base, b, 2));
        for (h, acc_h) in acc.iter_mut().enumerate() {
            // Spelled out: through `array::from_fn` the decoding stayed a call per lane.
            let lv = |l: usize| q5_levels(qs, bits, l, h);
            let w = [lv(0), lv(1), lv(2), lv(3), lv(4), lv(5), lv(6), lv(7)];
            let dw = half_scales(scales, h);
            for (t, acc_t) in (t0..t1).zip(acc_h.iter_mut()) {
                let acc_t = acc_t.assume_init_mut();
                let isum = q5_0_block_isum(&w, |l| act4(a, t, b * 32 + 4 * l), word_corrections(a, t, b));
                *acc_t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, act_d(a, t, b)), *acc_t);
            }
        }
    }
    for (h, acc_h) in acc.iter().enumerate() {
        for (t, acc_t) in (t0..t1).zip(acc_h.iter()) {
            store(a, g, h, t, acc_t.assume_init());
        }
    }
}

/// Q5_0 over tokens t0..t1 (one accumulator). Up to `FEW_TOKENS`: `q5_0_few`. More: the
/// group decoded once into levels, both halves block by block (fetching the next group
/// meanwhile), then passes of four tokens (then two, then one) over each half.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_many(a: &KernelArgs, g: usize, t0: usize, t1: usize) {
    if t1 - t0 <= FEW_TOKENS {
        q5_0_few(a, g, t0, t1);
        return;
    }
    let base = a.w.add(g * a.group_bytes);
    EXPANDED.with(|buf| {
        let mut buf = buf.borrow_mut();
        let half_bytes = a.nb * EXPANDED_BLOCK;
        let vectors = (2 * half_bytes).div_ceil(32);
        if buf.len() < vectors {
            buf.resize(vectors, _mm256_setzero_si256());
        }
        let e = buf.as_mut_ptr() as *mut u8;
        let next = NextGroup::after(a, g);
        for b in 0..a.nb {
            next.fetch(b);
            // The block's planes, once: the stores below may alias `a` as far as the
            // compiler knows, and would make it reload the layout for every lane.
            let (scales, qs, bits) = (at(a, base, b, 0), at(a, base, b, 1), at(a, base, b, 2));
            for h in 0..2 {
                let eb = e.add(h * half_bytes + b * EXPANDED_BLOCK);
                for l in 0..8 {
                    _mm256_storeu_si256(eb.add(32 * l) as *mut __m256i, q5_levels(qs, bits, l, h));
                }
                _mm256_storeu_ps(eb.add(256) as *mut f32, half_scales(scales, h));
            }
        }
        for h in 0..2 {
            let eh = e.add(h * half_bytes);
            let mut t = t0;
            while t < t1 {
                t += match t1 - t {
                    4.. => { q5_0_block_sums::<4>(a, eh, g, h, t); 4 }
                    2.. => { q5_0_block_sums::<2>(a, eh, g, h, t); 2 }
                    _ => { q5_0_block_sums::<1>(a, eh, g, h, t); 1 }
                };
            }
        }
    });
}

/// Rows 8h..8h + 8 of sub-block j's lane l of Q4_K super-block i: the low nibbles of the qs
/// plane's pair j / 2 for even j, the high ones for odd j.
#[inline(always)]
unsafe fn q4_k_levels(a: &KernelArgs, base: *const u8, i: usize, j: usize, l: usize, h: usize) -> __m256i {
    nibbles(_mm256_loadu_si256(at(a, base, i, 4).add((j / 2) * 512 + l * 64 + h * 32) as *const __m256i), j % 2 == 1)
}

/// Eight u8 of rows 8h..8h + 8 at p as i16, each twice (row r in lanes 2r and 2r + 1).
#[inline(always)]
unsafe fn row_scales_i16(p: *const u8) -> __m256i {
    let s = _mm_cvtepu8_epi16(_mm_loadl_epi64(p as *const __m128i));
    _mm256_set_m128i(_mm_unpackhi_epi16(s, s), _mm_unpacklo_epi16(s, s))
}

/// What ends a Q4_K super-block for the rows of half h: their mins (four vectors, the
/// sub-block pairs), d and dmin.
struct Q4kSuperBlockEnd {
    mins: [__m256i; 4],
    d: __m256,
    dmin: __m256,
}

impl Q4kSuperBlockEnd {
    #[inline(always)]
    unsafe fn load(a: &KernelArgs, base: *const u8, i: usize, h: usize) -> Q4kSuperBlockEnd {
        let half = |plane: usize| _mm_loadu_si128(at(a, base, i, plane).add(h * 16) as *const __m128i);
        Q4kSuperBlockEnd {
            mins: [0, 1, 2, 3].map(|jp| _mm256_cvtepu8_epi16(_mm_loadu_si128(at(a, base, i, 3).add(jp * 32 + h * 16) as *const __m128i))),
            d: _mm256_cvtph_ps(half(0)),
            dmin: _mm256_cvtph_ps(half(1)),
        }
    }

    /// Token t's super-block i: imin = sum_j min_j * bsum32_j (the activation's sums of 32
    /// as i16 pairs, sub-blocks 2jp and 2jp + 1 in one dword), then acc = fma(float(isum),
    /// d * d_x, acc) and acc_min = fma(float(imin), dmin * d_x, acc_min).
    #[inline(always)]
    unsafe fn accumulate(&self, a: &KernelArgs, t: usize, i: usize, isum: __m256i, acc: &mut __m256, acc_min: &mut __m256) {
        let pair = |jp: usize| _mm256_set1_epi32(*a.aux.add((t * a.nb + i) * a.aux_per_block + jp));
        let m = &self.mins;
        let imin = _mm256_add_epi32(
            _mm256_add_epi32(_mm256_madd_epi16(m[0], pair(0)), _mm256_madd_epi16(m[1], pair(1))),
            _mm256_add_epi32(_mm256_madd_epi16(m[2], pair(2)), _mm256_madd_epi16(m[3], pair(3))),
        );
        let dx = act_d(a, t, i);
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(self.d, dx), *acc);
        *acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(self.dmin, dx), *acc_min);
    }
}

/// Q4_K over tokens t0..t0 + T of half h, llama.cpp's repacked arithmetic
/// (`scalar::repacked::vec_dot_q4_k_q8_k`): per super-block the exact isum = sum_j scale_j *
/// (q4 . q8)_j (a sub-block's eight lanes add in i16: |pair| <= 2 * 15 * 127, eight of them
/// < 2^15, and `madd` by the row's scale widens them) and imin = sum_j min_j * bsum32_j, then
/// acc = fma(float(isum), d * d_x, acc), acc_min = fma(float(imin), dmin * d_x, acc_min);
/// out = acc - acc_min. AHEAD: also fetch the next group.
#[inline(always)]
unsafe fn q4_k_sums<const T: usize, const AHEAD: bool>(a: &KernelArgs, base: *const u8, g: usize, h: usize, t0: usize) {
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc_min = [_mm256_setzero_ps(); T];
    let next = NextGroup::after(a, g);
    for i in 0..a.nb {
        if AHEAD {
            next.fetch(i);
        }
        let mut isum = [_mm256_setzero_si256(); T];
        for j in 0..8 {
            let mut p16 = [_mm256_setzero_si256(); T];
            for l in 0..8 {
                let w = q4_k_levels(a, base, i, j, l, h);
                for (t, p) in p16.iter_mut().enumerate() {
                    *p = add16_in_order(*p, _mm256_maddubs_epi16(w, act4(a, t0 + t, i * 256 + 32 * j + 4 * l)));
                }
            }
            let scale = row_scales_i16(at(a, base, i, 2).add(j * 16 + h * 8));
            for (t, s) in isum.iter_mut().enumerate() {
                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(p16[t], scale));
            }
        }
        let end = Q4kSuperBlockEnd::load(a, base, i, h);
        for t in 0..T {
            end.accumulate(a, t0 + t, i, isum[t], &mut acc[t], &mut acc_min[t]);
        }
    }
    for t in 0..T {
        store(a, g, h, t0 + t, _mm256_sub_ps(acc[t], acc_min[t]));
    }
}

/// Q4_K over tokens t0..t0 + T, both halves.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_tile<const T: usize>(a: &KernelArgs, g: usize, t0: usize) {
    let base = a.w.add(g * a.group_bytes);
    for h in 0..2 {
        q4_k_sums::<T, false>(a, base, g, h, t0);
    }
}

/// Q4_K over a few tokens t0..t1 (at most `FEW_TOKENS`), the arithmetic of `q4_k_sums`
/// block by block as `q5_0_few`: each sub-block's levels decoded once into registers for
/// every token, the integer sums and the accumulators in memory (L1). In passes of four
/// tokens, the first pass over a group (the one that met its weights coming from memory)
/// took 1.7 times the samples of the second in Qwen's 8-sequence step.
#[inline(always)]
unsafe fn q4_k_few(a: &KernelArgs, g: usize, t0: usize, t1: usize) {
    let base = a.w.add(g * a.group_bytes);
    let next = NextGroup::after(a, g);
    let n = t1 - t0;
    let mut acc = [[MaybeUninit::<__m256>::uninit(); FEW_TOKENS]; 2];
    let mut acc_min = [[MaybeUninit::<__m256>::uninit(); FEW_TOKENS]; 2];
    let mut isum = [MaybeUninit::<__m256i>::uninit(); FEW_TOKENS];
    for acc_h in acc.iter_mut().chain(acc_min.iter_mut()) {
        opaque_zeros(&mut acc_h[..n], _mm256_setzero_ps());
    }
    for i in 0..a.nb {
        next.fetch(i);
        for h in 0..2 {
            opaque_zeros(&mut isum[..n], _mm256_setzero_si256());
            for j in 0..8 {
                let lv = |l: usize| q4_k_levels(a, base, i, j, l, h);
                let w = [lv(0), lv(1), lv(2), lv(3), lv(4), lv(5), lv(6), lv(7)];
                let scale = row_scales_i16(at(a, base, i, 2).add(j * 16 + h * 8));
                for (t, s) in (t0..t1).zip(isum.iter_mut()) {
                    // Exact in 16 bits in any order: |pair| <= 2 * 15 * 127, eight of them.
                    let m = |l: usize| _mm256_maddubs_epi16(w[l], act4(a, t, i * 256 + 32 * j + 4 * l));
                    let p16 = _mm256_add_epi16(
                        _mm256_add_epi16(_mm256_add_epi16(m(0), m(1)), _mm256_add_epi16(m(2), m(3))),
                        _mm256_add_epi16(_mm256_add_epi16(m(4), m(5)), _mm256_add_epi16(m(6), m(7))),
                    );
                    let s = s.assume_init_mut();
                    *s = _mm256_add_epi32(*s, _mm256_madd_epi16(p16, scale));
                }
            }
            let end = Q4kSuperBlockEnd::load(a, base, i, h);
            for (k, t) in (t0..t1).enumerate() {
                end.accumulate(a, t, i, isum[k].assume_init(), acc[h][k].assume_init_mut(), acc_min[h][k].assume_init_mut());
            }
        }
    }
    for h in 0..2 {
        for (k, t) in (t0..t1).enumerate() {
            store(a, g, h, t, _mm256_sub_ps(acc[h][k].assume_init(), acc_min[h][k].assume_init()));
        }
    }
}

/// Q4_K over tokens t0..t1: up to `FEW_TOKENS` by `q4_k_few`, more in passes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_many(a: &KernelArgs, g: usize, t0: usize, t1: usize) {
    if t1 - t0 <= FEW_TOKENS {
        q4_k_few(a, g, t0, t1);
        return;
    }
    token_passes!(q4_k_sums, 4, a, a.w.add(g * a.group_bytes), g, t0, t1);
}

/// acc + x as a VPADDW that LLVM does not reassociate (see `add_in_order`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add16_in_order(acc: __m256i, x: __m256i) -> __m256i {
    let mut r = acc;
    std::arch::asm!("vpaddw {r}, {r}, {x}", r = inout(ymm_reg) r, x = in(ymm_reg) x, options(pure, nomem, nostack, preserves_flags));
    r
}
