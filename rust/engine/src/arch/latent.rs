//! Multi-head latent attention (DeepSeek-V2/V3/R1, Kimi-K2: llama.cpp's src/models/deepseek2.cpp),
//! a shared block like `blocks::self_attention`.
//!
//! Each token's keys and values come from one compressed latent: `attn_kv_a_mqa` projects the
//! token to `kv_lora_rank` latent values (RMS-normed by `attn_kv_a_norm`) and `n_rot` values of
//! a key part every head shares, which RoPE rotates. Queries come from `attn_q`, or through a
//! compression of their own (`attn_q_a`, `attn_q_a_norm`, `attn_q_b`); each query head is a
//! no-RoPE part then `n_rot` rotated values. Two file layouts, as llama.cpp runs them:
//!
//! - split (`attn_k_b` and `attn_v_b`, newer files): the latent is what the cache holds — one
//!   KV head per cell of `kv_lora_rank + n_rot` values, whose leading `kv_lora_rank` values
//!   are also the cell's value (`KvStore::latent`). Each head's no-RoPE query is absorbed
//!   through its `attn_k_b` into the latent space, so that attention is multi-query attention
//!   over the cached latents; each head's output (a mix of latents) goes back to the head's
//!   value size through its `attn_v_b`.
//! - joint (`attn_kv_b`, older files): llama.cpp's non-MLA path: `attn_kv_b` decompresses
//!   each head's no-RoPE key and value from the latent, the key gets the shared rotated part,
//!   and the cache holds every head's key and value as for any attention.
//!
//! Scores are scaled by mscale² / sqrt(query head size), mscale being YaRN's magnitude scale as
//! llama.cpp's graph recomputes it (`kq_scale`).

use ferrollama_tensor::{matmul, MatmulScratch, QMatrix, Threads};

use crate::actstats::Matrix;
use crate::arch::blocks::{lora_mm, note};
use crate::attention::{attention, AttnInput};
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, LatentParams};
use crate::kvstore::KvStore;
use crate::lora::Proj;
use crate::model::Loader;
use crate::ops::{rms_norm_inplace, rope_apply, RopeParams};
use crate::recurrent::sized;

/// How a layer projects its queries.
pub enum LatentQ {
    /// `attn_q`: n_embd to every head's query.
    Direct(QMatrix),
    /// `attn_q_a` to q_lora_rank values, RMS-normed by `attn_q_a_norm`, then `attn_q_b`.
    Compressed { a: QMatrix, norm: Vec<f32>, b: QMatrix },
}

/// How a layer gets each head's key and value from the latent.
pub enum LatentKv {
    /// Per head: `attn_k_b` (kv_lora_rank rows of the no-RoPE query size), `attn_v_b` (value
    /// size rows of kv_lora_rank).
    Split { k_b: Vec<QMatrix>, v_b: Vec<QMatrix> },
    /// `attn_kv_b`: each head's no-RoPE key then its value, from the latent.
    Joint(QMatrix),
}

pub struct LatentAttnWeights {
    pub q: LatentQ,
    /// kv_lora_rank + n_rot rows: the latent, then the shared key part RoPE rotates.
    pub kv_a: QMatrix,
    pub kv_a_norm: Vec<f32>,
    pub kv: LatentKv,
    pub wo: QMatrix,
}

/// The block's buffers, grown on first use to the micro-batch's size.
#[derive(Default)]
pub struct LatentScratch {
    /// The projected queries: n × n_head × query head size.
    q: Vec<f32>,
    /// The compressed queries: n × q_lora_rank.
    q_a: Vec<f32>,
    /// The latents and rotated key parts: n × (kv_lora_rank + n_rot).
    kv_a: Vec<f32>,
    /// The joint layout's decompressed keys and values: n × n_head × (no-RoPE + value size).
    kv: Vec<f32>,
    /// One head's inputs and outputs of a per-head product, for all tokens.
    head_in: Vec<f32>,
    head_out: Vec<f32>,
    /// Every head's value-size output: the output projection's input.
    heads: Vec<f32>,
}

/// Layer il's latent attention as `lp` sizes it.
pub fn load_latent_attention(ld: &Loader, hp: &HParams, lp: &LatentParams, il: usize) -> Result<LatentAttnWeights> {
    let n = |s: &str| format!("blk.{il}.{s}.weight");
    let (d, nh, n_rot) = (hp.n_embd, hp.n_head, hp.rope.n_dims);
    let (kvr, nope, dv) = (lp.kv_lora_rank, lp.nope(n_rot), lp.head_dim_v);
    let q = if lp.q_lora_rank > 0 {
        LatentQ::Compressed {
            a: ld.matrix(&n("attn_q_a"), d, lp.q_lora_rank)?,
            norm: ld.vector(&n("attn_q_a_norm"), lp.q_lora_rank)?,
            b: ld.matrix(&n("attn_q_b"), lp.q_lora_rank, nh * lp.head_dim_qk)?,
        }
    } else {
        LatentQ::Direct(ld.matrix(&n("attn_q"), d, nh * lp.head_dim_qk)?)
    };
    let kv = if lp.split {
        LatentKv::Split {
            k_b: ld.row_blocks(&n("attn_k_b"), &[nope, kvr, nh], nope, &vec![kvr; nh])?,
            v_b: ld.row_blocks(&n("attn_v_b"), &[kvr, dv, nh], kvr, &vec![dv; nh])?,
        }
    } else {
        LatentKv::Joint(ld.matrix(&n("attn_kv_b"), kvr, nh * (nope + dv))?)
    };
    Ok(LatentAttnWeights {
        q,
        kv_a: ld.matrix(&n("attn_kv_a_mqa"), d, kvr + n_rot)?,
        kv_a_norm: ld.vector(&n("attn_kv_a_norm"), kvr)?,
        kv,
        wo: ld.matrix(&n("attn_output"), nh * dv, d)?,
    })
}

/// The sizes a latent attention's cache needs of the file's `attention.key_length`,
/// `value_length` and `head_count_kv`: in a split file one KV head of the latent and the
/// rotated part, whose value is the latent; in a joint file every head's key and value.
pub fn check_cache_sizes(hp: &HParams, lp: &LatentParams) -> Result<()> {
    let n_rot = hp.rope.n_dims;
    let (want_k, want_v, want_kv_heads) = if lp.split {
        (lp.kv_lora_rank + n_rot, lp.kv_lora_rank, 1)
    } else {
        (lp.head_dim_qk, lp.head_dim_v, hp.n_head)
    };
    if hp.head_dim_k != want_k || hp.head_dim_v != want_v || hp.n_head_kv != want_kv_heads {
        return Err(EngineError::Unsupported(format!(
            "{}: latent attention with key_length {}, value_length {} and head_count_kv {} (this layout needs {want_k}, {want_v} \
             and {want_kv_heads})", hp.arch, hp.head_dim_k, hp.head_dim_v, hp.n_head_kv)));
    }
    Ok(())
}

/// The scores' scale of llama.cpp's graph: YaRN's magnitude scale recomputed from the
/// context's attention factor (llama_context cancelled ggml's own factor in it), squared,
/// over the square root of the query head size.
pub fn kq_scale(hp: &HParams, lp: &LatentParams, rope: &RopeParams) -> f32 {
    let ln_factor = (1.0f32 / rope.freq_scale).ln();
    let attn_factor_org = rope.attn_factor * (1.0 + 0.1 * ln_factor);
    let mscale = attn_factor_org * (1.0 + 0.1 * hp.rope_train.yarn_log_mul * ln_factor);
    mscale * mscale / (lp.head_dim_qk as f32).sqrt()
}

/// ws.o = layer il's latent attention of ws.h: queries and latents, RoPE of their rotated
/// parts, the cache store, attention and the output projection (with the adapters' terms of
/// `attn_output`, the one product of this block llama.cpp adapts).
pub fn latent_attention(hp: &HParams, lw: &LatentAttnWeights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, il: usize,
                        threads: &Threads) {
    let lp = hp.latent.as_ref().expect("latent attention is loaded with its sizes");
    let n = ub.tokens.len();
    project_queries(hp, lp, lw, ws, ub, n, threads);
    project_latents(hp, lp, lw, ws, ub, n, threads);
    let scale = kq_scale(hp, lp, ub.rope);
    match &lw.kv {
        LatentKv::Split { k_b, v_b } => absorbed_attention(hp, lp, k_b, v_b, ws, kv, ub, il, scale, threads),
        LatentKv::Joint(kv_b) => decompressed_attention(hp, lp, kv_b, ws, kv, ub, il, scale, threads),
    }
    let (d, attn_dim) = (hp.n_embd, hp.n_head * lp.head_dim_v);
    let heads = &ws.latent.heads[..n * attn_dim];
    lora_mm(&lw.wo, None, ub.lora_layer(il).terms(Proj::O), heads, n, &mut ws.o[..n * d], &mut ws.mm, &mut ws.lora, threads);
    note(&mut ws.stats, Matrix::AttnOutput, heads, n);
}

/// ws.latent.q = every head's query (n × n_head × head_dim_qk), its last n_rot values rotated.
fn project_queries(hp: &HParams, lp: &LatentParams, lw: &LatentAttnWeights, ws: &mut Workspace, ub: &UBatchView, n: usize,
                   threads: &Threads) {
    let (d, dqk, n_rot) = (hp.n_embd, lp.head_dim_qk, hp.rope.n_dims);
    let s = &mut ws.latent;
    let q = sized(&mut s.q, n * hp.n_head * dqk);
    let x = &ws.h[..n * d];
    match &lw.q {
        LatentQ::Direct(w) => {
            matmul(w, x, n, q, &mut ws.mm, threads);
            note(&mut ws.stats, Matrix::AttnQ, x, n);
        }
        LatentQ::Compressed { a, norm, b } => {
            let q_a = sized(&mut s.q_a, n * a.rows);
            matmul(a, x, n, q_a, &mut ws.mm, threads);
            rms_norm_inplace(q_a, norm, hp.rms_eps);
            matmul(b, q_a, n, q, &mut ws.mm, threads);
            note(&mut ws.stats, Matrix::Other("attn_q_a"), x, n);
            note(&mut ws.stats, Matrix::Other("attn_q_b"), q_a, n);
        }
    }
    for (t, row) in q.chunks_exact_mut(hp.n_head * dqk).enumerate() {
        let cache = &ws.rope_cache[t * n_rot..(t + 1) * n_rot];
        for head in row.chunks_exact_mut(dqk) {
            rope_apply(&mut head[dqk - n_rot..], cache, ub.rope);
        }
    }
}

/// ws.latent.kv_a = each token's normed latent then its rotated shared key part
/// (n × (kv_lora_rank + n_rot)): in a split file, the row the cache holds.
fn project_latents(hp: &HParams, lp: &LatentParams, lw: &LatentAttnWeights, ws: &mut Workspace, ub: &UBatchView, n: usize,
                   threads: &Threads) {
    let (kvr, n_rot) = (lp.kv_lora_rank, hp.rope.n_dims);
    let kv_a = sized(&mut ws.latent.kv_a, n * (kvr + n_rot));
    matmul(&lw.kv_a, &ws.h[..n * hp.n_embd], n, kv_a, &mut ws.mm, threads);
    note(&mut ws.stats, Matrix::Other("attn_kv_a_mqa"), &ws.h[..n * hp.n_embd], n);
    for (t, row) in kv_a.chunks_exact_mut(kvr + n_rot).enumerate() {
        rope_apply(&mut row[kvr..], &ws.rope_cache[t * n_rot..(t + 1) * n_rot], ub.rope);
        rms_norm_inplace(&mut row[..kvr], &lw.kv_a_norm, hp.rms_eps);
    }
}

/// The split layout: each head's no-RoPE query through its attn_k_b into the latent space
/// beside its rotated part (ws.q), the latents stored, multi-query attention over them
/// (ws.attn: each head's mix of latents), and each head's mix through its attn_v_b
/// (ws.latent.heads).
#[allow(clippy::too_many_arguments)]
fn absorbed_attention(hp: &HParams, lp: &LatentParams, k_b: &[QMatrix], v_b: &[QMatrix], ws: &mut Workspace, kv: &mut KvStore,
                      ub: &UBatchView, il: usize, scale: f32, threads: &Threads) {
    let n = ub.tokens.len();
    let (nh, n_rot, dqk, kvr, dv) = (hp.n_head, hp.rope.n_dims, lp.head_dim_qk, lp.kv_lora_rank, lp.head_dim_v);
    let (nope, dk) = (dqk - n_rot, kvr + n_rot);
    let s = &mut ws.latent;
    for (h, w) in k_b.iter().enumerate() {
        let absorbed = per_head_product(w, &s.q, n, nh, dqk, h, 0..nope, &mut s.head_in, &mut s.head_out, &mut ws.mm, threads);
        note_head(&mut ws.stats, Matrix::Other("attn_k_b"), h, nh, &s.head_in[..n * nope], n);
        for (t, a) in absorbed.chunks_exact(kvr).enumerate() {
            let dst = &mut ws.q[(t * nh + h) * dk..(t * nh + h + 1) * dk];
            dst[..kvr].copy_from_slice(a);
            dst[kvr..].copy_from_slice(&s.q[(t * nh + h) * dqk + nope..(t * nh + h + 1) * dqk]);
        }
    }
    let view = ub.kv(il);
    for (t, row) in s.kv_a[..n * dk].chunks_exact(dk).enumerate() {
        kv.write(il, view.slots[t] as usize, row, &[]);
    }
    let input = AttnInput {
        q: &ws.q[..n * nh * dk], n_tokens: n, n_head: nh, n_head_kv: 1, kv, layer: il,
        mask: view.mask, n_kv: view.n_kv, visible: view.visible, scale, softcap: 0.0, sinks: None,
    };
    attention(&input, &mut ws.attn[..n * nh * kvr], threads);
    let heads = sized(&mut s.heads, n * nh * dv);
    for (h, w) in v_b.iter().enumerate() {
        let out = per_head_product(w, &ws.attn, n, nh, kvr, h, 0..kvr, &mut s.head_in, &mut s.head_out, &mut ws.mm, threads);
        note_head(&mut ws.stats, Matrix::Other("attn_v_b"), h, nh, &s.head_in[..n * kvr], n);
        for (t, o) in out.chunks_exact(dv).enumerate() {
            heads[(t * nh + h) * dv..(t * nh + h + 1) * dv].copy_from_slice(o);
        }
    }
}

/// Adds head h's product input `x` (n rows, gathered) to the activation statistics of the
/// per-head matrix m, when they are collected.
fn note_head(stats: &mut Option<Box<crate::actstats::ActivationStats>>, m: Matrix, h: usize, nh: usize, x: &[f32], n: usize) {
    if let Some(s) = stats.as_deref_mut() {
        s.record_of(m, h, nh, x, n);
    }
}

/// w · (values `part` of head h of each token's row of n_head × `head` values in `x`), for
/// the n tokens: ggml's batched product of one head's matrix (n × w.rows values).
#[allow(clippy::too_many_arguments)]
fn per_head_product<'a>(w: &QMatrix, x: &[f32], n: usize, nh: usize, head: usize, h: usize, part: std::ops::Range<usize>,
                        gathered: &mut Vec<f32>, out: &'a mut Vec<f32>, mm: &mut MatmulScratch, threads: &Threads) -> &'a [f32] {
    let len = part.len();
    let g = sized(gathered, n * len);
    for (t, dst) in g.chunks_exact_mut(len).enumerate() {
        let at = (t * nh + h) * head;
        dst.copy_from_slice(&x[at + part.start..at + part.end]);
    }
    let o = sized(out, n * w.rows);
    matmul(w, g, n, o, mm, threads);
    o
}

/// The joint layout (llama.cpp's non-MLA path): attn_kv_b decompresses each head's no-RoPE
/// key and value from the latent; each head's key gets the shared rotated part; every head's
/// key and value are stored, and attention runs over them as for any model (ws.latent.heads).
#[allow(clippy::too_many_arguments)]
fn decompressed_attention(hp: &HParams, lp: &LatentParams, kv_b: &QMatrix, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView,
                          il: usize, scale: f32, threads: &Threads) {
    let n = ub.tokens.len();
    let (nh, n_rot, dqk, kvr, dv) = (hp.n_head, hp.rope.n_dims, lp.head_dim_qk, lp.kv_lora_rank, lp.head_dim_v);
    let nope = dqk - n_rot;
    let s = &mut ws.latent;
    let decompressed = per_head_product(kv_b, &s.kv_a, n, 1, kvr + n_rot, 0, 0..kvr, &mut s.head_in, &mut s.kv, &mut ws.mm, threads);
    note(&mut ws.stats, Matrix::Other("attn_kv_b"), &s.head_in[..n * kvr], n);
    let view = ub.kv(il);
    for t in 0..n {
        let k_pe = &s.kv_a[t * (kvr + n_rot) + kvr..(t + 1) * (kvr + n_rot)];
        let (k, v) = (&mut ws.k[t * nh * dqk..(t + 1) * nh * dqk], &mut ws.v[t * nh * dv..(t + 1) * nh * dv]);
        let heads = decompressed[t * nh * (nope + dv)..(t + 1) * nh * (nope + dv)].chunks_exact(nope + dv);
        for ((kh, vh), both) in k.chunks_exact_mut(dqk).zip(v.chunks_exact_mut(dv)).zip(heads) {
            kh[..nope].copy_from_slice(&both[..nope]);
            kh[nope..].copy_from_slice(k_pe);
            vh.copy_from_slice(&both[nope..]);
        }
        kv.write(il, view.slots[t] as usize, k, v);
    }
    let input = AttnInput {
        q: &s.q[..n * nh * dqk], n_tokens: n, n_head: nh, n_head_kv: nh, kv, layer: il,
        mask: view.mask, n_kv: view.n_kv, visible: view.visible, scale, softcap: 0.0, sinks: None,
    };
    attention(&input, sized(&mut s.heads, n * nh * dv), threads);
}
