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
            && self.n_q <= MAX_HEADS
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

/// Query heads one `attend` call may cover.
pub const MAX_HEADS: usize = 64;

/// Buffers `attend` reuses: grown to the largest call, never shrunk.
#[derive(Default)]
pub struct AttnScratch {
    q: Vec<f32>,
    w: Vec<f32>,
    sets: Vec<f32>,
    /// The cached rows of the call as f32 (for an F16 cache whose rows several queries read).
    k: Vec<f32>,
    v: Vec<f32>,
    /// The cells visible to the current token, ascending.
    visible: Vec<u32>,
    /// The same cells grouped by set (cell % sets), ascending within a set, for the sparse
    /// weighted sum; set r's are by_set[set_start[r]..set_start[r + 1]].
    by_set: Vec<u32>,
    set_start: Vec<usize>,
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

    use super::{grow, AttnScratch, DotOrder, Heads, MAX_HEADS, MAX_TOKENS};
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

    /// Queries per cached row from which converting the rows to f32 once pays (below it, each
    /// dot product converts the f16 it reads: a decoded token reads each row once per head).
    const CONVERT_FROM_USES: usize = 16;

    /// Where a row's values are read: an f16 cache in place, or f32 (an F32 cache, or rows
    /// converted once).
    #[derive(Clone, Copy)]
    struct Rows {
        p: *const u8,
        /// Bytes from one cell's row to the next.
        stride: usize,
        f16: bool,
    }

    impl Rows {
        #[inline(always)]
        unsafe fn row(&self, j: usize) -> *const u8 {
            self.p.add(j * self.stride)
        }
        /// Values i..i + 16 of a row (from `row`) as f32.
        #[inline(always)]
        unsafe fn load16(&self, row: *const u8, i: usize) -> __m512 {
            if self.f16 {
                _mm512_cvtph_ps(_mm256_loadu_si256(row.add(2 * i) as *const __m256i))
            } else {
                _mm512_loadu_ps((row as *const f32).add(i))
            }
        }
    }

    /// The cached rows of cells 0..end: converted to f32 into `buf` when `convert` (and the
    /// cache is F16), else read in place.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows(ty: GgmlType, cache: &[u8], stride: usize, offset: usize, d: usize, end: usize, convert: bool, buf: &mut Vec<f32>) -> Rows {
        let f16 = ty == GgmlType::F16;
        let in_place = Rows { p: cache.as_ptr().add(offset), stride, f16 };
        if !f16 || !convert {
            return in_place;
        }
        let b = grow(buf, end * d).as_mut_ptr();
        for j in 0..end {
            for i in (0..d).step_by(16) {
                _mm512_storeu_ps(b.add(j * d + i), in_place.load16(in_place.row(j), i));
            }
        }
        Rows { p: b as *const u8, stride: 4 * d, f16: false }
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
        // The rows of the cache, once for all tokens and heads of the task when they share them.
        let convert = nt * nq >= CONVERT_FROM_USES;
        let kr = rows(h.k_type, h.k, h.k_stride, h.k_offset, dk, end_any, convert, &mut s.k);
        let vr = rows(h.v_type, h.v, h.v_stride, h.v_offset, dv, end_any, convert, &mut s.v);
        let sets = h.sets();
        let qbuf = grow(&mut s.q, nq * dk).as_mut_ptr();
        let w = grow(&mut s.w, nq * n_kv).as_mut_ptr();
        let acc = grow(&mut s.sets, nq * sets * dv).as_mut_ptr();
        for t in 0..nt {
            let m = mask(t);
            let end = ends[t];
            s.visible.clear();
            s.visible.extend((0..end as u32).filter(|&j| *m.add(j as usize) != f32::NEG_INFINITY));
            let visible = &s.visible[..];
            for qi in 0..nq {
                // The query in the K type's precision.
                let (q, qb) = (h.q.as_ptr().add(t * h.q_stride + qi * dk), qbuf.add(qi * dk));
                for i in (0..dk).step_by(16) {
                    let x = _mm512_loadu_ps(q.add(i));
                    let x = if h.k_type == GgmlType::F16 { _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)) } else { x };
                    _mm512_storeu_ps(qb.add(i), x);
                }
                for c in (0..n_kv).step_by(16) {
                    _mm512_storeu_ps(w.add(qi * n_kv + c), _mm512_set1_ps(f32::NEG_INFINITY));
                }
            }
            // Scores, scaled and masked: each cached key read once for all heads.
            if kr.f16 {
                scores::<true>(h, kr, qbuf, m, visible, w);
            } else {
                scores::<false>(h, kr, qbuf, m, visible, w);
            }
            let o = out.add(t * h.out_stride);
            let mut live = [false; MAX_HEADS];
            for qi in 0..nq {
                live[qi] = softmax(w.add(qi * n_kv), n_kv, h.v_type == GgmlType::F16);
            }
            // Weighted sums: each cached value read once for all heads.
            let cells = if sparse(visible.len(), end) {
                group_by_set(visible, sets, &mut s.by_set, &mut s.set_start);
                Cells::BySet(&s.by_set, &s.set_start)
            } else {
                Cells::All
            };
            let sums = Sums { sets, dv, n_kv, nq, p: w, end, acc, cells };
            if vr.f16 {
                weighted_sums::<true>(&sums, vr);
            } else {
                weighted_sums::<false>(&sums, vr);
            }
            for qi in 0..nq {
                let oq = o.add(qi * dv);
                if live[qi] {
                    reduce_sets(sets, dv, acc.add(qi * sets * dv), oq);
                } else {
                    for i in 0..dv {
                        *oq.add(i) = 0.0;
                    }
                }
            }
        }
    }

    /// w[qi][j] = scale * K_j · q_qi + mask[j] for the visible cells j and every head qi (the
    /// others keep their -inf).
    #[inline(always)]
    unsafe fn scores<const F16: bool>(h: &Heads, kr: Rows, q: *const f32, m: *const f32, visible: &[u32], w: *mut f32) {
        let kr = Rows { f16: F16, ..kr };
        let (dk, n_kv) = (h.head_dim_k, h.n_kv);
        // Four cells at a time: four independent chains keep the FMA units busy.
        let mut quads = visible.chunks_exact(4);
        for c4 in quads.by_ref() {
            let j = [c4[0] as usize, c4[1] as usize, c4[2] as usize, c4[3] as usize];
            let rows = [kr.row(j[0]), kr.row(j[1]), kr.row(j[2]), kr.row(j[3])];
            for qi in 0..h.n_q {
                let sc = dot4(h.order_kq, kr, rows, q.add(qi * dk), dk);
                for c in 0..4 {
                    *w.add(qi * n_kv + j[c]) = sc[c] * h.scale + *m.add(j[c]);
                }
            }
        }
        for &j in quads.remainder() {
            let j = j as usize;
            for qi in 0..h.n_q {
                *w.add(qi * n_kv + j) = dot4(h.order_kq, kr, [kr.row(j); 4], q.add(qi * dk), dk)[0] * h.scale + *m.add(j);
            }
        }
    }

    /// The dot products of four cached rows with q, each in `order`.
    #[inline(always)]
    unsafe fn dot4(order: DotOrder, kr: Rows, k: [*const u8; 4], q: *const f32, n: usize) -> [f32; 4] {
        match order {
            DotOrder::TinyBlas => {
                let mut acc = [_mm512_setzero_ps(); 4];
                for c in (0..n).step_by(16) {
                    let qc = _mm512_loadu_ps(q.add(c));
                    for r in 0..4 {
                        acc[r] = _mm512_fmadd_ps(kr.load16(k[r], c), qc, acc[r]);
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
                            acc[j] = _mm512_fmadd_ps(kr.load16(k[r], c + 16 * j), _mm512_loadu_ps(q.add(c + 16 * j)), acc[j]);
                        }
                    }
                    out[r] = reduce16(_mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3])));
                }
                out
            }
        }
    }

    /// The weighted sums of one token's heads: probabilities p[qi * n_kv + j] for cells
    /// j < end, into acc[qi][set][dv] (lane r of a dot product over cells, set r, sums cells
    /// r, r + sets, ... in cell order).
    struct Sums<'a> {
        sets: usize,
        dv: usize,
        n_kv: usize,
        nq: usize,
        p: *const f32,
        end: usize,
        acc: *mut f32,
        cells: Cells<'a>,
    }

    /// The cells a set's sum walks.
    #[derive(Clone, Copy)]
    enum Cells<'a> {
        /// Every cell below `end` (a masked one adds exact zeros: its probability is 0).
        All,
        /// Only the visible cells, grouped by set (few of them: other sequences' cells
        /// interleaved); the same FMAs in the same order as `All` but for those zeros.
        BySet(&'a [u32], &'a [usize]),
    }

    /// Whether a token's weighted sum walks only its visible cells (few of the cells below
    /// its last) rather than every cell below `end`.
    #[inline(always)]
    fn sparse(n_visible: usize, end: usize) -> bool {
        n_visible * 4 < end
    }

    /// `visible` (ascending) grouped by cell % sets, ascending within each set.
    fn group_by_set(visible: &[u32], sets: usize, by_set: &mut Vec<u32>, set_start: &mut Vec<usize>) {
        set_start.clear();
        set_start.resize(sets + 1, 0);
        for &j in visible {
            set_start[j as usize % sets + 1] += 1;
        }
        for r in 0..sets {
            set_start[r + 1] += set_start[r];
        }
        by_set.clear();
        by_set.resize(visible.len(), 0);
        let mut next = [0usize; 64];
        next[..sets].copy_from_slice(&set_start[..sets]);
        for &j in visible {
            let r = j as usize % sets;
            by_set[next[r]] = j;
            next[r] += 1;
        }
    }

    #[inline(always)]
    unsafe fn weighted_sums<const F16: bool>(u: &Sums, vr: Rows) {
        let vr = Rows { f16: F16, ..vr };
        // Heads in blocks of up to eight, each cached row read once per block: the blocks'
        // accumulators (heads x 16 NV floats) stay in registers.
        let mut h0 = 0;
        while h0 < u.nq {
            let hb = (u.nq - h0).min(8);
            macro_rules! pass {
                ($(($h:literal, $nv:literal)),*) => {
                    match (hb, lanes_per_pass(hb, u.dv)) {
                        $(($h, $nv) => {
                            for i in (0..u.dv).step_by(16 * $nv) {
                                sets_pass::<$h, $nv>(u, vr, h0, i);
                            }
                        })*
                        _ => unreachable!("lanes_per_pass returns one of these"),
                    }
                };
            }
            pass!((1, 16), (1, 8), (1, 4), (2, 8), (2, 4), (3, 4), (4, 4), (5, 2), (6, 2), (7, 2), (8, 2));
            h0 += hb;
        }
    }

    /// out[d] = the dot product over cells: the lanes of one head's sets, then GCC's reduce
    /// tree, lane-wise.
    #[inline(always)]
    unsafe fn reduce_sets(sets: usize, dv: usize, acc: *const f32, o: *mut f32) {
        for i in (0..dv).step_by(16) {
            let at = acc.add(i);
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

    /// 16-float vectors per row chunk for a block of `hb` heads: as many as the registers hold
    /// (hb x NV accumulators, NV values, one probability), dividing head_dim_v (a multiple of
    /// 64).
    fn lanes_per_pass(hb: usize, dv: usize) -> usize {
        match hb {
            1 if dv % 256 == 0 => 16,
            1 | 2 if dv % 128 == 0 => 8,
            1..=4 => 4,
            _ => 2,
        }
    }

    /// Dimensions i..i + 16 NV of every set of heads h0..h0 + HB: FMAs in cell order, the
    /// accumulators in registers, each cached row chunk loaded (and converted) once for all
    /// HB heads.
    #[inline(always)]
    unsafe fn sets_pass<const HB: usize, const NV: usize>(u: &Sums, vr: Rows, h0: usize, i: usize) {
        // Rows a set's walk reaches a few steps from now: its cells are `sets` rows apart,
        // a power-of-two stride the hardware prefetchers do not follow.
        let ahead = 8 * u.sets;
        let es = if vr.f16 { 2 } else { 4 };
        let chunk_bytes = es * 16 * NV;
        let p = u.p.add(h0 * u.n_kv);
        for r in 0..u.sets {
            let mut a = [[_mm512_setzero_ps(); NV]; HB];
            // A macro, not a closure: the accumulators must stay in registers.
            macro_rules! add {
                ($j:expr) => {{
                let j: usize = $j;
                let v = vr.row(j);
                let mut x = [_mm512_setzero_ps(); NV];
                for c in 0..NV {
                    x[c] = vr.load16(v, i + 16 * c);
                }
                for h in 0..HB {
                    // A zero probability adds exact zeros: the FMA leaves the sum's bits.
                    let pv = _mm512_set1_ps(*p.add(h * u.n_kv + j));
                    for c in 0..NV {
                        a[h][c] = _mm512_fmadd_ps(x[c], pv, a[h][c]);
                    }
                }
                }};
            }
            match u.cells {
                Cells::All => {
                    for j in (r..u.end.min(r + ahead)).step_by(u.sets) {
                        prefetch(vr.row(j).add(es * i), chunk_bytes);
                    }
                    let mut j = r;
                    while j < u.end {
                        if j + ahead < u.end {
                            prefetch(vr.row(j + ahead).add(es * i), chunk_bytes);
                        }
                        add!(j);
                        j += u.sets;
                    }
                }
                Cells::BySet(by_set, start) => {
                    for &j in &by_set[start[r]..start[r + 1]] {
                        add!(j as usize);
                    }
                }
            }
            for h in 0..HB {
                let base = u.acc.add(((h0 + h) * u.sets + r) * u.dv + i);
                for c in 0..NV {
                    _mm512_storeu_ps(base.add(16 * c), a[h][c]);
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn prefetch(p: *const u8, bytes: usize) {
        for off in (0..bytes).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(p.add(off) as *const i8);
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
            for (dk, dv, n_kv, nq) in [(64, 64, 256, 7), (256, 256, 128, 4), (128, 64, 64, 1), (128, 128, 64, 2), (64, 64, 128, 5), (64, 128, 64, 9), (64, 256, 64, 1)] {
                for ((okq, ovp), sparse) in [(DotOrder::VecDot, DotOrder::VecDot), (DotOrder::TinyBlas, DotOrder::TinyBlas)]
                    .into_iter()
                    .flat_map(|o| [(o, false), (o, true)])
                {
                    let n_head_kv = 2;
                    let kvals: Vec<f32> = (0..n_kv * n_head_kv * dk).map(|_| rng.next()).collect();
                    let vvals: Vec<f32> = (0..n_kv * n_head_kv * dv).map(|_| rng.next()).collect();
                    let (k, v) = (cache(kt, &kvals), cache(vt, &vvals));
                    let es = |t: GgmlType| if t == GgmlType::F16 { 2 } else { 4 };
                    let nt = 3;
                    let q: Vec<f32> = (0..nt * nq * dk).map(|_| rng.next()).collect();
                    // A causal-like mask per token, with holes; token 2 sees nothing. With
                    // `sparse`, token 1 sees one cell in eight (sequences interleaved in the
                    // cache), which takes the kernel's sparse path.
                    let mask: Vec<f32> = (0..nt * n_kv)
                        .map(|i| {
                            let (t, j) = (i / n_kv, i % n_kv);
                            let hidden = t == 2 || j % 5 == 3 || j > n_kv - 9 - 7 * t || (sparse && t == 1 && j % 8 != 5);
                            if hidden { f32::NEG_INFINITY } else { 0.0 }
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
                        assert_eq!(x.to_bits(), y.to_bits(), "{kt}/{vt} {dk}x{dv} n_kv {n_kv} {okq:?} sparse {sparse} output {i}: {x} vs {y}");
                    }
                }
            }
        }
    }
}
