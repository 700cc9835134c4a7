//! Hyper-parameters read from the GGUF metadata (`{arch}.*` keys).

use ferrollama_gguf::{Array, GgufFile};
pub use ferrollama_kv::SwaType;

use crate::error::{EngineError, Result};
use crate::ops::RopeParams;

#[derive(Debug, Clone)]
pub struct HParams {
    pub arch: String,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// KV heads: the largest of any layer (every layer's but where `kv_heads_per_layer`).
    pub n_head_kv: usize,
    /// Per layer: its KV heads (head_count_kv, a scalar or per-layer array; 0 in layers
    /// without attention).
    pub n_head_kv_layers: Vec<usize>,
    /// Whether the architecture reads KV head counts per layer (Gemma 4's full layers have
    /// their own); the others refuse counts that differ between layers.
    pub kv_heads_per_layer: bool,
    pub n_ff: usize,
    /// Per-head key and value sizes (key_length / value_length; n_embd / n_head by default).
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// The sliding-window layers' head sizes and rotated dimensions (key_length_swa,
    /// value_length_swa, rope.dimension_count_swa: Gemma 4; the full layers' elsewhere).
    pub head_dim_k_swa: usize,
    pub head_dim_v_swa: usize,
    pub n_rot_swa: usize,
    /// Per layer: the layer whose cached K/V it attends over: itself, or for Gemma 4's shared
    /// KV layers an earlier layer of its kind (such a layer stores nothing).
    pub kv_source: Vec<usize>,
    /// Whether the sliding-window layers rotate with the model's frequency factors too (Gemma
    /// 4's `rope_freqs` belong to its full layers only).
    pub swa_rope_factors: bool,
    pub rms_eps: f32,
    /// The RoPE a context runs unless it overrides it (`rope_train` resolved with defaults).
    pub rope: RopeParams,
    /// RoPE as the file describes it, which a context resolves with its own parameters.
    pub rope_train: RopeTrain,
    /// Sliding-window size for the layers that have one (0: none).
    pub n_swa: usize,
    /// Per layer: does it attend through the sliding window?
    pub swa_layers: Vec<bool>,
    /// The window's rule: the last n_swa positions (Standard), or the positions of the
    /// token's own chunk of n_swa (Chunked: Llama 4).
    pub swa_kind: SwaType,
    /// RoPE base and scale of sliding-window layers (Gemma 3: rope.freq_base_swa, 10000 when
    /// absent, and a scale of 1).
    pub rope_freq_base_swa: f32,
    pub rope_freq_scale_swa: f32,
    /// Whether sliding-window layers rotate with that base and scale (llama.cpp's
    /// get_rope_freq_base / _scale) rather than the context's RoPE (EXAONE 4's graph).
    pub swa_own_rope: bool,
    /// Per layer: does it attend without RoPE (SmolLM3's every fourth layer, the global
    /// layers of Cohere 2 and EXAONE 4)? Its K is stored as projected; a K-shift still rotates
    /// it, as llama.cpp's does (its hparams.has_rope is true for those layers).
    pub nope_layers: Vec<bool>,
    /// The attention temperature (Mistral 3's `attention.temperature_scale`, Llama 4's fixed
    /// tuning of its layers without RoPE): Q multiplied per token after RoPE (None: no tuning).
    pub attn_temp: Option<AttnTemperature>,
    /// Scale applied to the attention scores (1/sqrt(head_dim) unless the architecture says).
    pub attn_scale: f32,
    /// tanh soft-capping of the final logits (0: none).
    pub final_logit_softcap: f32,
    /// tanh soft-capping of the attention scores (0: none; Gemma 2).
    pub attn_logit_softcap: f32,
    /// Experts of a mixture-of-experts FFN (0: a dense FFN), and how many each token uses.
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// Rows of each expert's up/gate matrices (expert_feed_forward_length, else n_ff).
    pub n_ff_exp: usize,
    /// Rows of the shared expert's up/gate matrices (expert_shared_feed_forward_length; 0: the
    /// architecture decides, or there is none).
    pub n_ff_shexp: usize,
    /// Leading layers whose FFN is dense before the experts' layers (llama.cpp's
    /// n_layer_dense_lead; set by the architectures that have them, 0 otherwise).
    pub n_layer_dense_lead: usize,
    /// Granite's multipliers: of the embeddings, of each block's output before the residual
    /// add, and the divisor of the logits (1 where a model has none).
    pub embedding_scale: f32,
    /// Whether `embedding_scale` also multiplies embeddings given as input (a batch of image
    /// embeddings): llama.cpp's build_inp_embd scales them by the file's multiplier (Granite),
    /// while the Gemma graphs scale token embeddings only.
    pub embedding_scale_raw: bool,
    pub residual_scale: f32,
    pub logit_scale: f32,
    /// LayerNorm epsilon (attention.layer_norm_epsilon; BERT).
    pub norm_eps: f32,
    /// The decoder's norms are LayerNorms (ggml_norm with norm_eps, then the weight and an
    /// optional bias) instead of RMSNorms (Cohere 2, StarCoder 2).
    pub layer_norm: bool,
    /// A multiplier of the logits (Cohere 2's logit_scale; 1: none).
    pub logit_multiplier: f32,
    /// The file's pooling type (llama_pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank),
    /// which a context uses unless told otherwise.
    pub pooling_type: u32,
    /// How the router's logits become expert weights.
    pub moe_gating: MoeGating,
    /// A multiplier of the expert weights (0 or 1: none).
    pub expert_weights_scale: f32,
    /// Context length the RoPE frequency factors were made for (LongRoPE chooses its long
    /// factors for a context per sequence above it).
    pub n_ctx_orig: usize,
    /// Per layer: does it attend (KV heads > 0; every layer of a model without per-layer
    /// head counts)?
    pub kv_layers: Vec<bool>,
    /// Per layer: does it have an FFN (feed_forward_length > 0)?
    pub ff_layers: Vec<bool>,
    /// The recurrent layers' sizes (hybrid and state-space models; None for the others).
    pub rs: Option<RsParams>,
    /// Multi-axis RoPE (`rope.dimension_sections`: Qwen2-VL's consecutive sections, Qwen3-VL's
    /// and Qwen3.5's interleaved ones): four positions per token (llama.cpp's n_pos_per_embd
    /// 4); None for the plain RoPE of the other models.
    pub mrope: Option<crate::ops::Mrope>,
    /// DeepStack layers (Qwen3-VL's `n_deepstack_layers`): an input embedding row holds the
    /// main embedding then one more per such layer, added to the output of layers 0, 1 ...
    /// (token embeddings add nothing); 0 for the other models.
    pub n_deepstack: usize,
    /// Multi-head latent attention's sizes (DeepSeek-V2/V3); None for the other models.
    pub latent: Option<LatentParams>,
    /// Expert groups (DeepSeek-V3's routing: the experts of the `n_group_used` groups with the
    /// best sums of their two best scores compete); 0 or 1: no groups.
    pub n_expert_groups: usize,
    pub n_group_used: usize,
}

/// Multi-head latent attention (llama.cpp's n_lora_q, n_lora_kv, n_embd_head_k_mla,
/// n_embd_head_v_mla). The cache's key and value sizes are `head_dim_k`/`head_dim_v` of
/// HParams: the latent and the rotated part with one KV head in a split file (`split`: the
/// absorbed products through attn_k_b/attn_v_b), each head's decompressed key and value in a
/// file with the joint attn_kv_b.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatentParams {
    /// Rank of Q's compression (0: Q projected directly by attn_q).
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    /// Each query head's size (the no-RoPE part then the n_rot rotated values) and each
    /// head's decompressed value size.
    pub head_dim_qk: usize,
    pub head_dim_v: usize,
    pub split: bool,
}

impl LatentParams {
    /// The no-RoPE part of a query head.
    pub fn nope(&self, n_rot: usize) -> usize { self.head_dim_qk - n_rot }
}

/// llama.cpp's attention temperature tuning (llm_graph_input_attn_temp): a token at position
/// p has its Q multiplied by log(floor((p + offset) / floor_scale) + 1) * scale + 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnTemperature {
    pub scale: f32,
    pub offset: f32,
    /// Positions per step of the logarithm (> 0).
    pub floor_scale: usize,
}

impl AttnTemperature {
    /// The multiplier of Q at position `pos`, as llama.cpp computes it: the floor in f32, the
    /// rest in double, rounded to f32.
    pub fn factor(&self, pos: i32) -> f32 {
        let steps = ((pos as f32 + self.offset) / self.floor_scale as f32).floor();
        ((steps as f64 + 1.0).ln() * self.scale as f64 + 1.0) as f32
    }
}

/// What the recurrent layers of a model keep per sequence, and their sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct RsParams {
    /// Per layer: is it recurrent (a state per sequence instead of K/V per token)?
    pub layers: Vec<bool>,
    /// Floats of a layer's convolution state (llama.cpp's n_embd_r).
    pub n_r: usize,
    /// Floats of a layer's recurrent (SSM / delta-net) state (llama.cpp's n_embd_s).
    pub n_s: usize,
    /// ssm.conv_kernel, ssm.inner_size, ssm.state_size, ssm.group_count, ssm.time_step_rank
    /// (the Mamba-2 head count); 0 where the family has none.
    pub d_conv: usize,
    pub d_inner: usize,
    pub d_state: usize,
    pub n_group: usize,
    pub dt_rank: usize,
}

/// How a mixture of experts weighs the experts it picks (llama_expert_gating_func_type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeGating {
    /// Top-k of the softmax of the logits, renormalized to sum 1 when `norm`.
    Softmax { norm: bool },
    /// Top-k of the logits, then a softmax over the chosen ones (gpt-oss).
    SoftmaxOfChosen,
    /// Top-k of the sigmoid of each logit, renormalized to sum 1 when `norm` (Nemotron-H MoE,
    /// LFM2-MoE).
    Sigmoid { norm: bool },
    /// Top-k of the logits themselves, weighted by their sigmoid, the weights multiplied into
    /// the experts' input rather than their output (Llama 4: build_moe_ffn's
    /// weight_before_ffn).
    SigmoidOfTopLogits,
}

impl MoeGating {
    /// The gating of `{arch}.expert_gating_func` (1 softmax, 2 sigmoid, as llama.cpp numbers
    /// them), the weights renormalized when `norm` (the graph's norm_w).
    pub fn from_func(file: &GgufFile, arch: &str, norm: bool) -> Result<MoeGating> {
        let key = format!("{arch}.expert_gating_func");
        let code = file.get(&key).map(|v| v.as_u64().ok_or_else(|| file.error(format!("{key} is not an integer"))))
            .transpose()?;
        match code {
            Some(1) => Ok(MoeGating::Softmax { norm }),
            Some(2) => Ok(MoeGating::Sigmoid { norm }),
            Some(c) => Err(EngineError::Unsupported(format!("{key} = {c} (supported: 1 softmax, 2 sigmoid)"))),
            None => Err(file.error(format!("missing metadata key {key}")).into()),
        }
    }
}

/// Typed access to `{arch}.KEY` with errors that name the key.
pub struct Meta<'a> {
    pub file: &'a GgufFile,
    pub arch: &'a str,
}

impl Meta<'_> {
    pub fn key(&self, k: &str) -> String { format!("{}.{k}", self.arch) }
    pub fn opt_usize(&self, k: &str) -> Result<Option<usize>> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) => usize::try_from(n).map(Some).map_err(|_| self.bad(&key, "too large")),
                // Some files store per-layer arrays (head_count_kv): take the first, check all equal.
                None => self.uniform_array(&key, v.as_array()).map(Some),
            },
        }
    }
    pub fn usize(&self, k: &str) -> Result<usize> {
        self.opt_usize(k)?.ok_or_else(|| self.file.error(format!("missing metadata key {}", self.key(k))).into())
    }
    pub fn opt_f32(&self, k: &str) -> Result<Option<f32>> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(|x| Some(x as f32)).ok_or_else(|| self.bad(&key, "not a number")),
        }
    }
    /// `{arch}.KEY` per layer: a scalar for every layer, or an array of n_layer values.
    pub fn layer_values(&self, k: &str, n_layer: usize) -> Result<Option<Vec<usize>>> {
        let key = self.key(k);
        let Some(v) = self.file.get(&key) else { return Ok(None) };
        if let Some(n) = v.as_u64() {
            return Ok(Some(vec![usize::try_from(n).map_err(|_| self.bad(&key, "too large"))?; n_layer]));
        }
        let vals = v.as_array().and_then(Array::to_i64_vec).ok_or_else(|| self.bad(&key, "not an integer"))?;
        if vals.len() != n_layer {
            return Err(self.bad(&key, &format!("{} values for {n_layer} layers", vals.len())));
        }
        vals.iter().map(|&x| usize::try_from(x).map_err(|_| self.bad(&key, "negative"))).collect::<Result<Vec<_>>>().map(Some)
    }
    /// `{arch}.KEY` as an array of n_layer numbers (Gemma 3n's activation_sparsity_scale).
    pub fn layer_f32s(&self, k: &str, n_layer: usize) -> Result<Option<Vec<f32>>> {
        let key = self.key(k);
        let Some(v) = self.file.get(&key) else { return Ok(None) };
        let vals = v.as_array().and_then(Array::to_f32_vec).ok_or_else(|| self.bad(&key, "not an array of numbers"))?;
        if vals.len() != n_layer {
            return Err(self.bad(&key, &format!("{} values for {n_layer} layers", vals.len())));
        }
        Ok(Some(vals))
    }
    fn uniform_array(&self, key: &str, a: Option<&Array>) -> Result<usize> {
        let vals = a.and_then(Array::to_i64_vec).ok_or_else(|| self.bad(key, "not an integer"))?;
        let first = *vals.first().ok_or_else(|| self.bad(key, "empty array"))?;
        if vals.iter().any(|&v| v != first) {
            return Err(EngineError::Unsupported(format!("{key}: per-layer values differ ({vals:?})")));
        }
        usize::try_from(first).map_err(|_| self.bad(key, "negative"))
    }
    pub fn bad(&self, key: &str, what: &str) -> EngineError {
        self.file.error(format!("metadata key {key}: {what}")).into()
    }
}

/// The one non-zero value of a per-layer array (0 where no layer has one); layers with
/// different non-zero values are not supported.
fn uniform_nonzero(m: &Meta, key: &str, vals: &[usize]) -> Result<usize> {
    let mut nz = vals.iter().copied().filter(|&v| v > 0);
    let first = nz.next().unwrap_or(0);
    if nz.any(|v| v != first) {
        return Err(EngineError::Unsupported(format!("{}: per-layer values differ ({vals:?})", m.key(key))));
    }
    Ok(first)
}

/// Refuse sizes no real model has, so a crafted file cannot size huge scratch buffers.
const MAX_DIM: usize = 1 << 20;

impl HParams {
    pub fn from_gguf(file: &GgufFile, arch: &str, n_vocab: usize) -> Result<HParams> {
        let m = Meta { file, arch };
        let n_embd = m.usize("embedding_length")?;
        let n_layer = m.usize("block_count")?;
        if n_embd == 0 || n_embd > MAX_DIM || n_layer == 0 || n_layer > MAX_DIM {
            return Err(file.error(format!("{arch}.embedding_length {n_embd} or block_count {n_layer} is out of range")).into());
        }
        // Per-layer arrays: a hybrid model marks its recurrent layers with 0 KV heads (and
        // Nemotron-H its FFN-only layers with 0 heads); a state-space model has no heads.
        let heads = m.layer_values("attention.head_count", n_layer)?;
        let heads_kv = m.layer_values("attention.head_count_kv", n_layer)?
            .unwrap_or_else(|| heads.clone().unwrap_or_else(|| vec![0; n_layer]));
        let ffs = m.layer_values("feed_forward_length", n_layer)?;
        let n_head = uniform_nonzero(&m, "attention.head_count", heads.as_deref().unwrap_or(&[]))?;
        // The largest count: layers of different non-zero counts are refused after the
        // architecture's own hyper-parameters, unless it reads them per layer (Gemma 4).
        let n_head_kv = heads_kv.iter().copied().max().unwrap_or(0);
        let n_ff = ffs.as_deref().unwrap_or(&[]).iter().copied().max().unwrap_or(0);
        for (name, v) in [("head_count", n_head), ("head_count_kv", n_head_kv), ("feed_forward_length", n_ff)] {
            if v > MAX_DIM {
                return Err(file.error(format!("{arch}.{name} = {v} is out of range")).into());
            }
        }
        if let Some(&h) = heads_kv.iter().find(|&&h| h > 0 && n_head % h != 0) {
            return Err(file.error(format!("head_count {n_head} is not a multiple of head_count_kv {h}")).into());
        }
        let n_head_div = n_head.max(1);
        let head_dim_k = m.opt_usize("attention.key_length")?.unwrap_or(n_embd / n_head_div);
        let head_dim_v = m.opt_usize("attention.value_length")?.unwrap_or(n_embd / n_head_div);
        let n_rot = m.opt_usize("rope.dimension_count")?.unwrap_or(head_dim_k);
        if n_rot > head_dim_k || n_rot % 2 != 0 || head_dim_k > MAX_DIM {
            return Err(file.error(format!("rope.dimension_count {n_rot} does not fit head size {head_dim_k}")).into());
        }
        let (rope, rope_train) = rope_params(&m, n_rot)?;
        let n_swa = m.opt_usize("attention.sliding_window")?.unwrap_or(0);
        let n_expert = m.opt_usize("expert_count")?.unwrap_or(0);
        let n_expert_used = m.opt_usize("expert_used_count")?.unwrap_or(0);
        if n_expert > 0 && (n_expert_used == 0 || n_expert_used > n_expert || n_expert > 4096) {
            return Err(file.error(format!("{arch}.expert_used_count {n_expert_used} does not fit expert_count {n_expert}")).into());
        }
        let n_ff_exp = m.opt_usize("expert_feed_forward_length")?.unwrap_or(n_ff);
        if (n_expert > 0 && n_ff_exp == 0) || n_ff_exp > MAX_DIM {
            return Err(file.error(format!("{arch}.expert_feed_forward_length = {n_ff_exp} is out of range")).into());
        }
        let n_ff_shexp = m.opt_usize("expert_shared_feed_forward_length")?.unwrap_or(0);
        if n_ff_shexp > MAX_DIM {
            return Err(file.error(format!("{arch}.expert_shared_feed_forward_length = {n_ff_shexp} is out of range")).into());
        }
        // DeepSeek-V3's choice of expert groups before experts (build_moe_ffn's n_expert_groups > 1).
        let n_expert_groups = m.opt_usize("expert_group_count")?.unwrap_or(0);
        let n_group_used = m.opt_usize("expert_group_used_count")?.unwrap_or(0);
        if n_expert_groups > 1 && (n_expert % n_expert_groups != 0 || n_expert / n_expert_groups < 2 || n_group_used == 0
                                   || n_group_used > n_expert_groups || n_expert_used > n_group_used * (n_expert / n_expert_groups)) {
            return Err(file.error(format!(
                "{arch}.expert_group_count {n_expert_groups} and expert_group_used_count {n_group_used} do not fit \
                 {n_expert} experts of which {n_expert_used} are used")).into());
        }
        Ok(HParams {
            arch: arch.to_string(),
            n_vocab,
            n_ctx_train: m.opt_usize("context_length")?.unwrap_or(2048),
            n_embd, n_layer, n_head, n_head_kv, n_head_kv_layers: heads_kv.clone(), kv_heads_per_layer: false,
            n_ff, head_dim_k, head_dim_v,
            head_dim_k_swa: head_dim_k, head_dim_v_swa: head_dim_v, n_rot_swa: n_rot,
            kv_source: (0..n_layer).collect(), swa_rope_factors: true,
            rms_eps: m.opt_f32("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
            rope,
            rope_train,
            n_swa,
            swa_layers: vec![false; n_layer],
            swa_kind: SwaType::Standard,
            nope_layers: vec![false; n_layer],
            attn_temp: None,
            swa_own_rope: true,
            layer_norm: false,
            logit_multiplier: 1.0,
            rope_freq_base_swa: m.opt_f32("rope.freq_base_swa")?.unwrap_or(10000.0),
            rope_freq_scale_swa: 1.0,
            attn_scale: 1.0 / (head_dim_k.max(1) as f32).sqrt(),
            kv_layers: heads_kv.iter().map(|&h| h > 0).collect(),
            ff_layers: match &ffs { Some(v) => v.iter().map(|&f| f > 0).collect(), None => vec![false; n_layer] },
            rs: None,
            mrope: None,
            n_deepstack: 0,
            latent: None,
            n_expert_groups,
            n_group_used,
            final_logit_softcap: m.opt_f32("final_logit_softcapping")?.unwrap_or(0.0),
            attn_logit_softcap: m.opt_f32("attn_logit_softcapping")?.unwrap_or(0.0),
            n_expert, n_expert_used, n_ff_exp, n_ff_shexp,
            n_layer_dense_lead: 0,
            embedding_scale: 1.0,
            embedding_scale_raw: false,
            residual_scale: 1.0,
            logit_scale: 1.0,
            n_ctx_orig: rope.n_ctx_orig,
            moe_gating: MoeGating::Softmax { norm: true },
            expert_weights_scale: m.opt_f32("expert_weights_scale")?.unwrap_or(0.0),
            norm_eps: m.opt_f32("attention.layer_norm_epsilon")?.unwrap_or(1e-5),
            pooling_type: m.opt_usize("pooling_type")?.unwrap_or(0) as u32,
        })
    }

    /// A per-architecture number `{arch}.KEY` (e.g. Granite's embedding_scale), or `default`.
    pub fn opt_f32(&self, file: &GgufFile, key: &str, default: f32) -> Result<f32> {
        Ok(Meta { file, arch: &self.arch }.opt_f32(key)?.unwrap_or(default))
    }

    /// A per-architecture boolean `{arch}.KEY`, or `default`.
    pub fn opt_bool(&self, file: &GgufFile, key: &str, default: bool) -> Result<bool> {
        let full = format!("{}.{key}", self.arch);
        match file.get(&full) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| file.error(format!("metadata key {full}: not a boolean")).into()),
        }
    }

    /// A per-architecture number that must be present.
    pub fn f32(&self, file: &GgufFile, key: &str) -> Result<f32> {
        Meta { file, arch: &self.arch }.opt_f32(key)?
            .ok_or_else(|| file.error(format!("missing metadata key {}.{key}", self.arch)).into())
    }

    /// Marks the sliding-window layers as llama.cpp's load_swa_pattern does: a per-layer bool
    /// array `attention.sliding_window_pattern`, or a period n (default `default_period`) where
    /// every layer but the last of each period slides.
    pub fn load_swa_pattern(&mut self, file: &GgufFile, default_period: usize) -> Result<()> {
        if self.n_swa == 0 {
            return Ok(());
        }
        let key = format!("{}.attention.sliding_window_pattern", self.arch);
        match file.get(&key) {
            Some(v) if v.as_array().is_some() => {
                let flags = v.as_array().and_then(Array::to_i64_vec)
                    .ok_or_else(|| file.error(format!("{key} is not an array of booleans")))?;
                if flags.len() != self.n_layer {
                    return Err(file.error(format!("{key} has {} entries for {} layers", flags.len(), self.n_layer)).into());
                }
                self.swa_layers = flags.iter().map(|&f| f != 0).collect();
            }
            other => {
                let period = match other {
                    Some(v) => v.as_u64().ok_or_else(|| file.error(format!("{key} is not an integer")))? as usize,
                    None => default_period,
                };
                self.swa_layers = (0..self.n_layer).map(|il| period == 0 || il % period < period - 1).collect();
            }
        }
        Ok(())
    }

    /// RoPE parameters of layer `il`'s graph in a context running `rope`: the sliding-window
    /// layers' own (`swa_rope`) where the model rotates them so, else the context's.
    pub fn layer_rope(&self, rope: &RopeParams, il: usize) -> RopeParams {
        if self.swa_own_rope { self.swa_rope(rope, il) } else { *rope }
    }

    /// RoPE parameters of layer `il` as llama.cpp's get_rope_freq_base / _scale give them:
    /// sliding-window layers keep their own base and scale (the context's parameters do not
    /// override them) and rotate their own n_rot_swa dimensions (Gemma 4). llama.cpp's
    /// K-shift rotates by these even where the graph does not (EXAONE 4, Cohere 2).
    pub fn swa_rope(&self, rope: &RopeParams, il: usize) -> RopeParams {
        if self.is_swa(il) {
            RopeParams { freq_base: self.rope_freq_base_swa, freq_scale: self.rope_freq_scale_swa, n_dims: self.n_rot_swa, ..*rope }
        } else {
            *rope
        }
    }

    /// The frequency factors layer il rotates with, of the model's `factors`.
    pub fn layer_rope_factors<'f>(&self, il: usize, factors: Option<&'f [f32]>) -> Option<&'f [f32]> {
        if self.is_swa(il) && !self.swa_rope_factors { None } else { factors }
    }

    /// The sizes an attention-only architecture needs: heads in every layer, an FFN width
    /// (a recurrent architecture reads its own layer kinds).
    pub fn check_attention_only(&self, file: &GgufFile) -> Result<()> {
        for (name, v) in [("head_count", self.n_head), ("head_count_kv", self.n_head_kv), ("feed_forward_length", self.n_ff)] {
            if v == 0 {
                return Err(file.error(format!("{}.{name} = {v} is out of range", self.arch)).into());
            }
        }
        if !self.kv_layers.iter().all(|&k| k) || !self.ff_layers.iter().all(|&f| f) {
            return Err(EngineError::Unsupported(format!("{}: layers without attention heads or FFN", self.arch)));
        }
        Ok(())
    }

    /// Whether layer il attends through the sliding window.
    pub fn is_swa(&self, il: usize) -> bool { self.swa_layers.get(il).copied().unwrap_or(false) }

    /// Layer il's per-head key and value sizes.
    pub fn head_dim_k_of(&self, il: usize) -> usize { if self.is_swa(il) { self.head_dim_k_swa } else { self.head_dim_k } }
    pub fn head_dim_v_of(&self, il: usize) -> usize { if self.is_swa(il) { self.head_dim_v_swa } else { self.head_dim_v } }

    /// Layer il's KV heads.
    pub fn n_head_kv_of(&self, il: usize) -> usize {
        if self.kv_heads_per_layer { self.n_head_kv_layers[il] } else { self.n_head_kv }
    }

    /// Layer il's cache row shape.
    pub fn kv_geom(&self, il: usize) -> crate::kvstore::KvGeom {
        crate::kvstore::KvGeom { n_head_kv: self.n_head_kv_of(il), head_dim_k: self.head_dim_k_of(il), head_dim_v: self.head_dim_v_of(il) }
    }

    /// Refuses KV head counts that differ between layers (zeros aside: layers without
    /// attention), unless the architecture reads them per layer.
    pub fn check_kv_heads(&self) -> Result<()> {
        if self.kv_heads_per_layer {
            return Ok(());
        }
        let mut nz = self.n_head_kv_layers.iter().copied().filter(|&h| h > 0);
        let first = nz.next().unwrap_or(0);
        if nz.any(|h| h != first) {
            return Err(EngineError::Unsupported(format!(
                "{}.attention.head_count_kv: per-layer values differ ({:?})", self.arch, self.n_head_kv_layers)));
        }
        Ok(())
    }

    /// Layers from `n_kv` on attend over the K/V of the last layer of their kind before
    /// `n_kv` and store none (llama.cpp's layer_reuse_cb of Gemma 3n and Gemma 4: a sliding
    /// layer over layer n_kv - 2, a full one over n_kv - 1). Refused where that layer is of
    /// the other kind or has other KV heads (llama.cpp would read a cache it does not have).
    pub fn share_kv_from(&mut self, n_kv: usize) -> Result<()> {
        for il in n_kv..self.n_layer {
            let src = n_kv.checked_sub(if self.is_swa(il) { 2 } else { 1 });
            let Some(src) = src.filter(|&s| self.is_swa(s) == self.is_swa(il) && self.n_head_kv_of(s) == self.n_head_kv_of(il)) else {
                return Err(EngineError::Unsupported(format!(
                    "{}: shared-KV layer {il} would attend over layer {src:?}, missing or of another attention kind or KV head count",
                    self.arch)));
            };
            self.kv_source[il] = src;
        }
        Ok(())
    }

    /// Whether layer il keeps K/V of its own (it attends, and not over an earlier layer's).
    pub fn stores_kv(&self, il: usize) -> bool { self.kv_layers[il] && self.kv_source[il] == il }

    /// The largest per-head key / value sizes and rotated dimensions of any layer (scratch sizes).
    pub fn max_head_dim_k(&self) -> usize { self.head_dim_k.max(self.head_dim_k_swa) }
    pub fn max_head_dim_v(&self) -> usize { self.head_dim_v.max(self.head_dim_v_swa) }
    pub fn max_n_rot(&self) -> usize { self.rope.n_dims.max(self.n_rot_swa) }

    /// The sliding window's parameters for the KV cache's masks and cell reuse.
    pub fn swa_params(&self) -> ferrollama_kv::SwaParams {
        ferrollama_kv::SwaParams { n_swa: self.n_swa as u32, kind: self.swa_kind }
    }

    pub fn has_swa(&self) -> bool { self.n_swa > 0 && self.swa_layers.iter().any(|&s| s) }

    /// Placeholder hyper-parameters of a vocabulary-only file (no weights to run).
    pub fn vocab_only(arch: &str, n_vocab: usize) -> HParams {
        HParams {
            arch: arch.to_string(), n_vocab, n_ctx_train: 0, n_embd: 0, n_layer: 0, n_head: 1, n_head_kv: 1,
            n_head_kv_layers: Vec::new(), kv_heads_per_layer: false, n_ff: 0,
            head_dim_k: 0, head_dim_v: 0, head_dim_k_swa: 0, head_dim_v_swa: 0, n_rot_swa: 0, kv_source: Vec::new(),
            swa_rope_factors: true, rms_eps: 0.0,
            rope: RopeParams { n_dims: 0, neox: false, freq_base: 10000.0, freq_scale: 1.0, ext_factor: 0.0,
                attn_factor: 1.0, beta_fast: 32.0, beta_slow: 1.0, n_ctx_orig: 0 },
            rope_train: RopeTrain { freq_base: 10000.0, freq_scale: 1.0, scaling: RopeScaling::Linear, attn_factor: 1.0,
                yarn_log_mul: 0.0, yarn_mscale: 1.0, beta_fast: 32.0, beta_slow: 1.0, n_ctx_orig: 0 },
            n_swa: 0, swa_layers: Vec::new(), swa_kind: SwaType::Standard, nope_layers: Vec::new(), attn_temp: None, swa_own_rope: true,
            layer_norm: false, logit_multiplier: 1.0, rope_freq_base_swa: 10000.0, rope_freq_scale_swa: 1.0, attn_scale: 1.0, final_logit_softcap: 0.0,
            attn_logit_softcap: 0.0, n_expert: 0, n_expert_used: 0, n_ff_exp: 0, n_ff_shexp: 0, n_layer_dense_lead: 0,
            embedding_scale: 1.0, embedding_scale_raw: false, residual_scale: 1.0, logit_scale: 1.0, n_ctx_orig: 0,
            moe_gating: MoeGating::Softmax { norm: true }, expert_weights_scale: 0.0,
            norm_eps: 1e-5, pooling_type: 0, kv_layers: Vec::new(), ff_layers: Vec::new(), rs: None, mrope: None, n_deepstack: 0,
            latent: None, n_expert_groups: 0, n_group_used: 0,
        }
    }

    /// Query heads per KV head.
    pub fn gqa(&self) -> usize { self.n_head / self.n_head_kv }
    /// The width of an input embedding row (llama_model_n_embd_inp): n_embd, and n_embd more
    /// per DeepStack layer.
    pub fn n_embd_inp(&self) -> usize { self.n_embd * (1 + self.n_deepstack) }
    pub fn n_embd_k_gqa(&self) -> usize { self.head_dim_k * self.n_head_kv }
    pub fn n_embd_v_gqa(&self) -> usize { self.head_dim_v * self.n_head_kv }
}

fn rope_params(m: &Meta, n_rot: usize) -> Result<(RopeParams, RopeTrain)> {
    // llama.cpp reads the type with "linear" as its default, and the factor (or the older
    // rope.scale_linear) whatever the type.
    let scaling_name = m.file.get_str(&format!("{}.rope.scaling.type", m.arch)).unwrap_or("linear").to_string();
    let scaling = RopeScaling::from_name(&scaling_name).ok_or_else(|| EngineError::Unsupported(format!(
        "{}.rope.scaling.type '{scaling_name}' (known: none, linear, yarn, longrope)", m.arch)))?;
    let factor = match m.opt_f32("rope.scaling.factor")? {
        Some(f) => f,
        None => m.opt_f32("rope.scale_linear")?.unwrap_or(0.0),
    };
    let freq_scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
    if !(freq_scale.is_finite() && freq_scale > 0.0) {
        return Err(m.bad(&m.key("rope.scaling.factor"), "not a positive number"));
    }
    let train = RopeTrain {
        freq_base: m.opt_f32("rope.freq_base")?.unwrap_or(10000.0),
        freq_scale,
        scaling,
        attn_factor: m.opt_f32("rope.scaling.attn_factor")?.unwrap_or(1.0),
        yarn_log_mul: m.opt_f32("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0),
        yarn_mscale: 1.0,
        beta_fast: m.opt_f32("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
        beta_slow: m.opt_f32("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
        n_ctx_orig: m.opt_usize("rope.scaling.original_context_length")?
            .or(m.opt_usize("context_length")?).unwrap_or(2048),
    };
    let base = RopeParams { n_dims: n_rot, neox: false, freq_base: 0.0, freq_scale: 1.0, ext_factor: 0.0,
                            attn_factor: 1.0, beta_fast: 32.0, beta_slow: 1.0, n_ctx_orig: 0 };
    Ok((train.resolve(&base, &RopeOverrides::default())?, train))
}

/// RoPE scaling types (llama_rope_scaling_type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeScaling { None, Linear, Yarn, LongRope }

impl RopeScaling {
    pub fn from_name(name: &str) -> Option<RopeScaling> {
        Some(match name {
            "none" => RopeScaling::None,
            "linear" => RopeScaling::Linear,
            "yarn" => RopeScaling::Yarn,
            "longrope" => RopeScaling::LongRope,
            _ => return None,
        })
    }
}

/// RoPE as the file describes it (llama.cpp's `*_train` hyper-parameters).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeTrain {
    pub freq_base: f32,
    /// 1 / rope.scaling.factor (1 without a factor), whatever the scaling type.
    pub freq_scale: f32,
    pub scaling: RopeScaling,
    /// rope.scaling.attn_factor, multiplied into the context's attention factor.
    pub attn_factor: f32,
    pub yarn_log_mul: f32,
    /// YaRN's `mscale` over `mscale_all_dim` (= yarn_log_mul): 1 as llama.cpp assumes, except
    /// for DeepSeek-V2, whose mscale equals its mscale_all_dim when that is not 1.
    pub yarn_mscale: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub n_ctx_orig: usize,
}

/// A context's own RoPE parameters (llama_context_params): 0, negative and None mean "the
/// model's value".
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeOverrides {
    pub scaling: Option<RopeScaling>,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub yarn_ext_factor: f32,
    pub yarn_attn_factor: f32,
    pub yarn_beta_fast: f32,
    pub yarn_beta_slow: f32,
    pub yarn_orig_ctx: usize,
}

impl Default for RopeOverrides {
    fn default() -> Self {
        RopeOverrides { scaling: None, freq_base: 0.0, freq_scale: 0.0, yarn_ext_factor: -1.0, yarn_attn_factor: -1.0,
                        yarn_beta_fast: -1.0, yarn_beta_slow: -1.0, yarn_orig_ctx: 0 }
    }
}

impl RopeTrain {
    /// The RoPE a context runs, as llama_context's constructor computes its cparams: a type of
    /// "none" never scales, YaRN extrapolates (ext_factor 1) and sets its attention factor.
    /// `base` gives what the file does not (rotated dims, NEOX mode).
    pub fn resolve(&self, base: &RopeParams, o: &RopeOverrides) -> Result<RopeParams> {
        let pick = |given: f32, model: f32| if given >= 0.0 { given } else { model };
        let scaling = o.scaling.unwrap_or(self.scaling);
        let freq_base = if o.freq_base != 0.0 { o.freq_base } else { self.freq_base };
        let mut freq_scale = if o.freq_scale != 0.0 { o.freq_scale } else { self.freq_scale };
        if scaling == RopeScaling::None {
            freq_scale = 1.0;
        }
        if !(freq_base.is_finite() && freq_base > 0.0 && freq_scale.is_finite() && freq_scale > 0.0) {
            return Err(EngineError::InvalidArgument(format!(
                "RoPE frequency base {freq_base} and scale {freq_scale} must be positive numbers")));
        }
        let mut ext_factor = o.yarn_ext_factor;
        if ext_factor < 0.0 {
            ext_factor = if scaling == RopeScaling::Yarn { 1.0 } else { 0.0 };
        }
        // llama.cpp's hparams.yarn_attn_factor is 1 for the architectures supported.
        let mut attn_factor = pick(o.yarn_attn_factor, 1.0);
        if ext_factor != 0.0 {
            attn_factor = yarn_attn_factor(1.0 / freq_scale, self.yarn_mscale, self.yarn_log_mul);
        }
        Ok(RopeParams {
            freq_base,
            freq_scale,
            ext_factor,
            attn_factor: attn_factor * self.attn_factor,
            beta_fast: pick(o.yarn_beta_fast, self.beta_fast),
            beta_slow: pick(o.yarn_beta_slow, self.beta_slow),
            n_ctx_orig: if o.yarn_orig_ctx != 0 { o.yarn_orig_ctx } else { self.n_ctx_orig },
            ..*base
        })
    }
}

/// llama_context's YaRN attention factor before rope.scaling.attn_factor: the magnitude
/// scale of YaRN (get_mscale), divided by the one ggml's rope_yarn multiplies in again.
fn yarn_attn_factor(factor: f32, yarn_mscale: f32, log_mul: f32) -> f32 {
    let mscale = |scale: f32, m: f32| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
    let f = if log_mul != 0.0 { mscale(factor, yarn_mscale) / mscale(factor, log_mul) } else { mscale(factor, 1.0) };
    f * (1.0 / (1.0 + 0.1 * factor.ln()))
}

#[cfg(test)]
mod tests {
    use super::AttnTemperature;

    #[test]
    fn llama4_temperature_steps_every_floor_scale_positions() {
        let t = AttnTemperature { scale: 0.1, offset: 1.0, floor_scale: 8192 };
        assert_eq!(t.factor(0), 1.0);
        assert_eq!(t.factor(8190), 1.0);
        assert_eq!(t.factor(8191), (2f64.ln() * 0.1 + 1.0) as f32);
        assert_eq!(t.factor(100 * 8192 - 1), (101f64.ln() * 0.1 + 1.0) as f32);
    }

    /// Llama 4's temperature: 1 for the first floor_scale positions, then
    /// 1 + scale · ln(k + 1) for the k-th step.
    #[test]
    fn attention_temperature_steps_every_floor_scale_positions() {
        let t = AttnTemperature { scale: 0.5, offset: 0.0, floor_scale: 16 };
        assert_eq!(t.factor(0), 1.0);
        assert_eq!(t.factor(15), 1.0);
        assert_eq!(t.factor(16), (2f64.ln() * 0.5 + 1.0) as f32);
        assert_eq!(t.factor(47), (3f64.ln() * 0.5 + 1.0) as f32);
    }
}
