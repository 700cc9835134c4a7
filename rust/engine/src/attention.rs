//! Attention over the cells of the KV cache: scores, masked softmax, weighted sum of values.
//!
//! Numerics follow ggml. The query is converted to the K cache type's dot-product partner
//! (f16 for an f16 cache, q8_0 for q8_0) before the dot products. For f32 and f16 V caches the
//! softmax and weighted sum are ggml_soft_max + mul_mat, the path of llama.cpp's recorded
//! outputs (measured: with it the q8_0 model's logits match the F16-cache records exactly,
//! while the flash-attention arithmetic is 0.075 off); for a quantized V cache, which llama.cpp
//! only allows with flash attention, the online-softmax kernel.

use std::cell::RefCell;

use ferrollama_tensor::{traits, GgmlType, Threads};
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
}

thread_local! {
    static SCRATCH: RefCell<(Vec<u8>, Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// out: n_tokens rows of n_head × head_dim_v.
pub fn attention(a: &AttnInput, out: &mut [f32], threads: &Threads) {
    let hd_v = a.kv.head_dim_v;
    let out_ptr = OutPtr(out.as_mut_ptr());
    let n_tasks = a.n_tokens * a.n_head;
    let online = !matches!(a.kv.type_v.ty, GgmlType::F32 | GgmlType::F16);
    threads.run(n_tasks, |task| {
        let (t, h) = (task / a.n_head, task % a.n_head);
        let row_len = a.n_head * hd_v;
        // SAFETY: each (token, head) task writes its own disjoint hd_v-slice of `out`.
        let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(t * row_len + h * hd_v), hd_v) };
        SCRATCH.with(|s| {
            let (qbuf, vbuf, scores) = &mut *s.borrow_mut();
            if online {
                one_head_online(a, t, h, dst, qbuf, vbuf);
            } else {
                one_head(a, t, h, dst, qbuf, vbuf, scores);
            }
        });
    });
}

/// ggml_soft_max then V·P (llama.cpp without flash attention, the path its records took for
/// f32 and f16 caches): scores in f32, the softmax sum in f64, the probabilities rounded to
/// f16 when V is f16 (ggml converts them to V's dot type), the weighted sum in f32.
fn one_head(a: &AttnInput, t: usize, h: usize, dst: &mut [f32], qbuf: &mut Vec<u8>, vbuf: &mut Vec<f32>, scores: &mut Vec<f32>) {
    let kv = a.kv;
    let (hd_k, hd_v) = (kv.head_dim_k, kv.head_dim_v);
    let g = h / (a.n_head / a.n_head_kv);
    let layer = &kv.layers[a.layer];
    query_to_dot_type(a, t, h, qbuf);
    let mask = &a.mask[t * a.n_kv..(t + 1) * a.n_kv];
    scores.clear();
    scores.resize(a.n_kv, f32::NEG_INFINITY);
    let mut max = f32::NEG_INFINITY;
    for (j, &mv) in mask.iter().enumerate() {
        if mv == f32::NEG_INFINITY {
            continue;
        }
        let mut s = (kv.type_k.vec_dot)(hd_k, kv.k_head(layer, j, g), qbuf);
        if a.softcap > 0.0 {
            s = a.softcap * (s * a.scale / a.softcap).tanh();
            scores[j] = s + mv;
        } else {
            scores[j] = s * a.scale + mv;
        }
        max = max.max(scores[j]);
    }
    dst.fill(0.0);
    if max == f32::NEG_INFINITY {
        return;
    }
    let mut sum = 0.0f64;
    for s in scores.iter_mut() {
        *s = if *s == f32::NEG_INFINITY { 0.0 } else { (*s - max).exp() };
        sum += *s as f64;
    }
    let inv = (1.0 / sum) as f32;
    let p_as_f16 = kv.type_v.ty == GgmlType::F16;
    vbuf.resize(hd_v, 0.0);
    for (j, &e) in scores.iter().enumerate() {
        let p = round(e * inv, p_as_f16);
        if p == 0.0 {
            continue;
        }
        (kv.type_v.to_f32)(kv.v_head(layer, j, g), vbuf);
        for (o, &v) in dst.iter_mut().zip(vbuf.iter()) {
            *o += p * v;
        }
    }
}

/// The query of (token t, head h) in the K cache type's dot-product partner type.
fn query_to_dot_type(a: &AttnInput, t: usize, h: usize, qbuf: &mut Vec<u8>) {
    let hd_k = a.kv.head_dim_k;
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
    let (hd_k, hd_v) = (kv.head_dim_k, kv.head_dim_v);
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

struct OutPtr(*mut f32);
impl OutPtr {
    fn get(&self) -> *mut f32 { self.0 }
}
unsafe impl Sync for OutPtr {}
unsafe impl Send for OutPtr {}
