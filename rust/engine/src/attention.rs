//! Attention over the cells of the KV cache: scores, masked softmax, weighted sum of values.
//! Over a quantized cache that llama.cpp rotates (`KvStore::rot_k`, `rot_v`) the queries are
//! rotated like the stored keys and the output is rotated back like the stored values.
//!
//! Numerics follow ggml. The query is converted to the K cache type's dot-product partner
//! (f16 for an f16 cache, q8_0 for q8_0) before the dot products. For f32 and f16 V caches the
//! softmax and weighted sum are ggml_soft_max + mul_mat, the path of llama.cpp's recorded
//! outputs (measured: with it the q8_0 model's logits match the F16-cache records exactly,
//! while the flash-attention arithmetic is 0.075 off); for a quantized V cache, which llama.cpp
//! only allows with flash attention, the online-softmax kernel.
//!
//! On AVX-512 machines the f32/f16 path runs `ferrollama_tensor::attn::attend`, which repeats
//! llama.cpp's operations in llama.cpp's order (vec_dot or tinyBLAS summation depending on the
//! micro-batch size, ggml_v_expf, the chunked f64 softmax sum): with it the Q4_0, IQ4_NL,
//! IQ4_XS, Q5_0, Q6_K and Q8_0 tiny models match the F32-cache records to the last printed
//! digit, and Q4_0, IQ4_XS, Q3_K and Q8_0 the F16-cache records too. On AVX2 machines it runs
//! `ferrollama_tensor::attn_avx2`, llama.cpp's arithmetic on an AVX2 CPU for one token (its
//! ggml_vec_dot order for every token of a batch too), and elsewhere that kernel's scalar
//! specification, which gives the same bits.

use std::cell::RefCell;

use ferrollama_tensor::attn::{DotOrder, Heads};
use ferrollama_tensor::attn_avx2;
use ferrollama_tensor::{traits, GgmlType, SendPtr, Threads};
use half::f16;

use crate::kvstore::KvStore;

pub struct AttnInput<'a> {
    /// Queries after RoPE: n_tokens rows of n_head × head_dim_k.
    pub q: &'a [f32],
    pub n_tokens: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub kv: &'a KvStore,
    pub layer: usize,
    /// n_tokens rows of n_kv entries, 0 or -inf.
    pub mask: &'a [f32],
    pub n_kv: usize,
    pub scale: f32,
    /// tanh soft-capping of the scores (0: none).
    pub softcap: f32,
    /// Per query head, a logit that takes part in the softmax with no value (gpt-oss's
    /// attention sinks).
    pub sinks: Option<&'a [f32]>,
    /// Each token's visible cells in position order: given, the attention is batch-invariant
    /// (`attend_invariant`); None, it is llama.cpp's arithmetic over the masked window.
    pub visible: Option<&'a ferrollama_kv::VisibleCells>,
}

impl AttnInput<'_> {
    /// The row shape of the attended layer's cache.
    fn geom(&self) -> crate::kvstore::KvGeom { self.kv.layers[self.layer].geom }
}

/// Per-thread buffers, grown to the largest call and then reused.
#[derive(Default)]
struct Scratch {
    /// The buffers of the exact AVX-512 kernel.
    exact: ferrollama_tensor::attn::AttnScratch,
    /// The buffers of the AVX2 kernel and of its scalar specification.
    avx2: attn_avx2::Avx2Scratch,
    spec: attn_avx2::SpecScratch,
    /// The buffers of the batch-invariant kernels.
    invariant: ferrollama_tensor::attn_inv::InvScratch,
    /// Queries of the task's heads in the K type's dot type, and as f32.
    q_bytes: Vec<u8>,
    q_f32: Vec<f32>,
    /// Scores, then probabilities, of each head: heads x n_kv.
    scores: Vec<f32>,
    /// One cached value row as f32.
    vbuf: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// out: n_tokens rows of n_head × head_dim_v.
///
/// A task is a block of tokens and some query heads of one KV head (grouped-query attention
/// shares each cached key and value among them: the kernel reads each cached row once per
/// task while it is in cache, and converts it once when enough queries share it).
pub fn attention(a: &AttnInput, out: &mut [f32], threads: &Threads) {
    let (rot_k, rot_v) = (a.kv.rot_k, a.kv.rot_v);
    if rot_k == 0 {
        attend_cells(a, out, threads);
    } else {
        // A rotated cache's keys are met by queries rotated alike (llama.cpp's build_attn):
        // orthonormal blocks keep every score.
        let mut q = ROTATED_Q.with(|b| std::mem::take(&mut *b.borrow_mut()));
        q.clear();
        q.extend_from_slice(a.q);
        crate::ops::hadamard_blocks(&mut q, rot_k);
        attend_cells(&AttnInput { q: &q, ..*a }, out, threads);
        ROTATED_Q.with(|b| *b.borrow_mut() = q);
    }
    if rot_v > 0 {
        // the values were stored rotated: so is their weighted sum, rotated back here
        let n = a.n_tokens * a.n_head * a.geom().head_dim_v;
        crate::ops::hadamard_blocks(&mut out[..n], rot_v);
    }
}

thread_local! {
    /// The queries of a call over a rotated cache, rotated (kept for the next call).
    static ROTATED_Q: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `attention` over the cells as they are stored (the queries already in the cache's basis).
fn attend_cells(a: &AttnInput, out: &mut [f32], threads: &Threads) {
    if let Some(visible) = a.visible {
        return attend_invariant(a, visible, out, threads);
    }
    let hd_v = a.geom().head_dim_v;
    let out_ptr = SendPtr(out.as_mut_ptr());
    let (tokens_per_task, heads_per_task) = task_shape(a.n_tokens, a.n_head, a.n_head_kv, threads.n_threads());
    let n_blocks = a.n_tokens.div_ceil(tokens_per_task);
    let groups = a.n_head / heads_per_task;
    let online = !matches!(a.kv.type_v.ty, GgmlType::F32 | GgmlType::F16);
    threads.run(n_blocks * groups, |task| {
        let (block, h0) = (task / groups, (task % groups) * heads_per_task);
        let tokens = block * tokens_per_task..((block + 1) * tokens_per_task).min(a.n_tokens);
        let row_len = a.n_head * hd_v;
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            if !online && (exact_heads(a, tokens.clone(), h0, heads_per_task, &out_ptr, s) || avx2_heads(a, tokens.clone(), h0, heads_per_task, &out_ptr, s)) {
                return;
            }
            for t in tokens {
                // SAFETY: each (token, heads) pair belongs to one task: a disjoint slice of `out`.
                let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(t * row_len + h0 * hd_v), heads_per_task * hd_v) };
                if online {
                    for (i, d) in dst.chunks_exact_mut(hd_v).enumerate() {
                        one_head_online(a, t, h0 + i, d, &mut s.q_bytes, &mut s.vbuf);
                    }
                } else if !spec_heads(a, t, h0, heads_per_task, dst, s) {
                    heads_portable(a, t, h0, heads_per_task, dst, s);
                }
            }
        });
    });
}

/// Batch-invariant attention (`ferrollama_tensor::attn_inv`): each query over its token's
/// visible cells in position order, with one arithmetic whatever the number of queries in the
/// call, the thread count and the cells' slots. F16/F32 caches run the tensor crate's kernels;
/// other cache types take their row dot (`vec_dot`, per pair) for the scores and the same
/// softmax and weighted sum.
fn attend_invariant(a: &AttnInput, visible: &ferrollama_kv::VisibleCells, out: &mut [f32], threads: &Threads) {
    let hd_v = a.geom().head_dim_v;
    let out_ptr = SendPtr(out.as_mut_ptr());
    let (tokens_per_task, heads_per_task) = task_shape(a.n_tokens, a.n_head, a.n_head_kv, threads.n_threads());
    let n_blocks = a.n_tokens.div_ceil(tokens_per_task);
    let groups = a.n_head / heads_per_task;
    threads.run(n_blocks * groups, |task| {
        let (block, h0) = (task / groups, (task % groups) * heads_per_task);
        let tokens = block * tokens_per_task..((block + 1) * tokens_per_task).min(a.n_tokens);
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            for t in tokens {
                // SAFETY: each (token, heads) pair belongs to one task: a disjoint slice of `out`.
                let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add((t * a.n_head + h0) * hd_v), heads_per_task * hd_v) };
                invariant_heads(a, visible.of(t), t, h0, heads_per_task, dst, s);
            }
        });
    });
}

/// Query heads h0..h0 + nh (one KV head's) of token t over `cells` (see `attend_invariant`).
fn invariant_heads(a: &AttnInput, cells: &[u32], t: usize, h0: usize, nh: usize, dst: &mut [f32], s: &mut Scratch) {
    use ferrollama_tensor::attn_inv::{accumulate, attend_inv, probabilities, score, softmax_inv, InvQuery};
    let kv = a.kv;
    let (hd_k, hd_v) = (a.geom().head_dim_k, a.geom().head_dim_v);
    let g = h0 / (a.n_head / a.n_head_kv);
    let layer = &kv.layers[a.layer];
    let sinks = a.sinks.map(|sk| &sk[h0..h0 + nh]);
    queries_to_dot_type(a, t, h0, nh, s);
    let (v, v_stride, v_offset, v_cols) = kv.v_view(layer, g);
    let query = InvQuery {
        k_type: kv.type_k.ty, v_type: kv.type_v.ty, k: &layer.k, k_stride: kv.k_head_bytes(layer), k_offset: kv.k_block(layer, g),
        v, v_stride, v_offset, v_cols, head_dim_k: hd_k, head_dim_v: hd_v, q: &s.q_f32, n_q: nh, cells,
        scale: a.scale, softcap: a.softcap, sinks,
    };
    if query.supported() {
        return attend_inv(&query, dst, &mut s.invariant);
    }
    // Other cache types: their row dots, then the same softmax and sum.
    let n = cells.len();
    let qrow = s.q_bytes.len() / nh;
    s.scores.clear();
    s.scores.resize(nh * n, 0.0);
    for (i, &j) in cells.iter().enumerate() {
        let k = kv.k_head(layer, j as usize, g);
        for h in 0..nh {
            s.scores[h * n + i] = score((kv.type_k.vec_dot)(hd_k, k, &s.q_bytes[h * qrow..(h + 1) * qrow]), a.scale, a.softcap);
        }
    }
    for h in 0..nh {
        let e = &mut s.scores[h * n..(h + 1) * n];
        let inv = softmax_inv(e, sinks.map(|sk| sk[h]));
        probabilities(e, inv, kv.type_v.ty == GgmlType::F16);
    }
    dst.fill(0.0);
    s.vbuf.resize(hd_v, 0.0);
    for (i, &j) in cells.iter().enumerate() {
        (kv.type_v.to_f32)(kv.v_head(layer, j as usize, g), &mut s.vbuf);
        for (h, o) in dst.chunks_exact_mut(hd_v).enumerate() {
            accumulate(o, s.scores[h * n + i], &s.vbuf);
        }
    }
}

/// (tokens, query heads) per task: blocks of up to TOKENS_PER_TASK tokens, about eight tasks
/// per thread (so that a decode step of several sequences gives one token a task: its
/// tokens see different cells, and a task's kernel walks every cell any of its tokens
/// sees); the most heads of one KV head that still give every thread equal work (a multiple
/// of the thread count, or enough tasks that the remainder is small).
fn task_shape(n_tokens: usize, n_head: usize, n_head_kv: usize, n_threads: usize) -> (usize, usize) {
    let group = n_head / n_head_kv;
    let tokens = (n_tokens * n_head_kv / (8 * n_threads)).clamp(1, TOKENS_PER_TASK).min(n_tokens.max(1));
    let blocks = n_tokens.div_ceil(tokens);
    let balanced = |heads: usize| {
        let tasks = blocks * (n_head / heads);
        tasks % n_threads == 0 || tasks >= 4 * n_threads
    };
    let heads = (1..=group.min(MAX_GROUP)).rev().find(|&h| group % h == 0 && balanced(h)).unwrap_or(1);
    (tokens, heads)
}

/// Tokens per task at most (the exact kernel's limit is larger).
const TOKENS_PER_TASK: usize = 16;

/// ggml_soft_max then V·P for query heads h0..h0 + nh of `tokens`, through the exact AVX-512
/// kernel; false (nothing written) when it does not apply here.
///
/// `attn::attend` reproduces llama.cpp's non-flash arithmetic operation for operation: the
/// orders of the dot products depend on whether the micro-batch has one token (ggml's
/// vec_dot) or several (llamafile's tinyBLAS for F16 operands and for V·P).
fn exact_heads(a: &AttnInput, tokens: std::ops::Range<usize>, h0: usize, nh: usize, out: &SendPtr<f32>, s: &mut Scratch) -> bool {
    use ferrollama_tensor::attn::attend_raw;
    if !plain_softmax(a) || tokens.is_empty() {
        return false;
    }
    let batch = a.n_tokens >= 2;
    let k_f16 = a.kv.type_k.ty == GgmlType::F16;
    // F32 queries stay non-contiguous in llama.cpp's graph, so K·Q with an F32 cache
    // never reaches tinyBLAS; V·P does for either type.
    let order_kq = if k_f16 && batch { DotOrder::TinyBlas } else { DotOrder::VecDot };
    let order_vp = if batch { DotOrder::TinyBlas } else { DotOrder::VecDot };
    let h = task_heads(a, tokens.clone(), h0, nh, order_kq, order_vp);
    if !h.supported() {
        return false;
    }
    // SAFETY: the task owns heads h0..h0 + nh of these tokens' rows of `out`.
    unsafe { attend_raw(&h, out.get().add((tokens.start * a.n_head + h0) * a.geom().head_dim_v), &mut s.exact) };
    true
}

/// The same on an AVX2 machine through `attn_avx2` (llama.cpp's arithmetic on such a CPU for
/// one token: ggml_vec_dot's AVX2 order, also for the tokens of a batch); false when it does
/// not apply here. Elsewhere `spec_heads` computes the same numbers one at a time.
fn avx2_heads(a: &AttnInput, tokens: std::ops::Range<usize>, h0: usize, nh: usize, out: &SendPtr<f32>, s: &mut Scratch) -> bool {
    if !plain_softmax(a) || tokens.is_empty() {
        return false;
    }
    let h = task_heads(a, tokens.clone(), h0, nh, DotOrder::VecDot, DotOrder::VecDot);
    if !attn_avx2::supported(&h) {
        return false;
    }
    // SAFETY: the task owns heads h0..h0 + nh of these tokens' rows of `out`.
    unsafe { attn_avx2::attend_raw(&h, out.get().add((tokens.start * a.n_head + h0) * a.geom().head_dim_v), &mut s.avx2) };
    true
}

/// `attn_avx2`'s specification for the heads h0..h0 + nh of token t (dst: their outputs);
/// false when its shape does not apply.
fn spec_heads(a: &AttnInput, t: usize, h0: usize, nh: usize, dst: &mut [f32], s: &mut Scratch) -> bool {
    if !plain_softmax(a) {
        return false;
    }
    let h = task_heads(a, t..t + 1, h0, nh, DotOrder::VecDot, DotOrder::VecDot);
    if !attn_avx2::shape_ok(&h) {
        return false;
    }
    for (i, d) in dst.chunks_exact_mut(a.geom().head_dim_v).enumerate() {
        attn_avx2::query_spec(&h, 0, i, d, &mut s.spec);
    }
    true
}

/// Whether the scores go into the softmax as they are (no soft-capping, no sinks): what the
/// AVX-512 and AVX2 kernels compute.
fn plain_softmax(a: &AttnInput) -> bool {
    a.softcap == 0.0 && a.sinks.is_none()
}

/// The task of query heads h0..h0 + nh (one KV head's) of `tokens`, as the kernels take it.
fn task_heads<'a>(a: &AttnInput<'a>, tokens: std::ops::Range<usize>, h0: usize, nh: usize, order_kq: DotOrder, order_vp: DotOrder) -> Heads<'a> {
    let kv = a.kv;
    let (hd_k, hd_v, n_kv) = (a.geom().head_dim_k, a.geom().head_dim_v, a.n_kv);
    let g = h0 / (a.n_head / a.n_head_kv);
    let layer = &kv.layers[a.layer];
    let t0 = tokens.start;
    let (v, v_stride, v_offset, v_cols) = kv.v_view(layer, g);
    Heads {
        k_type: kv.type_k.ty,
        v_type: kv.type_v.ty,
        k: &layer.k,
        k_stride: kv.k_head_bytes(layer),
        k_offset: kv.k_block(layer, g),
        v,
        v_stride,
        v_offset,
        v_cols,
        head_dim_k: hd_k,
        head_dim_v: hd_v,
        n_kv,
        q: &a.q[(t0 * a.n_head + h0) * hd_k..],
        q_stride: a.n_head * hd_k,
        n_q: nh,
        n_t: tokens.len(),
        mask: &a.mask[t0 * n_kv..],
        mask_stride: n_kv,
        out_stride: a.n_head * hd_v,
        scale: a.scale,
        order_kq,
        order_vp,
    }
}

/// ggml_soft_max then V·P (llama.cpp without flash attention, the path its records took for
/// f32 and f16 caches) for query heads h0..h0 + nh of token t, which share one KV head, where
/// neither kernel nor the specification applies (soft-capped scores, sinks, odd head sizes):
/// each dot product from the type table's `vec_dot`, the softmax sum in f64 (a sink counts in
/// the maximum and the sum, as ggml_soft_max adds it), the weighted sum in cell order.
fn heads_portable(a: &AttnInput, t: usize, h0: usize, nh: usize, dst: &mut [f32], s: &mut Scratch) {
    let kv = a.kv;
    let (hd_k, hd_v, n_kv) = (a.geom().head_dim_k, a.geom().head_dim_v, a.n_kv);
    let g = h0 / (a.n_head / a.n_head_kv);
    let layer = &kv.layers[a.layer];
    queries_to_dot_type(a, t, h0, nh, s);
    let mask = &a.mask[t * n_kv..(t + 1) * n_kv];
    s.scores.clear();
    s.scores.resize(nh * n_kv, f32::NEG_INFINITY);
    let mut max = [f32::NEG_INFINITY; MAX_GROUP];
    let qrow = s.q_bytes.len() / nh;
    for (j, &mv) in mask.iter().enumerate() {
        if mv == f32::NEG_INFINITY {
            continue;
        }
        let k = kv.k_head(layer, j, g);
        for h in 0..nh {
            let v = (kv.type_k.vec_dot)(hd_k, k, &s.q_bytes[h * qrow..(h + 1) * qrow]);
            let sc = if a.softcap > 0.0 { a.softcap * (v * a.scale / a.softcap).tanh() + mv } else { v * a.scale + mv };
            s.scores[h * n_kv + j] = sc;
            max[h] = max[h].max(sc);
        }
    }
    dst.fill(0.0);
    let mut inv = [0f32; MAX_GROUP];
    for h in 0..nh {
        let row = &mut s.scores[h * n_kv..(h + 1) * n_kv];
        let sink = a.sinks.map(|sk| sk[h0 + h]);
        if let Some(sk) = sink {
            max[h] = max[h].max(sk);
        }
        if max[h] == f32::NEG_INFINITY {
            // No cell visible: the output stays zero.
            row.fill(0.0);
            continue;
        }
        let mut sum = 0.0f64;
        for e in row.iter_mut() {
            *e = if *e == f32::NEG_INFINITY { 0.0 } else { (*e - max[h]).exp() };
            sum += *e as f64;
        }
        if let Some(sk) = sink {
            sum += (sk - max[h]).exp() as f64;
        }
        inv[h] = (1.0 / sum) as f32;
    }
    let p_as_f16 = kv.type_v.ty == GgmlType::F16;
    s.vbuf.resize(hd_v, 0.0);
    for j in 0..n_kv {
        let vrow = kv.v_head(layer, j, g);
        let mut converted = false;
        for h in 0..nh {
            let p = round(s.scores[h * n_kv + j] * inv[h], p_as_f16);
            if p == 0.0 {
                continue;
            }
            if !converted {
                (kv.type_v.to_f32)(vrow, &mut s.vbuf);
                converted = true;
            }
            for (o, &v) in dst[h * hd_v..(h + 1) * hd_v].iter_mut().zip(&s.vbuf) {
                *o += p * v;
            }
        }
    }
}

/// Query heads per KV head this file handles in one task (more are split into tasks of one).
const MAX_GROUP: usize = 64;

/// The queries of (token t, heads h0..h0 + nh) in the K cache type's dot-product partner
/// type, and (for F16 and F32 partners) as f32.
fn queries_to_dot_type(a: &AttnInput, t: usize, h0: usize, nh: usize, s: &mut Scratch) {
    let hd_k = a.geom().head_dim_k;
    let q = &a.q[(t * a.n_head + h0) * hd_k..(t * a.n_head + h0 + nh) * hd_k];
    let dot_tr = traits(a.kv.type_k.vec_dot_type).expect("vec_dot types are in the table");
    s.q_bytes.resize(dot_tr.row_bytes(hd_k) * nh, 0);
    (dot_tr.from_f32.expect("vec_dot types quantize"))(q, &mut s.q_bytes);
    if matches!(dot_tr.ty, GgmlType::F16 | GgmlType::F32) {
        s.q_f32.resize(nh * hd_k, 0.0);
        (dot_tr.to_f32)(&s.q_bytes, &mut s.q_f32);
    }
}

/// The query of (token t, head h) in the K cache type's dot-product partner type.
fn query_to_dot_type(a: &AttnInput, t: usize, h: usize, qbuf: &mut Vec<u8>) {
    let hd_k = a.geom().head_dim_k;
    let q = &a.q[(t * a.n_head + h) * hd_k..(t * a.n_head + h + 1) * hd_k];
    let dot_tr = traits(a.kv.type_k.vec_dot_type).expect("vec_dot types are in the table");
    qbuf.resize(dot_tr.row_bytes(hd_k), 0);
    (dot_tr.from_f32.expect("vec_dot types quantize"))(q, qbuf);
}

/// ggml's flash-attention kernel (llama.cpp forces it on for a quantized V cache): the softmax
/// computed online over the cells in cache order, the values accumulated in f32 (or in f16 for
/// an f16 V, as ggml_vec_mad_f16 does).
fn one_head_online(a: &AttnInput, t: usize, h: usize, dst: &mut [f32], qbuf: &mut Vec<u8>, vbuf: &mut Vec<f32>) {
    let kv = a.kv;
    let (hd_k, hd_v) = (a.geom().head_dim_k, a.geom().head_dim_v);
    let g = h / (a.n_head / a.n_head_kv);
    let layer = &kv.layers[a.layer];
    query_to_dot_type(a, t, h, qbuf);
    // ggml folds the soft-cap into the scale: s = cap * tanh(kq * scale / cap).
    let scale = if a.softcap > 0.0 { a.scale / a.softcap } else { a.scale };
    // An f16 V cache is accumulated in f16 (ggml_vec_mad_f16): the values are kept in f32
    // here but rounded to f16 after every update, which is the same arithmetic.
    let v_is_f16 = kv.type_v.ty == GgmlType::F16;
    let acc = dst;
    acc.fill(0.0);
    vbuf.resize(hd_v, 0.0);
    let mask = &a.mask[t * a.n_kv..(t + 1) * a.n_kv];
    let (mut sum, mut max) = (0.0f32, f32::NEG_INFINITY);
    for (j, &mv) in mask.iter().enumerate() {
        if mv == f32::NEG_INFINITY {
            continue;
        }
        let mut s = (kv.type_k.vec_dot)(hd_k, kv.k_head(layer, j, g), qbuf) * scale;
        if a.softcap > 0.0 {
            s = a.softcap * s.tanh();
        }
        s += mv;
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > max {
            ms = (max - s).exp();
            max = s;
            scale_acc(acc, ms, v_is_f16);
        } else {
            vs = (s - max).exp();
        }
        (kv.type_v.to_f32)(kv.v_head(layer, j, g), vbuf);
        mad_acc(acc, vbuf, vs, v_is_f16);
        sum = sum * ms + vs;
    }
    if let Some(sk) = a.sinks.map(|sk| sk[h]) {
        // ggml's flash attention folds the sink in last, as one more score without a value.
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if sk > max {
            ms = (max - sk).exp();
            scale_acc(acc, ms, v_is_f16);
        } else {
            vs = (sk - max).exp();
        }
        sum = sum * ms + vs;
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for o in acc.iter_mut() {
        *o *= inv;
    }
}

/// acc *= ms (ggml_vec_scale_f16 / _f32).
fn scale_acc(acc: &mut [f32], ms: f32, as_f16: bool) {
    for y in acc.iter_mut() {
        *y = round(*y * ms, as_f16);
    }
}

/// acc += v * vs (ggml_vec_mad_f16 / _f32, fused multiply-add as the SIMD paths compute it).
fn mad_acc(acc: &mut [f32], v: &[f32], vs: f32, as_f16: bool) {
    for (y, &x) in acc.iter_mut().zip(v) {
        *y = round(x.mul_add(vs, *y), as_f16);
    }
}

#[inline]
fn round(x: f32, as_f16: bool) -> f32 {
    if as_f16 { f16::from_f32(x).to_f32() } else { x }
}


#[cfg(test)]
mod tests {
    use super::task_shape;

    #[test]
    fn tasks_keep_a_kv_heads_queries_together_when_threads_stay_balanced() {
        // Qwen2.5-0.5B (14 heads, 2 KV heads), one decoded token, 2 threads: a KV head each.
        assert_eq!(task_shape(1, 14, 2, 2), (1, 7));
        // Gemma 3 270M (4 heads, 1 KV head): two tasks of two heads.
        assert_eq!(task_shape(1, 4, 1, 2), (1, 2));
        // Eight sequences' tokens: one token a task, whole groups.
        assert_eq!(task_shape(8, 14, 2, 2), (1, 7));
        // A prompt: blocks of 16 tokens.
        assert_eq!(task_shape(512, 14, 2, 2), (16, 7));
        // One thread, no grouping constraint but the group's size.
        assert_eq!(task_shape(1, 32, 8, 1), (1, 4));
        // Three threads, one token of a 7-head group: no grouping balances them; single heads.
        assert_eq!(task_shape(1, 7, 1, 3), (1, 1));
    }
}
