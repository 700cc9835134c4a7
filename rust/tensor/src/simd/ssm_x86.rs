//! The recurrent kernels of `ssm` (ssm_conv, ssm_scan, the gated delta net) in AVX2 and
//! AVX-512. `ssm_kernels!` writes them once over a level's vector primitives (`V`, `LANES`,
//! load/store with a lane count for a row's last partial vector, mul/add/fmadd, hsum, hsum4);
//! the two levels differ only in those and in ssm_conv's kernel for a few tokens
//! (`conv_few`: four taps, windows kept one channel per 128-bit lane, filled by AVX-512's
//! expanding loads or AVX2's permutes).
//!
//! They compute what the scalar specifications in `ssm` do, element for element, except
//! that the dot products are summed in vector lanes with fused multiply-adds (ssm_scan's new
//! state, a product and a sum as in the scalar code, comes out bit for bit the same, and so
//! does all of ssm_conv, whose few terms are summed in the scalar order).
//!
//! SAFETY (whole module): the kernels are `unsafe` only for their CPU features, which the
//! dispatch in `ssm` checks (`Isa::available`); they check the lengths of their slices
//! themselves, and `conv_channels` relies on `ssm_conv`'s checks of its raw pointers.

use crate::ssm::{ConvPart, DeltaToken, ScanToken};

/// The most taps the vector ssm_conv keeps in registers (wider kernels use the scalar one).
pub const MAX_TAPS: usize = 8;

/// Rows of the state handled together. A token's work on a row waits for the previous
/// token's on it (its dot with k, the reduction, the delta, the update: some ninety cycles),
/// so the rows of a group are independent chains that overlap; eight keep the FMA units
/// busy rather than waiting on those chains (four: 512 tokens of Qwen3.5-0.8B's delta net
/// 36-41 us a layer on AVX-512, eight: 26-27), and share the loads of k, q and the decay (of
/// B and C in the scan). AVX2 spills a few registers at eight and is still a little faster.
const ROWS: usize = 8;

/// Channels `conv_tiled` transposes at a time: its stack holds their taps and state.
const CONV_CHUNK: usize = 256;


macro_rules! ssm_kernels {
    ($features:literal) => {
        use super::*;

        /// A full vector from `p`, or its first `n` lanes (the rest zero).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn load_upto(p: *const f32, n: usize) -> V {
            if n == LANES { load(p) } else { load_part(p, n) }
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn store_upto(p: *mut f32, n: usize, v: V) {
            if n == LANES { store(p, v) } else { store_part(p, n, v) }
        }

        /// The lane sums of R accumulators: by fours through one reduction tree (a third of
        /// the shuffles of four separate ones), else one by one.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn hsums<const R: usize>(acc: &[V; R]) -> [f32; R] {
            let mut sums = [0f32; R];
            if R % 4 == 0 {
                for (four, acc4) in sums.chunks_exact_mut(4).zip(acc.chunks_exact(4)) {
                    four.copy_from_slice(&hsum4([acc4[0], acc4[1], acc4[2], acc4[3]]));
                }
            } else {
                sums.iter_mut().zip(acc).for_each(|(s, &a)| *s = hsum(a));
            }
            sums
        }

        /// One head of ssm_scan through a tile of tokens (`ssm::scan_head_scalar`): ROWS
        /// rows at a time, each group through all the tokens while it is in L1.
        ///
        /// `state` borrowed whole, the rows are reached through its pointer (`scan_rows`
        /// writes R rows at once); in bounds by the shape checks.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn scan_head(state: &mut [f32], tokens: &mut [ScanToken]) {
            let Some(first) = tokens.first() else { return };
            let (d_state, head_dim) = (first.b.len(), first.x.len());
            assert_eq!(state.len(), head_dim * d_state, "scan_head: state");
            for tok in tokens.iter() {
                assert!(tok.b.len() == d_state && tok.c.len() == d_state && tok.x.len() == head_dim && tok.y.len() == head_dim, "scan_head: token shapes");
            }
            let rows = state.as_mut_ptr();
            let mut r = 0;
            while r < head_dim {
                // Groups of ROWS, then of four, then single rows.
                let group = if r + ROWS <= head_dim { ROWS } else if r + 4 <= head_dim { 4 } else { 1 };
                for tok in tokens.iter_mut() {
                    match group {
                        ROWS => scan_rows::<ROWS>(rows.add(r * d_state), r, tok),
                        4 => scan_rows::<4>(rows.add(r * d_state), r, tok),
                        _ => scan_rows::<1>(rows.add(r * d_state), r, tok),
                    }
                }
                r += group;
            }
        }

        /// Rows r0..r0+R of one head's scan state, starting at `rows`, for one token.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn scan_rows<const R: usize>(rows: *mut f32, r0: usize, tok: &mut ScanToken) {
            let d_state = tok.b.len();
            let d_a = set1(tok.d_a);
            let x_dt: [V; R] = std::array::from_fn(|r| set1(tok.x[r0 + r] * tok.dt_soft_plus));
            let mut acc = [zero(); R];
            for i in (0..d_state).step_by(LANES) {
                let n = (d_state - i).min(LANES);
                let (b, c) = (load_upto(tok.b.as_ptr().add(i), n), load_upto(tok.c.as_ptr().add(i), n));
                for r in 0..R {
                    let p = rows.add(r * d_state + i);
                    // s * dA + B * x_dt: two products and a sum, as the scalar code (and ggml's
                    // vector loop) rounds them.
                    let s = add(mul(load_upto(p, n), d_a), mul(b, x_dt[r]));
                    store_upto(p, n, s);
                    acc[r] = fmadd(s, c, acc[r]);
                }
            }
            for (r, sum) in hsums(&acc).into_iter().enumerate() {
                tok.y[r0 + r] = sum;
            }
        }

        /// One head of the gated delta net through a tile of tokens
        /// (`ssm::delta_head_scalar`): ROWS rows at a time, each group through all the tokens
        /// while it is in L1.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn delta_head(state: &mut [f32], tokens: &mut [DeltaToken]) {
            let Some(s_v) = tokens.first().map(|t| t.v.len()) else { return };
            assert_eq!(state.len(), s_v * s_v, "delta_head: state");
            for tok in tokens.iter() {
                assert!(tok.q.len() == s_v && tok.k.len() == s_v && tok.v.len() == s_v && tok.out.len() == s_v, "delta_head: token shapes");
                assert!(tok.decay.len() == 1 || tok.decay.len() == s_v, "delta_head: decay");
            }
            let rows = state.as_mut_ptr();
            let mut j = 0;
            while j < s_v {
                // Groups of ROWS, then of four, then single rows.
                let group = if j + ROWS <= s_v { ROWS } else if j + 4 <= s_v { 4 } else { 1 };
                for tok in tokens.iter_mut() {
                    match group {
                        ROWS => delta_rows::<ROWS>(rows.add(j * s_v), j, tok),
                        4 => delta_rows::<4>(rows.add(j * s_v), j, tok),
                        _ => delta_rows::<1>(rows.add(j * s_v), j, tok),
                    }
                }
                j += group;
            }
        }

        /// The decay of elements i.. of a state row: exp(g) for all, or per element (KDA).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn decay_at(tok: &DeltaToken, i: usize, n: usize) -> V {
            if tok.decay.len() > 1 { load_upto(tok.decay.as_ptr().add(i), n) } else { set1(tok.decay[0]) }
        }

        /// Rows j0..j0+R of one head's transposed state (columns of S), starting at `rows`,
        /// for one token: decay, dot with k, the delta, the rank-1 update, dot with q. The
        /// first pass only reads (the decayed row is recomputed, the same product, in the
        /// second rather than stored twice), the second reads from L1 and writes. A scalar
        /// gate factors out of the first dot: decay * (s . k), one multiply-add an element.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn delta_rows<const R: usize>(rows: *mut f32, j0: usize, tok: &mut DeltaToken) {
            let s_v = tok.v.len();
            let per_channel = tok.decay.len() > 1;
            let mut acc = [zero(); R];
            for i in (0..s_v).step_by(LANES) {
                let n = (s_v - i).min(LANES);
                let k = load_upto(tok.k.as_ptr().add(i), n);
                if per_channel {
                    let decay = load_upto(tok.decay.as_ptr().add(i), n);
                    for r in 0..R {
                        acc[r] = fmadd(mul(load_upto(rows.add(r * s_v + i), n), decay), k, acc[r]);
                    }
                } else {
                    for r in 0..R {
                        acc[r] = fmadd(load_upto(rows.add(r * s_v + i), n), k, acc[r]);
                    }
                }
            }
            let kv = hsums(&acc);
            let kv_scale = if per_channel { 1.0 } else { tok.decay[0] };
            let delta: [V; R] = std::array::from_fn(|r| set1((tok.v[j0 + r] - kv[r] * kv_scale) * tok.beta));
            let mut acc = [zero(); R];
            for i in (0..s_v).step_by(LANES) {
                let n = (s_v - i).min(LANES);
                let (decay, k, q) = (decay_at(tok, i, n), load_upto(tok.k.as_ptr().add(i), n), load_upto(tok.q.as_ptr().add(i), n));
                for r in 0..R {
                    let p = rows.add(r * s_v + i);
                    let m = fmadd(k, delta[r], mul(load_upto(p, n), decay));
                    store_upto(p, n, m);
                    acc[r] = fmadd(m, q, acc[r]);
                }
            }
            for (r, sum) in hsums(&acc).into_iter().enumerate() {
                tok.out[j0 + r] = sum * tok.scale;
            }
        }

        /// ssm_conv on channels c0..c1 (`ssm::conv_channels_scalar`). Prompts take
        /// `conv_tiled`; a few tokens the level's `conv_few` (AVX-512's four-tap kernel, or
        /// the scalar loop: the transposes `conv_tiled` starts with cost what a token does).
        ///
        /// SAFETY: as `conv_channels_scalar`, and d_conv <= MAX_TAPS.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn conv_channels(part: &ConvPart, c0: usize, c1: usize) {
            if part.n_t >= CONV_TILED_MIN_TOKENS {
                match part.d_conv {
                    1 => conv_tiled::<1>(part, c0, c1),
                    2 => conv_tiled::<2>(part, c0, c1),
                    3 => conv_tiled::<3>(part, c0, c1),
                    4 => conv_tiled::<4>(part, c0, c1),
                    _ => conv_tiled::<MAX_TAPS>(part, c0, c1),
                }
            } else {
                conv_few(part, c0, c1)
            }
        }

        /// ssm_conv over a prompt, CONV_CHUNK channels at a time: the chunk's taps and
        /// state transposed onto the stack (tap- and position-major), then token by token
        /// each output vector a sum over the window's rows, which are rows of the state copy
        /// or of x itself (the previous d_conv - 1 rows of x, still in L1). TAPS is d_conv,
        /// or MAX_TAPS for any d_conv up to it (then a loop bound).
        ///
        /// The sum is the scalar loop's, from zero, a product and a sum per tap, so that every
        /// path of ssm_conv gives the same bits (and a prompt split differently the same
        /// outputs); a fused multiply-add would gain little in a kernel this light.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn conv_tiled<const TAPS: usize>(part: &ConvPart, c0: usize, c1: usize) {
            let taps = if TAPS == MAX_TAPS { part.d_conv } else { TAPS };
            let keep = taps - 1;
            let mut weight_t = [0f32; MAX_TAPS * CONV_CHUNK];
            let mut state_t = [0f32; (MAX_TAPS - 1) * CONV_CHUNK];
            for cs in (c0..c1).step_by(CONV_CHUNK) {
                let width = (c1 - cs).min(CONV_CHUNK);
                for l in 0..width {
                    for i in 0..taps {
                        weight_t[i * CONV_CHUNK + l] = part.weight[(cs + l) * taps + i];
                    }
                    for j in 0..keep {
                        state_t[j * CONV_CHUNK + l] = *part.state.add((cs + l) * keep + j);
                    }
                }
                // Window row j of the chunk: a row of the state copy, then of x.
                let row = |j: usize| if j < keep { state_t.as_ptr().add(j * CONV_CHUNK) } else { part.x.as_ptr().add((j - keep) * part.x_stride + cs) };
                for t in 0..part.n_t {
                    let rows: [*const f32; MAX_TAPS] = std::array::from_fn(|i| if i < taps { row(t + i) } else { std::ptr::null() });
                    let out = part.out.add(t * part.channels + cs);
                    for v in (0..width).step_by(LANES) {
                        let n = (width - v).min(LANES);
                        let mut sum = zero();
                        for i in 0..taps {
                            sum = add(sum, mul(load_upto(rows[i].add(v), n), load_upto(weight_t.as_ptr().add(i * CONV_CHUNK + v), n)));
                        }
                        store_upto(out.add(v), n, sum);
                    }
                }
                for j in 0..keep {
                    let src = row(part.n_t + j);
                    for l in 0..width {
                        *part.state.add((cs + l) * keep + j) = *src.add(l);
                    }
                }
            }
        }
    };
}

/// AVX2 + FMA: eight lanes; a partial vector through maskload/maskstore.
pub mod avx2 {
    use std::arch::x86_64::*;

    type V = __m256;
    const LANES: usize = 8;
    /// Tokens from which ssm_conv takes the transposing kernel (`conv_tiled`) rather than
    /// `conv_few`: Qwen3.5-0.8B's 6144 channels, 4 tokens 8.3 us few / 11.1 tiled, 8 tokens
    /// 8.1 / 6.0.
    const CONV_TILED_MIN_TOKENS: usize = 8;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(p: *const f32) -> V { _mm256_loadu_ps(p) }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store(p: *mut f32, v: V) { _mm256_storeu_ps(p, v) }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn first_lanes(n: usize) -> __m256i { _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_part(p: *const f32, n: usize) -> V { _mm256_maskload_ps(p, first_lanes(n)) }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store_part(p: *mut f32, n: usize, v: V) { _mm256_maskstore_ps(p, first_lanes(n), v) }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn set1(x: f32) -> V { _mm256_set1_ps(x) }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn zero() -> V { _mm256_setzero_ps() }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn add(a: V, b: V) -> V { _mm256_add_ps(a, b) }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn mul(a: V, b: V) -> V { _mm256_mul_ps(a, b) }
    /// a * b + c, rounded once.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fmadd(a: V, b: V, c: V) -> V { _mm256_fmadd_ps(a, b, c) }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: V) -> f32 {
        let r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
    }
    /// The lane sums of four vectors: pairwise horizontal adds within the 128-bit lanes, then
    /// the two lanes added.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum4(v: [V; 4]) -> [f32; 4] {
        let quads = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
        let sums = _mm_add_ps(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1));
        let mut out = [0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), sums);
        out
    }

    ssm_kernels!("avx2,fma");

    /// A few tokens of ssm_conv: four taps eight channels at a time (`conv4_block`), other
    /// widths and the channels past the last block by the scalar loop.
    ///
    /// SAFETY: as `ssm::conv_channels_scalar`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn conv_few(part: &ConvPart, c0: usize, c1: usize) {
        let blocks_end = if part.d_conv == 4 { c0 + (c1 - c0) / 8 * 8 } else { c0 };
        for c in (c0..blocks_end).step_by(8) {
            conv4_block(part, c);
        }
        crate::ssm::conv_channels_scalar(part, blocks_end, c1);
    }

    /// Four-tap ssm_conv on channels c..c+8 without transposing anything: register a holds
    /// channels c+2a and c+2a+1, one per 128-bit lane, as its window (the state widened from
    /// 3 to 4 floats a channel by a permute, each token shifted in by a lane-wise byte align)
    /// and as its four taps (the weight rows as they are). The products' in-lane sums come
    /// out of a 4x4 transpose within lanes, added to zero in tap order (the scalar loop's
    /// sum, bit for bit), and the new state out of a permute and a masked store.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn conv4_block(part: &ConvPart, c: usize) {
        let weight = part.weight.as_ptr().add(c * 4);
        let w: [V; 4] = std::array::from_fn(|a| _mm256_loadu_ps(weight.add(8 * a)));
        let state = part.state.add(c * 3);
        let six = first_lanes(6);
        // [0 s0 s1 s2] per lane (lane 6 of the masked load is a zero): each token shifts one
        // in at the top.
        let widen = _mm256_setr_epi32(6, 0, 1, 2, 6, 3, 4, 5);
        let mut win: [V; 4] = std::array::from_fn(|a| _mm256_permutevar8x32_ps(_mm256_maskload_ps(state.add(6 * a), six), widen));
        // Register a's inputs x[2a] and x[2a + 1] at the bottom of its lanes.
        let inputs: [__m256i; 4] = std::array::from_fn(|a| _mm256_setr_epi32(2 * a as i32, 0, 0, 0, 2 * a as i32 + 1, 0, 0, 0));
        // Output lane 2a + q (channel c + 2a + q) is the sum's lane 4q + a.
        let channel_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for t in 0..part.n_t {
            let x = _mm256_loadu_ps(part.x.as_ptr().add(t * part.x_stride + c));
            for (a, wa) in win.iter_mut().enumerate() {
                let x_low = _mm256_permutevar8x32_ps(x, inputs[a]);
                *wa = _mm256_castsi256_ps(_mm256_alignr_epi8(_mm256_castps_si256(x_low), _mm256_castps_si256(*wa), 4));
            }
            let p: [V; 4] = std::array::from_fn(|a| _mm256_mul_ps(win[a], w[a]));
            let taps = transpose_in_lanes(p);
            let sum = taps.iter().fold(_mm256_setzero_ps(), |s, &tap| _mm256_add_ps(s, tap));
            _mm256_storeu_ps(part.out.add(t * part.channels + c), _mm256_permutevar8x32_ps(sum, channel_order));
        }
        let narrow = _mm256_setr_epi32(1, 2, 3, 5, 6, 7, 0, 0);
        for (a, wa) in win.iter().enumerate() {
            _mm256_maskstore_ps(state.add(6 * a), six, _mm256_permutevar8x32_ps(*wa, narrow));
        }
    }

    /// The 4x4 transposes within each 128-bit lane of four registers: lane q of result i is
    /// element i of lane q of p[0], p[1], p[2], p[3].
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn transpose_in_lanes(p: [V; 4]) -> [V; 4] {
        let (lo01, hi01) = (_mm256_unpacklo_ps(p[0], p[1]), _mm256_unpackhi_ps(p[0], p[1]));
        let (lo23, hi23) = (_mm256_unpacklo_ps(p[2], p[3]), _mm256_unpackhi_ps(p[2], p[3]));
        let pd = _mm256_castps_pd;
        let ps = _mm256_castpd_ps;
        [
            ps(_mm256_unpacklo_pd(pd(lo01), pd(lo23))),
            ps(_mm256_unpackhi_pd(pd(lo01), pd(lo23))),
            ps(_mm256_unpacklo_pd(pd(hi01), pd(hi23))),
            ps(_mm256_unpackhi_pd(pd(hi01), pd(hi23))),
        ]
    }
}

/// AVX-512 F and BW: sixteen lanes; a partial vector through a lane mask.
pub mod avx512 {
    use std::arch::x86_64::*;

    type V = __m512;
    const LANES: usize = 16;
    /// Tokens from which ssm_conv takes the transposing kernel (`conv_tiled`) rather than
    /// `conv_few`: Qwen3.5-0.8B's 6144 channels, 16 tokens 4.2 us few / 5.0 tiled, 32 tokens
    /// 4.4 / 3.6.
    const CONV_TILED_MIN_TOKENS: usize = 24;

    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn load(p: *const f32) -> V { _mm512_loadu_ps(p) }
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn store(p: *mut f32, v: V) { _mm512_storeu_ps(p, v) }
    #[inline]
    fn first_lanes(n: usize) -> __mmask16 { ((1u32 << n) - 1) as __mmask16 }
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn load_part(p: *const f32, n: usize) -> V { _mm512_maskz_loadu_ps(first_lanes(n), p) }
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn store_part(p: *mut f32, n: usize, v: V) { _mm512_mask_storeu_ps(p, first_lanes(n), v) }
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn set1(x: f32) -> V { _mm512_set1_ps(x) }
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn zero() -> V { _mm512_setzero_ps() }
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn add(a: V, b: V) -> V { _mm512_add_ps(a, b) }
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn mul(a: V, b: V) -> V { _mm512_mul_ps(a, b) }
    /// a * b + c, rounded once.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn fmadd(a: V, b: V, c: V) -> V { _mm512_fmadd_ps(a, b, c) }
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn hsum(v: V) -> f32 { _mm512_reduce_add_ps(v) }
    /// The lane sums of four vectors: their 256-bit halves added, then AVX2's reduction of
    /// four.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn hsum4(v: [V; 4]) -> [f32; 4] {
        let half = |x: V| _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x))));
        let (h0, h1, h2, h3) = (half(v[0]), half(v[1]), half(v[2]), half(v[3]));
        let quads = _mm256_hadd_ps(_mm256_hadd_ps(h0, h1), _mm256_hadd_ps(h2, h3));
        let sums = _mm_add_ps(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1));
        let mut out = [0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), sums);
        out
    }

    ssm_kernels!("avx2,fma,avx512f,avx512bw");

    /// A few tokens of ssm_conv: four taps sixteen channels at a time (`conv4_block`), other
    /// widths and the channels past the last block by the scalar loop.
    ///
    /// SAFETY: as `ssm::conv_channels_scalar`.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn conv_few(part: &ConvPart, c0: usize, c1: usize) {
        let blocks_end = if part.d_conv == 4 { c0 + (c1 - c0) / 16 * 16 } else { c0 };
        for c in (c0..blocks_end).step_by(16) {
            conv4_block(part, c);
        }
        crate::ssm::conv_channels_scalar(part, blocks_end, c1);
    }

    /// Four-tap ssm_conv on channels c..c+16 without transposing anything: register a holds
    /// channels c+4a..c+4a+3, one per 128-bit lane, as [the lane's channel's window] (the
    /// state widened from 3 to 4 floats a channel by an expanding load, each token shifted in
    /// by a lane-wise byte align) and as its four taps (the weight rows as they are). The
    /// products' in-lane sums come out of a 4x4 transpose within lanes, added to zero in tap
    /// order (the scalar loop's sum, bit for bit), and the new state out of a compress.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn conv4_block(part: &ConvPart, c: usize) {
        let weight = part.weight.as_ptr().add(c * 4);
        let w: [V; 4] = std::array::from_fn(|a| _mm512_loadu_ps(weight.add(16 * a)));
        let state = part.state.add(c * 3);
        // [0 s0 s1 s2] per lane: each token shifts one in at the top.
        let mut win: [V; 4] = std::array::from_fn(|a| _mm512_maskz_expandloadu_ps(0xEEEE, state.add(12 * a)));
        // Output lane 4a + q (channel c + 4a + q) is the sum's lane 4q + a.
        let channel_order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        for t in 0..part.n_t {
            let x = part.x.as_ptr().add(t * part.x_stride + c);
            for (a, wa) in win.iter_mut().enumerate() {
                let x_low = _mm512_maskz_expandloadu_ps(0x1111, x.add(4 * a));
                *wa = _mm512_castsi512_ps(_mm512_alignr_epi8(_mm512_castps_si512(x_low), _mm512_castps_si512(*wa), 4));
            }
            let p: [V; 4] = std::array::from_fn(|a| _mm512_mul_ps(win[a], w[a]));
            let taps = transpose_in_lanes(p);
            let sum = taps.iter().fold(_mm512_setzero_ps(), |s, &tap| _mm512_add_ps(s, tap));
            _mm512_storeu_ps(part.out.add(t * part.channels + c), _mm512_permutexvar_ps(channel_order, sum));
        }
        for (a, wa) in win.iter().enumerate() {
            _mm512_mask_storeu_ps(state.add(12 * a), 0x0FFF, _mm512_maskz_compress_ps(0xEEEE, *wa));
        }
    }

    /// The 4x4 transposes within each 128-bit lane of four registers: lane q of result i is
    /// element i of lane q of p[0], p[1], p[2], p[3].
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn transpose_in_lanes(p: [V; 4]) -> [V; 4] {
        let (lo01, hi01) = (_mm512_unpacklo_ps(p[0], p[1]), _mm512_unpackhi_ps(p[0], p[1]));
        let (lo23, hi23) = (_mm512_unpacklo_ps(p[2], p[3]), _mm512_unpackhi_ps(p[2], p[3]));
        let pd = _mm512_castps_pd;
        let ps = _mm512_castpd_ps;
        [
            ps(_mm512_unpacklo_pd(pd(lo01), pd(lo23))),
            ps(_mm512_unpackhi_pd(pd(lo01), pd(lo23))),
            ps(_mm512_unpacklo_pd(pd(hi01), pd(hi23))),
            ps(_mm512_unpackhi_pd(pd(hi01), pd(hi23))),
        ]
    }
}
