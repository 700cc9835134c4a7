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

/// The accumulator sets of the weighted sum over cells for one token (ggml_vec_dot_f16's
/// 4 x 16 lanes): cell j goes to set j % V_SETS. The smaller tinyBLAS order's 16 sets are
/// unions of these.
pub const V_SETS: usize = 64;

/// Rows per set for a cache of `cells` cells.
pub fn v_cols(cells: usize) -> usize {
    cells.div_ceil(V_SETS)
}

/// The row of cell j in a set-major V cache of `cols` rows per set: each set's cells are
/// consecutive rows, so the weighted sum, which walks a set's cells in order, streams them
/// (cells 64 apart in cell order are 16 KB apart in a 128-dimension cache: the walk would
/// miss every cache level and alias in L1). `cols` 0: the values are rows in cell order (a
/// latent cache's values are the leading part of its keys, read in place).
#[inline(always)]
pub fn v_row(cell: usize, cols: usize) -> usize {
    if cols == 0 { cell } else { (cell % V_SETS) * cols + cell / V_SETS }
}

/// The cells a V cache of `cols` rows per set holds (0: rows in cell order, as many as the
/// keys: `n_kv`).
#[inline]
pub fn v_capacity(cols: usize, n_kv: usize) -> usize {
    if cols == 0 { n_kv } else { V_SETS * cols }
}

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
    /// The layer's cached values, rows set-major (or in cell order for v_cols 0): cell j's
    /// head starts at v[v_row(j, v_cols) * v_stride + v_offset].
    pub v: &'a [u8],
    pub v_stride: usize,
    pub v_offset: usize,
    pub v_cols: usize,
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
        active_isa() == Isa::Avx512 && dims_ok(self.head_dim_k) && dims_ok(self.head_dim_v) && self.n_kv % 64 == 0 && self.operands_fit()
    }

    /// What every attention kernel needs of a call: F16/F32 caches, 1..=MAX_HEADS heads and
    /// 1..=MAX_TOKENS tokens, and every index of the queries, mask, output and cache in bounds.
    pub fn operands_fit(&self) -> bool {
        matches!(self.k_type, GgmlType::F16 | GgmlType::F32)
            && matches!(self.v_type, GgmlType::F16 | GgmlType::F32)
            && self.n_kv <= v_capacity(self.v_cols, self.n_kv)
            && (1..=MAX_HEADS).contains(&self.n_q)
            && (1..=MAX_TOKENS).contains(&self.n_t)
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
        let v_end = v_capacity(self.v_cols, self.n_kv).saturating_sub(1) * self.v_stride + self.v_offset + self.head_dim_v * es(self.v_type);
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
    /// Probabilities of each head, set-major (`Sums::p`).
    p: Vec<f32>,
    w: Vec<f32>,
    sets: Vec<f32>,
    /// The cached rows of the call as f32 (for an F16 cache whose rows several queries read).
    k: Vec<f32>,
    v: Vec<f32>,
    /// The cells visible to the current token, ascending.
    visible: Vec<u32>,
    /// The cells visible to any token of the call, ascending.
    union: Vec<u32>,
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
    let value = |j: usize| row_f32(h.v_type, &h.v[v_row(j, h.v_cols) * h.v_stride + h.v_offset..], dv);
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
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::{grow, v_row, AttnScratch, DotOrder, Heads, MAX_HEADS, MAX_TOKENS};
    use crate::GgmlType;

    /// Lane-wise GCC `_mm512_reduce_add_ps` of one vector, as a scalar.
    #[inline(always)]
    pub(crate) unsafe fn reduce16(x: __m512) -> f32 {
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

    /// Uses of a cached row (queries that read it) from which converting it to f32 once pays
    /// (below it, each dot product converts the f16 it reads: a decoded token reads each row
    /// once per head).
    const CONVERT_FROM_USES: usize = 16;

    /// How a cell's row is found.
    #[derive(Clone, Copy)]
    enum Layout {
        /// Row j (K).
        Cells,
        /// Set-major with this many rows per set (the V cache, `v_row`).
        SetMajor(usize),
        /// Row j / sets: the converted rows of one set of the weighted sum's walk.
        OneSet(usize),
    }

    /// Where a row's values are read: an f16 cache in place, or f32 (an F32 cache, or rows
    /// converted once).
    #[derive(Clone, Copy)]
    struct Rows {
        p: *const u8,
        /// Bytes from one row to the next.
        stride: usize,
        f16: bool,
        layout: Layout,
    }

    impl Rows {
        /// The row of cell j.
        #[inline(always)]
        unsafe fn row(&self, j: usize) -> *const u8 {
            let r = match self.layout {
                Layout::Cells => j,
                Layout::SetMajor(cols) => v_row(j, cols),
                Layout::OneSet(sets) => j / sets,
            };
            self.p.add(r * self.stride)
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

    /// The f16 row `src` (d values, a multiple of 16) as f32 at `dst`.
    #[inline(always)]
    unsafe fn convert_row(src: *const u8, d: usize, dst: *mut f32) {
        for i in (0..d).step_by(16) {
            _mm512_storeu_ps(dst.add(i), _mm512_cvtph_ps(_mm256_loadu_si256(src.add(2 * i) as *const __m256i)));
        }
    }

    /// One token's view of the call: its query heads, mask row, scores and probabilities.
    #[derive(Clone, Copy)]
    struct Token {
        /// Its queries in the K type's precision (nq rows of dk).
        q: *const f32,
        mask: *const f32,
        /// nq rows of n_kv scores, then exponentials.
        w: *mut f32,
        /// nq rows of n_kv probabilities.
        p: *mut f32,
        /// nq blocks of sets x dv partial sums.
        acc: *mut f32,
        /// One past its last visible cell.
        end: usize,
        /// How many cells it sees.
        n_visible: usize,
    }

    /// The tokens of a call are computed together, so that each cached row is read from
    /// memory once per call rather than once per token (a prompt at a depth of thousands of
    /// cells: the rows of a KV head no longer fit the core's caches). Every score, softmax
    /// and weighted sum is still the same sequence of operations as for one token alone.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
    pub unsafe fn attend(h: &Heads, out: *mut f32, s: &mut AttnScratch) {
        let (dk, dv, n_kv, nq, nt) = (h.head_dim_k, h.head_dim_v, h.n_kv, h.n_q, h.n_t);
        let sets = h.sets();
        let qbuf = grow(&mut s.q, nt * nq * dk).as_mut_ptr();
        let w = grow(&mut s.w, nt * nq * n_kv).as_mut_ptr();
        let probs = grow(&mut s.p, nt * nq * n_kv).as_mut_ptr();
        let acc = grow(&mut s.sets, nt * nq * sets * dv).as_mut_ptr();
        let mut tokens = [None; MAX_TOKENS];
        let mut n_union = 0;
        union_of_visible(h, &mut s.union);
        for (t, slot) in tokens.iter_mut().enumerate().take(nt) {
            let mask = h.mask.as_ptr().add(t * h.mask_stride);
            let (end, n_visible) = seen_by(h, mask);
            n_union += n_visible;
            let at = t * nq;
            let tok = Token { q: qbuf.add(at * dk), mask, w: w.add(at * n_kv), p: probs.add(at * n_kv), acc: acc.add(at * sets * dv), end, n_visible };
            prepare_queries(h, t, tok);
            *slot = Some(tok);
        }
        let tokens: Vec<Token> = tokens[..nt].iter().map(|t| t.expect("set above")).collect();
        let f16 = |t: GgmlType| t == GgmlType::F16;
        let kr = Rows { p: h.k.as_ptr().add(h.k_offset), stride: h.k_stride, f16: f16(h.k_type), layout: Layout::Cells };
        let vr = Rows { p: h.v.as_ptr().add(h.v_offset), stride: h.v_stride, f16: f16(h.v_type), layout: Layout::SetMajor(h.v_cols) };
        // An f16 block of keys (a set of values) is converted to f32 once for all the queries
        // of the call when enough of them read it.
        let uses = |n_tokens: usize| n_tokens * nq >= CONVERT_FROM_USES;
        let k_block = grow(&mut s.k, 16 * dk).as_mut_ptr();
        // Scores: each key of the union read once for every token while in L1, when the
        // tokens see mostly the same cells (one sequence's prompt); else each token walks its own.
        if n_union * 5 >= 4 * nt * s.union.len() {
            scores(h, kr, &tokens, &s.union, uses(nt).then_some(k_block));
        } else {
            for tok in &tokens {
                visible_cells(tok, &s.union, &mut s.visible);
                scores(h, kr, std::slice::from_ref(tok), &s.visible, uses(1).then_some(k_block));
            }
        }
        let mut live = [[false; MAX_HEADS]; MAX_TOKENS];
        for (t, tok) in tokens.iter().enumerate() {
            // A dense walk reads the probabilities set by set: they are stored set-major.
            let layout = if sparse(tok.n_visible, tok.end) { None } else { Some(sets) };
            for qi in 0..nq {
                live[t][qi] = softmax(tok.w.add(qi * n_kv), n_kv, h.v_type == GgmlType::F16, layout, tok.p.add(qi * n_kv));
            }
        }
        // Weighted sums: the dense tokens together (each value row read once for all of them),
        // the sparse ones alone, over their own cells.
        let sums = |tok: &Token, cells| Sums { sets, dv, n_kv, nq, p: tok.p, end: tok.end, acc: tok.acc, cells };
        let dense: Vec<Sums> = tokens.iter().filter(|t| !sparse(t.n_visible, t.end)).map(|t| sums(t, Cells::All)).collect();
        let end_dense = dense.iter().map(|u| u.end).max().unwrap_or(0);
        let v_set = uses(dense.len()).then(|| grow(&mut s.v, end_dense.div_ceil(sets) * dv).as_mut_ptr());
        weighted_sums(&dense, vr, v_set);
        for tok in tokens.iter().filter(|t| sparse(t.n_visible, t.end)) {
            visible_cells(tok, &s.union, &mut s.visible);
            group_by_set(&s.visible, sets, &mut s.by_set, &mut s.set_start);
            let cells = Cells::BySet(&s.by_set, &s.set_start);
            weighted_sums(&[Sums { sets, dv, n_kv, nq, p: tok.p, end: tok.end, acc: tok.acc, cells }], vr, None);
        }
        for (t, tok) in tokens.iter().enumerate() {
            let o = out.add(t * h.out_stride);
            for qi in 0..nq {
                let oq = o.add(qi * dv);
                if live[t][qi] {
                    reduce_sets(sets, dv, tok.acc.add(qi * sets * dv), oq);
                } else {
                    for i in 0..dv {
                        *oq.add(i) = 0.0;
                    }
                }
            }
        }
    }

    /// The cells some token of the call sees, ascending (sixteen cells' masks at a time).
    #[inline(always)]
    unsafe fn union_of_visible(h: &Heads, union: &mut Vec<u32>) {
        union.clear();
        let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
        let seen1 = |j: usize| (0..h.n_t).any(|t| *h.mask.as_ptr().add(t * h.mask_stride + j) != f32::NEG_INFINITY);
        let whole = h.n_kv - h.n_kv % 16;
        for j0 in (0..whole).step_by(16) {
            let mut bits: u32 = 0;
            for t in 0..h.n_t {
                let m = _mm512_loadu_ps(h.mask.as_ptr().add(t * h.mask_stride + j0));
                bits |= _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(m, neg_inf) as u32;
            }
            while bits != 0 {
                union.push(j0 as u32 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
        union.extend((whole..h.n_kv).filter(|&j| seen1(j)).map(|j| j as u32));
    }

    /// One past the last cell a token's mask row shows, and how many it shows.
    #[inline(always)]
    unsafe fn seen_by(h: &Heads, mask: *const f32) -> (usize, usize) {
        let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
        let (mut end, mut n_visible) = (0, 0);
        let whole = h.n_kv - h.n_kv % 16;
        for j0 in (0..whole).step_by(16) {
            let bits = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(_mm512_loadu_ps(mask.add(j0)), neg_inf) as u32;
            if bits != 0 {
                end = j0 + 32 - bits.leading_zeros() as usize;
                n_visible += bits.count_ones() as usize;
            }
        }
        for j in whole..h.n_kv {
            if *mask.add(j) != f32::NEG_INFINITY {
                end = j + 1;
                n_visible += 1;
            }
        }
        (end, n_visible)
    }

    /// The cells `tok` sees (a subset of the union), ascending.
    unsafe fn visible_cells(tok: &Token, union: &[u32], visible: &mut Vec<u32>) {
        visible.clear();
        visible.extend(union.iter().copied().filter(|&j| *tok.mask.add(j as usize) != f32::NEG_INFINITY));
    }

    /// Token t's queries rounded to the K type, and its scores all -inf (masked).
    #[inline(always)]
    unsafe fn prepare_queries(h: &Heads, t: usize, tok: Token) {
        let dk = h.head_dim_k;
        for qi in 0..h.n_q {
            let (q, qb) = (h.q.as_ptr().add(t * h.q_stride + qi * dk), (tok.q as *mut f32).add(qi * dk));
            for i in (0..dk).step_by(16) {
                let x = _mm512_loadu_ps(q.add(i));
                let x = if h.k_type == GgmlType::F16 { _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)) } else { x };
                _mm512_storeu_ps(qb.add(i), x);
            }
            for c in (0..h.n_kv).step_by(16) {
                _mm512_storeu_ps(tok.w.add(qi * h.n_kv + c), _mm512_set1_ps(f32::NEG_INFINITY));
            }
        }
    }

    /// w[qi][j] = scale * K_j · q_qi + mask[j] of each token for the cells j of `cells` it
    /// sees and every head qi (the others keep their -inf).
    ///
    /// Sixteen cells at a time: the sixteen dot products of a head are reduced together
    /// (`fold_pair`, `reduce_halves`: the adds of sixteen `reduce16` trees, with shuffles that
    /// serve several), leaving the scores in one vector for the scale and the mask. (Converting
    /// an F16 block to f32 once for all heads measured no faster for Qwen's 64-dimension heads
    /// and slower for Gemma's 256.)
    ///
    /// With `f32_block` (room for 16 rows of head_dim_k floats) an f16 cache's block of keys is
    /// converted there once for every token and head.
    #[inline(always)]
    unsafe fn scores(h: &Heads, kr: Rows, tokens: &[Token], cells: &[u32], f32_block: Option<*mut f32>) {
        // The common head sizes as constants: the dot products unroll completely.
        match (kr.f16, f32_block.is_some(), h.head_dim_k) {
            (true, false, 64) => scores_dk::<true, false, 64>(h, kr, tokens, cells, f32_block),
            (true, false, 128) => scores_dk::<true, false, 128>(h, kr, tokens, cells, f32_block),
            (true, false, 256) => scores_dk::<true, false, 256>(h, kr, tokens, cells, f32_block),
            (true, false, _) => scores_dk::<true, false, 0>(h, kr, tokens, cells, f32_block),
            (true, true, 64) => scores_dk::<true, true, 64>(h, kr, tokens, cells, f32_block),
            (true, true, 128) => scores_dk::<true, true, 128>(h, kr, tokens, cells, f32_block),
            (true, true, 256) => scores_dk::<true, true, 256>(h, kr, tokens, cells, f32_block),
            (true, true, _) => scores_dk::<true, true, 0>(h, kr, tokens, cells, f32_block),
            (false, _, 64) => scores_dk::<false, false, 64>(h, kr, tokens, cells, None),
            (false, _, 128) => scores_dk::<false, false, 128>(h, kr, tokens, cells, None),
            (false, _, 256) => scores_dk::<false, false, 256>(h, kr, tokens, cells, None),
            (false, _, _) => scores_dk::<false, false, 0>(h, kr, tokens, cells, None),
        }
    }

    /// `scores` for an F16 cache or not, converted blocks or not, head size DK (0: h.head_dim_k).
    #[inline(always)]
    unsafe fn scores_dk<const F16: bool, const CONVERT: bool, const DK: usize>(
        h: &Heads, kr: Rows, tokens: &[Token], cells: &[u32], f32_block: Option<*mut f32>,
    ) {
        let (dk, n_kv) = (if DK > 0 { DK } else { h.head_dim_k }, h.n_kv);
        let kr = if CONVERT {
            Rows { p: f32_block.expect("CONVERT has a block").cast(), stride: 4 * dk, f16: false, layout: Layout::Cells }
        } else {
            Rows { f16: F16, ..kr }
        };
        let scale = _mm512_set1_ps(h.scale);
        let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
        for block in cells.chunks(16) {
            let n = block.len();
            // Cells of the block; a short last block repeats its last cell (scores not stored).
            let cell = |c: usize| block[c.min(n - 1)] as usize;
            let contiguous = n == 16 && block[15] - block[0] == 15;
            let rows: [*const u8; 16] = if CONVERT {
                for c in 0..n {
                    convert_row(h.k.as_ptr().add(block[c] as usize * h.k_stride + h.k_offset), dk, (kr.p as *mut f32).add(c * dk));
                }
                std::array::from_fn(|c| kr.row(c.min(n - 1)))
            } else {
                std::array::from_fn(|c| kr.row(cell(c)))
            };
            for tok in tokens {
                if block[0] as usize >= tok.end {
                    continue;
                }
                let m = tok.mask;
                for qi in 0..h.n_q {
                    let qh = tok.q.add(qi * dk);
                    // Four rows at a time (independent chains for the FMA units), folded in pairs
                    // as they come: sixteen whole vectors would not fit the registers.
                    let mut halves = [_mm512_setzero_ps(); 8];
                    for p in 0..4 {
                        let x = dot_lanes4(h.order_kq, kr, [rows[4 * p], rows[4 * p + 1], rows[4 * p + 2], rows[4 * p + 3]], qh, dk);
                        halves[2 * p] = fold_pair(x[0], x[1]);
                        halves[2 * p + 1] = fold_pair(x[2], x[3]);
                    }
                    let sc = _mm512_mul_ps(reduce_halves(&halves), scale);
                    let wq = tok.w.add(qi * n_kv);
                    if contiguous {
                        // A cell the token does not see keeps -inf whatever its key holds.
                        let j0 = block[0] as usize;
                        let mv = _mm512_loadu_ps(m.add(j0));
                        let hidden = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(mv, neg_inf);
                        _mm512_storeu_ps(wq.add(j0), _mm512_mask_blend_ps(hidden, _mm512_add_ps(sc, mv), neg_inf));
                    } else {
                        let mut lanes = [0f32; 16];
                        _mm512_storeu_ps(lanes.as_mut_ptr(), sc);
                        for (c, &j) in block.iter().enumerate() {
                            let mj = *m.add(j as usize);
                            if mj != f32::NEG_INFINITY {
                                *wq.add(j as usize) = lanes[c] + mj;
                            }
                        }
                    }
                }
            }
        }
    }

    /// The 16 lanes of the dot products of four cached rows with q in `order`, before
    /// `reduce16` (vec_dot's four accumulators already added as (a0 + a2) + (a1 + a3)).
    #[inline(always)]
    unsafe fn dot_lanes4(order: DotOrder, kr: Rows, k: [*const u8; 4], q: *const f32, n: usize) -> [__m512; 4] {
        match order {
            DotOrder::TinyBlas => {
                let mut acc = [_mm512_setzero_ps(); 4];
                for c in (0..n).step_by(16) {
                    let qc = _mm512_loadu_ps(q.add(c));
                    for r in 0..4 {
                        acc[r] = _mm512_fmadd_ps(kr.load16(k[r], c), qc, acc[r]);
                    }
                }
                acc
            }
            DotOrder::VecDot => {
                let mut acc = [[_mm512_setzero_ps(); 4]; 4];
                for c in (0..n).step_by(64) {
                    for j in 0..4 {
                        let qc = _mm512_loadu_ps(q.add(c + 16 * j));
                        for r in 0..4 {
                            acc[r][j] = _mm512_fmadd_ps(kr.load16(k[r], c + 16 * j), qc, acc[r][j]);
                        }
                    }
                }
                acc.map(|a| _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3])))
            }
        }
    }

    /// Sixteen `reduce16` trees at once, bit for bit: lane c of
    /// `reduce_halves([fold_pair(x0, x1), .., fold_pair(x14, x15)])` is reduce16(x[c]). Each
    /// level adds the same pairs of partial sums as `reduce16` (upper and lower 256 bits, then
    /// 128, then lanes 0,1 + 2,3, then 0 + 1), one shuffle pair serving two vectors.
    ///
    /// The first level: [a.lo256 + a.hi256, b.lo256 + b.hi256].
    #[inline(always)]
    unsafe fn fold_pair(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xEE>(a, b))
    }

    /// The other levels of `fold_pair`'s trees.
    #[inline(always)]
    unsafe fn reduce_halves(y: &[__m512; 8]) -> __m512 {
        // Level 2: per 128-bit quarter, one vector's 8-lane sum folded to 4 (cells 4q..4q+4).
        let mut z = [_mm512_setzero_ps(); 4];
        for q in 0..4 {
            let (a, b) = (y[2 * q], y[2 * q + 1]);
            z[q] = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xDD>(a, b));
        }
        // Level 3: lanes 0 + 2 and 1 + 3 of each quarter.
        let mut v = [_mm512_setzero_ps(); 2];
        for s in 0..2 {
            let (a, b) = (z[2 * s], z[2 * s + 1]);
            v[s] = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xEE>(a, b));
        }
        // Level 4: lane 0 + lane 1; lane 4k + m now holds vector 4m + k.
        let r = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(v[0], v[1]), _mm512_shuffle_ps::<0xDD>(v[0], v[1]));
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r)
    }

    /// The weighted sums of one token's heads: probabilities of cells j < end, into
    /// acc[qi][set][dv] (lane r of a dot product over cells, set r, sums cells r, r + sets,
    /// ... in cell order). Head qi's probability of cell j is at p[qi * n_kv + j] for the
    /// sparse walk, and set-major, as the V rows, at p[qi * n_kv + p_index(j, sets, n_kv)] for
    /// the dense one, whose walk of a set then reads them in a row.
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

    /// Where cell j's probability is in a head's set-major row of n_kv (a multiple of sets).
    /// (`sets` is 16 or 64: shifts and masks, not divisions.)
    #[inline(always)]
    fn p_index(j: usize, sets: usize, n_kv: usize) -> usize {
        debug_assert!(sets.is_power_of_two());
        let shift = sets.trailing_zeros();
        (j & (sets - 1)) * (n_kv >> shift) + (j >> shift)
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

    /// The weighted sums of several tokens' heads (all the same heads, sets and dimensions).
    ///
    /// With `f32_set` (room for the rows of one set of cells below the largest end) an f16
    /// cache's rows of a set are converted there once for all the tokens and heads.
    #[inline(always)]
    unsafe fn weighted_sums(sums: &[Sums], vr: Rows, f32_set: Option<*mut f32>) {
        match (vr.f16, f32_set) {
            (true, None) => weighted_sums_of::<true, false>(sums, vr, f32_set),
            (true, Some(_)) => weighted_sums_of::<true, true>(sums, vr, f32_set),
            (false, _) => weighted_sums_of::<false, false>(sums, vr, None),
        }
    }

    #[inline(always)]
    unsafe fn weighted_sums_of<const F16: bool, const CONVERT: bool>(sums: &[Sums], vr: Rows, f32_set: Option<*mut f32>) {
        let Some(first) = sums.first() else { return };
        let (nq, sets, dv) = (first.nq, first.sets, first.dv);
        let end = sums.iter().map(|u| u.end).max().unwrap_or(0);
        let in_place = Rows { f16: F16, ..vr };
        let converted = |buf: *mut f32| Rows { p: buf.cast(), stride: 4 * dv, f16: false, layout: Layout::OneSet(sets) };
        // Heads in blocks of up to eight, each cached row read once per block: the blocks'
        // accumulators (heads x 16 NV floats) stay in registers. A set's rows are read for
        // every slice of dimensions and every token while they are in L1 or L2.
        // Two tokens at a time where the heads are few (each value vector loaded then feeds
        // twice the accumulators): the dense walks, which cover the same cells.
        let pairs = nq <= 2 && sums.len() >= 2 && sums.iter().all(|u| matches!(u.cells, Cells::All));
        let mut h0 = 0;
        while h0 < nq {
            let hb = (nq - h0).min(8);
            let nv = if pairs { lanes_per_pair(hb, dv) } else { lanes_per_pass(hb, dv) };
            macro_rules! pass {
                ($(($h:literal, $nv:literal)),*) => {
                    match (hb, nv) {
                        $(($h, $nv) => {
                            for r in 0..sets {
                                let vr = if CONVERT {
                                    let buf = f32_set.expect("CONVERT has a buffer");
                                    for (k, j) in (r..end).step_by(sets).enumerate() {
                                        convert_row(in_place.row(j), dv, buf.add(k * dv));
                                    }
                                    converted(buf)
                                } else {
                                    in_place
                                };
                                for i in (0..dv).step_by(16 * $nv) {
                                    if pairs {
                                        for two in sums.chunks(2) {
                                            match two {
                                                [u0, u1] => set_pass_pair::<$h, $nv>([u0, u1], vr, h0, i, r),
                                                _ => set_pass::<$h, $nv>(&two[0], vr, h0, i, r),
                                            }
                                        }
                                    } else {
                                        for u in sums {
                                            set_pass::<$h, $nv>(u, vr, h0, i, r);
                                        }
                                    }
                                }
                            }
                        })*
                        _ => unreachable!("lanes_per_pass and lanes_per_pair return one of these"),
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

    /// 16-float vectors per row chunk for two tokens of `hb` (1 or 2) heads.
    fn lanes_per_pair(hb: usize, dv: usize) -> usize {
        if hb == 1 && dv % 128 == 0 {
            8
        } else {
            4
        }
    }

    /// `set_pass` of two tokens' dense walks together: each value vector loaded once for both
    /// (the cells both see, then the rest of the longer walk); every accumulator still takes
    /// its cells in order.
    #[inline(always)]
    unsafe fn set_pass_pair<const HB: usize, const NV: usize>(u: [&Sums; 2], vr: Rows, h0: usize, i: usize, r: usize) {
        let (n_kv, sets) = (u[0].n_kv, u[0].sets);
        let p = [u[0].p.add(h0 * n_kv), u[1].p.add(h0 * n_kv)];
        let mut a = [[[_mm512_setzero_ps(); NV]; HB]; 2];
        macro_rules! add {
            ($j:expr, $pi:expr, $tokens:expr) => {{
                let (j, pi): (usize, usize) = ($j, $pi);
                let v = vr.row(j);
                let mut x = [_mm512_setzero_ps(); NV];
                for c in 0..NV {
                    x[c] = vr.load16(v, i + 16 * c);
                }
                for t in $tokens {
                    for h in 0..HB {
                        let pv = _mm512_set1_ps(*p[t].add(h * n_kv + pi));
                        for c in 0..NV {
                            a[t][h][c] = _mm512_fmadd_ps(x[c], pv, a[t][h][c]);
                        }
                    }
                }
            }};
        }
        let (mut j, mut pi) = (r, p_index(r, sets, n_kv));
        let both = u[0].end.min(u[1].end);
        while j < both {
            add!(j, pi, 0..2);
            j += sets;
            pi += 1;
        }
        while j < u[0].end {
            add!(j, pi, 0..1);
            j += sets;
            pi += 1;
        }
        while j < u[1].end {
            add!(j, pi, 1..2);
            j += sets;
            pi += 1;
        }
        for (t, ut) in u.iter().enumerate() {
            for h in 0..HB {
                let base = ut.acc.add(((h0 + h) * sets + r) * ut.dv + i);
                for c in 0..NV {
                    _mm512_storeu_ps(base.add(16 * c), a[t][h][c]);
                }
            }
        }
    }

    /// Dimensions i..i + 16 NV of set r of heads h0..h0 + HB: FMAs in cell order, the
    /// accumulators in registers, each cached row chunk loaded (and converted) once for all
    /// HB heads.
    #[inline(always)]
    unsafe fn set_pass<const HB: usize, const NV: usize>(u: &Sums, vr: Rows, h0: usize, i: usize, r: usize) {
        let p = u.p.add(h0 * u.n_kv);
        let mut a = [[_mm512_setzero_ps(); NV]; HB];
        // A macro, not a closure: the accumulators must stay in registers.
        macro_rules! add {
            ($j:expr, $pi:expr) => {{
                let (j, pi): (usize, usize) = ($j, $pi);
                let v = vr.row(j);
                let mut x = [_mm512_setzero_ps(); NV];
                for c in 0..NV {
                    x[c] = vr.load16(v, i + 16 * c);
                }
                for h in 0..HB {
                    // A zero probability adds exact zeros: the FMA leaves the sum's bits.
                    let pv = _mm512_set1_ps(*p.add(h * u.n_kv + pi));
                    for c in 0..NV {
                        a[h][c] = _mm512_fmadd_ps(x[c], pv, a[h][c]);
                    }
                }
            }};
        }
        match u.cells {
            Cells::All => {
                let (mut j, mut pi) = (r, p_index(r, u.sets, u.n_kv));
                while j < u.end {
                    add!(j, pi);
                    j += u.sets;
                    pi += 1;
                }
            }
            Cells::BySet(by_set, start) => {
                for &j in &by_set[start[r]..start[r + 1]] {
                    add!(j as usize, j as usize);
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

    /// x[i][j] becomes x[j][i].
    #[inline(always)]
    pub(super) unsafe fn transpose16(x: &mut [__m512; 16]) {
        // Pairs of rows interleaved within 128-bit lanes, then pairs of pairs: u[4i + j]
        // holds, in lane L, column 4L + j of rows 4i..4i + 4.
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]);
        }
        let (lo, hi) = (|a: __m512, b: __m512| _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))),
                        |a: __m512, b: __m512| _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))));
        let mut u = [_mm512_setzero_ps(); 16];
        for i in 0..4 {
            let b = 4 * i;
            u[b] = lo(t[b], t[b + 2]);
            u[b + 1] = hi(t[b], t[b + 2]);
            u[b + 2] = lo(t[b + 1], t[b + 3]);
            u[b + 3] = hi(t[b + 1], t[b + 3]);
        }
        // Lanes regrouped: column j, 4 + j, 8 + j, 12 + j from u[j], u[4 + j], u[8 + j], u[12 + j].
        for j in 0..4 {
            let v0 = _mm512_shuffle_f32x4::<0x88>(u[j], u[4 + j]);
            let v1 = _mm512_shuffle_f32x4::<0x88>(u[8 + j], u[12 + j]);
            let v2 = _mm512_shuffle_f32x4::<0xDD>(u[j], u[4 + j]);
            let v3 = _mm512_shuffle_f32x4::<0xDD>(u[8 + j], u[12 + j]);
            x[j] = _mm512_shuffle_f32x4::<0x88>(v0, v1);
            x[8 + j] = _mm512_shuffle_f32x4::<0xDD>(v0, v1);
            x[4 + j] = _mm512_shuffle_f32x4::<0x88>(v2, v3);
            x[12 + j] = _mm512_shuffle_f32x4::<0xDD>(v2, v3);
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

    /// ggml_soft_max of the n scores in w (overwritten), probabilities (rounded to f16 when
    /// `as_f16`) into p: at j, or at p_index(j, sets, n) for `Some(sets)`; false (and zeros)
    /// when every cell is masked.
    #[inline(always)]
    unsafe fn softmax(w: *mut f32, n: usize, as_f16: bool, layout: Option<usize>, p: *mut f32) -> bool {
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        for c in (0..n).step_by(16) {
            m = _mm512_max_ps(m, _mm512_loadu_ps(w.add(c)));
        }
        let max = _mm512_reduce_max_ps(m);
        if max == f32::NEG_INFINITY {
            for c in (0..n).step_by(16) {
                _mm512_storeu_ps(p.add(c), _mm512_setzero_ps());
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
        let prob = |c: usize| {
            let x = _mm512_mul_ps(_mm512_loadu_ps(w.add(c)), inv);
            if as_f16 { _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)) } else { x }
        };
        let Some(sets) = layout else {
            for c in (0..n).step_by(16) {
                _mm512_storeu_ps(p.add(c), prob(c));
            }
            return true;
        };
        // Set-major: cells c..c + 16 (c a multiple of 16, as sets is) are sets c % sets ..
        // + 16 of step c / sets. Sixteen steps of sixteen sets are one 16 x 16 transpose.
        let per_set = n / sets;
        let whole = per_set / 16 * 16;
        for k0 in (0..whole).step_by(16) {
            for g in (0..sets).step_by(16) {
                let mut x: [__m512; 16] = std::array::from_fn(|i| prob((k0 + i) * sets + g));
                transpose16(&mut x);
                for (r, xr) in x.iter().enumerate() {
                    _mm512_storeu_ps(p.add((g + r) * per_set + k0), *xr);
                }
            }
        }
        let mut lanes = [0f32; 16];
        for c in (whole * sets..n).step_by(16) {
            _mm512_storeu_ps(lanes.as_mut_ptr(), prob(c));
            let at = p.add(p_index(c, sets, n));
            for (l, &v) in lanes.iter().enumerate() {
                *at.add(l * per_set) = v;
            }
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
    fn transpose16_transposes() {
        if active_isa() != Isa::Avx512 {
            return;
        }
        #[target_feature(enable = "avx512f")]
        unsafe fn run() {
            use std::arch::x86_64::*;
            let mut x: [__m512; 16] = std::array::from_fn(|i| {
                let row: [f32; 16] = std::array::from_fn(|j| (16 * i + j) as f32);
                _mm512_loadu_ps(row.as_ptr())
            });
            super::x86::transpose16(&mut x);
            for (i, xi) in x.iter().enumerate() {
                let mut row = [0f32; 16];
                _mm512_storeu_ps(row.as_mut_ptr(), *xi);
                let want: [f32; 16] = std::array::from_fn(|j| (16 * j + i) as f32);
                assert_eq!(row, want, "row {i}");
            }
        }
        // SAFETY: AVX-512 checked above.
        unsafe { run() }
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
    fn values_read_in_place_from_the_keys_equal_a_set_major_copy() {
        // A latent cache: one KV head, each cell's value the leading 64 of its 128 key values
        // (v_cols 0: rows in cell order), against the same values in a set-major V cache.
        if active_isa() != Isa::Avx512 {
            return;
        }
        let mut rng = Lcg(5);
        let (dk, dv, n_kv, nq, nt) = (128, 64, 192, 4, 2);
        for ty in [GgmlType::F32, GgmlType::F16] {
            let es = if ty == GgmlType::F16 { 2 } else { 4 };
            let kvals: Vec<f32> = (0..n_kv * dk).map(|_| rng.next()).collect();
            let cols = v_cols(n_kv);
            let mut vvals = vec![0f32; V_SETS * cols * dv];
            for j in 0..n_kv {
                vvals[v_row(j, cols) * dv..(v_row(j, cols) + 1) * dv].copy_from_slice(&kvals[j * dk..j * dk + dv]);
            }
            let (k, v) = (cache(ty, &kvals), cache(ty, &vvals));
            let q: Vec<f32> = (0..nt * nq * dk).map(|_| rng.next()).collect();
            let mask: Vec<f32> = (0..nt * n_kv).map(|i| if i % n_kv > 150 + i / n_kv { f32::NEG_INFINITY } else { 0.0 }).collect();
            let heads = |v: &'static [u8], v_stride: usize, v_cols: usize, order: DotOrder| Heads {
                k_type: ty, v_type: ty, k: leak(&k), k_stride: dk * es, k_offset: 0, v, v_stride, v_offset: 0, v_cols,
                head_dim_k: dk, head_dim_v: dv, n_kv, q: leak(&q), q_stride: nq * dk, n_q: nq, n_t: nt, mask: leak(&mask),
                mask_stride: n_kv, out_stride: nq * dv, scale: 0.1, order_kq: order, order_vp: order,
            };
            for order in [DotOrder::VecDot, DotOrder::TinyBlas] {
                let (in_place, set_major) = (heads(leak(&k), dk * es, 0, order), heads(leak(&v), dv * es, cols, order));
                assert!(in_place.supported() && set_major.supported());
                let mut s = AttnScratch::default();
                let (mut a, mut b, mut c) = (vec![0f32; nt * nq * dv], vec![1f32; nt * nq * dv], vec![2f32; nt * nq * dv]);
                attend(&in_place, &mut a, &mut s);
                attend(&set_major, &mut b, &mut s);
                attend_reference(&in_place, &mut c, &mut s);
                assert!(a.iter().zip(&b).chain(a.iter().zip(&c)).all(|(x, y)| x.to_bits() == y.to_bits()), "{ty} {order:?}");
            }
        }
    }

    fn leak<T: Clone>(x: &[T]) -> &'static [T] {
        Box::leak(x.to_vec().into_boxed_slice())
    }

    #[test]
    fn kernel_equals_the_reference_bit_for_bit() {
        if active_isa() != Isa::Avx512 {
            eprintln!("no AVX-512: attend is not used on this CPU");
            return;
        }
        let mut rng = Lcg(3);
        for (kt, vt) in [(GgmlType::F16, GgmlType::F16), (GgmlType::F32, GgmlType::F32), (GgmlType::F16, GgmlType::F32)] {
            for (dk, dv, n_kv, nq) in [(64, 64, 1088, 7), (64, 64, 256, 7), (256, 256, 128, 4), (128, 64, 64, 1), (128, 128, 64, 2), (64, 64, 128, 5), (64, 128, 64, 9), (64, 256, 64, 1)] {
                for ((okq, ovp), sparse) in [(DotOrder::VecDot, DotOrder::VecDot), (DotOrder::TinyBlas, DotOrder::TinyBlas)]
                    .into_iter()
                    .flat_map(|o| [(o, false), (o, true)])
                {
                    let n_head_kv = 2;
                    let kvals: Vec<f32> = (0..n_kv * n_head_kv * dk).map(|_| rng.next()).collect();
                    // A cache with more cells than the call attends to (one more row per set).
                    let v_cols = n_kv / V_SETS + 1;
                    let vvals: Vec<f32> = (0..V_SETS * v_cols * n_head_kv * dv).map(|_| rng.next()).collect();
                    let (k, v) = (cache(kt, &kvals), cache(vt, &vvals));
                    let es = |t: GgmlType| if t == GgmlType::F16 { 2 } else { 4 };
                    // One token per micro-batch needs no more; 18 exercise the tokens computed
                    // together (and a block of them with a sparse one among dense ones).
                    let nt = if okq == DotOrder::VecDot { 3 } else { 18 };
                    let q: Vec<f32> = (0..nt * nq * dk).map(|_| rng.next()).collect();
                    // A causal-like mask per token, with holes; token 2 sees nothing. With
                    // `sparse`, tokens 1, 5, 9.. see one cell in eight (sequences interleaved in
                    // the cache), which takes the kernel's sparse path.
                    let mask: Vec<f32> = (0..nt * n_kv)
                        .map(|i| {
                            let (t, j) = (i / n_kv, i % n_kv);
                            let last = n_kv - 9 - (7 * t) % (n_kv / 2);
                            let hidden = t == 2 || j % 5 == 3 || j > last || (sparse && t % 4 == 1 && j % 8 != 5);
                            if hidden { f32::NEG_INFINITY } else { 0.0 }
                        })
                        .collect();
                    let h = Heads {
                        k_type: kt, v_type: vt, k: &k, k_stride: n_head_kv * dk * es(kt), k_offset: dk * es(kt),
                        v: &v, v_stride: n_head_kv * dv * es(vt), v_offset: dv * es(vt), v_cols, head_dim_k: dk, head_dim_v: dv,
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
