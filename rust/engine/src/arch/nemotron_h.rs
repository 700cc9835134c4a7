//! Nemotron-H (`nemotron_h`) and its mixture-of-experts version (`nemotron_h_moe`, Nemotron 3):
//! one loader and graph in llama.cpp. Each block is an RMS pre-norm, one of a Mamba-2 mixer
//! (layers with neither KV heads nor FFN), an attention without RoPE (KV heads, no FFN) or an
//! FFN (feed_forward_length > 0), and a residual add. The FFN is squared ReLU of the up
//! projection (no gate): dense, or experts routed by the sigmoid of the router's logits with
//! the selection bias exp_probs_b, their weights optionally normalized and scaled, plus a
//! shared expert of the same kind.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{embed, output, plain_ffn, pre_norm, residual, self_attention, FfnAct};
use crate::arch::ArchInfo;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{HParams, Meta, MoeGating};
use crate::kvstore::KvStore;
use crate::model::{load_attention, load_experts, ExpertParts, Ffn, LayerParts, LayerWeights, Loader, Model, PlainFfn,
                   SharedParts, Weights};
use crate::ops::relu_sqr_inplace;
use crate::recurrent::{mamba2_mixer, mamba2_params, Mamba2Weights, RsWeights};

pub const NEMOTRON_H: ArchInfo = ArchInfo { name: "nemotron_h", rope_neox: false, hparams, load, forward, encoder: false };
pub const NEMOTRON_H_MOE: ArchInfo = ArchInfo { name: "nemotron_h_moe", rope_neox: false, hparams, load, forward, encoder: false };

/// llama_model_nemotron_h::load_arch_hparams.
fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    let arch = hp.arch.clone();
    let m = Meta { file, arch: &arch };
    for key in ["nextn_predict_layers", "moe_latent_size"] {
        if m.opt_usize(key)?.unwrap_or(0) > 0 {
            return Err(EngineError::Unsupported(format!("{}.{key}: multi-token prediction blocks and latent experts", hp.arch)));
        }
    }
    // The RMS norms' epsilon: attention.layer_norm_rms_epsilon, else attention.layer_norm_epsilon.
    hp.rms_eps = match m.opt_f32("attention.layer_norm_rms_epsilon")? {
        Some(eps) => eps,
        None => m.opt_f32("attention.layer_norm_epsilon")?
            .ok_or_else(|| file.error(format!("missing metadata key {}.attention.layer_norm_epsilon", hp.arch)))?,
    };
    // No RoPE anywhere: no dimension rotates, in the graph or in a K-shift.
    hp.rope.n_dims = 0;
    let recurrent: Vec<bool> = (0..hp.n_layer).map(|il| !hp.kv_layers[il] && !hp.ff_layers[il]).collect();
    // The attention layers are those with KV heads and no FFN (llama.cpp's filter_attn).
    hp.kv_layers = (0..hp.n_layer).map(|il| hp.kv_layers[il] && !hp.ff_layers[il]).collect();
    if hp.kv_layers.iter().any(|&a| a) && hp.n_head == 0 {
        return Err(file.error(format!("{}: attention layers without attention.head_count", hp.arch)).into());
    }
    if hp.n_expert > 0 {
        if m.opt_usize("expert_feed_forward_length")?.is_none() {
            hp.n_ff_exp = hp.n_ff / hp.n_expert_used;
        }
        if hp.n_ff_exp == 0 || hp.n_ff_shexp == 0 {
            return Err(file.error(format!("{}: experts need expert_feed_forward_length and expert_shared_feed_forward_length",
                                          hp.arch)).into());
        }
        hp.moe_gating = MoeGating::Sigmoid { norm: hp.opt_bool(file, "expert_weights_norm", false)? };
    }
    hp.rs = Some(mamba2_params(file, &hp.arch, recurrent)?);
    Ok(())
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let rs = hp.rs.as_ref().expect("set by hparams");
    let attn_parts = LayerParts { o_bias: true, ..LayerParts::PRE_NORM };
    let layers = (0..hp.n_layer)
        .map(|il| -> Result<LayerWeights> {
            let (recurrent, attends) = (rs.layers[il], hp.kv_layers[il]);
            Ok(LayerWeights {
                attn_norm: Some(ld.vector(&format!("blk.{il}.attn_norm.weight"), hp.n_embd)?),
                attn: if attends { Some(load_attention(ld, hp, &attn_parts, il)?) } else { None },
                rs: if recurrent { Some(RsWeights::Mamba2(Mamba2Weights::load(ld, rs, hp.n_embd, il, true)?)) } else { None },
                post_attn_norm: None,
                ffn_norm: None,
                ffn: if recurrent || attends { Ffn::None } else { load_ffn(ld, hp, il)? },
                post_ffn_norm: None, attn_out_norm: None, layer_out_norm: None,
                attn_norm_b: None, ffn_norm_b: None, latent: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    crate::model::load_embeddings_and_head(ld, hp, layers)
}

/// An FFN layer: experts (up/down, the selection bias, the shared expert, second scales), or
/// a dense up/down with optional biases and scales.
fn load_ffn(ld: &Loader, hp: &HParams, il: usize) -> Result<Ffn> {
    if hp.n_expert > 0 {
        let shared = Some(SharedParts { gated: false, sigmoid_gate: false, scales: true });
        let ep = ExpertParts { gated: false, scales: true, probs_b: true, shared, ..ExpertParts::ROUTED };
        return Ok(Ffn::Experts(load_experts(ld, hp, il, &ep)?));
    }
    let n = |s: &str| format!("blk.{il}.{s}");
    let n_ff = hp.n_ff;
    for m in ["ffn_up.weight", "ffn_down.weight"] {
        ld.skip_input_scale(&n(m), 1)?;
    }
    Ok(Ffn::Plain(PlainFfn {
        up: ld.matrix(&n("ffn_up.weight"), hp.n_embd, n_ff)?,
        down: ld.matrix(&n("ffn_down.weight"), n_ff, hp.n_embd)?,
        up_b: ld.opt_vector(&n("ffn_up.bias"), n_ff)?,
        down_b: ld.opt_vector(&n("ffn_down.bias"), hp.n_embd)?,
        up_s: ld.opt_scale(&n("ffn_up.weight"))?,
        down_s: ld.opt_scale(&n("ffn_down.weight"))?,
    }))
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    let hp = &model.hparams;
    let rs = hp.rs.as_ref().expect("set by hparams");
    let (n, d, eps) = (ub.tokens.len(), hp.n_embd, hp.rms_eps);
    embed(w, ws, ub, hp, 1.0, threads);
    for (il, lw) in w.layers.iter().enumerate() {
        if let Some(s) = ws.stats.as_deref_mut() {
            s.begin_layer(il);
        }
        pre_norm(ws, lw.attn_norm.as_deref(), eps, n, d);
        if let Some(RsWeights::Mamba2(m)) = &lw.rs {
            mamba2_mixer(rs, m, ws, &mut kv.rs, ub, il, eps, threads);
        } else if let Some(a) = &lw.attn {
            self_attention(hp, a, ws, kv, ub, il, threads);
        } else {
            let lora = ub.lora_layer(il);
            match &lw.ffn {
                Ffn::Plain(f) => plain_ffn(hp, f, ws, n, relu_sqr_inplace, lora, threads),
                Ffn::Experts(e) => crate::moe::moe_ffn(hp, e, ws, n, FfnAct::Ungated(relu_sqr_inplace), lora, threads),
                _ => unreachable!("a nemotron_h FFN layer is loaded with a plain FFN or experts"),
            }
            // llama.cpp adds the control vector to the FFN layers' output, before the residual.
            if let Some(cv) = ub.cvec {
                cv.apply(il, &mut ws.o[..n * d]);
            }
        }
        residual(ws, None, eps, 1.0, n, d);
    }
    output(hp, w, ws, ub, threads, logits);
}
