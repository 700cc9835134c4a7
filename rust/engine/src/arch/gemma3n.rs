//! Gemma 3n (llama_model_gemma3n): Gemma's block (per-head Q/K norms, V normalized without
//! weights, unscaled scores, post-norms, a GeGLU FFN, embeddings scaled by sqrt(n_embd),
//! logits soft-capped at 30) inside two additions of its own:
//!
//! - AltUp: each token carries 4 hidden states ("streams"). Before a layer, a router of the
//!   active stream mixes the 4 into predictions; only the active prediction goes through the
//!   block; after it, a second routing corrects every prediction by the block's change of the
//!   active one ("innovation"), and the per-layer embedding (`arch::ple`) gated by the
//!   corrected active stream is added to the other three. The streams start as the embedding
//!   and three projections of it, rescaled to its magnitude, and end averaged the same way.
//! - LAuReL: a rank-64 residual beside the attention (x + norm(R·L·x)), averaged with the
//!   attention's residual (the sum divided by sqrt 2).
//!
//! The first 10 layers sparsify the FFN's gate: values below mean + 1.6449 std of their row
//! (the 95th percentile of a normal distribution) are cut to 0 before the GELU. Layers from
//! the 20th attend over the K/V of layer 18 (sliding) or 19 (full) and store none.
//! llama.cpp fixes these numbers (4 streams, stream 0 active, 256 per-layer values, rank 64,
//! 10 sparse layers, 20 layers with K/V, a cap of 30) whatever the file says; a file that
//! states other values is refused.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::{QMatrix, Threads};

use crate::arch::blocks::{
    embed, fill_rope_caches, gated_ffn, lora_mm, normed_qkv_attention, output, pre_norm, residual, softcap_logits,
};
use crate::arch::{ple, ArchInfo};
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, Meta};
use crate::kvstore::KvStore;
use crate::model::{
    load_attention, load_embeddings_and_head, load_gated, ExtraParts, Ffn, LayerParts, LayerWeights, Loader, Model, QkNorm,
    Weights,
};
use crate::ops::{add_inplace, geglu, rms_norm, scale_inplace};
use crate::recurrent::sized;

pub const GEMMA3N: ArchInfo = ArchInfo { name: "gemma3n", rope_neox: true, hparams, load, forward, encoder: false };

/// Hidden states per token (altup_num_inputs), and the one the blocks compute (altup_active_idx).
const N_ALTUP: usize = 4;
const ACTIVE: usize = 0;
/// Values per layer and token of the per-layer embeddings (hidden_size_per_layer_input).
const N_PER_LAYER: usize = 256;
const LAUREL_RANK: usize = 64;
/// Layers whose FFN gate is sparsified, and the cut-off in standard deviations above the
/// mean (the normal distribution's 0.95 quantile, as f32).
const N_SPARSE_LAYERS: usize = 10;
const SPARSITY_STD_MUL: f32 = 1.644_853_4;
/// Layers from the start that keep K/V of their own.
const N_LAYERS_WITH_KV: usize = 20;
const FINAL_LOGIT_SOFTCAP: f32 = 30.0;

/// The AltUp and LAuReL weights.
pub struct AltUp {
    /// N_ALTUP - 1 matrices of n_embd rows (altup_proj): the embedding to the other streams.
    pub proj: Vec<QMatrix>,
    /// N_ALTUP - 1 matrices of n_embd rows (altup_unembd_proj): the other streams back.
    pub unembd: Vec<QMatrix>,
    pub layers: Vec<AltUpLayer>,
}

pub struct AltUpLayer {
    /// N_ALTUP rows of n_embd, and the RMSNorm before it.
    pub router: QMatrix,
    pub router_norm: Vec<f32>,
    /// N_ALTUP² rows of N_ALTUP: the router's output to each prediction's mix of the streams.
    pub predict_coef: QMatrix,
    /// N_ALTUP rows of N_ALTUP: the router's output to each stream's share of the innovation.
    pub correct_coef: QMatrix,
    /// n_embd values: the corrected active stream's scale before it gates the per-layer input.
    pub correct_scale: Vec<f32>,
    /// LAuReL: LAUREL_RANK rows of n_embd, n_embd rows of LAUREL_RANK, and the norm after.
    pub laurel_l: QMatrix,
    pub laurel_r: QMatrix,
    pub laurel_post_norm: Vec<f32>,
}

/// The forward pass's buffers of Gemma 3n (sized on first use; empty for the other models).
#[derive(Default)]
pub struct AltUpScratch {
    /// The streams: N_ALTUP blocks of n tokens × n_embd.
    streams: Vec<f32>,
    /// Per token: the router's N_ALTUP outputs, and the coefficients made of them.
    modalities: Vec<f32>,
    coefs: Vec<f32>,
    /// Per token: a magnitude, and the other streams' projection's magnitude.
    magnitude: Vec<f32>,
}

/// llama_model_gemma3n::load_arch_hparams, and the keys it leaves unread checked against the
/// values it fixes.
fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    let arch = hp.arch.clone();
    let m = Meta { file, arch: &arch };
    hp.n_swa = m.usize("attention.sliding_window")?;
    hp.load_swa_pattern(file, 5)?;
    hp.attn_scale = 1.0;
    hp.embedding_scale = (hp.n_embd as f32).sqrt();
    hp.final_logit_softcap = FINAL_LOGIT_SOFTCAP;
    hp.check_attention_only(file)?;
    check_fixed_values(hp, &m)?;
    if hp.n_layer > N_LAYERS_WITH_KV {
        hp.share_kv_from(N_LAYERS_WITH_KV)?;
    }
    Ok(())
}

/// Refuses a file whose metadata states other values than those llama.cpp's graph fixes
/// (it reads none of these keys): computing with either would be wrong for one of them.
fn check_fixed_values(hp: &HParams, m: &Meta) -> Result<()> {
    let n_shared = hp.n_layer.saturating_sub(N_LAYERS_WITH_KV);
    for (key, fixed) in [("altup.num_inputs", N_ALTUP), ("altup.active_idx", ACTIVE),
                         ("embedding_length_per_layer_input", N_PER_LAYER), ("attention.shared_kv_layers", n_shared)] {
        if let Some(v) = m.opt_usize(key)?.filter(|&v| v != fixed) {
            return Err(unsupported(hp, format!("{key} = {v} (llama.cpp's gemma3n graph fixes {fixed})")));
        }
    }
    if let Some(cap) = m.opt_f32("final_logit_softcapping")?.filter(|&c| c != FINAL_LOGIT_SOFTCAP) {
        return Err(unsupported(hp, format!("final_logit_softcapping = {cap} (llama.cpp's gemma3n graph fixes {FINAL_LOGIT_SOFTCAP})")));
    }
    if let Some(scales) = m.layer_f32s("activation_sparsity_scale", hp.n_layer)? {
        // The converter writes the normal quantile of each layer's sparsity: 1.6449 for the
        // sparse layers, -inf (a sparsity of 0) for the others.
        let expected = |il: usize| if il < N_SPARSE_LAYERS { SPARSITY_STD_MUL } else { f32::NEG_INFINITY };
        if let Some(il) = (0..hp.n_layer).find(|&il| (scales[il] - expected(il)).abs() > 1e-5 && scales[il] != expected(il)) {
            return Err(unsupported(hp, format!(
                "activation_sparsity_scale[{il}] = {} (llama.cpp's gemma3n graph sparsifies layers 0-{} at {SPARSITY_STD_MUL})",
                scales[il], N_SPARSE_LAYERS - 1)));
        }
    }
    Ok(())
}

fn unsupported(hp: &HParams, what: String) -> EngineError {
    EngineError::Unsupported(format!("{}: {what}", hp.arch))
}

const PARTS: LayerParts = LayerParts { qk_norm: Some(QkNorm::PerHead), post_norms: true, ..LayerParts::PRE_NORM };

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let layers = (0..hp.n_layer).map(|il| load_layer(ld, hp, il)).collect::<Result<Vec<_>>>()?;
    let mut w = load_embeddings_and_head(ld, hp, layers)?;
    w.extras = ExtraParts { ple: ple::load(ld, hp, N_PER_LAYER)?, altup: Some(load_altup(ld, hp)?), layers: Vec::new() };
    Ok(w)
}

/// Layer il's block. Every layer's file carries K, V and their norm (llama.cpp requires
/// them); a layer over an earlier layer's K/V never applies them.
fn load_layer(ld: &Loader, hp: &HParams, il: usize) -> Result<LayerWeights> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let norm = |name: &str| ld.vector(&n(name), hp.n_embd).map(Some);
    let mut attn = load_attention(ld, hp, &PARTS, il)?;
    if attn.q_norm.is_none() || attn.k_norm.is_none() {
        return Err(ld.error(format!("missing tensor 'blk.{il}.attn_{}_norm.weight'", if attn.q_norm.is_none() { "q" } else { "k" })));
    }
    if !hp.stores_kv(il) {
        attn.k_norm = None;
    }
    Ok(LayerWeights {
        attn_norm: norm("attn_norm.weight")?,
        attn: Some(attn),
        rs: None,
        post_attn_norm: norm("post_attention_norm.weight")?,
        ffn_norm: norm("ffn_norm.weight")?,
        ffn: Ffn::Gated(load_gated(ld, hp, &PARTS, il)?),
        post_ffn_norm: norm("post_ffw_norm.weight")?,
        attn_out_norm: None,
        layer_out_norm: None,
        latent: None,
        attn_norm_b: None,
        ffn_norm_b: None,
    })
}

fn load_altup(ld: &Loader, hp: &HParams) -> Result<AltUp> {
    let d = hp.n_embd;
    let stack = |name: &str| ld.row_blocks(name, &[d, d, N_ALTUP - 1], d, &[d; N_ALTUP - 1]);
    let layers = (0..hp.n_layer)
        .map(|il| {
            let n = |s: &str| format!("blk.{il}.{s}");
            Ok(AltUpLayer {
                router: ld.matrix(&n("altup_router.weight"), d, N_ALTUP)?,
                router_norm: ld.vector(&n("altup_router_norm.weight"), d)?,
                predict_coef: ld.matrix(&n("altup_predict_coef.weight"), N_ALTUP, N_ALTUP * N_ALTUP)?,
                correct_coef: ld.matrix(&n("altup_correct_coef.weight"), N_ALTUP, N_ALTUP)?,
                correct_scale: ld.vector(&n("altup_correct_scale.weight"), d)?,
                laurel_l: ld.matrix(&n("laurel_l.weight"), d, LAUREL_RANK)?,
                laurel_r: ld.matrix(&n("laurel_r.weight"), LAUREL_RANK, d)?,
                laurel_post_norm: ld.vector(&n("laurel_post_norm.weight"), d)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(AltUp { proj: stack("altup_proj.weight")?, unembd: stack("altup_unembd_proj.weight")?, layers })
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    let hp = &model.hparams;
    let (n, d, eps) = (ub.tokens.len(), hp.n_embd, hp.rms_eps);
    let (p, au) = (w.extras.ple.as_ref().expect("loaded with the model"), w.extras.altup.as_ref().expect("loaded with the model"));
    embed(w, ws, ub, hp, hp.embedding_scale, threads);
    fill_rope_caches(hp, ws, ub);
    ple::inputs(p, hp, ws, ub, threads);
    stack_streams(au, hp, ws, n, threads);
    for (il, (lw, al)) in w.layers.iter().zip(&au.layers).enumerate() {
        if let Some(s) = ws.stats.as_deref_mut() {
            s.begin_layer(il);
        }
        predict(al, hp, ws, n, threads);
        pre_norm(ws, lw.attn_norm.as_deref(), eps, n, d);
        laurel(al, hp, ws, n, threads);
        normed_qkv_attention(hp, lw.attn(), ws, kv, ub, il, threads);
        residual(ws, lw.post_attn_norm.as_deref(), eps, 1.0, n, d);
        add_inplace(&mut ws.x[..n * d], &ws.aux[..n * d]);
        scale_inplace(&mut ws.x[..n * d], 1.0 / 2f32.sqrt());
        pre_norm(ws, lw.ffn_norm.as_deref(), eps, n, d);
        let Ffn::Gated(f) = &lw.ffn else { unreachable!("gemma3n layers load a gated FFN") };
        gated_ffn(hp, f, ws, n, if il < N_SPARSE_LAYERS { sparse_geglu } else { geglu }, ub.lora_layer(il), threads);
        residual(ws, lw.post_ffn_norm.as_deref(), eps, 1.0, n, d);
        correct(al, hp, ws, n, threads);
        add_per_layer_input(p, al, hp, il, ws, n, threads);
        if let Some(cv) = ub.cvec {
            cv.apply(il, &mut ws.altup.streams[..N_ALTUP * n * d]);
        }
    }
    merge_streams(au, hp, ws, n, threads);
    output(hp, w, ws, ub, threads, logits);
    softcap_logits(&mut logits[..ub.out_rows.len() * hp.n_vocab], hp.final_logit_softcap);
}

/// Each row's Euclidean norm, as ggml_sqrt(ggml_sum_rows(ggml_sqr(x))) computes it (squares
/// in f32, their sum in f64).
fn magnitudes(x: &[f32], d: usize, out: &mut [f32]) {
    for (m, row) in out.iter_mut().zip(x.chunks_exact(d)) {
        *m = (row.iter().fold(0f64, |s, &v| s + (v * v) as f64) as f32).sqrt();
    }
}

/// `rows` (n rows of d) times each row's `target` magnitude, divided by its own (the two
/// products in ggml's order).
fn rescale_to(rows: &mut [f32], target: &[f32], own: &mut [f32], d: usize) {
    magnitudes(rows, d, own);
    for ((row, &t), &m) in rows.chunks_exact_mut(d).zip(target).zip(own.iter()) {
        row.iter_mut().for_each(|v| *v = *v * t / m);
    }
}

/// The streams of the embeddings in ws.x: the embeddings, then each altup_proj product
/// rescaled to the embedding's magnitude.
fn stack_streams(au: &AltUp, hp: &HParams, ws: &mut Workspace, n: usize, threads: &Threads) {
    let (d, block) = (hp.n_embd, n * hp.n_embd);
    let s = &mut ws.altup;
    let streams = sized(&mut s.streams, N_ALTUP * block);
    let target = sized(&mut s.magnitude, 2 * n);
    let (target, own) = target.split_at_mut(n);
    streams[..block].copy_from_slice(&ws.x[..block]);
    magnitudes(&ws.x[..block], d, target);
    for (k, proj) in au.proj.iter().enumerate() {
        let out = &mut streams[(k + 1) * block..(k + 2) * block];
        lora_mm(proj, None, &[], &ws.x[..block], n, out, &mut ws.mm, &mut ws.lora, threads);
        rescale_to(out, target, own, d);
    }
}

/// ws.altup.modalities = tanh(router · (RMSNorm(x) / n_embd)) of n rows of x, through ws.h.
fn route(al: &AltUpLayer, hp: &HParams, x: &[f32], ws: &mut Workspace, n: usize, threads: &Threads) {
    let d = hp.n_embd;
    rms_norm(&x[..n * d], &al.router_norm, hp.rms_eps, &mut ws.h[..n * d]);
    scale_inplace(&mut ws.h[..n * d], 1.0 / d as f32);
    let modalities = sized(&mut ws.altup.modalities, n * N_ALTUP);
    lora_mm(&al.router, None, &[], &ws.h[..n * d], n, modalities, &mut ws.mm, &mut ws.lora, threads);
    modalities.iter_mut().for_each(|v| *v = v.tanh());
}

/// The streams become their predictions: stream j += Σ_k stream k · c(k, j), the router's
/// coefficients of the active stream; ws.x = the active prediction.
fn predict(al: &AltUpLayer, hp: &HParams, ws: &mut Workspace, n: usize, threads: &Threads) {
    let (d, block) = (hp.n_embd, n * hp.n_embd);
    let active = std::mem::take(&mut ws.altup.streams);
    route(al, hp, &active[ACTIVE * block..], ws, n, threads);
    ws.altup.streams = active;
    let coefs = sized(&mut ws.altup.coefs, n * N_ALTUP * N_ALTUP);
    lora_mm(&al.predict_coef, None, &[], &ws.altup.modalities, n, coefs, &mut ws.mm, &mut ws.lora, threads);
    let streams = &mut ws.altup.streams;
    for (t, c) in coefs.chunks_exact(N_ALTUP * N_ALTUP).enumerate() {
        for e in t * d..(t + 1) * d {
            let s: [f32; N_ALTUP] = std::array::from_fn(|k| streams[k * block + e]);
            for (j, cj) in c.chunks_exact(N_ALTUP).enumerate() {
                // ggml's f32 dot product of 4 values: its leftover loop, contracted to FMAs
                let mix = s.iter().zip(cj).fold(0f32, |acc, (&v, &cv)| v.mul_add(cv, acc));
                streams[j * block + e] = mix + s[j];
            }
        }
    }
    ws.x[..block].copy_from_slice(&streams[ACTIVE * block..(ACTIVE + 1) * block]);
}

/// ws.aux = x + RMSNorm(R · L · x) of the normalized block input x in ws.h (LAuReL), through
/// ws.gate.
fn laurel(al: &AltUpLayer, hp: &HParams, ws: &mut Workspace, n: usize, threads: &Threads) {
    let d = hp.n_embd;
    let low = &mut ws.gate[..n * LAUREL_RANK];
    lora_mm(&al.laurel_l, None, &[], &ws.h[..n * d], n, low, &mut ws.mm, &mut ws.lora, threads);
    let out = sized(&mut ws.aux, n * d);
    lora_mm(&al.laurel_r, None, &[], &ws.gate[..n * LAUREL_RANK], n, out, &mut ws.mm, &mut ws.lora, threads);
    crate::ops::rms_norm_inplace(out, &al.laurel_post_norm, hp.rms_eps);
    add_inplace(out, &ws.h[..n * d]);
}

/// x = gelu(sparse(x)) * y, row by row: in the first layers' FFN each gate row is cut at its
/// mean plus SPARSITY_STD_MUL standard deviations (ggml_mean, the unbiased variance summed
/// in f64, ReLU of the difference) before the GeGLU.
fn sparse_geglu(x: &mut [f32], y: &[f32], row: usize) {
    for r in x.chunks_exact_mut(row) {
        let mean = (r.iter().fold(0f64, |s, &v| s + v as f64) as f32) / row as f32;
        let var_sum = r.iter().fold(0f64, |s, &v| s + ((v - mean) * (v - mean)) as f64) as f32;
        let std = (var_sum * (1.0 / (row - 1) as f32)).sqrt();
        let cutoff = mean + std * SPARSITY_STD_MUL;
        r.iter_mut().for_each(|v| *v = (*v - cutoff).max(0.0));
    }
    geglu(x, y, row);
}

/// Every stream k += (activated - active prediction) · (c_k + 1), the router's coefficients
/// of the block's output `activated` in ws.x.
fn correct(al: &AltUpLayer, hp: &HParams, ws: &mut Workspace, n: usize, threads: &Threads) {
    let (d, block) = (hp.n_embd, n * hp.n_embd);
    let activated = std::mem::take(&mut ws.x);
    route(al, hp, &activated, ws, n, threads);
    let coefs = sized(&mut ws.altup.coefs, n * N_ALTUP);
    lora_mm(&al.correct_coef, None, &[], &ws.altup.modalities, n, coefs, &mut ws.mm, &mut ws.lora, threads);
    let streams = &mut ws.altup.streams;
    for (t, c) in coefs.chunks_exact(N_ALTUP).enumerate() {
        for e in t * d..(t + 1) * d {
            let innovation = activated[e] - streams[ACTIVE * block + e];
            for (k, &ck) in c.iter().enumerate() {
                streams[k * block + e] += innovation * (ck + 1.0);
            }
        }
    }
    ws.x = activated;
}

/// Streams 1.. += the per-layer input of layer il gated by the corrected active stream
/// times altup_correct_scale (`ple::gated_projection`).
fn add_per_layer_input(p: &ple::PerLayerEmbeddings, al: &AltUpLayer, hp: &HParams, il: usize, ws: &mut Workspace, n: usize,
                       threads: &Threads) {
    let (d, block) = (hp.n_embd, n * hp.n_embd);
    for (h, s) in ws.h[..block].chunks_exact_mut(d).zip(ws.altup.streams[ACTIVE * block..].chunks_exact(d)) {
        h.iter_mut().zip(s).zip(&al.correct_scale).for_each(|((h, &s), &g)| *h = s * g);
    }
    ple::gated_projection(p, hp, il, ws, n, threads);
    for stream in ws.altup.streams[block..N_ALTUP * block].chunks_exact_mut(block) {
        add_inplace(stream, &ws.o[..block]);
    }
}

/// ws.x = the mean of stream 0 and the altup_unembd products of the others, each rescaled to
/// the active stream's magnitude.
fn merge_streams(au: &AltUp, hp: &HParams, ws: &mut Workspace, n: usize, threads: &Threads) {
    let (d, block) = (hp.n_embd, n * hp.n_embd);
    let s = &mut ws.altup;
    let mags = sized(&mut s.magnitude, 2 * n);
    let (target, own) = mags.split_at_mut(n);
    magnitudes(&s.streams[ACTIVE * block..(ACTIVE + 1) * block], d, target);
    ws.x[..block].copy_from_slice(&s.streams[..block]);
    for (k, unembd) in au.unembd.iter().enumerate() {
        let stream = &s.streams[(k + 1) * block..(k + 2) * block];
        lora_mm(unembd, None, &[], stream, n, &mut ws.h[..block], &mut ws.mm, &mut ws.lora, threads);
        rescale_to(&mut ws.h[..block], target, own, d);
        add_inplace(&mut ws.x[..block], &ws.h[..block]);
    }
    scale_inplace(&mut ws.x[..block], 1.0 / N_ALTUP as f32);
}
