//! The AVX2 kernel of `attend_raw`: the arithmetic of `query_spec`, vectorized.
//!
//! Scores: the keys are read eight cells at a time, one of ggml's four accumulator chains at
//! a time for a tile of queries x keys (`dot8_tile`), and each query's eight dot products are
//! reduced together by one transpose-like tree (the same adds as eight GGML_F32x8_REDUCE);
//! the same cells' value rows are prefetched meanwhile. Weighted sums: eight lanes are eight output
//! dimensions; each of the 32 lanes of ggml's accumulators (cells j with the same j % 32) is a
//! chain of multiply-adds walked in cell order, for up to eight queries at once (each value
//! row read once per group of queries), its rows two sequential streams of the set-major cache.

use std::arch::x86_64::*;

use super::{grow, Avx2Scratch, MAX_TOKENS, STEP};
use crate::attn::{v_row, Heads};
use crate::GgmlType;

/// Queries whose weighted sums are accumulated together (their accumulators stay in registers).
const GROUP: usize = 8;

/// Cells of one lane walked per pass over the output dimensions (their rows stay in L1).
const BLOCK: usize = 32;

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn attend(h: &Heads, out: *mut f32, s: &mut Avx2Scratch) {
    let (dk, n_kv, nq, nt) = (h.head_dim_k, h.n_kv, h.n_q, h.n_t);
    // One past the last cell visible to each token, and to any.
    let mut ends = [0usize; MAX_TOKENS];
    for (t, e) in ends.iter_mut().enumerate().take(nt) {
        let m = &h.mask[t * h.mask_stride..t * h.mask_stride + n_kv];
        *e = m.iter().rposition(|&v| v != f32::NEG_INFINITY).map_or(0, |j| j + 1);
    }
    let end_any = ends[..nt].iter().copied().max().unwrap_or(0);
    // Every cell below end_any visible (one sequence): no lists, the cells are 0..end_any.
    let dense = visible_cells(h, end_any, s);
    let q = grow(&mut s.q, nt * nq * dk);
    queries(h, q);
    let w = grow(&mut s.w, nt * nq * n_kv);
    let kbuf = grow(&mut s.k, 8 * dk);
    if dense || s.cells.len() >= end_any - end_any / 8 {
        scores(h, q, end_any, w, kbuf);
    } else {
        sparse_scores(h, q, end_any, &s.cells, w, kbuf);
    }
    // The queries with a visible cell, grouped by GROUP; the others output zeros.
    s.live.clear();
    for qq in 0..nt * nq {
        let t = qq / nq;
        let o = out.add(t * h.out_stride + (qq % nq) * h.head_dim_v);
        if softmax(w.add(qq * n_kv), n_kv, ends[t], end_any, h.v_type == GgmlType::F16) {
            s.live.push(qq as u16);
        } else {
            std::ptr::write_bytes(o, 0, h.head_dim_v);
        }
    }
    for g in s.live.chunks(GROUP) {
        let walk_end = g.iter().map(|&qq| ends[qq as usize / nq]).max().unwrap_or(0);
        let sets = grow(&mut s.sets, STEP * lane_floats(g.len(), h.head_dim_v));
        let lanes = if dense { None } else { Some((&s.lane_cells[..], &s.lane_start[..])) };
        let u = Group { h, w, queries: g, walk_end, sets, out, lanes };
        match g.len() {
            1 => u.run::<1>(),
            2 => u.run::<2>(),
            3 => u.run::<3>(),
            4 => u.run::<4>(),
            5 => u.run::<5>(),
            6 => u.run::<6>(),
            7 => u.run::<7>(),
            _ => u.run::<8>(),
        }
    }
}

/// True when every cell below `end_any` is seen by some token of the call; otherwise those
/// that are (ascending, `s.cells`), and the same bucketed by lane of ggml's V·P
/// accumulators (`s.lane_cells`, `s.lane_start`).
/// Cells no token sees have probability zero for every query: leaving them out of the
/// weighted sums changes no bit (a multiply-add of a finite value by zero returns the
/// accumulator, which is never -0), and their scores are -inf however computed. With several
/// sequences in one cache each token sees a fraction of the cells.
#[inline(always)]
unsafe fn visible_cells(h: &Heads, end_any: usize, s: &mut Avx2Scratch) -> bool {
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    // Bit c of seen8(j0): cell j0 + c is seen by some token.
    let seen8 = |j0: usize| {
        let mut seen = 0;
        for t in 0..h.n_t {
            let m = _mm256_loadu_ps(h.mask.as_ptr().add(t * h.mask_stride + j0));
            seen |= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NEQ_OQ>(m, neg_inf));
        }
        seen as u32
    };
    let seen1 = |j: usize| (0..h.n_t).any(|t| *h.mask.get_unchecked(t * h.mask_stride + j) != f32::NEG_INFINITY);
    let whole = end_any - end_any % 8;
    // First only count: a call of one sequence sees every cell, and needs no lists.
    let visible = (0..whole).step_by(8).map(|j0| seen8(j0).count_ones() as usize).sum::<usize>() + (whole..end_any).filter(|&j| seen1(j)).count();
    if visible == end_any {
        return true;
    }
    s.cells.clear();
    for j0 in (0..whole).step_by(8) {
        let mut bits = seen8(j0);
        while bits != 0 {
            s.cells.push((j0 + bits.trailing_zeros() as usize) as u32);
            bits &= bits - 1;
        }
    }
    s.cells.extend((whole..end_any).filter(|&j| seen1(j)).map(|j| j as u32));
    let mut counts = [0usize; STEP];
    for &j in &s.cells {
        counts[j as usize % STEP] += 1;
    }
    s.lane_start.resize(STEP + 1, 0);
    for r in 0..STEP {
        s.lane_start[r + 1] = s.lane_start[r] + counts[r];
    }
    s.lane_cells.resize(s.cells.len(), 0);
    let mut next: [usize; STEP] = std::array::from_fn(|r| s.lane_start[r]);
    for &j in &s.cells {
        let r = j as usize % STEP;
        s.lane_cells[next[r]] = j;
        next[r] += 1;
    }
    false
}

/// Each query (token-major, then head) into `q`, rounded to f16 for an F16 K cache.
#[inline(always)]
unsafe fn queries(h: &Heads, q: *mut f32) {
    let dk = h.head_dim_k;
    for t in 0..h.n_t {
        for i in 0..h.n_q {
            let src = h.q.as_ptr().add(t * h.q_stride + i * dk);
            let dst = q.add((t * h.n_q + i) * dk);
            for d in (0..dk).step_by(8) {
                let x = _mm256_loadu_ps(src.add(d));
                let x = if h.k_type == GgmlType::F16 { round_f16(x) } else { x };
                _mm256_storeu_ps(dst.add(d), x);
            }
        }
    }
}

#[inline(always)]
unsafe fn round_f16(x: __m256) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

/// Eight values of a cached row (f16 or f32) from element i, as f32.
#[inline(always)]
unsafe fn load8<const F16: bool>(row: *const u8, i: usize) -> __m256 {
    if F16 {
        _mm256_cvtph_ps(_mm_loadu_si128(row.add(2 * i) as *const __m128i))
    } else {
        _mm256_loadu_ps((row as *const f32).add(i))
    }
}

/// Runs `$body` for each of the `$n` queries at `$q` (`$dk` floats apart) with `$qq` its index
/// and `$d` its eight dot products with the key rows `$rows`, computed a tile of queries at a
/// time (`KeyRows::dots`). A macro, not a closure: a closure would not inherit the caller's
/// target features, and its intrinsics would become calls.
macro_rules! each_query_dots {
    ($rows:expr, $q:expr, $n:expr, $dk:expr, |$qq:ident, $d:ident| $body:block) => {{
        let mut q0 = 0;
        while q0 < $n {
            let (tile, dots) = $rows.dots($q.add(q0 * $dk), $n - q0, $dk);
            for ($qq, $d) in (q0..q0 + tile).zip(dots) $body
            q0 += tile;
        }
    }};
}

/// w[qq][j] = scale * K_j · q_qq + mask[j] for cells j of the blocks of eight below
/// `end_any` (later cells are never read): each key converted once for all queries.
#[inline(always)]
unsafe fn scores(h: &Heads, q: *const f32, end_any: usize, w: *mut f32, kbuf: *mut f32) {
    let (dk, n_kv) = (h.head_dim_k, h.n_kv);
    let scale = _mm256_set1_ps(h.scale);
    for c0 in (0..end_any).step_by(8) {
        let n = (n_kv - c0).min(8);
        // A short last block repeats its last cell (those scores are not stored).
        let rows = key_rows(h, |c| c0 + c.min(n - 1), kbuf);
        prefetch_values::<_MM_HINT_T1>(h, c0..c0 + n);
        each_query_dots!(rows, q, h.n_t * h.n_q, dk, |qq, d| {
            let kq = _mm256_mul_ps(d, scale);
            let m = h.mask.as_ptr().add((qq / h.n_q) * h.mask_stride + c0);
            let wr = w.add(qq * n_kv + c0);
            if n == 8 {
                _mm256_storeu_ps(wr, _mm256_add_ps(kq, _mm256_loadu_ps(m)));
            } else {
                let mut x = [0f32; 8];
                _mm256_storeu_ps(x.as_mut_ptr(), kq);
                for c in 0..n {
                    *wr.add(c) = x[c] + *m.add(c);
                }
            }
        });
    }
}

/// The keys of cells cell(0..8) as rows `dot8` reads: an F16 cache's converted into `kbuf`
/// (once for every query of the call) when more than `RAW_QUERIES` queries share them,
/// otherwise read as f16 where they lie (true: converting costs a store per eight values,
/// more than converting again for each of a few queries); an F32 cache's in place.
#[inline(always)]
unsafe fn key_rows(h: &Heads, cell: impl Fn(usize) -> usize, kbuf: *mut f32) -> KeyRows {
    let dk = h.head_dim_k;
    let kbase = h.k.as_ptr().add(h.k_offset);
    let raw_f16 = h.k_type == GgmlType::F16 && h.n_t * h.n_q <= RAW_QUERIES;
    // A loop, not `array::from_fn`: a closure does not inherit the caller's target features,
    // and its intrinsics became calls (two function calls per eight values).
    let mut rows = [std::ptr::null::<u8>(); 8];
    for (c, row) in rows.iter_mut().enumerate() {
        let src = kbase.add(cell(c) * h.k_stride);
        *row = if h.k_type == GgmlType::F16 && !raw_f16 {
            let dst = kbuf.add(c * dk);
            for i in (0..dk).step_by(8) {
                _mm256_storeu_ps(dst.add(i), load8::<true>(src, i));
            }
            dst as *const u8
        } else {
            src
        };
    }
    KeyRows { rows, f16: raw_f16 }
}

/// Queries of a call up to which `key_rows` leaves F16 keys unconverted.
const RAW_QUERIES: usize = 4;

/// Eight key rows from `key_rows`: f16 (`f16`) or f32.
struct KeyRows {
    rows: [*const u8; 8],
    f16: bool,
}

impl KeyRows {
    /// The eight dot products with each of the first queries of the `left` at q (dk floats
    /// apart): how many it took (4, 2 or 1) and theirs (`dot8_tile`), the rest zeros.
    #[inline(always)]
    unsafe fn dots(&self, q: *const f32, left: usize, dk: usize) -> (usize, [__m256; 4]) {
        macro_rules! tile {
            ($nq:expr, $nk:expr) => {{
                let d = if self.f16 { dot8_tile::<true, $nq, $nk>(&self.rows, q, dk) } else { dot8_tile::<false, $nq, $nk>(&self.rows, q, dk) };
                let mut out = [_mm256_setzero_ps(); 4];
                out[..$nq].copy_from_slice(&d);
                ($nq, out)
            }};
        }
        match left {
            4.. => tile!(4, 2),
            2 | 3 => tile!(2, 4),
            _ => tile!(1, 8),
        }
    }
}

/// `scores` for the cells in `cells` only (eight at a time, any eight: each lane of `dot8`
/// is its own dot product), every other score of the first `end_any` cells -inf.
#[inline(always)]
unsafe fn sparse_scores(h: &Heads, q: *const f32, end_any: usize, cells: &[u32], w: *mut f32, kbuf: *mut f32) {
    let (dk, n_kv) = (h.head_dim_k, h.n_kv);
    let scale = _mm256_set1_ps(h.scale);
    for qq in 0..h.n_t * h.n_q {
        std::slice::from_raw_parts_mut(w.add(qq * n_kv), end_any.next_multiple_of(8).min(n_kv)).fill(f32::NEG_INFINITY);
    }
    for group in cells.chunks(8) {
        let n = group.len();
        let rows = key_rows(h, |c| group[c.min(n - 1)] as usize, kbuf);
        prefetch_values::<_MM_HINT_T1>(h, group.iter().map(|&j| j as usize));
        each_query_dots!(rows, q, h.n_t * h.n_q, dk, |qq, d| {
            let mut x = [0f32; 8];
            _mm256_storeu_ps(x.as_mut_ptr(), _mm256_mul_ps(d, scale));
            let m = h.mask.as_ptr().add((qq / h.n_q) * h.mask_stride);
            let wr = w.add(qq * n_kv);
            for (c, &j) in group.iter().enumerate() {
                *wr.add(j as usize) = x[c] + *m.add(j as usize);
            }
        });
    }
}

/// For each of the NQ queries at q (dk floats apart), the eight dot products rows[c] · q_i
/// (ggml_vec_dot's order), lane c; rows of f16 (F16) or f32.
///
/// ggml's four accumulators of a dot product are four independent chains (accumulator j
/// takes terms 32s + 8j .. 32s + 8j + 8 in step order), so one chain at a time is computed
/// for NQ queries x NK keys (8 accumulators: enough independent multiply-adds to hide their
/// latency): each query chunk loaded serves NK keys and each key chunk converted serves NQ
/// queries. (A dot product at a time, with its four accumulators, loaded a query chunk and a
/// key chunk for every multiply-add: the scores were bound by loads.)
#[inline(always)]
unsafe fn dot8_tile<const F16: bool, const NQ: usize, const NK: usize>(rows: &[*const u8; 8], q: *const f32, dk: usize) -> [__m256; NQ] {
    // chains[i][c][j]: accumulator j of query i and key c, each written once below before
    // it is read (left uninitialized: zeroing these 4 KiB was a memset per block of keys).
    let mut chains = [[[std::mem::MaybeUninit::<__m256>::uninit(); 4]; 8]; NQ];
    for k0 in (0..8).step_by(NK) {
        for j in 0..4 {
            let mut acc = [[_mm256_setzero_ps(); NK]; NQ];
            for step in (0..dk).step_by(STEP) {
                let o = step + 8 * j;
                let mut qv = [_mm256_setzero_ps(); NQ];
                for (i, v) in qv.iter_mut().enumerate() {
                    *v = _mm256_loadu_ps(q.add(i * dk + o));
                }
                for kk in 0..NK {
                    let kv = load8::<F16>(rows[k0 + kk], o);
                    for i in 0..NQ {
                        acc[i][kk] = _mm256_fmadd_ps(kv, qv[i], acc[i][kk]);
                    }
                }
            }
            for i in 0..NQ {
                for kk in 0..NK {
                    chains[i][k0 + kk][j].write(acc[i][kk]);
                }
            }
        }
    }
    let mut out = [_mm256_setzero_ps(); NQ];
    for (o, ch) in out.iter_mut().zip(&chains) {
        let mut a = [_mm256_setzero_ps(); 8];
        for (ac, c) in a.iter_mut().zip(ch) {
            // SAFETY: every chain of every key was written above.
            let c = c.map(|v| v.assume_init());
            *ac = _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]));
        }
        *o = reduce8(&a);
    }
    out
}

/// Lane c = GGML_F32x8_REDUCE's last steps on a[c]: (t0 + t1) + (t2 + t3) where
/// t_l = a[l] + a[l + 4]; the eight trees share their shuffles.
#[inline(always)]
unsafe fn reduce8(a: &[__m256; 8]) -> __m256 {
    // w[c] = [t of a[c] | t of a[c + 4]].
    let w: [__m256; 4] = std::array::from_fn(|c| {
        _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a[c], a[c + 4]), _mm256_permute2f128_ps::<0x31>(a[c], a[c + 4]))
    });
    // hadd: [t0 + t1, t2 + t3] of both operands per half, then the pairs of those.
    _mm256_hadd_ps(_mm256_hadd_ps(w[0], w[1]), _mm256_hadd_ps(w[2], w[3]))
}

/// ggml_v_expf (AVX2).
#[inline(always)]
pub(crate) unsafe fn expf8(x: __m256) -> __m256 {
    macro_rules! c {
        ($b:expr) => {
            _mm256_set1_ps(f32::from_bits($b))
        };
    }
    let r = c!(0x4b40_0000);
    let z = _mm256_fmadd_ps(x, c!(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(n, c!(0x35bf_be8e), _mm256_fnmadd_ps(n, c!(0x3f31_7200), x));
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0))));
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let cm = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(c!(0x3c07_2010), b, c!(0x3d2b_9f17)), u, _mm256_fmadd_ps(c!(0x3e2a_af33), b, c!(0x3eff_fedb))),
        u,
        _mm256_mul_ps(c!(0x3f7f_fff6), b),
    );
    if _mm256_movemask_ps(cm) == 0 {
        return _mm256_fmadd_ps(j, k, k);
    }
    let g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())), _mm256_set1_epi32(0x8200_0000u32 as i32));
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let d = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    let inner = _mm256_or_ps(_mm256_and_ps(cm, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)), _mm256_andnot_ps(cm, _mm256_fmadd_ps(k, j, k)));
    _mm256_or_ps(_mm256_and_ps(d, _mm256_mul_ps(s1, s1)), _mm256_andnot_ps(d, inner))
}

/// ggml_vec_soft_max_f32's sum of one chunk: halves, movehl, movehdup.
#[inline(always)]
unsafe fn chunk_sum8(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)))
}

/// `softmax_spec` over one row of n scores whose cells from `end` on are -inf, writing the
/// probabilities of cells below `zero_to` (zeros past `end`); false when nothing is visible.
#[inline(always)]
unsafe fn softmax(w: *mut f32, n: usize, end: usize, zero_to: usize, as_f16: bool) -> bool {
    let n8 = n - n % 8;
    // Chunks past `end` are all -inf: their exponentials and sums are zeros.
    let lim8 = end.next_multiple_of(8).min(n8);
    let mut maxv = _mm256_set1_ps(f32::NEG_INFINITY);
    for i in (0..lim8).step_by(8) {
        maxv = _mm256_max_ps(maxv, _mm256_loadu_ps(w.add(i)));
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), maxv);
    let tail = lim8.max(n8)..end.max(n8);
    let max = (tail.clone()).fold(lanes.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)), |m, j| m.max(*w.add(j)));
    if max == f32::NEG_INFINITY {
        return false;
    }
    let mut sum = 0f64;
    let mv = _mm256_set1_ps(max);
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    for i in (0..lim8).step_by(8) {
        let v = _mm256_loadu_ps(w.add(i));
        // A chunk of masked cells only (another sequence's, with several in one cache):
        // its exponentials are zeros and adding their +0 sum changes nothing, but
        // `expf8` would take its slow out-of-range path for them.
        let masked = _mm256_cmp_ps::<_CMP_EQ_OQ>(v, neg_inf);
        if _mm256_movemask_ps(masked) == 0xff {
            _mm256_storeu_ps(w.add(i), _mm256_setzero_ps());
            continue;
        }
        // The masked cells of a chunk with visible ones (a sequence's cell among other
        // sequences' decoded in turns) also push `expf8` to that path; its lanes are
        // independent, so it gets 0 there instead and their +0 exponentials are put back.
        let arg = _mm256_blendv_ps(_mm256_sub_ps(v, mv), _mm256_setzero_ps(), masked);
        let e = _mm256_andnot_ps(masked, expf8(arg));
        _mm256_storeu_ps(w.add(i), e);
        sum += chunk_sum8(e) as f64;
    }
    for j in tail.clone() {
        let e = (*w.add(j) - max).exp();
        *w.add(j) = e;
        sum += e as f64;
    }
    let inv = (1.0 / sum) as f32;
    let iv = _mm256_set1_ps(inv);
    for i in (0..lim8).step_by(8) {
        let p = _mm256_mul_ps(_mm256_loadu_ps(w.add(i)), iv);
        _mm256_storeu_ps(w.add(i), if as_f16 { round_f16(p) } else { p });
    }
    for j in tail.clone() {
        let p = *w.add(j) * inv;
        *w.add(j) = if as_f16 { crate::util::f16_to_f32(crate::util::f32_to_f16(p)) } else { p };
    }
    let done = if end > n8 { end } else { lim8 };
    for j in done..zero_to {
        *w.add(j) = 0.0;
    }
    true
}

/// The weighted sums of a group of queries (indices token * n_q + head), whose
/// probabilities are zero from `walk_end` on.
struct Group<'a, 'b> {
    h: &'a Heads<'b>,
    w: *const f32,
    queries: &'a [u16],
    walk_end: usize,
    /// STEP lanes of `lane_floats` floats (queries x head_dim_v, then padding).
    sets: *mut f32,
    out: *mut f32,
    /// The visible cells by lane and where each lane's start (see `visible_cells`); None
    /// when every cell below `walk_end` may be visible.
    lanes: Option<(&'a [u32], &'a [usize])>,
}

impl Group<'_, '_> {
    #[inline(always)]
    unsafe fn run<const N: usize>(&self) {
        if self.h.v_type == GgmlType::F16 {
            self.lanes::<N, true>(self.lanes);
        } else {
            self.lanes::<N, false>(self.lanes);
        }
        self.reduce::<N>();
        if self.walk_end > self.vector_end() {
            self.tail();
        }
    }

    /// The cells ggml's vector loop covers (whole steps of 32).
    fn vector_end(&self) -> usize {
        self.h.n_kv - self.h.n_kv % STEP
    }

    /// Where lane r of query k's dimensions dc..dc + 8 lives in `sets`: [lane][query][dim],
    /// so that one lane's pass writes one contiguous stretch (the layout with each (query,
    /// dimensions)'s lanes contiguous put a pass's stores 4 KiB apart, in one L1 set: 2-3%
    /// slower decoding at depth 4096).
    #[inline(always)]
    fn set_at(&self, r: usize, k: usize, dc: usize) -> *mut f32 {
        self.sets.wrapping_add(r * lane_floats(self.queries.len(), self.h.head_dim_v) + k * self.h.head_dim_v + dc)
    }
    fn out_row(&self, k: usize) -> *mut f32 {
        let (qq, nq) = (self.queries[k] as usize, self.h.n_q);
        self.out.wrapping_add((qq / nq) * self.h.out_stride + (qq % nq) * self.h.head_dim_v)
    }

    /// Lane r of query k = the chain of multiply-adds of the visible cells r, r + 32, ...
    /// below the vector loop's end (in order).
    #[inline(always)]
    unsafe fn lanes<const N: usize, const F16: bool>(&self, lists: Option<(&[u32], &[usize])>) {
        match lists {
            Some((cells, start)) => self.lanes_of::<N, F16>(|r| {
                let all = &cells[start[r]..start[r + 1]];
                let lim = self.walk_end.min(self.vector_end());
                all[..all.partition_point(|&j| (j as usize) < lim)].len()
            }, |r, i| cells[start[r] + i] as usize),
            None => {
                let lim = self.walk_end.min(self.vector_end());
                self.lanes_of::<N, F16>(|r| if r < lim { (lim - r).div_ceil(STEP) } else { 0 }, |r, i| r + STEP * i)
            }
        }
    }

    /// `lanes` over the cells cell(r, i), i < count(r), of each lane r.
    #[inline(always)]
    unsafe fn lanes_of<const N: usize, const F16: bool>(&self, count: impl Fn(usize) -> usize, cell: impl Fn(usize, usize) -> usize) {
        let (h, dv) = (self.h, self.h.head_dim_v);
        let vbase = h.v.as_ptr().add(h.v_offset);
        let p: [*const f32; N] = std::array::from_fn(|k| self.w.add(self.queries[k] as usize * h.n_kv));
        for r in 0..STEP {
            let n = count(r);
            if n == 0 {
                for k in 0..N {
                    for dc in (0..dv).step_by(8) {
                        _mm256_storeu_ps(self.set_at(r, k, dc), _mm256_setzero_ps());
                    }
                }
                continue;
            }
            for s0 in (0..n).step_by(BLOCK) {
                let s1 = (s0 + BLOCK).min(n);
                // The next block's rows, while this one is summed: the walk is latency bound
                // otherwise (each pass over the dimensions reads a sixteen-byte piece per row).
                if s1 < n {
                    prefetch_values::<_MM_HINT_T0>(h, (s1..(s1 + BLOCK).min(n)).map(|i| cell(r, i)));
                } else if r + 1 < STEP {
                    prefetch_values::<_MM_HINT_T0>(h, (0..BLOCK.min(count(r + 1))).map(|i| cell(r + 1, i)));
                }
                // The block's value rows and probabilities, gathered once for all the passes
                // over the dimensions (each pass recomputed every row's address from its
                // cell, a chain of two multiplies ahead of every load).
                let mut rows = [std::ptr::null::<u8>(); BLOCK];
                let mut probs = [[0f32; N]; BLOCK];
                for i in s0..s1 {
                    let j = cell(r, i);
                    rows[i - s0] = vbase.add(v_row(j, h.v_cols) * h.v_stride);
                    probs[i - s0] = std::array::from_fn(|k| *p[k].add(j));
                }
                let (rows, probs) = (&rows[..s1 - s0], &probs[..s1 - s0]);
                // Sixteen dimensions a pass when the accumulators fit the registers: twice
                // the independent multiply-add chains over the block's few rows.
                let mut dc = 0;
                if N <= 4 {
                    while dc + 16 <= dv {
                        self.block_pass::<N, 2, F16>(r, s0 > 0, dc, rows, probs);
                        dc += 16;
                    }
                }
                while dc < dv {
                    self.block_pass::<N, 1, F16>(r, s0 > 0, dc, rows, probs);
                    dc += 8;
                }
            }
        }
    }

    /// Dimensions dc..dc + 8 C of lane r over one block of cells (their value rows and the
    /// queries' probabilities), continuing the sums in `sets` when `continued`.
    #[inline(always)]
    unsafe fn block_pass<const N: usize, const C: usize, const F16: bool>(&self, r: usize, continued: bool, dc: usize, rows: &[*const u8], probs: &[[f32; N]]) {
        let mut acc = [[_mm256_setzero_ps(); N]; C];
        if continued {
            for (c, acc_c) in acc.iter_mut().enumerate() {
                for (k, a) in acc_c.iter_mut().enumerate() {
                    *a = _mm256_loadu_ps(self.set_at(r, k, dc + 8 * c));
                }
            }
        }
        for (row, pr) in rows.iter().zip(probs) {
            let v: [__m256; C] = std::array::from_fn(|c| load8::<F16>(*row, dc + 8 * c));
            for k in 0..N {
                let pk = _mm256_broadcast_ss(&pr[k]);
                for c in 0..C {
                    acc[c][k] = _mm256_fmadd_ps(v[c], pk, acc[c][k]);
                }
            }
        }
        for (c, acc_c) in acc.iter().enumerate() {
            for (k, a) in acc_c.iter().enumerate() {
                _mm256_storeu_ps(self.set_at(r, k, dc + 8 * c), *a);
            }
        }
    }

    /// GGML_F32x8_REDUCE of each output dimension's 32 lanes, eight dimensions at a time.
    #[inline(always)]
    unsafe fn reduce<const N: usize>(&self) {
        let dv = self.h.head_dim_v;
        // Lane r of some dimensions is `stride` floats after lane r - 1.
        let stride = lane_floats(N, dv);
        for k in 0..N {
            let o = self.out_row(k);
            for dc in (0..dv).step_by(8) {
                // Lanes i, 8 + i, 16 + i and 24 + i through four pointers walked one lane at
                // a time, each step hidden from LLVM: it otherwise computes all 32 lane
                // addresses once for the whole loop, spills them and reloads one per load
                // (the reduce was a third of `attend` with eight sequences).
                let mut p: [*const f32; 4] = std::array::from_fn(|g| self.set_at(8 * g, k, dc) as *const f32);
                let mut a = [_mm256_setzero_ps(); 8];
                for ai in a.iter_mut() {
                    let l = |g: usize| _mm256_loadu_ps(p[g]);
                    *ai = _mm256_add_ps(_mm256_add_ps(l(0), l(2)), _mm256_add_ps(l(1), l(3)));
                    for pg in p.iter_mut() {
                        *pg = opaque(pg.add(stride));
                    }
                }
                let t: [__m256; 4] = std::array::from_fn(|i| _mm256_add_ps(a[i], a[i + 4]));
                _mm256_storeu_ps(o.add(dc), _mm256_add_ps(_mm256_add_ps(t[0], t[1]), _mm256_add_ps(t[2], t[3])));
            }
        }
    }

    /// The cells past ggml's vector loop, added after the reduce (in f64 for f16 operands, by
    /// float multiply-adds for f32), one dimension at a time: only caches whose size is not a
    /// multiple of 32 have them.
    #[cold]
    unsafe fn tail(&self) {
        let h = self.h;
        let vbase = h.v.as_ptr().add(h.v_offset);
        let cells = self.vector_end()..self.walk_end;
        for k in 0..self.queries.len() {
            let o = self.out_row(k);
            let p = self.w.add(self.queries[k] as usize * h.n_kv);
            for d in 0..h.head_dim_v {
                let v = |j: usize| {
                    let row = vbase.add(v_row(j, h.v_cols) * h.v_stride);
                    if h.v_type == GgmlType::F16 {
                        crate::util::f16_to_f32((row.add(2 * d) as *const u16).read_unaligned())
                    } else {
                        (row.add(4 * d) as *const f32).read_unaligned()
                    }
                };
                *o.add(d) = if h.v_type == GgmlType::F16 {
                    cells.clone().fold(*o.add(d) as f64, |s, j| s + (v(j) * *p.add(j)) as f64) as f32
                } else {
                    cells.clone().fold(*o.add(d), |s, j| v(j).mul_add(*p.add(j), s))
                };
            }
        }
    }
}

/// Prefetches the value rows of `cells` (to L1 for HINT `_MM_HINT_T0`, L2 for `_MM_HINT_T1`).
#[inline(always)]
unsafe fn prefetch_values<const HINT: i32>(h: &Heads, cells: impl Iterator<Item = usize>) {
    let row_bytes = h.head_dim_v * if h.v_type == GgmlType::F16 { 2 } else { 4 };
    let vbase = h.v.as_ptr().add(h.v_offset);
    for j in cells {
        let row = vbase.add(v_row(j, h.v_cols) * h.v_stride);
        for b in (0..row_bytes).step_by(64) {
            _mm_prefetch::<HINT>(row.add(b) as *const i8);
        }
    }
}

/// Floats from one lane's sums to the next in `sets`: the lane's queries x dimensions plus a
/// cache line, so that lanes do not lie a multiple of 4 KiB apart (Gemma: 4 queries x 256
/// dimensions are exactly 4 KiB, which put the reduce's 32 loads of a dimension chunk in one
/// L1 set).
#[inline(always)]
fn lane_floats(n_queries: usize, head_dim_v: usize) -> usize {
    n_queries * head_dim_v + 16
}

/// p, as a value LLVM cannot derive from anything (an empty asm block): stops it from
/// rewriting a walk of pointers into precomputed offsets.
#[inline(always)]
fn opaque(p: *const f32) -> *const f32 {
    let mut r = p;
    // SAFETY: an empty asm block that leaves the register as it is.
    unsafe { std::arch::asm!("/* {0} */", inout(reg) r, options(pure, nomem, nostack, preserves_flags)) };
    r
}
