//! GLM-4.5 / 4.6 / 4.5-Air (`glm4moe`, llama.cpp's src/models/glm4-moe.cpp): pre-norm blocks
//! whose attention has Q/K/V biases, optional per-head RMSNorms of Q and K (after the biases),
//! and NEOX RoPE over the first `rope.dimension_count` values of each head only (partial
//! rotary); the norm before the FFN is stored as `post_attention_norm`. The first
//! `leading_dense_block_count` blocks have a dense SwiGLU FFN, the others a mixture of experts
//! routed by the sigmoid of the router's logits (chosen with the selection bias
//! `exp_probs_b`, weighted by the unbiased probabilities, normalized when
//! `expert_weights_norm`, times `expert_weights_scale`) plus a shared expert of
//! `expert_shared_count` experts' width.
//!
//! `block_count` counts the `nextn_predict_layers` multi-token-prediction (NextN) blocks after
//! the trunk. llama.cpp's plain decoding graph runs the trunk only and loads the NextN blocks'
//! tensors with TENSOR_SKIP (present, counted, never read: llama_model_params.load_mtp is off
//! by default); this file does the same (`skip_nextn_layer`), so their tensors are accounted
//! for rather than refused as unread.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{decoder_forward, DecoderStyle};
use crate::arch::ArchInfo;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, Meta, MoeGating};
use crate::kvstore::KvStore;
use crate::model::{load_attention, load_embeddings_and_head, load_experts, load_gated, ExpertParts, Ffn, LayerParts,
                   LayerWeights, Loader, Model, QkNorm, SharedParts, Weights};
use crate::ops::swiglu;

pub const GLM4MOE: ArchInfo = ArchInfo { name: "glm4moe", rope_neox: true, hparams, load, forward, encoder: false };

const STYLE: DecoderStyle = DecoderStyle { q_prescale: false, act: swiglu };

/// Optional per-head Q/K norms; the FFN's pre-norm under llama.cpp's `attn_post_norm` name.
const PARTS: LayerParts =
    LayerParts { qk_norm: Some(QkNorm::PerHead), ffn_norm_name: "post_attention_norm.weight", ..LayerParts::PRE_NORM };

/// The routed experts with their selection bias and a gated shared expert; no second scales
/// (the graph passes none to build_moe_ffn or to the shared expert's build_ffn).
const EXPERT_PARTS: ExpertParts = ExpertParts {
    probs_b: true,
    shared: Some(SharedParts { gated: true, sigmoid_gate: false, scales: false }),
    ..ExpertParts::ROUTED
};

/// llama_model_glm4_moe::load_arch_hparams, and the trunk without its NextN blocks.
fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    let arch = hp.arch.clone();
    let m = Meta { file, arch: &arch };
    hp.rms_eps = hp.f32(file, "attention.layer_norm_rms_epsilon")?;
    if let Some(s) = m.layer_values("rope.dimension_sections", 4)? {
        if s[0] > 0 && s[1] > 0 {
            return Err(EngineError::Unsupported(format!("{}: multimodal RoPE (rope.dimension_sections {s:?})", hp.arch)));
        }
    }
    drop_nextn_layers(hp, &m)?;
    if hp.n_expert == 0 {
        return Err(file.error(format!("{}: expert_count is missing or 0", hp.arch)).into());
    }
    hp.n_layer_dense_lead = m.opt_usize("leading_dense_block_count")?.unwrap_or(0);
    if m.opt_usize("expert_feed_forward_length")?.is_none() {
        hp.n_ff_exp = hp.n_ff / hp.n_expert_used;
    }
    // llama.cpp requires the shared experts' count and builds the shared expert in every
    // MoE block: a file without one would have it run without weights.
    let n_shared = m.usize("expert_shared_count")?;
    if n_shared == 0 {
        return Err(EngineError::Unsupported(format!("{}: expert_shared_count 0 (the graph always adds a shared expert)", hp.arch)));
    }
    hp.n_ff_shexp = hp.n_ff_exp.checked_mul(n_shared).filter(|&w| w > 0 && w <= 1 << 20)
        .ok_or_else(|| m.bad(&m.key("expert_shared_count"), "too large"))?;
    let norm = hp.opt_bool(file, "expert_weights_norm", false)?;
    // a missing (or 0: none) gating function is sigmoid for GLM-4.5
    hp.moe_gating = match m.opt_usize("expert_gating_func")? {
        None | Some(0) => MoeGating::Sigmoid { norm },
        Some(_) => MoeGating::from_func(file, &hp.arch, norm)?,
    };
    if hp.head_dim_k != hp.head_dim_v {
        return Err(file.error(format!("{}: attention.key_length {} differs from value_length {} (llama.cpp asserts they agree)",
                                      hp.arch, hp.head_dim_k, hp.head_dim_v)).into());
    }
    Ok(())
}

/// Drops the `nextn_predict_layers` NextN blocks (the last ones) from the layers the graph runs.
fn drop_nextn_layers(hp: &mut HParams, m: &Meta) -> Result<()> {
    let n_nextn = m.opt_usize("nextn_predict_layers")?.unwrap_or(0);
    if n_nextn >= hp.n_layer {
        return Err(EngineError::Unsupported(format!(
            "{}: nextn_predict_layers {n_nextn} of block_count {}: a file of the multi-token-prediction head alone",
            hp.arch, hp.n_layer)));
    }
    hp.n_layer -= n_nextn;
    for per_layer in [&mut hp.kv_layers, &mut hp.ff_layers, &mut hp.swa_layers] {
        per_layer.truncate(hp.n_layer);
    }
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let layers = (0..hp.n_layer).map(|il| load_layer(ld, hp, il)).collect::<Result<Vec<_>>>()?;
    let n_nextn = Meta { file: ld.file(), arch: &hp.arch }.opt_usize("nextn_predict_layers")?.unwrap_or(0);
    // llama.cpp requires the NextN blocks' tensors unless the file has none of them (a trunk
    // converted without its NextN head: blk.{n_layer}.nextn.eh_proj absent).
    let required = ld.has(&format!("blk.{}.nextn.eh_proj.weight", hp.n_layer));
    for il in hp.n_layer..hp.n_layer + n_nextn {
        skip_nextn_layer(ld, hp, il, required)?;
    }
    load_embeddings_and_head(ld, hp, layers)
}

fn load_layer(ld: &Loader, hp: &HParams, il: usize) -> Result<LayerWeights> {
    let norm = |name: &str| ld.vector(&format!("blk.{il}.{name}"), hp.n_embd);
    let ffn = if il < hp.n_layer_dense_lead {
        Ffn::Gated(load_gated(ld, hp, &PARTS, il)?)
    } else {
        Ffn::Experts(load_experts(ld, hp, il, &EXPERT_PARTS)?)
    };
    Ok(LayerWeights {
        attn_norm: Some(norm("attn_norm.weight")?),
        attn: Some(load_attention(ld, hp, &PARTS, il)?),
        rs: None,
        post_attn_norm: None,
        ffn_norm: Some(norm(PARTS.ffn_norm_name)?),
        ffn,
        post_ffn_norm: None,
        attn_out_norm: None,
        layer_out_norm: None,
        latent: None,
        attn_norm_b: None, ffn_norm_b: None,
    })
}

/// Marks NextN block il's tensors read, as llama_model_glm4_moe::load_arch_tensors creates
/// them with TENSOR_SKIP: a trunk-like block (Q, K, V separate or fused with optional biases,
/// optional Q/K norms, its FFN dense or of experts with a shared expert) plus the NextN
/// projection and norms, the last three optional.
fn skip_nextn_layer(ld: &Loader, hp: &HParams, il: usize, required: bool) -> Result<()> {
    let w = |s: &str| format!("blk.{il}.{s}.weight");
    let mut must = vec!["attn_norm", "attn_output", "post_attention_norm", "nextn.eh_proj", "nextn.enorm", "nextn.hnorm"];
    if il < hp.n_layer_dense_lead {
        must.extend(["ffn_gate", "ffn_down", "ffn_up"]);
    } else {
        must.extend(["ffn_gate_inp", "ffn_gate_exps", "ffn_down_exps", "ffn_up_exps", "ffn_gate_shexp", "ffn_down_shexp",
                     "ffn_up_shexp"]);
        ld.skip(&format!("blk.{il}.exp_probs_b.bias"), required)?;
    }
    for t in must {
        ld.skip(&w(t), required)?;
    }
    for t in ["attn_qkv", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "nextn.embed_tokens",
              "nextn.shared_head_head", "nextn.shared_head_norm"] {
        ld.skip(&w(t), false)?;
    }
    for b in ["attn_qkv", "attn_q", "attn_k", "attn_v"] {
        ld.skip(&format!("blk.{il}.{b}.bias"), false)?;
    }
    Ok(())
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    decoder_forward(model, w, ws, kv, ub, threads, logits, &STYLE);
}
