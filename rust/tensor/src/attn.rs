//! Attention over an F16 or F32 cache with the arithmetic of llama.cpp's CPU backend on an
//! AVX-512 machine (no flash attention: `mul_mat(K, Q)`, `soft_max_ext`, `mul_mat(V, P)`):
//!
//! - the query is rounded to the K type (f16) before the scores;
//! - a dot product is summed the way the matrix product that computes it sums: one token
//!   (`DotOrder::VecDot`: ggml_vec_dot_f16/f32, four 16-lane accumulators over 64-element
//!   steps added as (a0 + a2) + (a1 + a3)) or a prompt batch with F16 operands
//!   (`DotOrder::TinyBlas`: llamafile's tinyBLAS, one 16-lane accumulator); the 16 lanes are
//!   then added in the tree of GCC's `_mm512_reduce_add_ps`;
//! - the softmax is ggml_soft_max: scores times the scale plus the mask, exponentials by
//!   `ggml_v_expf` over 16 cells at a time, their sum in f64 of each 16-cell lane sum,
//!   multiplied by (float)(1 / sum); probabilities rounded to f16 for an F16 V;
//! - the weighted sum over cells is again a dot product (over cells) in one of the orders.
//!
//! `attend` is the AVX-512 kernel; `attend_reference` computes the same numbers one operation
//! at a time (the specification, and the test of the kernel).

use crate::dispatch::{active_isa, Isa};
use crate::util::{f16_to_f32 as half_to_f32, f32_to_f16};
use crate::GgmlType;

/// How a dot product's terms are summed (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DotOrder {
    VecDot,
    TinyBlas,
}

/// The query heads that share one cached KV head, for a few tokens, and the cache they
/// attend to. Query (token t, head i) is q[t * q_stride + i * head_dim_k ..]; its output goes
/// to out[t * out_stride + i * head_dim_v ..].
pub struct Heads<'a> {
    /// F16 or F32.
    pub k_type: GgmlType,
    pub v_type: GgmlType,
    /// The layer's cached keys: cell j's head starts at k[j * k_stride + k_offset].
    pub k: &'a [u8],
    pub k_stride: usize,
    pub k_offset: usize,
    pub v: &'a [u8],
    pub v_stride: usize,
    pub v_offset: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub n_kv: usize,
    pub q: &'a [f32],
    pub q_stride: usize,
    /// Heads per token.
    pub n_q: usize,
    /// Tokens.
    pub n_t: usize,
    /// n_t rows of n_kv entries (0 or -inf), row t at mask[t * mask_stride].
    pub mask: &'a [f32],
    pub mask_stride: usize,
    pub out_stride: usize,
    pub scale: f32,
    /// The order of the scores' dot products and of the weighted sum's.
    pub order_kq: DotOrder,
    pub order_vp: DotOrder,
}

impl Heads<'_> {
    /// True when `attend` handles this call (the shapes the exact orders are defined for, on
    /// an AVX-512 machine); otherwise the caller uses its own path.
    pub fn supported(&self) -> bool {
        let dims_ok = |d: usize| d > 0 && d % 64 == 0;
        active_isa() == Isa::Avx512
            && matches!(self.k_type, GgmlType::F16 | GgmlType::F32)
            && matches!(self.v_type, GgmlType::F16 | GgmlType::F32)
            && dims_ok(self.head_dim_k)
            && dims_ok(self.head_dim_v)
            && self.n_kv % 64 == 0
            && self.n_q > 0
            && self.n_t > 0
            && self.n_t <= MAX_TOKENS
            && self.mask_stride >= self.n_kv
            && self.mask.len() >= (self.n_t - 1) * self.mask_stride + self.n_kv
            && self.q_stride >= self.n_q * self.head_dim_k
            && self.q.len() >= (self.n_t - 1) * self.q_stride + self.n_q * self.head_dim_k
            && self.out_stride >= self.n_q * self.head_dim_v
            && self.cache_in_bounds()
    }

    fn cache_in_bounds(&self) -> bool {
        let es = |t: GgmlType| if t == GgmlType::F16 { 2 } else { 4 };
        let last = self.n_kv.saturating_sub(1);
        let k_end = last * self.k_stride + self.k_offset + self.head_dim_k * es(self.k_type);
        let v_end = last * self.v_stride + self.v_offset + self.head_dim_v * es(self.v_type);
        self.k.len() >= k_end && self.v.len() >= v_end
    }

    fn sets(&self) -> usize {
        match self.order_vp {
            DotOrder::VecDot => 64,
            DotOrder::TinyBlas => 16,
        }
    }
}

/// Tokens one `attend` call may cover.
pub const MAX_TOKENS: usize = 64;

/// Buffers `attend` reuses: grown to the largest call, never shrunk.
#[derive(Default)]
pub struct AttnScratch {
    q: Vec<f32>,
    w: Vec<f32>,
    sets: Vec<f32>,
    /// The cached rows of the call as f32 (for an F16 cache).
    k: Vec<f32>,
    v: Vec<f32>,
}

fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// out = softmax(scale * K·q + mask) · V for each query. Requires `h.supported()`. A query
/// with no visible cell gets zeros.
pub fn attend(h: &Heads, out: &mut [f32], s: &mut AttnScratch) {
    assert!(out.len() >= (h.n_t - 1) * h.out_stride + h.n_q * h.head_dim_v, "output too short");
    // SAFETY: the output range was checked above.
    unsafe { attend_raw(h, out.as_mut_ptr(), s) }
}

/// `attend` writing through a pointer, for callers whose tasks interleave their outputs
/// (token rows of one task alternate with other tasks' heads).
///
/// # Safety
/// `out` must be valid for writes at out[t * out_stride + i] for t < n_t and
/// i < n_q * head_dim_v, and no other thread may access those floats during the call.
pub unsafe fn attend_raw(h: &Heads, out: *mut f32, s: &mut AttnScratch) {
    assert!(h.supported(), "unsupported attention call");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: shapes and bounds checked by `supported`; AVX-512 by the dispatch.
    unsafe {
        x86::attend(h, out, s)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let len = (h.n_t - 1) * h.out_stride + h.n_q * h.head_dim_v;
        attend_reference(h, std::slice::from_raw_parts_mut(out, len), s)
    }
}

// ------------------------------------------------------------------ the specification

/// GCC's `_mm512_reduce_add_ps`: ((x8 + x0) ... ) as a tree of halves.
pub fn reduce16(x: &[f32; 16]) -> f32 {
    let mut t = [0f32; 8];
    for i in 0..8 {
        t[i] = x[8 + i] + x[i];
    }
    let mut u = [0f32; 4];
    for i in 0..4 {
        u[i] = t[4 + i] + t[i];
    }
    (u[0] + u[2]) + (u[1] + u[3])
}

fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// One dot product of n terms x[i] * y[i] in `order`.
pub fn dot_reference(order: DotOrder, x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    match order {
        DotOrder::TinyBlas => {
            let mut acc = [0f32; 16];
            for c in (0..n).step_by(16) {
                for k in 0..16 {
                    acc[k] = fma(x[c + k], y[c + k], acc[k]);
                }
            }
            reduce16(&acc)
        }
        DotOrder::VecDot => {
            let mut acc = [[0f32; 16]; 4];
            for c in (0..n).step_by(64) {
                for j in 0..4 {
                    for k in 0..16 {
                        acc[j][k] = fma(x[c + 16 * j + k], y[c + 16 * j + k], acc[j][k]);
                    }
                }
            }
            let mut x0 = [0f32; 16];
            for k in 0..16 {
                x0[k] = (acc[0][k] + acc[2][k]) + (acc[1][k] + acc[3][k]);
            }
            reduce16(&x0)
        }
    }
}

/// ggml_v_expf (AVX-512 version), one lane.
pub fn expf_reference(x: f32) -> f32 {
    let c = |b: u32| f32::from_bits(b);
    let r = c(0x4b40_0000);
    let z = fma(x, c(0x3fb8_aa3b), r);
    let n = z - r;
    // fnmadd(a, b, c) = -(a * b) + c, rounded once.
    let b = fma(-n, c(0x35bf_be8e), fma(-n, c(0x3f31_7200), x));
    let u = b * b;
    let j = fma(
        fma(fma(c(0x3c07_2010), b, c(0x3d2b_9f17)), u, fma(c(0x3e2a_af33), b, c(0x3eff_fedb))),
        u,
        fma(c(0x3f7f_fff6), b, 1.0),
    );
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // scalef: j * 2^n, rounded once (exact in f64, then rounded to f32).
    (j as f64 * 2f64.powi(n as i32)) as f32
}

fn row_f32(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    match ty {
        GgmlType::F16 => (0..n).map(|i| half_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]))).collect(),
        _ => (0..n).map(|i| f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"))).collect(),
    }
}

fn round_f16(x: f32) -> f32 {
    half_to_f32(f32_to_f16(x))
}

/// `attend`, one operation at a time.
pub fn attend_reference(h: &Heads, out: &mut [f32], _s: &mut AttnScratch) {
    let (dk, dv, n_kv) = (h.head_dim_k, h.head_dim_v, h.n_kv);
    let key = |j: usize| row_f32(h.k_type, &h.k[j * h.k_stride + h.k_offset..], dk);
    let value = |j: usize| row_f32(h.v_type, &h.v[j * h.v_stride + h.v_offset..], dv);
    for (t, qi) in (0..h.n_t).flat_map(|t| (0..h.n_q).map(move |qi| (t, qi))) {
        let q0 = t * h.q_stride + qi * dk;
        let q: Vec<f32> = h.q[q0..q0 + dk].iter().map(|&v| if h.k_type == GgmlType::F16 { round_f16(v) } else { v }).collect();
        let mask = &h.mask[t * h.mask_stride..t * h.mask_stride + n_kv];
        let mut w = vec![f32::NEG_INFINITY; n_kv];
        for (j, wj) in w.iter_mut().enumerate() {
            if mask[j] != f32::NEG_INFINITY {
                *wj = dot_reference(h.order_kq, &key(j), &q) * h.scale + mask[j];
            }
        }
        let o0 = t * h.out_stride + qi * dv;
        let o = &mut out[o0..o0 + dv];
        o.fill(0.0);
        let max = w.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        if max == f32::NEG_INFINITY {
            continue;
        }
        let mut sum = 0f64;
        for c in (0..n_kv).step_by(16) {
            let mut e = [0f32; 16];
            for k in 0..16 {
                e[k] = expf_reference(w[c + k] - max);
                w[c + k] = e[k];
            }
            sum += reduce16(&e) as f64;
        }
        let inv = (1.0 / sum) as f32;
        let p: Vec<f32> = w.iter().map(|&e| if h.v_type == GgmlType::F16 { round_f16(e * inv) } else { e * inv }).collect();
        let vt: Vec<Vec<f32>> = (0..n_kv).map(value).collect();
        for (d, od) in o.iter_mut().enumerate() {
            let col: Vec<f32> = vt.iter().map(|v| v[d]).collect();
            *od = dot_reference(h.order_vp, &col, &p);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{grow, AttnScratch, DotOrder, Heads, MAX_TOKENS};
    use crate::GgmlType;

    /// Lane-wise GCC `_mm512_reduce_add_ps` of one vector, as a scalar.
    #[inline(always)]
    unsafe fn reduce16(x: __m512) -> f32 {
        let hi = _mm512_extractf32x8_ps::<1>(x);
        let lo = _mm512_castps512_ps256(x);
        let t = _mm256_add_ps(hi, lo);
        let u = _mm_add_ps(_mm256_extractf128_ps::<1>(t), _mm256_castps256_ps128(t));
        let v = _mm_add_ps(u, _mm_shuffle_ps::<0b01_00_11_10>(u, u));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
    }

    /// ggml_v_expf (AVX-512).
    #[inline(always)]
    unsafe fn expf(x: __m512) -> __m512 {
        macro_rules! c {
            ($b:expr) => {
                _mm512_set1_ps(f32::from_bits($b))
            };
        }
        let r = c!(0x4b40_0000);
        let z = _mm512_fmadd_ps(x, c!(0x3fb8_aa3b), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(n, c!(0x35bf_be8e), _mm512_fnmadd_ps(n, c!(0x3f31_7200), x));
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(_mm512_fmadd_ps(c!(0x3c07_2010), b, c!(0x3d2b_9f17)), u, _mm512_fmadd_ps(c!(0x3e2a_af33), b, c!(0x3eff_fedb))),
            u,
            _mm512_fmadd_ps(c!(0x3f7f_fff6), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        if d == 0 {
            return res;
        }
        let zero = _mm512_setzero_ps();
        let alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero), _mm512_set1_ps(f32::INFINITY), zero);
        _mm512_mask_blend_ps(d, res, alt)
    }

    /// 16 values of a cached row (F16 or F32) as f32.
    #[inline(always)]
    unsafe fn load16(ty: GgmlType, p: *const u8, i: usize) -> __m512 {
        if ty == GgmlType::F16 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i) as *const __m256i))
        } else {
            _mm512_loadu_ps((p as *const f32).add(i))
        }
    }

    /// The cached rows of cells 0..end as f32: converted into `buf` for F16, the cache itself
    /// for F32. Returns (pointer to cell 0's head, stride in floats).
    #[inline(always)]
    unsafe fn rows_f32(ty: GgmlType, cache: &[u8], stride: usize, offset: usize, d: usize, end: usize, buf: &mut Vec<f32>) -> (*const f32, usize) {
        if ty == GgmlType::F32 {
            return ((cache.as_ptr().add(offset)) as *const f32, stride / 4);
        }
        let b = grow(buf, end * d).as_mut_ptr();
        for j in 0..end {
            let src = cache.as_ptr().add(j * stride + offset);
            for i in (0..d).step_by(16) {
                _mm512_storeu_ps(b.add(j * d + i), load16(ty, src, i));
            }
        }
        (b, d)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
    pub unsafe fn attend(h: &Heads, out: *mut f32, s: &mut AttnScratch) {
        let (dk, dv, n_kv, nq, nt) = (h.head_dim_k, h.head_dim_v, h.n_kv, h.n_q, h.n_t);
        let mask = |t: usize| h.mask.as_ptr().add(t * h.mask_stride);
        // One past the last cell visible to each token, and to any.
        let mut ends = [0usize; MAX_TOKENS];
        for (t, e) in ends.iter_mut().enumerate().take(nt) {
            let m = mask(t);
            *e = (0..n_kv).rev().find(|&j| *m.add(j) != f32::NEG_INFINITY).map_or(0, |j| j + 1);
        }
        let end_any = ends[..nt].iter().copied().max().unwrap_or(0);
        // The rows of the cache, once for all tokens and heads of the task.
        let (kf, ks) = rows_f32(h.k_type, h.k, h.k_stride, h.k_offset, dk, end_any, &mut s.k);
        let (vf, vs) = rows_f32(h.v_type, h.v, h.v_stride, h.v_offset, dv, end_any, &mut s.v);
        let qbuf = grow(&mut s.q, dk).as_mut_ptr();
        let w = grow(&mut s.w, n_kv).as_mut_ptr();
        let sets = h.sets();
        let acc = grow(&mut s.sets, sets * dv).as_mut_ptr();
        for t in 0..nt {
            let m = mask(t);
            let end = ends[t];
            for qi in 0..nq {
                // The query in the K type's precision.
                let q = h.q.as_ptr().add(t * h.q_stride + qi * dk);
                for i in (0..dk).step_by(16) {
                    let x = _mm512_loadu_ps(q.add(i));
                    let x = if h.k_type == GgmlType::F16 { _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)) } else { x };
                    _mm512_storeu_ps(qbuf.add(i), x);
                }
                // Scores, scaled and masked.
                scores(h, kf, ks, qbuf, m, end, w);
                for j in (end..n_kv).step_by(1) {
                    *w.add(j) = f32::NEG_INFINITY;
                }
                let o = out.add(t * h.out_stride + qi * dv);
                if !softmax(w, n_kv, h.v_type == GgmlType::F16) {
                    for i in 0..dv {
                        *o.add(i) = 0.0;
                    }
                    continue;
                }
                weighted_sum(sets, vf, vs, dv, w, end, acc, o);
            }
        }
    }

    /// w[j] = scale * K_j · q + mask[j] for the cells j < end (masked cells: -inf).
    #[inline(always)]
    unsafe fn scores(h: &Heads, kf: *const f32, ks: usize, q: *const f32, m: *const f32, end: usize, w: *mut f32) {
        let dk = h.head_dim_k;
        let mut j = 0;
        // Four cells at a time: four independent chains keep the FMA units busy.
        while j + 4 <= end {
            let k = [kf.add(j * ks), kf.add((j + 1) * ks), kf.add((j + 2) * ks), kf.add((j + 3) * ks)];
            let sc = dot4(h.order_kq, k, q, dk);
            for c in 0..4 {
                let mv = *m.add(j + c);
                *w.add(j + c) = if mv == f32::NEG_INFINITY { f32::NEG_INFINITY } else { sc[c] * h.scale + mv };
            }
            j += 4;
        }
        while j < end {
            let mv = *m.add(j);
            *w.add(j) = if mv == f32::NEG_INFINITY { f32::NEG_INFINITY } else { dot4(h.order_kq, [kf.add(j * ks); 4], q, dk)[0] * h.scale + mv };
            j += 1;
        }
    }

    /// The dot products of four f32 rows with q, each in `order`.
    #[inline(always)]
    unsafe fn dot4(order: DotOrder, k: [*const f32; 4], q: *const f32, n: usize) -> [f32; 4] {
        match order {
            DotOrder::TinyBlas => {
                let mut acc = [_mm512_setzero_ps(); 4];
                for c in (0..n).step_by(16) {
                    let qc = _mm512_loadu_ps(q.add(c));
                    for r in 0..4 {
                        acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(k[r].add(c)), qc, acc[r]);
                    }
                }
                let mut out = [0f32; 4];
                for r in 0..4 {
                    out[r] = reduce16(acc[r]);
                }
                out
            }
            DotOrder::VecDot => {
                let mut out = [0f32; 4];
                for r in 0..4 {
                    let mut acc = [_mm512_setzero_ps(); 4];
                    for c in (0..n).step_by(64) {
                        for j in 0..4 {
                            acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(k[r].add(c + 16 * j)), _mm512_loadu_ps(q.add(c + 16 * j)), acc[j]);
                        }
                    }
                    out[r] = reduce16(_mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3])));
                }
                out
            }
        }
    }

    /// o[d] = the dot product over cells of p (w, cells < end) with V[., d]: lane r of its
    /// accumulator (set r) sums cells r, r + sets, ... One set at a time, held in registers.
    #[inline(always)]
    unsafe fn weighted_sum(sets: usize, vf: *const f32, vs: usize, dv: usize, p: *const f32, end: usize, acc: *mut f32, o: *mut f32) {
        // head_dim_v is a multiple of 64 (`supported`): whole rows of up to 256 dimensions
        // at a time (each cached row read once per set), wider ones 64 at a time.
        match dv {
            64 => sets_pass::<4>(sets, vf, vs, dv, 0, p, end, acc),
            128 => sets_pass::<8>(sets, vf, vs, dv, 0, p, end, acc),
            256 => sets_pass::<16>(sets, vf, vs, dv, 0, p, end, acc),
            _ => {
                for i in (0..dv).step_by(64) {
                    sets_pass::<4>(sets, vf, vs, dv, i, p, end, acc);
                }
            }
        }
        for i in (0..dv).step_by(16) {
            let at = acc.add(i);
            // The lanes of the dot product over cells, then GCC's reduce tree, lane-wise.
            let mut x = [_mm512_setzero_ps(); 16];
            for k in 0..16 {
                x[k] = if sets == 64 {
                    let (s0, s1) = (_mm512_loadu_ps(at.add(k * dv)), _mm512_loadu_ps(at.add((16 + k) * dv)));
                    let (s2, s3) = (_mm512_loadu_ps(at.add((32 + k) * dv)), _mm512_loadu_ps(at.add((48 + k) * dv)));
                    _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3))
                } else {
                    _mm512_loadu_ps(at.add(k * dv))
                };
            }
            _mm512_storeu_ps(o.add(i), reduce16_lanes(&x));
        }
    }

    /// For every set r: acc[r][i..i + 16 NV] = sum over cells j = r, r + sets, .. < end of
    /// p[j] * V[j][i..], as FMAs in cell order, the NV accumulators held in registers.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn sets_pass<const NV: usize>(sets: usize, vf: *const f32, vs: usize, dv: usize, i: usize, p: *const f32, end: usize, acc: *mut f32) {
        for r in 0..sets {
            let mut a = [_mm512_setzero_ps(); NV];
            let mut j = r;
            while j < end {
                let pj = *p.add(j);
                if pj != 0.0 {
                    let pv = _mm512_set1_ps(pj);
                    let v = vf.add(j * vs + i);
                    for c in 0..NV {
                        a[c] = _mm512_fmadd_ps(_mm512_loadu_ps(v.add(16 * c)), pv, a[c]);
                    }
                }
                j += sets;
            }
            let base = acc.add(r * dv + i);
            for c in 0..NV {
                _mm512_storeu_ps(base.add(16 * c), a[c]);
            }
        }
    }

    /// The reduce tree of `reduce16` applied to 16 vectors lane by lane.
    #[inline(always)]
    unsafe fn reduce16_lanes(x: &[__m512; 16]) -> __m512 {
        let mut t = [_mm512_setzero_ps(); 8];
        for i in 0..8 {
            t[i] = _mm512_add_ps(x[8 + i], x[i]);
        }
        let mut u = [_mm512_setzero_ps(); 4];
        for i in 0..4 {
            u[i] = _mm512_add_ps(t[4 + i], t[i]);
        }
        _mm512_add_ps(_mm512_add_ps(u[0], u[2]), _mm512_add_ps(u[1], u[3]))
    }

    /// ggml_soft_max of one row in place (probabilities rounded to f16 when `as_f16`);
    /// false (and zeros) when every cell is masked.
    #[inline(always)]
    unsafe fn softmax(w: *mut f32, n: usize, as_f16: bool) -> bool {
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        for c in (0..n).step_by(16) {
            m = _mm512_max_ps(m, _mm512_loadu_ps(w.add(c)));
        }
        let max = _mm512_reduce_max_ps(m);
        if max == f32::NEG_INFINITY {
            for c in (0..n).step_by(16) {
                _mm512_storeu_ps(w.add(c), _mm512_setzero_ps());
            }
            return false;
        }
        let mv = _mm512_set1_ps(max);
        let mut sum = 0f64;
        for c in (0..n).step_by(16) {
            let x = _mm512_loadu_ps(w.add(c));
            if _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(x, _mm512_set1_ps(f32::NEG_INFINITY)) == 0 {
                // Every cell masked: exponentials 0, lane sum 0.
                _mm512_storeu_ps(w.add(c), _mm512_setzero_ps());
                continue;
            }
            let e = expf(_mm512_sub_ps(x, mv));
            _mm512_storeu_ps(w.add(c), e);
            sum += reduce16(e) as f64;
        }
        let inv = _mm512_set1_ps((1.0 / sum) as f32);
        for c in (0..n).step_by(16) {
            let p = _mm512_mul_ps(_mm512_loadu_ps(w.add(c)), inv);
            let p = if as_f16 { _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(p)) } else { p };
            _mm512_storeu_ps(w.add(c), p);
        }
        true
    }
}

/// f16 row to f32 (exact).
pub fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    assert!(src.len() >= 2 * n);
    #[cfg(target_arch = "x86_64")]
    {
        if active_isa() >= Isa::Avx2 {
            // SAFETY: lengths checked above; F16C is part of the Avx2 level.
            unsafe { convert::f16_to_f32(n, src.as_ptr(), dst.as_mut_ptr()) };
            return;
        }
    }
    crate::scalar::float::f16_to_f32_row(&src[..2 * n], dst);
}

#[cfg(target_arch = "x86_64")]
mod convert {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_to_f32(n: usize, src: *const u8, dst: *mut f32) {
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(dst.add(i), _mm256_cvtph_ps(_mm_loadu_si128(src.add(2 * i) as *const __m128i)));
            i += 8;
        }
        while i < n {
            *dst.add(i) = crate::util::f16_to_f32(std::ptr::read_unaligned(src.add(2 * i) as *const u16));
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        }
    }

    fn cache(ty: GgmlType, vals: &[f32]) -> Vec<u8> {
        match ty {
            GgmlType::F16 => vals.iter().flat_map(|&v| f32_to_f16(v).to_le_bytes()).collect(),
            _ => vals.iter().flat_map(|&v| v.to_le_bytes()).collect(),
        }
    }

    #[test]
    fn the_expf_port_is_close_to_libm_and_handles_the_limits() {
        for i in -2000..2000 {
            let x = i as f32 * 0.0437;
            let (a, b) = (expf_reference(x), x.exp());
            assert!((a - b).abs() <= b * 3e-7, "{x}: {a} vs {b}");
        }
        assert_eq!(expf_reference(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf_reference(-1000.0), 0.0);
        assert_eq!(expf_reference(0.0), 1.0);
    }

    #[test]
    fn kernel_equals_the_reference_bit_for_bit() {
        if active_isa() != Isa::Avx512 {
            eprintln!("no AVX-512: attend is not used on this CPU");
            return;
        }
        let mut rng = Lcg(3);
        for (kt, vt) in [(GgmlType::F16, GgmlType::F16), (GgmlType::F32, GgmlType::F32), (GgmlType::F16, GgmlType::F32)] {
            for (dk, dv, n_kv, nq) in [(64, 64, 256, 7), (256, 256, 128, 4), (128, 64, 64, 1)] {
                for (okq, ovp) in [(DotOrder::VecDot, DotOrder::VecDot), (DotOrder::TinyBlas, DotOrder::TinyBlas)] {
                    let n_head_kv = 2;
                    let kvals: Vec<f32> = (0..n_kv * n_head_kv * dk).map(|_| rng.next()).collect();
                    let vvals: Vec<f32> = (0..n_kv * n_head_kv * dv).map(|_| rng.next()).collect();
                    let (k, v) = (cache(kt, &kvals), cache(vt, &vvals));
                    let es = |t: GgmlType| if t == GgmlType::F16 { 2 } else { 4 };
                    let nt = 3;
                    let q: Vec<f32> = (0..nt * nq * dk).map(|_| rng.next()).collect();
                    // A causal-like mask per token, with holes; token 2 sees nothing.
                    let mask: Vec<f32> = (0..nt * n_kv)
                        .map(|i| {
                            let (t, j) = (i / n_kv, i % n_kv);
                            if t == 2 || j % 5 == 3 || j > n_kv - 9 - 7 * t { f32::NEG_INFINITY } else { 0.0 }
                        })
                        .collect();
                    let h = Heads {
                        k_type: kt, v_type: vt, k: &k, k_stride: n_head_kv * dk * es(kt), k_offset: dk * es(kt),
                        v: &v, v_stride: n_head_kv * dv * es(vt), v_offset: dv * es(vt), head_dim_k: dk, head_dim_v: dv,
                        n_kv, q: &q, q_stride: nq * dk, n_q: nq, n_t: nt, mask: &mask, mask_stride: n_kv, out_stride: nq * dv,
                        scale: 0.125, order_kq: okq, order_vp: ovp,
                    };
                    let mut s = AttnScratch::default();
                    let (mut a, mut b) = (vec![1f32; nt * nq * dv], vec![2f32; nt * nq * dv]);
                    attend(&h, &mut a, &mut s);
                    attend_reference(&h, &mut b, &mut s);
                    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                        assert_eq!(x.to_bits(), y.to_bits(), "{kt}/{vt} {dk}x{dv} n_kv {n_kv} {okq:?} output {i}: {x} vs {y}");
                    }
                }
            }
        }
    }
}
