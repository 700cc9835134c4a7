//! LFM2 (`lfm2`, LiquidAI): a hybrid whose blocks mix tokens either by a gated short
//! convolution (recurrent/short_conv.rs: a convolution state per sequence) or by attention
//! (per-head RMSNorm of Q and K, NEOX RoPE, no biases), the layers with 0 KV heads being the
//! convolutions; every block then has a SwiGLU FFN. RMSNorm before the mixer and before the
//! FFN; the output norm is stored as `token_embd_norm`, the head tied to the embedding when
//! the file has no `output`. `lfm2moe` (LFM2-MoE) keeps `leading_dense_block_count` dense
//! FFNs, then mixtures of experts routed by the sigmoid of the router's logits, chosen with
//! the selection bias `exp_probs_b` and weighted by the unbiased probabilities, normalized.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{attend, pre_norm_blocks, project_qkv, qk_norm, rope_and_store};
use crate::arch::ArchInfo;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, Meta, MoeGating};
use crate::kvstore::KvStore;
use crate::model::{load_attention, load_embeddings_and_head_named, load_experts, load_gated, AttnWeights, ExpertParts, Ffn,
                   LayerParts, LayerWeights, Loader, Model, QkNorm, Weights};
use crate::recurrent::{short_conv_mixer, short_conv_params, RsWeights, ShortConvWeights};

pub const LFM2: ArchInfo = ArchInfo { name: "lfm2", rope_neox: true, hparams, load, forward, encoder: false };
pub const LFM2MOE: ArchInfo = ArchInfo { name: "lfm2moe", rope_neox: true, hparams: hparams_moe, load, forward, encoder: false };

/// The attention blocks' parts: per-head Q/K norms, nothing else optional.
const PARTS: LayerParts = LayerParts { qk_norm: Some(QkNorm::PerHead), ..LayerParts::PRE_NORM };

fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    // every layer's FFN is dense (llama.cpp: n_layer_dense_lead = n_layer)
    hp.n_layer_dense_lead = hp.n_layer;
    hparams_common(hp, file)
}

fn hparams_moe(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    let lead = Meta { file, arch: &hp.arch }.opt_usize("leading_dense_block_count")?.unwrap_or(0);
    if lead > hp.n_layer {
        return Err(file.error(format!("{}.leading_dense_block_count {lead} exceeds block_count {}", hp.arch, hp.n_layer)).into());
    }
    if lead < hp.n_layer && hp.n_expert == 0 {
        return Err(file.error(format!("{}: expert layers without expert_count", hp.arch)).into());
    }
    hp.n_layer_dense_lead = lead;
    // the graph's build_moe_ffn: weights normalized (norm_w); llama.cpp's lfm2moe does not
    // read expert_weights_scale, so a file's value has no effect there either
    hp.moe_gating = MoeGating::from_func(file, &hp.arch, true)?;
    hp.expert_weights_scale = 0.0;
    hparams_common(hp, file)
}

/// What lfm2 and lfm2moe read alike: the epsilon, the convolution layers and their state,
/// the sliding window.
fn hparams_common(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    // llama.cpp requires the epsilon for LFM2 (no default)
    hp.rms_eps = hp.f32(file, "attention.layer_norm_rms_epsilon")?;
    let convolutions = hp.kv_layers.iter().map(|&attends| !attends).collect();
    hp.rs = Some(short_conv_params(file, &hp.arch, convolutions, hp.n_embd)?);
    check_shapes(hp, file)?;
    refuse_embedding_variants(hp, file)?;
    if hp.n_swa > 0 {
        // llama.cpp: with a window, every attention layer slides (LLAMA_SWA_TYPE_STANDARD)
        hp.swa_layers = hp.kv_layers.clone();
    }
    Ok(())
}

/// The sizes llama.cpp's loader assumes: Q and the output projection n_embd wide, K and V of
/// one width, an FFN width for the dense layers.
fn check_shapes(hp: &HParams, file: &GgufFile) -> Result<()> {
    if hp.n_ff == 0 && hp.n_layer_dense_lead > 0 {
        return Err(file.error(format!("{}.feed_forward_length is missing or 0", hp.arch)).into());
    }
    if hp.kv_layers.iter().any(|&a| a) && (hp.n_head == 0 || hp.n_head * hp.head_dim_k != hp.n_embd || hp.head_dim_v != hp.head_dim_k) {
        return Err(file.error(format!(
            "{}: {} heads of {} (keys) and {} (values) do not make the embedding's {} values", hp.arch, hp.n_head,
            hp.head_dim_k, hp.head_dim_v, hp.n_embd)).into());
    }
    Ok(())
}

/// LFM2's embedding models that need more than the final norm's hidden state: the
/// bidirectional ones (`attention.causal` false: symmetric convolution windows and
/// non-causal attention) and the ColBERT ones (`dense_2` projection to
/// `embedding_length_out` values).
fn refuse_embedding_variants(hp: &HParams, file: &GgufFile) -> Result<()> {
    if !hp.opt_bool(file, "attention.causal", true)? {
        return Err(EngineError::Unsupported(format!(
            "{}.attention.causal = false (a bidirectional LFM2 embedding model: centered convolution windows)", hp.arch)));
    }
    let out = Meta { file, arch: &hp.arch }.opt_usize("embedding_length_out")?;
    if out.is_some_and(|n| n != hp.n_embd) || file.tensor("dense_2.weight").is_some() || file.tensor("dense_2.bias").is_some() {
        return Err(EngineError::Unsupported(format!(
            "{}: the dense_2 projection of the embeddings (an LFM2 ColBERT model)", hp.arch)));
    }
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let layers = (0..hp.n_layer).map(|il| load_layer(ld, hp, il)).collect::<Result<Vec<_>>>()?;
    load_embeddings_and_head_named(ld, hp, layers, "token_embd_norm.weight")
}

fn load_layer(ld: &Loader, hp: &HParams, il: usize) -> Result<LayerWeights> {
    let rs = hp.rs.as_ref().expect("set by hparams");
    let norm = |name: &str| ld.vector(&format!("blk.{il}.{name}"), hp.n_embd);
    let (attn, mixer) = if rs.layers[il] {
        (None, Some(RsWeights::ShortConv(ShortConvWeights::load(ld, rs, hp.n_embd, il)?)))
    } else {
        (Some(load_lfm2_attention(ld, hp, il)?), None)
    };
    Ok(LayerWeights {
        attn_norm: Some(norm("attn_norm.weight")?),
        attn,
        rs: mixer,
        post_attn_norm: None,
        ffn_norm: Some(norm("ffn_norm.weight")?),
        ffn: load_ffn(ld, hp, il)?,
        post_ffn_norm: None,
        attn_out_norm: None,
        layer_out_norm: None,
        attn_norm_b: None,
        ffn_norm_b: None, latent: None,
    })
}

/// An attention block, whose Q and K norms llama.cpp requires.
fn load_lfm2_attention(ld: &Loader, hp: &HParams, il: usize) -> Result<AttnWeights> {
    let a = load_attention(ld, hp, &PARTS, il)?;
    if a.q_norm.is_none() || a.k_norm.is_none() {
        return Err(ld.error(format!("missing tensor blk.{il}.attn_q_norm.weight or blk.{il}.attn_k_norm.weight")));
    }
    Ok(a)
}

/// Layer il's FFN: dense for the first n_layer_dense_lead layers (all of lfm2's), then
/// experts with their selection bias (no second scales: the graph passes none).
fn load_ffn(ld: &Loader, hp: &HParams, il: usize) -> Result<Ffn> {
    if il < hp.n_layer_dense_lead {
        return Ok(Ffn::Gated(load_gated(ld, hp, &PARTS, il)?));
    }
    Ok(Ffn::Experts(load_experts(ld, hp, il, &ExpertParts { probs_b: true, ..ExpertParts::ROUTED })?))
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    let hp = &model.hparams;
    let rs = hp.rs.as_ref().expect("set by hparams");
    pre_norm_blocks(model, w, ws, kv, ub, threads, logits, |lw, ws, kv, il| match &lw.rs {
        Some(RsWeights::ShortConv(c)) => short_conv_mixer(rs, c, ws, &mut kv.rs, ub, il, threads),
        Some(_) => unreachable!("lfm2 layers are loaded with short convolutions or attention"),
        None => attention(hp, lw.attn(), ws, kv, ub, il, threads),
    });
}

/// ws.o = the attention of layer il: Q/K/V, their per-head norms, RoPE with the context's
/// parameters in every layer (LFM2's graph rotates sliding-window layers alike), attention
/// scaled by 1/sqrt(head_dim), the output projection.
fn attention(hp: &HParams, a: &AttnWeights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, il: usize, threads: &Threads) {
    let n = ub.tokens.len();
    project_qkv(a, ws, n, ub.lora_layer(il), threads);
    qk_norm(a, ws, n, hp.rms_eps);
    let rope_cache = std::mem::take(&mut ws.rope_cache);
    rope_and_store(hp, a, ub.rope, &rope_cache, ws, kv, ub, il);
    ws.rope_cache = rope_cache;
    attend(hp, a, ws, kv, ub, il, hp.attn_scale, 0.0, threads);
}
