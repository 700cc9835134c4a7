//! Attention over an F16 or F32 cache with the arithmetic of llama.cpp's CPU backend on an
//! AVX2 (+FMA+F16C) machine without flash attention (`mul_mat(K, Q)`, `soft_max_ext`,
//! `mul_mat(V, P)`), as one token computes it:
//!
//! - the query is rounded to f16 for an F16 K cache;
//! - every dot product is ggml_vec_dot_f16 / ggml_vec_dot_f32 on AVX2: four accumulators of
//!   eight lanes over steps of 32 terms (term i goes to accumulator (i % 32) / 8, lane i % 8),
//!   then GGML_F32x8_REDUCE; terms past the last whole step are added after the reduce (in f64
//!   for f16, by a float multiply-add for f32);
//! - the softmax is ggml_compute_forward_soft_max_f32: scores times the scale plus the mask,
//!   the max, exponentials by the AVX2 `ggml_v_expf` eight cells at a time (libm's expf for a
//!   last partial chunk), each chunk's lanes reduced as ggml_vec_soft_max_f32 does and added
//!   to an f64 sum, then multiplied by (float)(1 / sum); rounded to f16 for an F16 V cache;
//! - the weighted sum is, for each output dimension, a dot product over the cells in the same
//!   order (V·P is a matrix product whose rows are V's columns).
//!
//! `attend_spec` computes this one operation at a time (the specification, used where no
//! AVX2 is available); `attend_raw` is the AVX2 kernel, equal to it bit for bit.

use crate::attn::{v_row, Heads};
use crate::dispatch::{active_isa, Isa};
use crate::util::{f16_to_f32, f32_to_f16};
use crate::GgmlType;

/// Terms per step of ggml_vec_dot on AVX2 (GGML_F16_STEP = GGML_F32_STEP).
pub const STEP: usize = 32;

/// Tokens and query heads one call may cover.
pub const MAX_TOKENS: usize = crate::attn::MAX_TOKENS;
pub const MAX_HEADS: usize = crate::attn::MAX_HEADS;

fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

// ------------------------------------------------------------------ the specification

/// GGML_F32x8_REDUCE of ggml_vec_dot's four accumulators: (acc0 + acc2) + (acc1 + acc3),
/// then the high half onto the low half, then two horizontal adds.
pub fn reduce_4x8(acc: &[[f32; 8]; 4]) -> f32 {
    let a: [f32; 8] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let t: [f32; 4] = std::array::from_fn(|l| a[l] + a[l + 4]);
    (t[0] + t[1]) + (t[2] + t[3])
}

/// ggml_vec_dot_f16 (`f16`: terms past the steps added in f64) or ggml_vec_dot_f32 (in f32,
/// contracted to a multiply-add as GCC compiles it) on AVX2, of the n terms x(i) * y(i).
pub fn vec_dot(f16: bool, n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32) -> f32 {
    let np = n - n % STEP;
    let mut acc = [[0f32; 8]; 4];
    for i in (0..np).step_by(STEP) {
        for (a, acc_a) in acc.iter_mut().enumerate() {
            for (l, v) in acc_a.iter_mut().enumerate() {
                let k = i + 8 * a + l;
                *v = fma(x(k), y(k), *v);
            }
        }
    }
    let r = reduce_4x8(&acc);
    if f16 {
        (np..n).fold(r as f64, |s, i| s + (x(i) * y(i)) as f64) as f32
    } else {
        (np..n).fold(r, |s, i| fma(x(i), y(i), s))
    }
}

/// ggml_v_expf (AVX2 version), one lane. Every lane's result depends on that lane only.
pub fn expf_avx2(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000);
    let z = fma(x, c(0x3fb8_aa3b), r);
    let n = z - r;
    // fnmadd(a, b, c) = -(a * b) + c, rounded once.
    let b = fma(-n, c(0x35bf_be8e), fma(-n, c(0x3f31_7200), x));
    let e = z.to_bits() << 23;
    let k = c(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let j = fma(
        fma(fma(c(0x3c07_2010), b, c(0x3d2b_9f17)), u, fma(c(0x3e2a_af33), b, c(0x3eff_fedb))),
        u,
        c(0x3f7f_fff6) * b,
    );
    if n.abs() <= 126.0 {
        return fma(j, k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = c(g.wrapping_add(0x7f00_0000));
    let s2 = c(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        fma(s2, j, s2) * s1
    }
}

/// The sum of one chunk of eight exponentials as ggml_vec_soft_max_f32's AVX2 loop adds it:
/// high half onto low half, then movehl, then movehdup.
pub fn chunk_sum8(e: &[f32]) -> f32 {
    let t: [f32; 4] = std::array::from_fn(|i| e[4 + i] + e[i]);
    (t[0] + t[2]) + (t[1] + t[3])
}

/// ggml_vec_soft_max_f32 then the scale by 1 / sum, in place over the scores `w` (-inf where
/// masked); probabilities rounded to f16 when `as_f16`. False (w untouched) when every score
/// is -inf: the output is then zero.
pub fn softmax_spec(w: &mut [f32], as_f16: bool) -> bool {
    let max = w.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if max == f32::NEG_INFINITY {
        return false;
    }
    let n = w.len();
    let n8 = n - n % 8;
    let mut sum = 0f64;
    for chunk in w[..n8].chunks_exact_mut(8) {
        for e in chunk.iter_mut() {
            *e = expf_avx2(*e - max);
        }
        sum += chunk_sum8(chunk) as f64;
    }
    for e in &mut w[n8..] {
        *e = (*e - max).exp();
        sum += *e as f64;
    }
    let inv = (1.0 / sum) as f32;
    for e in w.iter_mut() {
        *e = if as_f16 { round_f16(*e * inv) } else { *e * inv };
    }
    true
}

/// Value i of the row starting at byte `at` of a cache of type `ty`.
fn elem(ty: GgmlType, bytes: &[u8], at: usize, i: usize) -> f32 {
    if ty == GgmlType::F16 {
        let o = at + 2 * i;
        f16_to_f32(u16::from_le_bytes([bytes[o], bytes[o + 1]]))
    } else {
        let o = at + 4 * i;
        f32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]])
    }
}

/// Buffers of the specification, reused between calls.
#[derive(Default)]
pub struct SpecScratch {
    q: Vec<f32>,
    w: Vec<f32>,
}

/// The output of query (token t, head qi) into `out` (head_dim_v floats), one operation at a
/// time. Requires `shape_ok(h)`.
pub fn query_spec(h: &Heads, t: usize, qi: usize, out: &mut [f32], s: &mut SpecScratch) {
    let (dk, dv, n_kv) = (h.head_dim_k, h.head_dim_v, h.n_kv);
    let (k_f16, v_f16) = (h.k_type == GgmlType::F16, h.v_type == GgmlType::F16);
    let q0 = t * h.q_stride + qi * dk;
    s.q.clear();
    s.q.extend(h.q[q0..q0 + dk].iter().map(|&v| if k_f16 { round_f16(v) } else { v }));
    let mask = &h.mask[t * h.mask_stride..t * h.mask_stride + n_kv];
    s.w.clear();
    for (j, &m) in mask.iter().enumerate() {
        let at = j * h.k_stride + h.k_offset;
        let kq = vec_dot(k_f16, dk, |i| elem(h.k_type, h.k, at, i), |i| s.q[i]);
        s.w.push(kq * h.scale + m);
    }
    out[..dv].fill(0.0);
    if !softmax_spec(&mut s.w, v_f16) {
        return;
    }
    let row = |j: usize| v_row(j, h.v_cols) * h.v_stride + h.v_offset;
    for (d, o) in out[..dv].iter_mut().enumerate() {
        *o = vec_dot(v_f16, n_kv, |j| elem(h.v_type, h.v, row(j), d), |j| s.w[j]);
    }
}

/// Every query of `h` through `query_spec`.
pub fn attend_spec(h: &Heads, out: &mut [f32], s: &mut SpecScratch) {
    for t in 0..h.n_t {
        for qi in 0..h.n_q {
            let o = t * h.out_stride + qi * h.head_dim_v;
            query_spec(h, t, qi, &mut out[o..o + h.head_dim_v], s);
        }
    }
}

// ------------------------------------------------------------------ shapes

/// True when the specification and the kernel handle `h` (F16/F32 caches, dimensions the
/// kernel's vectors divide, every index in bounds).
pub fn shape_ok(h: &Heads) -> bool {
    let dims_ok = h.head_dim_k > 0 && h.head_dim_k % STEP == 0 && h.head_dim_v > 0 && h.head_dim_v % 8 == 0;
    dims_ok && h.n_kv > 0 && h.operands_fit()
}

/// True when `attend_raw` runs here: the shape fits and this process uses the AVX2 kernels.
pub fn supported(h: &Heads) -> bool {
    active_isa() == Isa::Avx2 && shape_ok(h)
}

/// Buffers of the kernel: grown to the largest call, then reused.
#[derive(Default)]
pub struct Avx2Scratch {
    /// The queries (tokens x heads) in the K type's precision.
    q: Vec<f32>,
    /// Eight cached keys as f32.
    k: Vec<f32>,
    /// Scores, then probabilities: one row of n_kv per query.
    w: Vec<f32>,
    /// The 32 lane sums of the weighted sums of a group of queries.
    sets: Vec<f32>,
    /// The cells some token of the call sees, ascending.
    cells: Vec<u32>,
    /// The same cells bucketed by lane (cell % 32), each bucket ascending, and where each
    /// bucket starts (`lane_start[32]` is the end).
    lane_cells: Vec<u32>,
    lane_start: Vec<usize>,
    /// The queries of the call with a visible cell (token * n_q + head).
    live: Vec<u16>,
}

fn grow(v: &mut Vec<f32>, n: usize) -> *mut f32 {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    v.as_mut_ptr()
}

/// out = softmax(scale * K·q + mask) · V for each query of `h`, with the arithmetic of
/// `query_spec`. A query with no visible cell gets zeros.
///
/// # Safety
/// `out` must be valid for writes at out[t * out_stride + i] for t < n_t and
/// i < n_q * head_dim_v, and no other thread may access those floats during the call.
pub unsafe fn attend_raw(h: &Heads, out: *mut f32, s: &mut Avx2Scratch) {
    assert!(shape_ok(h) && Isa::Avx2.available(), "unsupported attention call");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: shapes and bounds checked by `shape_ok`, AVX2+FMA+F16C just above.
    unsafe {
        x86::attend(h, out, s)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("AVX2 is x86 only")
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

#[cfg(test)]
mod tests;
