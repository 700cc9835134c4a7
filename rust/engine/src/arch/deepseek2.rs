//! DeepSeek-V2, V2-Lite, V3, R1 and Kimi-K2 (`deepseek2`: llama.cpp's src/models/deepseek2.cpp).
//! Each block: RMSNorm, multi-head latent attention (`arch::latent`), the residual add; RMSNorm
//! and the FFN — dense SwiGLU in the first `leading_dense_block_count` blocks, then routed
//! experts beside `expert_shared_count` shared experts (one FFN of that many experts' width) —
//! and the residual add again.
//!
//! The router: softmax or sigmoid (`expert_gating_func`; softmax when absent, as llama.cpp
//! reads DeepSeek-V2 files), the choice biased by `exp_probs_b` where the file has it, limited
//! to the best expert groups (`expert_group_count`, `expert_group_used_count`), the weights
//! renormalized (`expert_weights_norm`) and scaled (`expert_weights_scale`).
//!
//! YaRN: llama.cpp's loader divides `rope.scaling.yarn_log_multiplier` (0.1 mscale_all_dim, as
//! the converter writes it) by 0.1, and the context's attention factor uses that value as
//! both YaRN's mscale and mscale_all_dim; the graph scales the scores by the square of the
//! magnitude scale (`latent::kq_scale`).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::pre_norm_blocks;
use crate::arch::latent::{check_cache_sizes, latent_attention, load_latent_attention};
use crate::arch::ArchInfo;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, LatentParams, Meta, MoeGating, RopeOverrides};
use crate::kvstore::KvStore;
use crate::model::{load_experts, load_gated, ExpertParts, Ffn, LayerParts, LayerWeights, Loader, Model, SharedParts, Weights};

pub const DEEPSEEK2: ArchInfo = ArchInfo { name: "deepseek2", rope_neox: false, hparams, load, forward, encoder: false };

/// Gated experts with the shared experts beside them (no gate of their own, no scales).
const EXPERT_PARTS: ExpertParts =
    ExpertParts { shared: Some(SharedParts { gated: true, sigmoid_gate: false, scales: false }), ..ExpertParts::ROUTED };

fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    hp.check_attention_only(file)?;
    let m = Meta { file, arch: &hp.arch };
    refuse_unsupported(&m)?;
    let lp = latent_params(hp, &m)?;
    check_cache_sizes(hp, &lp)?;
    hp.latent = Some(lp);
    hp.n_layer_dense_lead = m.opt_usize("leading_dense_block_count")?.unwrap_or(0).min(hp.n_layer);
    if hp.n_layer_dense_lead < hp.n_layer {
        expert_params(hp, file)?;
    }
    yarn_params(hp)
}

/// The keys of variants this file does not run: attention temperature tuning (Mistral-Large
/// 3) and the multi-token-prediction blocks (GLM-4.7 files).
fn refuse_unsupported(m: &Meta) -> Result<()> {
    if m.opt_f32("attention.temperature_scale")?.is_some_and(|s| s != 0.0) {
        return Err(EngineError::Unsupported(format!("{}: attention temperature tuning", m.key("attention.temperature_scale"))));
    }
    if m.opt_usize("nextn_predict_layers")?.is_some_and(|n| n > 0) {
        return Err(EngineError::Unsupported(format!("{}: multi-token-prediction blocks", m.key("nextn_predict_layers"))));
    }
    Ok(())
}

/// The latent attention's sizes: `attention.q_lora_rank` (0 or absent: `attn_q`),
/// `attention.kv_lora_rank`, and the query and value head sizes — `key_length_mla` and
/// `value_length_mla` in a split file (llama.cpp's is_mla), else key_length and value_length.
fn latent_params(hp: &HParams, m: &Meta) -> Result<LatentParams> {
    let k_mla = m.opt_usize("attention.key_length_mla")?.unwrap_or(0);
    let v_mla = m.opt_usize("attention.value_length_mla")?.unwrap_or(0);
    if (k_mla == 0) != (v_mla == 0) {
        return Err(m.bad(&m.key("attention.key_length_mla"), "given without value_length_mla, or the reverse"));
    }
    let split = k_mla != 0;
    let lp = LatentParams {
        q_lora_rank: m.opt_usize("attention.q_lora_rank")?.unwrap_or(0),
        kv_lora_rank: m.usize("attention.kv_lora_rank")?,
        head_dim_qk: if split { k_mla } else { hp.head_dim_k },
        head_dim_v: if split { v_mla } else { hp.head_dim_v },
        split,
    };
    const MAX: usize = 1 << 16;
    if lp.head_dim_qk <= hp.rope.n_dims || [lp.q_lora_rank, lp.kv_lora_rank, lp.head_dim_qk, lp.head_dim_v].iter().any(|&v| v > MAX)
        || lp.kv_lora_rank == 0 || lp.head_dim_v == 0 {
        return Err(m.bad(&m.key("attention.kv_lora_rank"), &format!(
            "latent attention of rank {} (queries {} with {} rotated, values {}, query rank {})",
            lp.kv_lora_rank, lp.head_dim_qk, hp.rope.n_dims, lp.head_dim_v, lp.q_lora_rank)));
    }
    Ok(lp)
}

/// The experts' sizes and routing as llama.cpp's loader reads them.
fn expert_params(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    let m = Meta { file, arch: &hp.arch };
    if hp.n_expert == 0 {
        return Err(file.error(format!("{}: expert layers without expert_count", hp.arch)).into());
    }
    hp.n_ff_exp = m.usize("expert_feed_forward_length")?;
    let n_shared = m.usize("expert_shared_count")?;
    if n_shared == 0 || hp.n_ff_exp == 0 {
        return Err(EngineError::Unsupported(format!("{}: experts of {} values with {n_shared} shared experts", hp.arch, hp.n_ff_exp)));
    }
    hp.n_ff_shexp = hp.n_ff_exp.checked_mul(n_shared).filter(|&f| f <= 1 << 20)
        .ok_or_else(|| m.bad(&m.key("expert_shared_count"), "too large"))?;
    let norm = hp.opt_bool(file, "expert_weights_norm", false)?;
    hp.moe_gating = match m.opt_usize("expert_gating_func")? {
        Some(_) => MoeGating::from_func(file, &hp.arch, norm)?,
        // llama.cpp's default for files without the key: sigmoid for GLM-4.7-Flash's shape,
        // softmax (DeepSeek-V2 and V2.5) otherwise
        None if matches!(hp.n_layer, 47 | 48) && hp.n_vocab == 154880 => MoeGating::Sigmoid { norm },
        None => MoeGating::Softmax { norm },
    };
    Ok(())
}

/// DeepSeek's reading of YaRN's multiplier (see the module documentation), and the RoPE the
/// model runs by default with it.
fn yarn_params(hp: &mut HParams) -> Result<()> {
    if hp.rope_train.yarn_log_mul != 0.0 {
        hp.rope_train.yarn_log_mul /= 0.1;
    }
    hp.rope_train.yarn_mscale = hp.rope_train.yarn_log_mul;
    hp.rope = hp.rope_train.resolve(&hp.rope, &RopeOverrides::default())?;
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let lp = hp.latent.expect("set by hparams");
    let layers = (0..hp.n_layer).map(|il| {
        let n = |s: &str| format!("blk.{il}.{s}");
        let ffn = if il < hp.n_layer_dense_lead {
            Ffn::Gated(load_gated(ld, hp, &LayerParts::PRE_NORM, il)?)
        } else {
            let mut experts = load_experts(ld, hp, il, &EXPERT_PARTS)?;
            experts.probs_b = ld.opt_vector(&n("exp_probs_b.bias"), hp.n_expert)?;
            Ffn::Experts(experts)
        };
        Ok(LayerWeights {
            attn_norm: Some(ld.vector(&n("attn_norm.weight"), hp.n_embd)?),
            attn: None,
            rs: None,
            post_attn_norm: None,
            ffn_norm: Some(ld.vector(&n("ffn_norm.weight"), hp.n_embd)?),
            ffn,
            post_ffn_norm: None, attn_out_norm: None, layer_out_norm: None,
            latent: Some(Box::new(load_latent_attention(ld, hp, &lp, il)?)),
            attn_norm_b: None, ffn_norm_b: None,
        })
    }).collect::<Result<Vec<_>>>()?;
    crate::model::load_embeddings_and_head(ld, hp, layers)
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    let hp = &model.hparams;
    pre_norm_blocks(model, w, ws, kv, ub, threads, logits, |lw, ws, kv, il| {
        let attn = lw.latent.as_deref().expect("every deepseek2 block is loaded with latent attention");
        latent_attention(hp, attn, ws, kv, ub, il, threads);
    });
}
