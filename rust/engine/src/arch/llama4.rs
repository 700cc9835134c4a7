//! Llama 4 (`llama4`, llama.cpp's src/models/llama4.cpp): pre-norm blocks, normal (pairwise)
//! RoPE with Llama 3's frequency factors where the file has them, and an interleaved cache:
//! three blocks of chunked attention (a token sees only its own chunk of 8192 positions) to one
//! of full attention (`attention.sliding_window_pattern`, 4 by default). The last block of
//! every four has no RoPE: its queries are multiplied by the attention temperature of their
//! position instead (log(floor((p + 1) / 8192) + 1) · 0.1 + 1); the other blocks normalize Q
//! and K per head without weights after RoPE (Llama4TextL2Norm; not in the 128-expert
//! model). Every `interleave_moe_layer_step`-th block's FFN is a mixture of experts: each
//! token's top expert by its router logit, that logit's sigmoid multiplied into the expert's
//! input, and a shared expert beside it; the others' FFNs are dense. All SwiGLU.
//!
//! llama.cpp fixes the chunk, the temperature's floor scale, its scale and offset whatever the
//! file says (llama_model_llama4::load_arch_hparams); a file whose `attention.sliding_window`
//! is 0 asks for no chunking, where llama.cpp's graph asserts on the missing temperature: refused.
//! A K-shift (context shift) re-rotates the keys of every block, the no-RoPE ones included, as
//! llama.cpp's does (its llama4 loader leaves rope_pattern at "every layer has RoPE").

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{attend, pre_norm_blocks, project_qkv, rope_layer, store_kv, temper_q};
use crate::arch::ArchInfo;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{AttnTemperature, HParams, Meta, MoeGating, SwaType};
use crate::kvstore::KvStore;
use crate::model::{load_attention, load_embeddings_and_head, load_experts, load_gated, load_rope_factors, AttnWeights, ExpertParts,
                   Ffn, LayerParts, LayerWeights, Loader, Model, SharedParts, Weights};
use crate::ops::rms_norm_unweighted_inplace;

pub const LLAMA4: ArchInfo = ArchInfo { name: "llama4", rope_neox: false, hparams, load, forward, encoder: false };

/// Llama 3's `rope_freqs` may come with the file; no other optional part.
const PARTS: LayerParts = LayerParts { rope_freqs: true, ..LayerParts::PRE_NORM };

/// Experts with a gated shared expert as wide as one of them; no second scales (the graph
/// passes none).
const EXPERT_PARTS: ExpertParts =
    ExpertParts { shared: Some(SharedParts { gated: true, sigmoid_gate: false, scales: false }), ..ExpertParts::ROUTED };

/// llama.cpp's chunk of positions, and the temperature's floor scale.
const CHUNK: usize = 8192;
/// The last block of every this many has no RoPE (llama_hparams::n_no_rope_layer_step).
const NO_ROPE_STEP: usize = 4;

fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    let arch = hp.arch.clone();
    let m = Meta { file, arch: &arch };
    hp.rms_eps = hp.f32(file, "attention.layer_norm_rms_epsilon")?;
    if m.opt_usize("attention.sliding_window")? == Some(0) {
        return Err(EngineError::Unsupported(format!(
            "{arch}: attention.sliding_window 0 (no chunked attention: llama.cpp's graph then lacks the temperature of its no-RoPE layers)")));
    }
    if hp.n_expert == 0 {
        return Err(EngineError::Unsupported(format!("{arch}: a model without experts (llama.cpp refuses it)")));
    }
    m.usize("expert_feed_forward_length")?;
    hp.n_ff_shexp = hp.n_ff_exp;
    if hp.rope.n_dims != hp.head_dim_k || hp.head_dim_k != hp.head_dim_v {
        return Err(file.error(format!("{arch}: rope.dimension_count {} and heads of {}/{} values (llama.cpp asserts they agree)",
                                      hp.rope.n_dims, hp.head_dim_k, hp.head_dim_v)).into());
    }
    hp.n_swa = CHUNK;
    hp.swa_kind = SwaType::Chunked;
    hp.load_swa_pattern(file, NO_ROPE_STEP)?;
    hp.rope_freq_base_swa = hp.opt_f32(file, "rope.freq_base_swa", hp.rope_train.freq_base)?;
    hp.rope_freq_scale_swa = hp.rope_train.freq_scale;
    hp.attn_temp = Some(AttnTemperature { scale: 0.1, offset: 1.0, floor_scale: CHUNK as usize });
    hp.moe_gating = MoeGating::SigmoidOfTopLogits;
    // llama.cpp's llama4 loader reads neither expert_weights_scale nor attention.scale
    hp.expert_weights_scale = 0.0;
    Ok(())
}

/// Whether block il rotates Q and K (the others scale Q by the attention temperature).
fn uses_rope(il: usize) -> bool {
    (il + 1) % NO_ROPE_STEP != 0
}

/// The L2 norm of Q and K on the RoPE blocks (llama.cpp: every model but the 128-expert one).
fn uses_kq_norm(hp: &HParams) -> bool {
    hp.n_expert != 128
}

fn load(ld: &Loader, hp: &HParams) -> Result<Weights> {
    let step = Meta { file: ld.file(), arch: &hp.arch }.usize("interleave_moe_layer_step")?;
    let layers = (0..hp.n_layer).map(|il| load_layer(ld, hp, il, step > 0 && (il + 1) % step == 0)).collect::<Result<Vec<_>>>()?;
    let mut w = load_embeddings_and_head(ld, hp, layers)?;
    w.rope_factors = load_rope_factors(ld, hp, &PARTS)?;
    Ok(w)
}

fn load_layer(ld: &Loader, hp: &HParams, il: usize, moe: bool) -> Result<LayerWeights> {
    let norm = |name: &str| ld.vector(&format!("blk.{il}.{name}"), hp.n_embd);
    let ffn = if moe { Ffn::Experts(load_experts(ld, hp, il, &EXPERT_PARTS)?) } else { Ffn::Gated(load_gated(ld, hp, &PARTS, il)?) };
    Ok(LayerWeights {
        attn_norm: Some(norm("attn_norm.weight")?),
        attn: Some(load_attention(ld, hp, &PARTS, il)?),
        rs: None,
        post_attn_norm: None,
        ffn_norm: Some(norm("ffn_norm.weight")?),
        ffn,
        post_ffn_norm: None,
        attn_out_norm: None,
        layer_out_norm: None,
        latent: None,
        attn_norm_b: None, ffn_norm_b: None,
    })
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, logits: &mut [f32]) {
    let hp = &model.hparams;
    pre_norm_blocks(model, w, ws, kv, ub, threads, logits, |lw, ws, kv, il| attention(hp, lw.attn(), ws, kv, ub, il, threads));
}

/// Block il's attention: Q/K/V; RoPE then the L2 norms of Q and K, or (no RoPE) Q times the
/// temperature of each token's position; the K/V store; attention and its output projection.
fn attention(hp: &HParams, a: &AttnWeights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, il: usize, threads: &Threads) {
    let n = ub.tokens.len();
    let (q_dim, k_dim) = (a.wq.rows, a.wk.rows);
    project_qkv(a, ws, n, ub.lora_layer(il), threads);
    if uses_rope(il) {
        rope_layer(hp, a, ws, ub, il);
        if uses_kq_norm(hp) {
            rms_norm_unweighted_inplace(&mut ws.q[..n * q_dim], hp.head_dim_k, hp.rms_eps);
            rms_norm_unweighted_inplace(&mut ws.k[..n * k_dim], hp.head_dim_k, hp.rms_eps);
        }
    } else {
        temper_q(hp, ws, ub);
    }
    store_kv(a, ws, kv, ub, il);
    attend(hp, a, ws, kv, ub, il, hp.attn_scale, 0.0, threads);
}
