//! Attention over the cells of the KV cache: scores, masked softmax, weighted sum of values.
//!
//! Numerics follow ggml's flash-attention kernel, which llama.cpp enables on the CPU by default
//! (flash_attn_type = auto): the query is converted to the K cache type's dot-product partner
//! (f16 for an f16 cache, q8_0 for q8_0), scores are scaled and masked, and the softmax is
//! computed online over the cells in cache order, the weighted sum of values kept in the
//! precision of the V cache (f16 for f16, f32 otherwise).

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
    static SCRATCH: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// out: n_tokens rows of n_head × head_dim_v.
pub fn attention(a: &AttnInput, out: &mut [f32], threads: &Threads) {
    let hd_v = a.kv.head_dim_v;
    let out_ptr = OutPtr(out.as_mut_ptr());
    let n_tasks = a.n_tokens * a.n_head;
    threads.run(n_tasks, |task| {
        let (t, h) = (task / a.n_head, task % a.n_head);
        let row_len = a.n_head * hd_v;
        // SAFETY: each (token, head) task writes its own disjoint hd_v-slice of `out`.
        let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(t * row_len + h * hd_v), hd_v) };
        SCRATCH.with(|s| {
            let (qbuf, vbuf) = &mut *s.borrow_mut();
            one_head(a, t, h, dst, qbuf, vbuf);
        });
    });
}

fn one_head(a: &AttnInput, t: usize, h: usize, dst: &mut [f32], qbuf: &mut Vec<u8>, vbuf: &mut Vec<f32>) {
    let kv = a.kv;
    let (hd_k, hd_v) = (kv.head_dim_k, kv.head_dim_v);
    let g = h / (a.n_head / a.n_head_kv);
    let layer = &kv.layers[a.layer];
    let q = &a.q[(t * a.n_head + h) * hd_k..(t * a.n_head + h + 1) * hd_k];
    let dot_tr = traits(kv.type_k.vec_dot_type).expect("vec_dot types are in the table");
    qbuf.resize(dot_tr.row_bytes(hd_k), 0);
    (dot_tr.from_f32.expect("vec_dot types quantize"))(q, qbuf);
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
