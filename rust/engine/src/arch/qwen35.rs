//! The hybrids of gated delta nets and gated attention: Qwen3.5 (`qwen35`, dense FFNs, tied
//! embeddings), Qwen3.5-MoE (`qwen35moe`) and Qwen3-Next (`qwen3next`), both with experts and
//! a sigmoid-gated shared expert. One graph for the three (llama.cpp's src/models/qwen35.cpp,
//! qwen35moe.cpp and qwen3next.cpp differ only where noted): each block is an RMSNorm, a
//! mixer — the gated delta net on the recurrent layers, gated full attention on the others
//! (every `full_attention_interval`-th, or as `attention.recurrent_layers` says) — added to
//! the residual stream, then `post_attention_norm` and the FFN, added again.
//!
//! Qwen3.5 rotates with interleaved M-RoPE (`rope.dimension_sections`, read as qwenvl.rs reads
//! Qwen3-VL's: its images, through the qwen3vl projector, take 2-D positions), Qwen3-Next with
//! NEOX RoPE; both rotate only the first `rope.dimension_count` values of each head.
//!
//! Files converted with their multi-token-prediction head carry `nextn_predict_layers` extra
//! blocks after the trunk (counted in `block_count`): llama.cpp loads them with TENSOR_SKIP for
//! plain decoding and never runs them, and so does this file (`skip_mtp_layer`).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{gated_attention, pre_norm_blocks};
use crate::arch::ArchInfo;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, Meta};
use crate::kvstore::KvStore;
use crate::model::{
    load_experts, load_gated, load_gated_attention, ExpertParts, Ffn, LayerParts, LayerWeights, Loader, Model, SharedParts, Weights,
};
use crate::recurrent::{delta_net_mixer, delta_net_params, DeltaNetFamily, DeltaNetWeights, RsWeights};

pub const QWEN35: ArchInfo = ArchInfo { name: "qwen35", rope_neox: true, hparams: hparams_qwen35, load: load_qwen35, forward, encoder: false };
pub const QWEN35MOE: ArchInfo =
    ArchInfo { name: "qwen35moe", rope_neox: true, hparams: hparams_qwen35moe, load: load_qwen35moe, forward, encoder: false };
pub const QWEN3NEXT: ArchInfo =
    ArchInfo { name: "qwen3next", rope_neox: true, hparams: hparams_qwen3next, load: load_qwen3next, forward, encoder: false };

/// The FFN's second scales are applied (build_ffn gets them in these graphs).
const FFN_PARTS: LayerParts = LayerParts { ffn_scales: true, ..LayerParts::PRE_NORM };

/// The experts of Qwen3.5-MoE and Qwen3-Next: softmax routing with renormalized weights,
/// second scales applied, and a shared expert behind its per-token sigmoid gate.
const EXPERT_PARTS: ExpertParts = ExpertParts {
    scales: true,
    shared: Some(SharedParts { gated: true, sigmoid_gate: true, scales: true }),
    ..ExpertParts::ROUTED
};

fn hparams_qwen35(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    layer_kinds(hp, file)?;
    hp.mrope = Some(crate::arch::qwenvl::read_mrope(hp, file, true)?);
    Ok(())
}

fn hparams_qwen35moe(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    hparams_qwen35(hp, file)?;
    expert_sizes(hp, file)
}

fn hparams_qwen3next(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    layer_kinds(hp, file)?;
    expert_sizes(hp, file)
}

/// The experts' sizes as llama.cpp's loaders default them: each expert n_ff / n_expert_used
/// wide without `expert_feed_forward_length`, the shared expert n_ff wide without
/// `expert_shared_feed_forward_length`. These loaders do not read `expert_weights_scale`, so
/// the graph never scales the expert weights whatever the file says.
fn expert_sizes(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    if hp.n_expert == 0 {
        return Err(file.error(format!("{}: a model without experts (expert_count)", hp.arch)).into());
    }
    let m = Meta { file, arch: &hp.arch };
    if m.opt_usize("expert_feed_forward_length")?.is_none() {
        hp.n_ff_exp = hp.n_ff / hp.n_expert_used;
    }
    if hp.n_ff_shexp == 0 {
        hp.n_ff_shexp = hp.n_ff;
    }
    if hp.n_ff_exp == 0 || hp.n_ff_shexp == 0 {
        return Err(file.error(format!("{}: experts {} or shared expert {} values wide", hp.arch, hp.n_ff_exp, hp.n_ff_shexp)).into());
    }
    hp.expert_weights_scale = 0.0;
    Ok(())
}

/// Which layers are recurrent and which attend (llama.cpp's load_arch_hparams of the three):
/// `attention.recurrent_layers` per layer of the file, else every layer but each
/// `full_attention_interval`-th (4 by default); the multi-token-prediction blocks
/// (`nextn_predict_layers`, the last ones) are dropped from the layers the graph runs.
fn layer_kinds(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    let m = Meta { file, arch: &hp.arch };
    let n_all = hp.n_layer;
    let n_nextn = m.opt_usize("nextn_predict_layers")?.unwrap_or(0);
    if n_nextn >= n_all {
        return Err(EngineError::Unsupported(format!(
            "{}: nextn_predict_layers {n_nextn} of block_count {n_all}: a file of the multi-token-prediction head alone", hp.arch)));
    }
    let n_layer = n_all - n_nextn;
    let recurrent: Vec<bool> = match m.layer_values("attention.recurrent_layers", n_all)? {
        Some(flags) => flags.iter().map(|&f| f != 0).collect(),
        None => {
            let interval = m.opt_usize("full_attention_interval")?.unwrap_or(4);
            if interval == 0 {
                return Err(m.bad(&m.key("full_attention_interval"), "0"));
            }
            (0..n_all).map(|il| il < n_layer && (il + 1) % interval != 0).collect()
        }
    };
    if recurrent[n_layer..].iter().any(|&r| r) {
        return Err(EngineError::Unsupported(format!("{}: a recurrent multi-token-prediction layer", hp.arch)));
    }
    hp.n_layer = n_layer;
    for per_layer in [&mut hp.ff_layers, &mut hp.swa_layers] {
        per_layer.truncate(n_layer);
    }
    hp.kv_layers = recurrent[..n_layer].iter().map(|&r| !r).collect();
    hp.rs = Some(delta_net_params(file, &hp.arch, recurrent[..n_layer].to_vec())?);
    if hp.kv_layers.iter().any(|&k| k) && (hp.n_head == 0 || hp.n_head_kv == 0) {
        return Err(file.error(format!("{}: attention layers without attention.head_count or head_count_kv", hp.arch)).into());
    }
    if hp.head_dim_k != hp.head_dim_v {
        return Err(file.error(format!("{}: attention.key_length {} differs from value_length {} (llama.cpp asserts they agree)",
                                      hp.arch, hp.head_dim_k, hp.head_dim_v)).into());
    }
    Ok(())
}

fn load_qwen35(ld: &Loader, hp: &HParams) -> Result<Weights> {
    if hp.n_ff == 0 {
        return Err(ld.error("qwen35.feed_forward_length is missing or 0"));
    }
    let layers = (0..hp.n_layer)
        .map(|il| load_layer(ld, hp, il, DeltaNetFamily::Qwen35, Ffn::Gated(load_gated(ld, hp, &FFN_PARTS, il)?)))
        .collect::<Result<Vec<_>>>()?;
    for il in hp.n_layer..hp.n_layer + n_mtp_layers(ld, hp)? {
        skip_mtp_layer(ld, il, false)?;
    }
    crate::model::load_embeddings_and_head(ld, hp, layers)
}

fn load_qwen35moe(ld: &Loader, hp: &HParams) -> Result<Weights> {
    load_moe(ld, hp, DeltaNetFamily::Qwen35)
}

fn load_qwen3next(ld: &Loader, hp: &HParams) -> Result<Weights> {
    load_moe(ld, hp, DeltaNetFamily::Qwen3Next)
}

fn load_moe(ld: &Loader, hp: &HParams, family: DeltaNetFamily) -> Result<Weights> {
    let layers = (0..hp.n_layer)
        .map(|il| load_layer(ld, hp, il, family, Ffn::Experts(load_experts(ld, hp, il, &EXPERT_PARTS)?)))
        .collect::<Result<Vec<_>>>()?;
    for il in hp.n_layer..hp.n_layer + n_mtp_layers(ld, hp)? {
        skip_mtp_layer(ld, il, true)?;
    }
    crate::model::load_embeddings_and_head(ld, hp, layers)
}

/// Layer il: its norms and mixer (the gated delta net or gated attention), with `ffn`.
fn load_layer(ld: &Loader, hp: &HParams, il: usize, family: DeltaNetFamily, ffn: Ffn) -> Result<LayerWeights> {
    let rs = hp.rs.as_ref().expect("set by hparams");
    let n = |s: &str| format!("blk.{il}.{s}");
    let recurrent = rs.layers[il];
    Ok(LayerWeights {
        attn_norm: Some(ld.vector(&n("attn_norm.weight"), hp.n_embd)?),
        attn: if recurrent { None } else { Some(load_gated_attention(ld, hp, il)?) },
        rs: if recurrent { Some(RsWeights::DeltaNet(DeltaNetWeights::load(ld, rs, hp.n_embd, il, family)?)) } else { None },
        post_attn_norm: None,
        // llama.cpp's `attn_post_norm` normalizes the FFN's input
        ffn_norm: Some(ld.vector(&n("post_attention_norm.weight"), hp.n_embd)?),
        ffn,
        post_ffn_norm: None, attn_out_norm: None, layer_out_norm: None,
        attn_norm_b: None, ffn_norm_b: None, latent: None,
    })
}

/// The multi-token-prediction blocks after the trunk (`nextn_predict_layers`).
fn n_mtp_layers(ld: &Loader, hp: &HParams) -> Result<usize> {
    Ok(Meta { file: ld.file(), arch: &hp.arch }.opt_usize("nextn_predict_layers")?.unwrap_or(0))
}

/// Marks multi-token-prediction block il's tensors read, as llama.cpp's loaders create them
/// with TENSOR_SKIP (load_block_mtp; Qwen3-Next's load_block_trunk with the MTP flags): a
/// full-attention block (Q, K, V separate or fused, with optional biases), its FFN (dense, or
/// experts and a shared expert when `moe`), and the NextN projections and norms.
fn skip_mtp_layer(ld: &Loader, il: usize, moe: bool) -> Result<()> {
    let n = |s: &str| format!("blk.{il}.{s}.weight");
    let mut required = vec!["attn_norm", "post_attention_norm", "attn_output", "attn_q_norm", "attn_k_norm",
                            "nextn.eh_proj", "nextn.enorm", "nextn.hnorm"];
    let mut optional = vec!["attn_qkv", "attn_q", "attn_k", "attn_v", "nextn.embed_tokens", "nextn.shared_head_head",
                            "nextn.shared_head_norm"];
    if moe {
        required.extend(["ffn_gate_inp", "ffn_down_exps", "ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"]);
        optional.extend(["ffn_gate_up_exps", "ffn_gate_exps", "ffn_up_exps"]);
    } else {
        required.extend(["ffn_gate", "ffn_down", "ffn_up"]);
    }
    for t in required {
        ld.skip(&n(t), true)?;
    }
    for t in optional {
        ld.skip(&n(t), false)?;
    }
    for b in ["attn_qkv", "attn_q", "attn_k", "attn_v"] {
        ld.skip(&format!("blk.{il}.{b}.bias"), false)?;
    }
    Ok(())
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    let hp = &model.hparams;
    let rs = hp.rs.as_ref().expect("set by hparams");
    pre_norm_blocks(model, w, ws, kv, ub, threads, logits, |lw, ws, kv, il| match &lw.rs {
        Some(RsWeights::DeltaNet(m)) => delta_net_mixer(rs, m, ws, &mut kv.rs, ub, il, hp.rms_eps, threads),
        Some(_) => unreachable!("the recurrent blocks of these models are loaded with a delta net"),
        None => gated_attention(hp, lw.attn(), ws, kv, ub, il, threads),
    });
}
