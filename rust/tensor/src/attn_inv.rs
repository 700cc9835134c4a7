//! Batch-invariant attention: one query's result depends only on the query and on the cells it
//! sees, taken in position order, never on how many other queries share the call, on the
//! micro-batch split, on the thread count, or on where the cells sit in the cache.
//!
//! The arithmetic (the specification, `attend_inv_reference`), for one query head over its
//! visible cells c_0, c_1, ... (the caller lists them in position order):
//! - score i = dot16(q, k_i) times the scale (soft-capped: cap * tanh(raw * scale / cap)),
//!   where dot16 sums q[d] * k[d] into 16 lanes by d mod 16 with fused multiply-adds, zero
//!   padded to a multiple of 16, and adds the lanes in the tree of `attn::reduce16`; the
//!   query is in the K cache's precision (rounded to f16 for an F16 cache, as ggml does);
//! - M = the largest score (and sink); e_i = `exp_inv`(score_i - M); their sum in 16 lanes by
//!   i mod 16, added by `reduce16`, plus the sink's term; p_i = e_i * (1 / sum), rounded to
//!   f16 for an F16 V cache (as ggml's product with an F16 V rounds it);
//! - out[d] = sum of p_i * v_i[d], one fused multiply-add per cell in list order.
//!
//! Lanes are fixed by the index in the list (i, d), never by the cell's index in the cache, so
//! the kernels (AVX-512 and AVX2, with 16 logical lanes on both) give the specification's bits.

use crate::attn::{reduce16, v_row};
use crate::dispatch::{active_isa, Isa};
use crate::util::{f16_to_f32, f32_to_f16};
use crate::GgmlType;

/// One token's query heads that share a KV head, and the cells that token sees.
pub struct InvQuery<'a> {
    /// F16 or F32 (`supported`); other cache types go through the caller's row dots with
    /// `softmax_inv` and `accumulate`.
    pub k_type: GgmlType,
    pub v_type: GgmlType,
    /// Cell j's key head starts at k[j * k_stride + k_offset].
    pub k: &'a [u8],
    pub k_stride: usize,
    pub k_offset: usize,
    /// Cell j's value head starts at v[v_row(j, v_cols) * v_stride + v_offset].
    pub v: &'a [u8],
    pub v_stride: usize,
    pub v_offset: usize,
    pub v_cols: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// n_q rows of head_dim_k, in the K cache's precision.
    pub q: &'a [f32],
    pub n_q: usize,
    /// The visible cells in position order.
    pub cells: &'a [u32],
    pub scale: f32,
    /// tanh soft-capping of the scores (0: none).
    pub softcap: f32,
    /// Per query head, a logit that takes part in the softmax with no value.
    pub sinks: Option<&'a [f32]>,
}

impl InvQuery<'_> {
    /// Whether `attend_inv` takes this call: F16/F32 caches and every index in bounds.
    pub fn supported(&self) -> bool {
        let es = |t: GgmlType| match t {
            GgmlType::F16 => Some(2),
            GgmlType::F32 => Some(4),
            _ => None,
        };
        let (Some(ek), Some(ev)) = (es(self.k_type), es(self.v_type)) else { return false };
        let k_ok = |j: usize| j * self.k_stride + self.k_offset + self.head_dim_k * ek <= self.k.len();
        let v_ok = |j: usize| v_row(j, self.v_cols) * self.v_stride + self.v_offset + self.head_dim_v * ev <= self.v.len();
        self.n_q >= 1
            && self.head_dim_k > 0
            && self.head_dim_v > 0
            && self.q.len() >= self.n_q * self.head_dim_k
            && self.sinks.is_none_or(|s| s.len() >= self.n_q)
            && self.cells.iter().all(|&j| k_ok(j as usize) && v_ok(j as usize))
    }

    fn key(&self, j: u32) -> &[u8] { &self.k[j as usize * self.k_stride + self.k_offset..] }
    fn value(&self, j: u32) -> &[u8] { &self.v[v_row(j as usize, self.v_cols) * self.v_stride + self.v_offset..] }
}

/// Buffers `attend_inv` reuses.
#[derive(Default)]
pub struct InvScratch {
    /// n_q rows of the scores, then of the probabilities.
    p: Vec<f32>,
    /// The queries zero padded to whole 16-lane chunks.
    q: Vec<f32>,
    /// One converted row.
    row: Vec<f32>,
}

/// out: n_q rows of head_dim_v. Panics unless `h.supported()`.
pub fn attend_inv(h: &InvQuery, out: &mut [f32], s: &mut InvScratch) {
    attend_inv_at(active_isa(), h, out, s)
}

/// `attend_inv` with the kernel of `isa` (the specification for Scalar). Panics unless this
/// CPU has `isa` and `h.supported()`.
pub fn attend_inv_at(isa: Isa, h: &InvQuery, out: &mut [f32], s: &mut InvScratch) {
    assert!(isa.available(), "{} kernels requested on a CPU without them", isa.name());
    assert!(h.supported() && out.len() >= h.n_q * h.head_dim_v, "attend_inv: operands out of bounds");
    #[cfg(target_arch = "x86_64")]
    {
        match isa {
            // SAFETY: the ISA is this CPU's; operands checked above.
            Isa::Avx512 => return unsafe { x86::avx512::attend(h, out, s) },
            Isa::Avx2 => return unsafe { x86::avx2::attend(h, out, s) },
            Isa::Scalar => {}
        }
    }
    attend_inv_reference(h, out, s)
}

// ------------------------------------------------------------------ the specification

/// q · k in 16 lanes by index mod 16 (zero padded), fused multiply-adds, `reduce16`.
pub fn dot16(q: &[f32], k: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for (qc, kc) in q.chunks(16).zip(k.chunks(16)) {
        for (l, (&a, &b)) in qc.iter().zip(kc).enumerate() {
            acc[l] = a.mul_add(b, acc[l]);
        }
    }
    reduce16(&acc)
}

/// A raw dot product as a score: scaled, soft-capped when `softcap` > 0.
#[inline]
pub fn score(raw: f32, scale: f32, softcap: f32) -> f32 {
    if softcap > 0.0 { softcap * (raw * scale / softcap).tanh() } else { raw * scale }
}

const LOG2E: u32 = 0x3fb8_aa3b;
const ROUND: u32 = 0x4b40_0000;
const LN2_HI: u32 = 0x3f31_7200;
const LN2_LO: u32 = 0x35bf_be8e;
const P: [u32; 5] = [0x3c07_2010, 0x3d2b_9f17, 0x3e2a_af33, 0x3eff_fedb, 0x3f7f_fff6];

/// e^x for x <= 0 by ggml_v_expf's reduction and polynomial, scaled by an exact power of two
/// (0 below 2^-125, where every term is negligible beside the largest, which is 1).
pub fn exp_inv(x: f32) -> f32 {
    let c = f32::from_bits;
    let z = x.mul_add(c(LOG2E), c(ROUND));
    let n = z - c(ROUND);
    let b = (-n).mul_add(c(LN2_LO), (-n).mul_add(c(LN2_HI), x));
    let u = b * b;
    let j = c(P[0]).mul_add(b, c(P[1])).mul_add(u, c(P[2]).mul_add(b, c(P[3]))).mul_add(u, c(P[4]).mul_add(b, 1.0));
    if n < -125.0 {
        return 0.0;
    }
    j * pow2(n)
}

/// 2^n for an integral n in -125..=127 (clamped above), exactly.
#[inline]
fn pow2(n: f32) -> f32 {
    f32::from_bits((((n as i32).min(127) + 127) as u32) << 23)
}

/// Turns the scores into their exponentials e_i = exp_inv(s_i - M) in place and returns
/// 1 / (their sum in 16 lanes by i mod 16, plus the sink's term); 0 when nothing is visible.
pub fn softmax_inv(scores: &mut [f32], sink: Option<f32>) -> f32 {
    let max = scores.iter().copied().chain(sink).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        scores.fill(0.0);
        return 0.0;
    }
    let mut lanes = [0f32; 16];
    for (i, e) in scores.iter_mut().enumerate() {
        *e = exp_inv(*e - max);
        lanes[i % 16] += *e;
    }
    let sum = reduce16(&lanes) + sink.map_or(0.0, |sk| exp_inv(sk - max));
    1.0 / sum
}

/// p_i = e_i * inv, rounded to f16 when the values are F16.
pub fn probabilities(e: &mut [f32], inv: f32, round_f16: bool) {
    for p in e.iter_mut() {
        *p *= inv;
        if round_f16 {
            *p = f16_to_f32(f32_to_f16(*p));
        }
    }
}

/// out += p * v, one fused multiply-add per element (p == 0 adds nothing: skipped).
pub fn accumulate(out: &mut [f32], p: f32, v: &[f32]) {
    if p != 0.0 {
        for (o, &x) in out.iter_mut().zip(v) {
            *o = p.mul_add(x, *o);
        }
    }
}

fn row_f32(ty: GgmlType, bytes: &[u8], out: &mut Vec<f32>, n: usize) {
    out.clear();
    match ty {
        GgmlType::F16 => out.extend((0..n).map(|i| f16_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])))),
        _ => out.extend((0..n).map(|i| f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes")))),
    }
}

/// `attend_inv`, one operation at a time.
pub fn attend_inv_reference(h: &InvQuery, out: &mut [f32], s: &mut InvScratch) {
    let (dk, dv, n) = (h.head_dim_k, h.head_dim_v, h.cells.len());
    s.p.clear();
    s.p.resize(h.n_q * n, 0.0);
    for (i, &j) in h.cells.iter().enumerate() {
        row_f32(h.k_type, h.key(j), &mut s.row, dk);
        for q in 0..h.n_q {
            s.p[q * n + i] = score(dot16(&h.q[q * dk..(q + 1) * dk], &s.row), h.scale, h.softcap);
        }
    }
    for q in 0..h.n_q {
        let e = &mut s.p[q * n..(q + 1) * n];
        let inv = softmax_inv(e, h.sinks.map(|sk| sk[q]));
        probabilities(e, inv, h.v_type == GgmlType::F16);
        out[q * dv..(q + 1) * dv].fill(0.0);
    }
    for (i, &j) in h.cells.iter().enumerate() {
        row_f32(h.v_type, h.value(j), &mut s.row, dv);
        for q in 0..h.n_q {
            accumulate(&mut out[q * dv..(q + 1) * dv], s.p[q * n + i], &s.row);
        }
    }
}

// ------------------------------------------------------------------ the kernels

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! SAFETY (whole module): callers check `InvQuery::supported` and the output's length, and
    //! call each function only on a CPU with its features.
    #![allow(clippy::missing_safety_doc)]
    use std::arch::x86_64::*;

    use super::{probabilities, score, InvQuery, InvScratch, LN2_HI, LN2_LO, LOG2E, P, ROUND};
    use crate::GgmlType;

    /// Stamps the kernel for one ISA: `$v` is a 16-lane f32 vector type of that ISA with the
    /// operations the kernel needs (`V16`).
    macro_rules! kernel {
        ($module:ident, $features:literal, $v:ident) => {
        pub mod $module {
            use super::*;

            #[target_feature(enable = $features)]
            pub unsafe fn attend(h: &InvQuery, out: &mut [f32], s: &mut InvScratch) {
                let (dk, dv, n) = (h.head_dim_k, h.head_dim_v, h.cells.len());
                let (ck, cv) = (dk.div_ceil(16), dv.div_ceil(16));
                // Queries as 16-lane chunks, zero padded.
                s.q.clear();
                s.q.resize(h.n_q * ck * 16, 0.0);
                for r in 0..h.n_q {
                    s.q[r * ck * 16..r * ck * 16 + dk].copy_from_slice(&h.q[r * dk..(r + 1) * dk]);
                }
                let q = s.q.as_ptr();
                s.p.clear();
                s.p.resize(h.n_q * n, 0.0);
                s.row.clear();
                s.row.resize(16 * ck.max(cv), 0.0);
                let row = s.row.as_mut_ptr();
                let k_f16 = h.k_type == GgmlType::F16;
                for (i, &j) in h.cells.iter().enumerate() {
                    let kp = h.key(j).as_ptr();
                    for c in 0..ck {
                        $v::load_row(kp, k_f16, c, dk).store(row.add(16 * c));
                    }
                    for r in 0..h.n_q {
                        let mut acc = $v::zero();
                        for c in 0..ck {
                            acc = $v::load(q.add(16 * (r * ck + c))).fma($v::load(row.add(16 * c)), acc);
                        }
                        *s.p.get_unchecked_mut(r * n + i) = score(acc.reduce(), h.scale, h.softcap);
                    }
                }
                let v_f16 = h.v_type == GgmlType::F16;
                for r in 0..h.n_q {
                    let e = &mut s.p[r * n..(r + 1) * n];
                    let inv = softmax(e, h.sinks.map(|sk| sk[r]));
                    probabilities(e, inv, v_f16);
                    out[r * dv..(r + 1) * dv].fill(0.0);
                }
                let o = out.as_mut_ptr();
                for (i, &j) in h.cells.iter().enumerate() {
                    let vp = h.value(j).as_ptr();
                    let mut converted = false;
                    for r in 0..h.n_q {
                        let p = *s.p.get_unchecked(r * n + i);
                        if p == 0.0 {
                            continue;
                        }
                        if !converted {
                            for c in 0..cv {
                                $v::load_row(vp, v_f16, c, dv).store(row.add(16 * c));
                            }
                            converted = true;
                        }
                        let pv = $v::splat(p);
                        for c in 0..cv {
                            let len = (dv - 16 * c).min(16);
                            let dst = o.add(r * dv + 16 * c);
                            pv.fma($v::load(row.add(16 * c)), $v::load_f32(dst, len)).store_n(dst, len);
                        }
                    }
                }
            }

            /// `super::softmax_inv` with 16-lane vectors.
            #[target_feature(enable = $features)]
            unsafe fn softmax(e: &mut [f32], sink: Option<f32>) -> f32 {
                let n = e.len();
                let mut m = $v::splat(f32::NEG_INFINITY);
                for c in 0..n.div_ceil(16) {
                    m = m.max($v::load_f32_or(e.as_ptr().add(16 * c), (n - 16 * c).min(16), f32::NEG_INFINITY));
                }
                let max = sink.into_iter().fold(m.reduce_max(), f32::max);
                if max == f32::NEG_INFINITY {
                    e.fill(0.0);
                    return 0.0;
                }
                let mv = $v::splat(max);
                let mut lanes = $v::zero();
                for c in 0..n.div_ceil(16) {
                    let len = (n - 16 * c).min(16);
                    let p = e.as_mut_ptr().add(16 * c);
                    // the padding lanes hold max - max: their exponential (1) is not stored and
                    // is masked out of the sum
                    let x = $v::load_f32_or(p, len, max).sub(mv).exp().zero_beyond(len);
                    x.store_n(p, len);
                    lanes = lanes.add(x);
                }
                let sum = lanes.reduce() + sink.map_or(0.0, |sk| crate::attn_inv::exp_inv(sk - max));
                1.0 / sum
            }
        }
        };
    }

    /// 16 f32 lanes in one AVX-512 register.
    #[derive(Clone, Copy)]
    struct Z(__m512);

    macro_rules! exp_poly {
        ($x:expr, $set1:ident, $fmadd:ident, $fnmadd:ident, $sub:ident, $mul:ident) => {{
            let c = |b: u32| $set1(f32::from_bits(b));
            let x = $x;
            let z = $fmadd(x, c(LOG2E), c(ROUND));
            let n = $sub(z, c(ROUND));
            let b = $fnmadd(n, c(LN2_LO), $fnmadd(n, c(LN2_HI), x));
            let u = $mul(b, b);
            let j = $fmadd($fmadd($fmadd(c(P[0]), b, c(P[1])), u, $fmadd(c(P[2]), b, c(P[3]))), u, $fmadd(c(P[4]), b, $set1(1.0)));
            (n, j)
        }};
    }

    impl Z {
        #[inline(always)]
        unsafe fn zero() -> Z { Z(_mm512_setzero_ps()) }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Z { Z(_mm512_set1_ps(x)) }
        #[inline(always)]
        unsafe fn mask(len: usize) -> __mmask16 { ((1u32 << len) - 1) as __mmask16 }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Z { Z(_mm512_loadu_ps(p)) }
        #[inline(always)]
        unsafe fn load_f32(p: *const f32, len: usize) -> Z { Z(_mm512_maskz_loadu_ps(Z::mask(len), p)) }
        #[inline(always)]
        unsafe fn load_f32_or(p: *const f32, len: usize, fill: f32) -> Z { Z(_mm512_mask_loadu_ps(_mm512_set1_ps(fill), Z::mask(len), p)) }
        /// Chunk c (16 elements) of a row of `dim` F16 or F32 values, zero padded.
        #[inline(always)]
        unsafe fn load_row(p: *const u8, f16: bool, c: usize, dim: usize) -> Z {
            let len = (dim - 16 * c).min(16);
            if f16 {
                Z(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(Z::mask(len), p.add(32 * c) as *const i16)))
            } else {
                Z::load_f32((p as *const f32).add(16 * c), len)
            }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) { _mm512_storeu_ps(p, self.0) }
        #[inline(always)]
        unsafe fn store_n(self, p: *mut f32, len: usize) { _mm512_mask_storeu_ps(p, Z::mask(len), self.0) }
        #[inline(always)]
        unsafe fn fma(self, b: Z, c: Z) -> Z { Z(_mm512_fmadd_ps(self.0, b.0, c.0)) }
        #[inline(always)]
        unsafe fn add(self, b: Z) -> Z { Z(_mm512_add_ps(self.0, b.0)) }
        #[inline(always)]
        unsafe fn sub(self, b: Z) -> Z { Z(_mm512_sub_ps(self.0, b.0)) }
        #[inline(always)]
        unsafe fn max(self, b: Z) -> Z { Z(_mm512_max_ps(self.0, b.0)) }
        #[inline(always)]
        unsafe fn reduce(self) -> f32 { crate::attn::x86::reduce16(self.0) }
        #[inline(always)]
        unsafe fn reduce_max(self) -> f32 { _mm512_reduce_max_ps(self.0) }
        #[inline(always)]
        unsafe fn zero_beyond(self, len: usize) -> Z { Z(_mm512_maskz_mov_ps(Z::mask(len), self.0)) }
        #[inline(always)]
        unsafe fn exp(self) -> Z {
            let (n, j) = exp_poly!(self.0, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_fnmadd_ps, _mm512_sub_ps, _mm512_mul_ps);
            let e = _mm512_min_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127));
            let pow = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(e, _mm512_set1_epi32(127))));
            let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(n, _mm512_set1_ps(-125.0));
            Z(_mm512_maskz_mul_ps(!tiny, j, pow))
        }
    }

    kernel!(avx512, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq", Z);

    /// 16 f32 lanes as two AVX2 registers (lanes 0..8, 8..16).
    #[derive(Clone, Copy)]
    struct Y(__m256, __m256);

    impl Y {
        #[inline(always)]
        unsafe fn zero() -> Y { Y(_mm256_setzero_ps(), _mm256_setzero_ps()) }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Y { Y(_mm256_set1_ps(x), _mm256_set1_ps(x)) }
        /// Lane masks of the first `len` lanes of each half.
        #[inline(always)]
        unsafe fn masks(len: usize) -> (__m256i, __m256i) {
            let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let n = _mm256_set1_epi32(len as i32);
            (_mm256_cmpgt_epi32(n, idx), _mm256_cmpgt_epi32(n, _mm256_add_epi32(idx, _mm256_set1_epi32(8))))
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Y { Y(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
        #[inline(always)]
        unsafe fn load_f32(p: *const f32, len: usize) -> Y {
            if len == 16 {
                return Y::load(p);
            }
            let (m0, m1) = Y::masks(len);
            Y(_mm256_maskload_ps(p, m0), _mm256_maskload_ps(p.add(8), m1))
        }
        #[inline(always)]
        unsafe fn load_f32_or(p: *const f32, len: usize, fill: f32) -> Y {
            let (m0, m1) = Y::masks(len);
            let f = _mm256_set1_ps(fill);
            let v = Y::load_f32(p, len);
            Y(_mm256_blendv_ps(f, v.0, _mm256_castsi256_ps(m0)), _mm256_blendv_ps(f, v.1, _mm256_castsi256_ps(m1)))
        }
        #[inline(always)]
        unsafe fn load_row(p: *const u8, f16: bool, c: usize, dim: usize) -> Y {
            let len = (dim - 16 * c).min(16);
            if !f16 {
                return Y::load_f32((p as *const f32).add(16 * c), len);
            }
            let src = p.add(32 * c) as *const u16;
            if len == 16 {
                let h = _mm256_loadu_si256(src as *const __m256i);
                return Y(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)));
            }
            let mut tmp = [0u16; 16];
            std::ptr::copy_nonoverlapping(src, tmp.as_mut_ptr(), len);
            let h = _mm256_loadu_si256(tmp.as_ptr() as *const __m256i);
            Y(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)))
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm256_storeu_ps(p, self.0);
            _mm256_storeu_ps(p.add(8), self.1);
        }
        #[inline(always)]
        unsafe fn store_n(self, p: *mut f32, len: usize) {
            if len == 16 {
                return self.store(p);
            }
            let (m0, m1) = Y::masks(len);
            _mm256_maskstore_ps(p, m0, self.0);
            _mm256_maskstore_ps(p.add(8), m1, self.1);
        }
        #[inline(always)]
        unsafe fn fma(self, b: Y, c: Y) -> Y { Y(_mm256_fmadd_ps(self.0, b.0, c.0), _mm256_fmadd_ps(self.1, b.1, c.1)) }
        #[inline(always)]
        unsafe fn add(self, b: Y) -> Y { Y(_mm256_add_ps(self.0, b.0), _mm256_add_ps(self.1, b.1)) }
        #[inline(always)]
        unsafe fn sub(self, b: Y) -> Y { Y(_mm256_sub_ps(self.0, b.0), _mm256_sub_ps(self.1, b.1)) }
        #[inline(always)]
        unsafe fn max(self, b: Y) -> Y { Y(_mm256_max_ps(self.0, b.0), _mm256_max_ps(self.1, b.1)) }
        /// `reduce16`: (x[8 + i] + x[i]), then halves, then (u0 + u2) + (u1 + u3).
        #[inline(always)]
        unsafe fn reduce(self) -> f32 {
            let t = _mm256_add_ps(self.1, self.0);
            let u = _mm_add_ps(_mm256_extractf128_ps::<1>(t), _mm256_castps256_ps128(t));
            let v = _mm_add_ps(u, _mm_shuffle_ps::<0b01_00_11_10>(u, u));
            _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
        }
        #[inline(always)]
        unsafe fn reduce_max(self) -> f32 {
            let mut x = [0f32; 16];
            self.store(x.as_mut_ptr());
            x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        }
        #[inline(always)]
        unsafe fn zero_beyond(self, len: usize) -> Y {
            let (m0, m1) = Y::masks(len);
            Y(_mm256_and_ps(self.0, _mm256_castsi256_ps(m0)), _mm256_and_ps(self.1, _mm256_castsi256_ps(m1)))
        }
        #[inline(always)]
        unsafe fn exp(self) -> Y { Y(exp8(self.0), exp8(self.1)) }
    }

    #[inline(always)]
    unsafe fn exp8(x: __m256) -> __m256 {
        let (n, j) = exp_poly!(x, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_fnmadd_ps, _mm256_sub_ps, _mm256_mul_ps);
        let e = _mm256_min_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127));
        let pow = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(e, _mm256_set1_epi32(127))));
        let kept = _mm256_cmp_ps::<_CMP_GE_OQ>(n, _mm256_set1_ps(-125.0));
        _mm256_and_ps(_mm256_mul_ps(j, pow), kept)
    }

    kernel!(avx2, "avx2,fma,f16c", Y);
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    fn bytes(ty: GgmlType, v: &[f32]) -> Vec<u8> {
        match ty {
            GgmlType::F16 => v.iter().flat_map(|&x| f32_to_f16(x).to_le_bytes()).collect(),
            _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    #[test]
    fn exp_inv_is_close_to_libm_and_zero_far_below() {
        for i in 0..2000 {
            let x = -(i as f32) * 0.05;
            let (a, b) = (exp_inv(x), x.exp());
            // ggml_v_expf's polynomial is within a few units in the last place of libm's
            assert!((a - b).abs() <= 3.6e-7 * b + 1e-37, "{x}: {a} vs {b}");
        }
        assert_eq!(exp_inv(-100.0), 0.0);
        assert_eq!(exp_inv(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_inv(0.0), 1.0);
    }

    /// The kernel of this CPU against the specification, bit for bit, over shapes, types,
    /// soft-capping, sinks, and cells in any order; and a query's output does not depend on
    /// which cache slots hold its cells.
    #[test]
    fn kernels_equal_the_specification_and_ignore_placement() {
        let mut rng = Rng(7);
        for &(ty_k, ty_v) in &[(GgmlType::F16, GgmlType::F16), (GgmlType::F32, GgmlType::F32), (GgmlType::F16, GgmlType::F32)] {
            for &(dk, dv) in &[(64, 64), (128, 128), (80, 80), (40, 24), (256, 256)] {
                for &(n_q, n_cells, softcap, sinks) in &[(1, 1, 0.0, false), (7, 37, 0.0, false), (4, 300, 30.0, false), (2, 64, 0.0, true), (3, 17, 0.0, false)] {
                    let cache = 2 * n_cells + 5;
                    let (n_kv_heads, g) = (2, 1);
                    let k: Vec<f32> = (0..cache * n_kv_heads * dk).map(|_| rng.next()).collect();
                    let v: Vec<f32> = (0..cache * n_kv_heads * dv).map(|_| rng.next()).collect();
                    let q: Vec<f32> = (0..n_q * dk).map(|_| rng.next() * 4.0).collect();
                    let q = if ty_k == GgmlType::F16 { q.iter().map(|&x| f16_to_f32(f32_to_f16(x))).collect() } else { q };
                    let sk: Vec<f32> = (0..n_q).map(|_| rng.next()).collect();
                    let (kb, vb) = (bytes(ty_k, &k), bytes(ty_v, &v));
                    let esk = if ty_k == GgmlType::F16 { 2 } else { 4 };
                    let esv = if ty_v == GgmlType::F16 { 2 } else { 4 };
                    // cells: every other slot, shuffled by a stride
                    let cells: Vec<u32> = (0..n_cells).map(|i| ((i * 7919) % n_cells * 2 + 1) as u32).collect();
                    let make = |cells: &'static [u32], kb: &'static [u8], vb: &'static [u8]| InvQuery {
                        k_type: ty_k, v_type: ty_v, k: kb, k_stride: n_kv_heads * dk * esk, k_offset: g * dk * esk,
                        v: vb, v_stride: n_kv_heads * dv * esv, v_offset: g * dv * esv, v_cols: 0,
                        head_dim_k: dk, head_dim_v: dv, q: Box::leak(q.clone().into_boxed_slice()), n_q, cells,
                        scale: 0.125, softcap, sinks: sinks.then(|| &*Box::leak(sk.clone().into_boxed_slice())),
                    };
                    let leak = |c: Vec<u32>| &*Box::leak(c.into_boxed_slice());
                    let (kb, vb) = (&*Box::leak(kb.into_boxed_slice()), &*Box::leak(vb.into_boxed_slice()));
                    let h = make(leak(cells.clone()), kb, vb);
                    assert!(h.supported());
                    let (mut a, mut b) = (vec![0f32; n_q * dv], vec![0f32; n_q * dv]);
                    let mut s = InvScratch::default();
                    attend_inv_reference(&h, &mut b, &mut s);
                    for isa in [Isa::Avx2, Isa::Avx512].into_iter().filter(|i| i.available()) {
                        attend_inv_at(isa, &h, &mut a, &mut s);
                        assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                   "{} {ty_k}/{ty_v} dk {dk} dv {dv} n_q {n_q} n {n_cells} cap {softcap} sinks {sinks}", isa.name());
                    }
                    // the same cells' contents moved to other slots: the same bits
                    let mut k2 = vec![0u8; kb.len()];
                    let mut v2 = vec![0u8; vb.len()];
                    let moved: Vec<u32> = (0..n_cells as u32).map(|i| 2 * i).collect();
                    for (&from, &to) in cells.iter().zip(&moved) {
                        let (kr, vr) = (n_kv_heads * dk * esk, n_kv_heads * dv * esv);
                        k2[to as usize * kr..(to as usize + 1) * kr].copy_from_slice(&kb[from as usize * kr..(from as usize + 1) * kr]);
                        v2[to as usize * vr..(to as usize + 1) * vr].copy_from_slice(&vb[from as usize * vr..(from as usize + 1) * vr]);
                    }
                    let h2 = make(leak(moved), Box::leak(k2.into_boxed_slice()), Box::leak(v2.into_boxed_slice()));
                    let mut c = vec![0f32; n_q * dv];
                    attend_inv(&h2, &mut c, &mut s);
                    assert_eq!(a, c);
                }
            }
        }
    }

    /// Close to the exact softmax-weighted sum (the arithmetic is an ordinary one).
    #[test]
    fn specification_is_attention() {
        let mut rng = Rng(3);
        let (dk, n) = (64, 50);
        let k: Vec<f32> = (0..n * dk).map(|_| rng.next()).collect();
        let v: Vec<f32> = (0..n * dk).map(|_| rng.next()).collect();
        let q: Vec<f32> = (0..dk).map(|_| rng.next() * 3.0).collect();
        let cells: Vec<u32> = (0..n as u32).collect();
        let (kb, vb) = (bytes(GgmlType::F32, &k), bytes(GgmlType::F32, &v));
        let h = InvQuery {
            k_type: GgmlType::F32, v_type: GgmlType::F32, k: &kb, k_stride: dk * 4, k_offset: 0, v: &vb, v_stride: dk * 4, v_offset: 0,
            v_cols: 0, head_dim_k: dk, head_dim_v: dk, q: &q, n_q: 1, cells: &cells, scale: 0.125, softcap: 0.0, sinks: None,
        };
        let mut out = vec![0f32; dk];
        attend_inv_reference(&h, &mut out, &mut InvScratch::default());
        let s: Vec<f64> = (0..n).map(|i| (0..dk).map(|d| q[d] as f64 * k[i * dk + d] as f64).sum::<f64>() * 0.125).collect();
        let m = s.iter().copied().fold(f64::MIN, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        for d in 0..dk {
            let want: f64 = (0..n).map(|i| (s[i] - m).exp() / z * v[i * dk + d] as f64).sum();
            assert!((out[d] as f64 - want).abs() < 1e-5, "{d}: {} vs {want}", out[d]);
        }
    }
}
