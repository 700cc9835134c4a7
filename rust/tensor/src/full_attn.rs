//! Full (non-causal, unmasked) attention over a whole sequence, for vision encoders, with
//! the arithmetic of ggml's tiled flash attention on an AVX-512 CPU
//! (ggml_compute_forward_flash_attn_ext_tiled): queries in f32, keys and values rounded to
//! f16; the scores of a tile of queries are one outer-product matrix product (simd_gemm:
//! each score a chain of fused multiply-adds over the head's dimensions, in order), then
//! scaled; the softmax is online, a tile of KV_TILE (64) keys at a time: the running max
//! grows by the tile's max, the output so far and the sum are rescaled by expf(old - new)
//! when it does, the tile's exponentials are ggml_v_expf of (score - running max), summed
//! in f64 16 lanes at a time (ggml_vec_soft_max_f32) and added to the f32 sum; the output
//! accumulates the unnormalized weights times V (another simd_gemm chain over the tile's
//! keys, continuing the previous tiles' sums) and is divided by the sum at the end.
//!
//! The AVX-512 kernels equal `attention_spec`, the specification one operation at a time,
//! bit for bit (a CPU without AVX-512 runs the specification).

use std::cell::RefCell;

use crate::attn::{expf_reference, reduce16};
use crate::dispatch::{active_isa, Isa};
use crate::threads::{SendPtr, Threads};
use crate::util::{f16_to_f32, f32_to_f16};

/// Queries per task (their scores take QUERY_TILE × keys floats, which stay in L2).
const QUERY_TILE: usize = 32;
/// Keys per panel of the transposed keys: the 16-lane vectors of one register tile, and
/// ggml's KV tile (GGML_FA_TILE_KV) of the online softmax.
const KEY_PANEL: usize = 64;
/// Query rows per register tile.
const RM: usize = 4;

/// softmax(q·kᵀ / √hd) · v per head, for n tokens of n_head heads of hd (q, k, v and the
/// result: n rows of n_head × hd).
pub fn full_attention(q: &[f32], k: &[f32], v: &[f32], n: usize, n_head: usize, hd: usize, threads: &Threads) -> Vec<f32> {
    full_attention_scaled(q, k, v, n, n_head, hd, 1.0 / (hd as f32).sqrt(), threads)
}

/// softmax(q·kᵀ · scale) · v per head, as `full_attention` computes it: for encoders whose
/// scores are not scaled by 1/√hd (Gemma 4's vision transformer, kq_scale 1).
#[allow(clippy::too_many_arguments)]
pub fn full_attention_scaled(q: &[f32], k: &[f32], v: &[f32], n: usize, n_head: usize, hd: usize, scale: f32, threads: &Threads) -> Vec<f32> {
    attention_on(active_isa(), q, n, k, v, n, n_head, hd, scale, threads)
}

/// `full_attention` of nq queries over nk keys and values (a resampler's learned queries
/// over an image's patches): q has nq rows, k and v nk rows, the result nq rows.
#[allow(clippy::too_many_arguments)]
pub fn cross_attention(q: &[f32], nq: usize, k: &[f32], v: &[f32], nk: usize, n_head: usize, hd: usize, threads: &Threads) -> Vec<f32> {
    cross_attention_isa(active_isa(), q, nq, k, v, nk, n_head, hd, threads)
}

/// The operands of one head laid out for the kernels.
struct HeadOperands {
    /// Keys rounded to f16, transposed by panels: panel p holds hd rows of KEY_PANEL keys;
    /// keys past n are zeros.
    kt: Vec<f32>,
    /// Values rounded to f16, n_keys rows of hd_pad (zeros past hd and past n).
    v: Vec<f32>,
}

fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// The attention on the kernels of `isa` (AVX-512; AVX2 for the products, the softmax as the
/// specification computes it; or anything else: the specification).
#[allow(clippy::too_many_arguments)]
pub fn full_attention_isa(isa: Isa, q: &[f32], k: &[f32], v: &[f32], n: usize, n_head: usize, hd: usize, threads: &Threads) -> Vec<f32> {
    attention_on(isa, q, n, k, v, n, n_head, hd, 1.0 / (hd as f32).sqrt(), threads)
}

/// `cross_attention` on the kernels of `isa`.
#[allow(clippy::too_many_arguments)]
pub fn cross_attention_isa(isa: Isa, q: &[f32], nq: usize, k: &[f32], v: &[f32], n: usize, n_head: usize, hd: usize, threads: &Threads) -> Vec<f32> {
    attention_on(isa, q, nq, k, v, n, n_head, hd, 1.0 / (hd as f32).sqrt(), threads)
}

/// nq queries over n keys and values, the scores scaled by `scale`, on the kernels of `isa`.
#[allow(clippy::too_many_arguments)]
fn attention_on(isa: Isa, q: &[f32], nq: usize, k: &[f32], v: &[f32], n: usize, n_head: usize, hd: usize, scale: f32,
                threads: &Threads) -> Vec<f32> {
    let d = n_head * hd;
    assert!(q.len() == nq * d && k.len() == n * d && v.len() == n * d, "attention operand sizes");
    assert!(isa.available(), "{} kernels on a CPU without them", isa.name());
    let (n_keys, hd_pad) = (n.div_ceil(KEY_PANEL) * KEY_PANEL, hd.div_ceil(16) * 16);
    let mut heads: Vec<HeadOperands> = (0..n_head).map(|_| HeadOperands { kt: vec![0f32; n_keys * hd], v: vec![0f32; n_keys * hd_pad] }).collect();
    let heads_ptr = SendPtr(heads.as_mut_ptr());
    threads.run(n_head, |h| {
        // SAFETY: each task fills its own head.
        let head = unsafe { &mut *heads_ptr.get().add(h) };
        for j in 0..n {
            let (panel, col) = (j / KEY_PANEL, j % KEY_PANEL);
            for c in 0..hd {
                head.kt[(panel * hd + c) * KEY_PANEL + col] = round_f16(k[j * d + h * hd + c]);
                head.v[j * hd_pad + c] = round_f16(v[j * d + h * hd + c]);
            }
        }
    });
    let mut out = vec![0f32; nq * d];
    let out_ptr = SendPtr(out.as_mut_ptr());
    let tiles = nq.div_ceil(QUERY_TILE);
    threads.run(n_head * tiles, |task| {
        let (h, q0) = (task / tiles, (task % tiles) * QUERY_TILE);
        let nq = QUERY_TILE.min(nq - q0);
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            let o = query_tile(isa, &heads[h], &q[q0 * d + h * hd..], d, nq, n, hd, scale, s);
            for t in 0..nq {
                // SAFETY: each task writes its own head of its own queries.
                let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add((q0 + t) * d + h * hd), hd) };
                dst.copy_from_slice(&o[t * hd_pad..][..hd]);
            }
        });
    });
    out
}

#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    scores: Vec<f32>,
    o: Vec<f32>,
}

thread_local! {
    /// Each thread's buffers for its query tiles (a tile's scores are too big to allocate
    /// per task).
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn zeroed(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    v.clear();
    v.resize(n, 0.0);
    v
}

/// The outputs (rows of hd_pad, normalized) of nq queries (rows `q_stride` apart) of one
/// head against its n keys, a panel of keys at a time (ggml_compute_forward_flash_attn_ext_tiled).
#[allow(clippy::too_many_arguments)]
fn query_tile<'s>(isa: Isa, head: &HeadOperands, q: &[f32], q_stride: usize, nq: usize, n: usize, hd: usize, scale: f32, s: &'s mut Scratch) -> &'s [f32] {
    let rows = nq.div_ceil(RM) * RM;
    let n_keys = head.kt.len() / hd;
    let hd_pad = head.v.len() / n_keys;
    let qt = zeroed(&mut s.q, rows * hd);
    for t in 0..nq {
        qt[t * hd..(t + 1) * hd].copy_from_slice(&q[t * q_stride..][..hd]);
    }
    let o = zeroed(&mut s.o, rows * hd_pad);
    let (mut max, mut sum) = (vec![f32::NEG_INFINITY; rows], vec![0f32; rows]);
    for panel in 0..n_keys / KEY_PANEL {
        let scores = zeroed(&mut s.scores, rows * KEY_PANEL);
        let kt = &head.kt[panel * hd * KEY_PANEL..][..hd * KEY_PANEL];
        outer_product(isa, qt, hd, kt, KEY_PANEL, scores, KEY_PANEL, rows, KEY_PANEL);
        let valid = (n - panel * KEY_PANEL).min(KEY_PANEL);
        for (t, row) in scores.chunks_exact_mut(KEY_PANEL).enumerate() {
            softmax_step(isa, row, valid, scale, &mut max[t], &mut sum[t], &mut o[t * hd_pad..(t + 1) * hd_pad]);
        }
        let v = &head.v[panel * KEY_PANEL * hd_pad..][..KEY_PANEL * hd_pad];
        outer_product(isa, scores, KEY_PANEL, v, hd_pad, o, hd_pad, rows, hd_pad);
    }
    for (t, &sum) in sum.iter().enumerate().take(nq) {
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        o[t * hd_pad..(t + 1) * hd_pad].iter_mut().for_each(|x| *x *= inv);
    }
    o
}

/// One query's step of the online softmax over a panel of scores (`valid` real keys, -inf
/// past them): the scores scaled, the running `max` raised to the panel's (the output `o`
/// and `sum` so far rescaled by expf(old - new) when it grows), the scores turned into
/// exp(score - max), their sum (f64 over 16-lane sums, as ggml_vec_soft_max_f32) added to
/// `sum` in f64 and rounded back.
fn softmax_step(isa: Isa, row: &mut [f32], valid: usize, scale: f32, max: &mut f32, sum: &mut f32, o: &mut [f32]) {
    row.iter_mut().for_each(|x| *x *= scale);
    row[valid..].fill(f32::NEG_INFINITY);
    let tile_max = row.iter().fold(f32::NEG_INFINITY, |m, &x| if m > x { m } else { x });
    let new_max = max.max(tile_max);
    if new_max > *max {
        let ms = (*max - new_max).exp();
        o.iter_mut().for_each(|x| *x *= ms);
        *sum *= ms;
    }
    *max = new_max;
    *sum = (*sum as f64 + exp_sum(isa, row, new_max)) as f32;
}

/// row = exp(row - max) (ggml_v_expf), returning Σ of each 16 lanes' sum in f64.
fn exp_sum(isa: Isa, row: &mut [f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: Isa::Avx512 is available (checked by the caller); rows are whole vectors.
        return unsafe { x86::exp_sum(row, max) };
    }
    let _ = isa;
    let mut sum = 0f64;
    for chunk in row.chunks_exact_mut(16) {
        chunk.iter_mut().for_each(|x| *x = expf_reference(*x - max));
        sum += reduce16(&(*chunk).try_into().expect("16 lanes")) as f64;
    }
    sum
}

/// c[i][j] += Σ_kk a[i][kk] · b[kk][j] for `rows` rows (a multiple of RM) and `cols`
/// columns (a multiple of 16), each a chain of fused multiply-adds over kk in order (k of
/// them: a's row length `lda`... b's rows).
#[allow(clippy::too_many_arguments)]
fn outer_product(isa: Isa, a: &[f32], lda: usize, b: &[f32], ldb: usize, c: &mut [f32], ldc: usize, rows: usize, cols: usize) {
    let k = b.len() / ldb;
    assert!(rows % RM == 0 && cols % 16 == 0 && a.len() >= rows * lda && lda >= k && c.len() >= (rows - 1) * ldc + cols);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: AVX-512 is available; the sizes are checked above.
        unsafe { x86::outer_product(a.as_ptr(), lda, b.as_ptr(), ldb, c.as_mut_ptr(), ldc, rows, cols, k) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: AVX2 and FMA are available; the sizes are checked above.
        unsafe { x86::outer_product_avx2(a.as_ptr(), lda, b.as_ptr(), ldb, c.as_mut_ptr(), ldc, rows, cols, k) };
        return;
    }
    let _ = isa;
    for i in 0..rows {
        for j in 0..cols {
            let mut acc = c[i * ldc + j];
            for kk in 0..k {
                acc = a[i * lda + kk].mul_add(b[kk * ldb + j], acc);
            }
            c[i * ldc + j] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::RM;

    /// ggml_vec_soft_max_f32 (AVX-512): row = ggml_v_expf(row - max); returns Σ of each 16
    /// lanes' `_mm512_reduce_add_ps` in f64.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
    pub unsafe fn exp_sum(row: &mut [f32], max: f32) -> f64 {
        let m = _mm512_set1_ps(max);
        let mut sum = 0f64;
        for chunk in row.chunks_exact_mut(16) {
            let e = crate::glu::expf16(_mm512_sub_ps(_mm512_loadu_ps(chunk.as_ptr()), m));
            _mm512_storeu_ps(chunk.as_mut_ptr(), e);
            sum += crate::attn::x86::reduce16(e) as f64;
        }
        sum
    }

    /// simd_gemm: tiles of RM rows × up to 5 vectors of 16 columns.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn outer_product(a: *const f32, lda: usize, b: *const f32, ldb: usize, c: *mut f32, ldc: usize, rows: usize, cols: usize, k: usize) {
        for i in (0..rows).step_by(RM) {
            let mut j = 0;
            while j < cols {
                let (a, c) = (a.add(i * lda), c.add(i * ldc + j));
                match ((cols - j) / 16).min(5) {
                    5 => ukernel::<5>(a, lda, b.add(j), ldb, c, ldc, k),
                    4 => ukernel::<4>(a, lda, b.add(j), ldb, c, ldc, k),
                    3 => ukernel::<3>(a, lda, b.add(j), ldb, c, ldc, k),
                    2 => ukernel::<2>(a, lda, b.add(j), ldb, c, ldc, k),
                    _ => ukernel::<1>(a, lda, b.add(j), ldb, c, ldc, k),
                }
                j += 16 * ((cols - j) / 16).min(5);
            }
        }
    }

    /// The same on AVX2: tiles of RM rows × 16 columns (two 8-lane vectors), each output's
    /// chain of fused multiply-adds in the same order, so the same bits.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn outer_product_avx2(a: *const f32, lda: usize, b: *const f32, ldb: usize, c: *mut f32, ldc: usize, rows: usize, cols: usize, k: usize) {
        for i in (0..rows).step_by(RM) {
            for j in (0..cols).step_by(16) {
                let (a, b, c) = (a.add(i * lda), b.add(j), c.add(i * ldc + j));
                let mut acc = [[_mm256_setzero_ps(); 2]; RM];
                for (r, row) in acc.iter_mut().enumerate() {
                    row[0] = _mm256_loadu_ps(c.add(r * ldc));
                    row[1] = _mm256_loadu_ps(c.add(r * ldc + 8));
                }
                for kk in 0..k {
                    let (b0, b1) = (_mm256_loadu_ps(b.add(kk * ldb)), _mm256_loadu_ps(b.add(kk * ldb + 8)));
                    for (r, row) in acc.iter_mut().enumerate() {
                        let p = _mm256_set1_ps(*a.add(r * lda + kk));
                        row[0] = _mm256_fmadd_ps(b0, p, row[0]);
                        row[1] = _mm256_fmadd_ps(b1, p, row[1]);
                    }
                }
                for (r, row) in acc.iter().enumerate() {
                    _mm256_storeu_ps(c.add(r * ldc), row[0]);
                    _mm256_storeu_ps(c.add(r * ldc + 8), row[1]);
                }
            }
        }
    }

    /// RM rows × RN vectors of c += a · b, over k.
    #[inline(always)]
    unsafe fn ukernel<const RN: usize>(a: *const f32, lda: usize, b: *const f32, ldb: usize, c: *mut f32, ldc: usize, k: usize) {
        let mut acc = [[_mm512_setzero_ps(); RN]; RM];
        for (i, row) in acc.iter_mut().enumerate() {
            for (r, v) in row.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(c.add(i * ldc + 16 * r));
            }
        }
        for kk in 0..k {
            let mut bv = [_mm512_setzero_ps(); RN];
            for (r, v) in bv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(b.add(kk * ldb + 16 * r));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let p = _mm512_set1_ps(*a.add(i * lda + kk));
                for (r, v) in row.iter_mut().enumerate() {
                    *v = _mm512_fmadd_ps(bv[r], p, *v);
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            for (r, v) in row.iter().enumerate() {
                _mm512_storeu_ps(c.add(i * ldc + 16 * r), *v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n).map(|_| { s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223); (s >> 8) as f32 / (1u32 << 22) as f32 - 2.0 }).collect()
    }

    /// The AVX-512 and AVX2 kernels (those this CPU has) equal the specification bit for bit,
    /// for sequences that do and do not fill the query tiles and key panels, and head sizes
    /// that are not whole vectors.
    #[test]
    fn kernels_equal_the_specification() {
        let threads = Threads::new(2);
        for isa in [Isa::Avx512, Isa::Avx2].into_iter().filter(|i| i.available()) {
            for (n, n_head, hd) in [(1, 1, 16), (37, 2, 72), (130, 3, 40), (64, 1, 80)] {
                let (q, k, v) = (values(n * n_head * hd, 1), values(n * n_head * hd, 2), values(n * n_head * hd, 3));
                let got = full_attention_isa(isa, &q, &k, &v, n, n_head, hd, &threads);
                let want = full_attention_isa(Isa::Scalar, &q, &k, &v, n, n_head, hd, &threads);
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{}: n {n}, {n_head} heads of {hd}", isa.name());
            }
        }
    }

    /// Fewer queries than keys (a resampler's): each query's output is the one it has in full
    /// attention over the same keys, bit for bit, on every kernel.
    #[test]
    fn cross_attention_is_full_attention_of_fewer_queries() {
        let threads = Threads::new(2);
        let (n, nq, n_head, hd) = (130, 40, 2, 128);
        let (q, k, v) = (values(n * n_head * hd, 7), values(n * n_head * hd, 8), values(n * n_head * hd, 9));
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Scalar].into_iter().filter(|i| i.available()) {
            let full = full_attention_isa(isa, &q, &k, &v, n, n_head, hd, &threads);
            let cross = cross_attention_isa(isa, &q[..nq * n_head * hd], nq, &k, &v, n, n_head, hd, &threads);
            assert_eq!(cross, full[..nq * n_head * hd], "{}", isa.name());
        }
    }

    /// The specification is attention: close to an f64 computation on the rounded K and V,
    /// over three panels of keys (the online softmax's rescaling).
    #[test]
    fn specification_is_attention() {
        let (n, hd) = (150, 24);
        let (q, k, v) = (values(n * hd, 4), values(n * hd, 5), values(n * hd, 6));
        let got = full_attention_isa(Isa::Scalar, &q, &k, &v, n, 1, hd, &Threads::new(1));
        for t in 0..n {
            let s: Vec<f64> = (0..n).map(|j| (0..hd).map(|c| q[t * hd + c] as f64 * round_f16(k[j * hd + c]) as f64).sum::<f64>() / (hd as f64).sqrt()).collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for c in 0..hd {
                let want: f64 = (0..n).map(|j| e[j] * round_f16(v[j * hd + c]) as f64).sum::<f64>() / sum;
                assert!((got[t * hd + c] as f64 - want).abs() < 1e-4, "token {t}, dim {c}");
            }
        }
    }
}
