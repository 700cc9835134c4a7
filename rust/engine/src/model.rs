//! A model: the file, its hyper-parameters, its weights (views into the map) and its vocabulary.

use std::path::Path;
use std::sync::Arc;

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::{GgmlType, QMatrix};
use ferrollama_vocab::{Vocab, VocabError};

use crate::arch::{arch_info, ArchInfo};
use crate::error::{EngineError, Result};
use crate::hparams::HParams;
pub(crate) use crate::weights::Loader;

/// The weights of one decoder block. Optional tensors are those only some architectures have;
/// an architecture loads only those its graph applies (see `LayerParts`). A block mixes its
/// tokens by attention, by a recurrent mixer (hybrid and state-space models), or both in
/// parallel (Falcon-H1); some blocks of Nemotron-H have neither, only their FFN.
pub struct LayerWeights {
    /// RMSNorm before the mixer (OLMo 2 has none).
    pub attn_norm: Option<Vec<f32>>,
    /// The biases of the pre-norms, where they are LayerNorms with biases (StarCoder 2).
    pub attn_norm_b: Option<Vec<f32>>,
    pub ffn_norm_b: Option<Vec<f32>>,
    pub attn: Option<AttnWeights>,
    /// The recurrent mixer (see `recurrent`).
    pub rs: Option<crate::recurrent::RsWeights>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Option<Vec<f32>>,
    pub ffn: Ffn,
    pub post_ffn_norm: Option<Vec<f32>>,
    /// BERT's LayerNorms after the attention's and the FFN's residual adds.
    pub attn_out_norm: Option<LayerNorm>,
    pub layer_out_norm: Option<LayerNorm>,
    /// Multi-head latent attention (DeepSeek-V2/V3: `arch::latent`), instead of `attn`.
    pub latent: Option<Box<crate::arch::latent::LatentAttnWeights>>,
}

/// The attention of a block: Q/K/V/O projections and what goes with them.
pub struct AttnWeights {
    pub wq: QMatrix,
    pub wk: QMatrix,
    pub wv: QMatrix,
    pub wo: QMatrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub bo: Option<Vec<f32>>,
    /// The second scales of Q, K, V and the output projection (see `ProjScales`).
    pub scales: ProjScales,
    /// RMSNorm of Q and K: per head (head_dim values: Qwen 3, Gemma 3) or over the whole
    /// projection (OLMo 2).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Per-head attention sinks (gpt-oss): a logit that takes part in each softmax.
    pub sinks: Option<Vec<f32>>,
}

impl LayerWeights {
    /// The block's attention; the architectures call the attention blocks only on blocks that
    /// have one (their loaders build them so).
    pub fn attn(&self) -> &AttnWeights {
        self.attn.as_ref().expect("an attention step on a block the architecture loaded without attention")
    }
}

/// Per-tensor second scales of the attention projections (`NAME.scale`, one f32: an NVFP4
/// conversion's `weight_scale_2`, though llama.cpp reads them whatever the type): each
/// product is multiplied by its scale before the adapters' terms and the bias are added
/// (llama.cpp's build_lora_mm). A fused `attn_qkv`'s scale is Q's, K's and V's.
#[derive(Default, Clone, Copy)]
pub struct ProjScales {
    pub q: Option<f32>,
    pub k: Option<f32>,
    pub v: Option<f32>,
    pub o: Option<f32>,
}

/// The weights and biases of a LayerNorm.
pub struct LayerNorm {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
}

/// What an encoder (BERT) adds to the token embeddings before its first layer.
pub struct EncoderInputs {
    /// Learned position embeddings (BERT; nomic-bert rotates instead).
    pub pos_embd: Option<QMatrix>,
    /// The first token type's embedding (llama.cpp gives every token type 0).
    pub type_row0: Option<Vec<f32>>,
    pub norm: LayerNorm,
}

/// A block's feed-forward network.
pub enum Ffn {
    /// down(act(gate·x) * up·x), with optional biases.
    Gated(GatedFfn),
    /// A mixture of experts: each token through the experts its router picks.
    Experts(Experts),
    /// down(act(up·x + b_up)) + b_down, not gated (BERT's GELU).
    Plain(PlainFfn),
    /// No FFN (a Mamba-2 block is its mixer alone).
    None,
}

pub struct PlainFfn {
    pub up: QMatrix,
    pub down: QMatrix,
    pub up_b: Option<Vec<f32>>,
    pub down_b: Option<Vec<f32>>,
    /// Second scales (Nemotron-H's MLP), multiplied in after the bias, as build_ffn does.
    pub up_s: Option<f32>,
    pub down_s: Option<f32>,
}

pub struct GatedFfn {
    pub gate: QMatrix,
    pub up: QMatrix,
    pub down: QMatrix,
    pub gate_b: Option<Vec<f32>>,
    pub up_b: Option<Vec<f32>>,
    pub down_b: Option<Vec<f32>>,
    /// Second scales (`NAME.scale`), for the architectures whose llama.cpp graph passes them
    /// to build_ffn: multiplied in after the adapters' terms and the bias.
    pub gate_s: Option<f32>,
    pub up_s: Option<f32>,
    pub down_s: Option<f32>,
}

/// The experts of a layer: views of the rows of the 3-D expert tensors (no copy), one
/// matrix per expert, and the router.
pub struct Experts {
    /// n_expert rows: the router's logit of each expert.
    pub router: QMatrix,
    pub router_b: Option<Vec<f32>>,
    /// The selection bias (`exp_probs_b.bias`, DeepSeek-V3's): added to the probabilities to
    /// choose the experts, not to the weights they get.
    pub probs_b: Option<Vec<f32>>,
    /// None: experts of up and down only (Nemotron-H's squared ReLU of the up projection).
    pub gate: Option<Vec<QMatrix>>,
    pub up: Vec<QMatrix>,
    pub down: Vec<QMatrix>,
    /// Biases, n_expert rows each (gpt-oss).
    pub gate_b: Option<Vec<f32>>,
    pub up_b: Option<Vec<f32>>,
    pub down_b: Option<Vec<f32>>,
    /// Second scales, one per expert (`NAME.scale`), for the architectures whose llama.cpp
    /// graph passes them: each expert's product times its scale before the adapters' terms
    /// and the bias (build_lora_mm_id).
    pub gate_s: Option<Vec<f32>>,
    pub up_s: Option<Vec<f32>>,
    pub down_s: Option<Vec<f32>>,
    /// A dense FFN every token goes through beside its routed experts.
    pub shared: Option<SharedExpert>,
    /// Gemma 4's router input: the residual stream RMS-normalized (no weights), divided by
    /// sqrt(n_embd), times these n_embd values (`ffn_gate_inp.scale`); None: the experts' input.
    pub router_in_scale: Option<Vec<f32>>,
}

/// The shared expert (`ffn_{gate,up,down}_shexp`): a dense FFN whose output is added to the
/// routed experts' (Granite 4.0-H, Nemotron-H MoE, Qwen3-Next, Qwen3.5-MoE).
pub struct SharedExpert {
    /// None: up and down only (Nemotron-H MoE).
    pub gate: Option<QMatrix>,
    pub up: QMatrix,
    pub down: QMatrix,
    /// Second scales, for the graphs that apply them.
    pub gate_s: Option<f32>,
    pub up_s: Option<f32>,
    pub down_s: Option<f32>,
    /// Qwen3-Next's gate of the shared expert (`ffn_gate_inp_shexp`, n_embd values): its output
    /// times sigmoid(gate · x), per token.
    pub gate_inp: Option<Vec<f32>>,
}

/// Which parts of a layer's experts an architecture's graph applies (`load_experts`).
#[derive(Clone, Copy)]
pub struct ExpertParts {
    /// Gate matrices `ffn_gate_exps` (false: up/down experts).
    pub gated: bool,
    /// Biases of the router and of the experts (gpt-oss).
    pub bias: bool,
    /// The experts' second scales `ffn_*_exps.scale`.
    pub scales: bool,
    /// The selection bias `exp_probs_b.bias`.
    pub probs_b: bool,
    /// The shared expert, of hp.n_ff_shexp rows.
    pub shared: Option<SharedParts>,
}

impl ExpertParts {
    /// Gated experts with a router and nothing else.
    pub const ROUTED: ExpertParts = ExpertParts { gated: true, bias: false, scales: false, probs_b: false, shared: None };
}

/// Which parts of the shared expert a graph applies.
#[derive(Clone, Copy)]
pub struct SharedParts {
    /// `ffn_gate_shexp` (false: up/down only).
    pub gated: bool,
    /// Qwen3-Next's sigmoid gate `ffn_gate_inp_shexp`.
    pub sigmoid_gate: bool,
    /// The second scales `ffn_*_shexp.scale`.
    pub scales: bool,
}

/// RoPE frequency factors: Llama 3's `rope_freqs`, or LongRoPE's long and short factors.
#[derive(Default)]
pub struct RopeFactors {
    pub freqs: Option<Vec<f32>>,
    pub long: Option<Vec<f32>>,
    pub short: Option<Vec<f32>>,
}

impl RopeFactors {
    /// The factors a context uses (llama_model::get_rope_factors): `rope_freqs` when the
    /// model has them, else LongRoPE's long factors when a sequence's context exceeds the
    /// original one, else the short ones.
    pub fn for_context(&self, n_ctx_seq: usize, n_ctx_orig: usize) -> Option<&[f32]> {
        if let Some(f) = &self.freqs {
            return Some(f);
        }
        if n_ctx_seq > n_ctx_orig { self.long.as_deref() } else { self.short.as_deref() }
    }
}

pub struct Weights {
    pub tok_embd: QMatrix,
    pub output_norm: Vec<f32>,
    /// The output norm's bias (a LayerNorm with bias: StarCoder 2).
    pub output_norm_b: Option<Vec<f32>>,
    /// The output projection; the token embedding itself when the model ties them.
    pub output: QMatrix,
    pub output_b: Option<Vec<f32>>,
    /// The output projection's second scale (`output.scale`, read for an NVFP4 output only,
    /// as llama.cpp reads it).
    pub output_s: Option<f32>,
    /// Whether the output projection is the token embedding (no output matrix of its own).
    pub output_tied: bool,
    pub layers: Vec<LayerWeights>,
    pub rope_factors: RopeFactors,
    /// An encoder's input additions (None for decoders).
    pub encoder: Option<EncoderInputs>,
    /// The parts of some families beyond the common decoder block.
    pub extras: ExtraParts,
}

/// Parts beyond the common decoder block, which the architectures that have them load.
#[derive(Default)]
pub struct ExtraParts {
    /// Per-layer embeddings (Gemma 3n, Gemma 4: `arch::ple`).
    pub ple: Option<crate::arch::ple::PerLayerEmbeddings>,
    /// Gemma 3n's AltUp streams and LAuReL residuals.
    pub altup: Option<crate::arch::gemma3n::AltUp>,
    /// Per layer (empty for the models without any).
    pub layers: Vec<LayerExtras>,
}

/// A layer's parts beyond `LayerWeights` (Gemma 4).
#[derive(Default)]
pub struct LayerExtras {
    /// A scalar the whole hidden state is multiplied by after the layer (layer_output_scale).
    pub out_scale: Option<f32>,
    /// A dense FFN beside the experts, each with its own norms: the dense FFN's input is
    /// ffn_norm's and its output goes through `dense_post_norm` (post_ffw_norm_1); the
    /// experts' input is `experts_pre_norm`'s (pre_ffw_norm_2), their output goes through
    /// `experts_post_norm` (post_ffw_norm_2); the two are summed before post_ffw_norm.
    pub dense_beside_experts: Option<DenseBesideExperts>,
}

pub struct DenseBesideExperts {
    pub ffn: GatedFfn,
    pub dense_post_norm: Vec<f32>,
    pub experts_pre_norm: Vec<f32>,
    pub experts_post_norm: Vec<f32>,
}

pub struct Model {
    pub file: Arc<GgufFile>,
    /// The architecture's table row; None only for a vocab-only model of an architecture the
    /// engine cannot run (its tokenizer still works).
    pub arch: Option<&'static ArchInfo>,
    pub hparams: HParams,
    /// None when loaded with vocab_only.
    pub weights: Option<Weights>,
    pub vocab: Arc<Vocab>,
    pub load_ms: f64,
    /// The thread making the matrices' repacked copies (see `weights::Repacking`).
    repack: crate::weights::RepackHandle,
}

impl Model {
    pub fn load(path: impl AsRef<Path>, use_mmap: bool, vocab_only: bool) -> Result<Model> {
        Self::load_with_overrides(path, use_mmap, vocab_only, &[])
    }

    /// Loads with some metadata values replaced (llama.cpp's kv_overrides): hyper-parameters
    /// and tokenizer settings are read from the overridden values.
    pub fn load_with_overrides(path: impl AsRef<Path>, use_mmap: bool, vocab_only: bool,
                               kv_overrides: &[(String, ferrollama_gguf::Value)]) -> Result<Model> {
        let t0 = std::time::Instant::now();
        let mut file = GgufFile::open(path, use_mmap)?;
        for (key, value) in kv_overrides {
            file.override_metadata(key, value.clone())?;
        }
        let file = Arc::new(file);
        let arch_name = file.get_str("general.architecture")
            .ok_or_else(|| file.error("missing metadata key general.architecture"))?
            .to_string();
        let arch = match arch_info(&arch_name) {
            Ok(a) => Some(a),
            Err(_) if vocab_only => None,
            Err(e) => return Err(e),
        };
        let n_vocab = match file.tensor("token_embd.weight") {
            Some(t) if t.shape.len() == 2 => t.shape[1],
            Some(t) => return Err(file.error(format!("token_embd.weight has shape {:?}", t.shape)).into()),
            None => file.get_array("tokenizer.ggml.tokens").map(|a| a.len())
                .ok_or_else(|| file.error("no token_embd.weight and no tokenizer.ggml.tokens"))?,
        };
        let mut hparams = match (HParams::from_gguf(&file, &arch_name, n_vocab), arch) {
            (Ok(hp), _) => hp,
            // A vocabulary file has no model hyper-parameters.
            (Err(_), _) if vocab_only => HParams::vocab_only(&arch_name, n_vocab),
            (Err(e), _) => return Err(e),
        };
        if let Some(arch) = arch {
            hparams.rope.neox = arch.rope_neox;
            (arch.hparams)(&mut hparams, &file)?;
            hparams.check_kv_heads()?;
            if hparams.rs.is_none() {
                hparams.check_attention_only(&file)?;
            }
        }
        let vocab = Arc::new(Vocab::from_gguf(&file).map_err(|e| match e {
            VocabError::Unsupported(m) => EngineError::Unsupported(format!("tokenizer: {m}")),
            VocabError::Invalid(m) => file.error(format!("tokenizer: {m}")).into(),
        })?);
        let (weights, repack) = match arch {
            Some(arch) if !vocab_only => {
                let ld = Loader::new(file.clone());
                let weights = (arch.load)(&ld, &hparams)?;
                ld.check_all_used(arch.name)?;
                (Some(weights), ld.repacking().start())
            }
            _ => (None, crate::weights::RepackHandle::none()),
        };
        Ok(Model { file, arch, hparams, weights, vocab, load_ms: t0.elapsed().as_secs_f64() * 1e3, repack })
    }

    /// Weight matrices still waiting for their repacked copy, which a thread makes after
    /// loading; until a matrix has it, its products run on the rows in place (same results,
    /// slower).
    pub fn repack_pending(&self) -> usize { self.repack.pending.load(std::sync::atomic::Ordering::Acquire) }

    /// Waits until every matrix has its repacked copy, at most `timeout`; true when they do.
    pub fn wait_repacked(&self, timeout: std::time::Duration) -> bool {
        // None: too far to represent, i.e. no limit.
        let deadline = std::time::Instant::now().checked_add(timeout);
        while self.repack_pending() > 0 {
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        true
    }

    /// The architecture's name (general.architecture).
    pub fn arch_name(&self) -> &str { &self.hparams.arch }

    /// The weights, or an error for a vocab-only model.
    pub fn weights(&self) -> Result<&Weights> {
        self.weights.as_ref().ok_or_else(|| EngineError::InvalidArgument("the model was loaded with vocab_only=True".into()))
    }

    /// Number of parameters (elements of every tensor).
    pub fn n_params(&self) -> usize { self.file.tensors.iter().map(|t| t.n_elements()).sum() }
    /// Bytes of tensor data.
    pub fn size(&self) -> usize { self.file.tensors.iter().map(|t| t.nbytes).sum() }
}

/// Which of the optional tensors of a decoder block an architecture's graph applies. The
/// loader reads those (when present) and no others: any other tensor in the file is refused.
/// Q, K and V may always come as one `attn_qkv` matrix (with or without biases), as
/// llama.cpp's create_tensor_qkv accepts them for every architecture.
#[derive(Clone, Copy)]
pub struct LayerParts {
    /// Pre-norms before attention and before the FFN (all but OLMo 2).
    pub pre_norms: bool,
    pub o_bias: bool,
    /// Q and K norms of head_dim values (per head) or of the whole projection.
    pub qk_norm: Option<QkNorm>,
    pub post_norms: bool,
    /// Gate and up in one `ffn_up` of 2 n_ff rows (Phi-3).
    pub fused_gate_up: bool,
    pub ffn_bias: bool,
    pub sinks: bool,
    /// Whether a file may carry Llama 3's `rope_freqs` factors.
    pub rope_freqs: bool,
    /// Whether a file may carry LongRoPE's `rope_factors_long`/`_short` (Phi-3).
    pub long_rope: bool,
    /// Whether the output projection has a bias.
    pub output_bias: bool,
    /// The output projection is the token embedding, whatever the file holds.
    pub tied_output: bool,
    /// The tensor of the norm before the FFN (gpt-oss calls it post_attention_norm).
    pub ffn_norm_name: &'static str,
    /// Whether the graph applies the FFN's (and experts') second scales: llama.cpp's llama,
    /// qwen3 and qwen3moe graphs pass them to build_ffn/build_moe_ffn; the others leave them
    /// unread, so a file with them is refused.
    pub ffn_scales: bool,
    /// The experts' shared expert (of hp.n_ff_shexp rows), in a model with experts.
    pub shared_expert: Option<SharedParts>,
}

impl LayerParts {
    /// A pre-norm decoder block with none of the optional parts.
    pub const PRE_NORM: LayerParts = LayerParts {
        pre_norms: true, o_bias: false, qk_norm: None, post_norms: false, fused_gate_up: false, ffn_bias: false,
        sinks: false, rope_freqs: false, long_rope: false, output_bias: false, tied_output: false,
        ffn_norm_name: "ffn_norm.weight", ffn_scales: false, shared_expert: None,
    };
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    PerHead,
    Whole,
}

/// The weights of a decoder-only model as `parts` describes them; every tensor of the file
/// must be read (Loader::check_all_used).
pub(crate) fn load_decoder(ld: &Loader, hp: &HParams, parts: &LayerParts) -> Result<Weights> {
    let n_embd = hp.n_embd;
    let tok_embd = ld.matrix("token_embd.weight", n_embd, hp.n_vocab)?;
    let own_output = match parts.tied_output {
        true => None,
        false => ld.opt_matrix("output.weight", n_embd, hp.n_vocab)?,
    };
    let output_tied = own_output.is_none();
    let output = own_output.unwrap_or_else(|| tok_embd.clone());
    let output_b = if parts.output_bias { ld.opt_vector("output.bias", hp.n_vocab)? } else { None };
    let output_s = load_output_scale(ld, &output, output_tied)?;
    let layers = (0..hp.n_layer).map(|il| load_layer(ld, hp, parts, il)).collect::<Result<Vec<_>>>()?;
    let output_norm = ld.vector("output_norm.weight", n_embd)?;
    let rope_factors = load_rope_factors(ld, hp, parts)?;
    Ok(Weights { tok_embd, output_norm, output_norm_b: None, output, output_b, output_s, output_tied, layers, rope_factors, encoder: None,
                 extras: ExtraParts::default() })
}

/// The token embedding, the output norm and head (tied to the embedding when the file has no
/// `output.weight`) around `layers` an architecture loaded itself.
pub(crate) fn load_embeddings_and_head(ld: &Loader, hp: &HParams, layers: Vec<LayerWeights>) -> Result<Weights> {
    load_embeddings_and_head_named(ld, hp, layers, "output_norm.weight")
}

/// `load_embeddings_and_head` with the output norm under another name (LFM2's files call it
/// `token_embd_norm`).
pub(crate) fn load_embeddings_and_head_named(ld: &Loader, hp: &HParams, layers: Vec<LayerWeights>, output_norm: &str)
                                             -> Result<Weights> {
    let tok_embd = ld.matrix("token_embd.weight", hp.n_embd, hp.n_vocab)?;
    let own_output = ld.opt_matrix("output.weight", hp.n_embd, hp.n_vocab)?;
    let output_tied = own_output.is_none();
    let output = own_output.unwrap_or_else(|| tok_embd.clone());
    let output_s = load_output_scale(ld, &output, output_tied)?;
    let output_norm = ld.vector(output_norm, hp.n_embd)?;
    Ok(Weights { tok_embd, output_norm, output_norm_b: None, output, output_b: None, output_s, output_tied, layers,
                 rope_factors: RopeFactors::default(), encoder: None, extras: ExtraParts::default() })
}

/// `output.scale` (and the unused `output.input_scale`), which llama.cpp reads for an NVFP4
/// output only, and refuses (an assertion) beside an NVFP4 output tied to the embedding.
fn load_output_scale(ld: &Loader, output: &QMatrix, tied: bool) -> Result<Option<f32>> {
    if output.ty != GgmlType::NVFP4 {
        return Ok(None);
    }
    if tied {
        if ld.has("output.scale") || ld.has("output.input_scale") {
            return Err(EngineError::Unsupported(
                "output scale tensors beside an NVFP4 output projection tied to the token embedding (llama.cpp asserts)".into()));
        }
        return Ok(None);
    }
    ld.skip_input_scale("output.weight", 1)?;
    ld.opt_scale("output.weight")
}

pub(crate) fn load_rope_factors(ld: &Loader, hp: &HParams, parts: &LayerParts) -> Result<RopeFactors> {
    let n = hp.rope.n_dims / 2;
    let mut f = RopeFactors::default();
    if parts.rope_freqs {
        f.freqs = ld.opt_vector("rope_freqs.weight", n)?;
    }
    if parts.long_rope {
        f.long = ld.opt_vector("rope_factors_long.weight", n)?;
        f.short = ld.opt_vector("rope_factors_short.weight", n)?;
    }
    Ok(f)
}

fn load_layer(ld: &Loader, hp: &HParams, parts: &LayerParts, il: usize) -> Result<LayerWeights> {
    let n_embd = hp.n_embd;
    let n = |s: &str| format!("blk.{il}.{s}");
    let norm = |on: bool, name: &str| -> Result<Option<Vec<f32>>> {
        if on { ld.vector(&n(name), n_embd).map(Some) } else { Ok(None) }
    };
    Ok(LayerWeights {
        attn_norm: norm(parts.pre_norms, "attn_norm.weight")?,
        attn: Some(load_attention(ld, hp, parts, il)?),
        rs: None,
        post_attn_norm: norm(parts.post_norms, "post_attention_norm.weight")?,
        ffn_norm: norm(parts.pre_norms, parts.ffn_norm_name)?,
        // The leading dense layers of a model with experts (n_layer_dense_lead) keep a dense FFN.
        ffn: if hp.n_expert > 0 && il >= hp.n_layer_dense_lead {
            let ep = ExpertParts { bias: parts.ffn_bias, scales: parts.ffn_scales, shared: parts.shared_expert,
                                   ..ExpertParts::ROUTED };
            Ffn::Experts(load_experts(ld, hp, il, &ep)?)
        } else {
            Ffn::Gated(load_gated(ld, hp, parts, il)?)
        },
        post_ffn_norm: norm(parts.post_norms, "post_ffw_norm.weight")?,
        attn_out_norm: None,
        layer_out_norm: None,
        attn_norm_b: None,
        ffn_norm_b: None,
        latent: None,
    })
}

/// Layer il's attention: Q/K/V (separate or fused, optional biases), the output projection,
/// their second scales, and the optional parts `parts` names (output bias, Q/K norms, sinks).
pub(crate) fn load_attention(ld: &Loader, hp: &HParams, parts: &LayerParts, il: usize) -> Result<AttnWeights> {
    let n_embd = hp.n_embd;
    let (hd_k, hd_v) = (hp.head_dim_k_of(il), hp.head_dim_v_of(il));
    let n_kv = hp.n_head_kv_of(il);
    let (q_dim, k_dim, v_dim) = (hd_k * hp.n_head, hd_k * n_kv, hd_v * n_kv);
    let n = |s: &str| format!("blk.{il}.{s}");
    let opt = |on: bool, name: &str, len: usize| -> Result<Option<Vec<f32>>> {
        if on { ld.opt_vector(&n(name), len) } else { Ok(None) }
    };
    let [wq, wk, wv] = load_qkv(ld, &n, n_embd, [q_dim, k_dim, v_dim])?;
    let [bq, bk, bv] = load_qkv_biases(ld, &n, [q_dim, k_dim, v_dim])?;
    let scales = load_proj_scales(ld, &n)?;
    let (q_norm_len, k_norm_len) = match parts.qk_norm {
        Some(QkNorm::Whole) => (q_dim, k_dim),
        _ => (hd_k, hd_k),
    };
    Ok(AttnWeights {
        wq, wk, wv,
        wo: ld.matrix(&n("attn_output.weight"), hd_v * hp.n_head, n_embd)?,
        bq, bk, bv,
        bo: opt(parts.o_bias, "attn_output.bias", n_embd)?,
        scales,
        q_norm: opt(parts.qk_norm.is_some(), "attn_q_norm.weight", q_norm_len)?,
        k_norm: opt(parts.qk_norm.is_some(), "attn_k_norm.weight", k_norm_len)?,
        sinks: opt(parts.sinks, "attn_sinks.weight", hp.n_head)?,
    })
}

/// Gated attention (Qwen3-Next, Qwen3.5: `arch::blocks::gated_attention`): Q's projection
/// has 2 n_head head_dim rows (each head's query, then its gate), per-head Q and K norms, no
/// output bias; Q, K and V separate or fused in `attn_qkv`, with their biases and scales as
/// llama.cpp's create_tensor_qkv and build_qkv take them.
pub(crate) fn load_gated_attention(ld: &Loader, hp: &HParams, il: usize) -> Result<AttnWeights> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let q_dim = hp.head_dim_k * hp.n_head;
    let dims = [2 * q_dim, hp.n_embd_k_gqa(), hp.n_embd_v_gqa()];
    let [wq, wk, wv] = load_qkv(ld, &n, hp.n_embd, dims)?;
    let [bq, bk, bv] = load_qkv_biases(ld, &n, dims)?;
    Ok(AttnWeights {
        wq, wk, wv,
        wo: ld.matrix(&n("attn_output.weight"), q_dim, hp.n_embd)?,
        bq, bk, bv,
        bo: None,
        scales: load_proj_scales(ld, &n)?,
        q_norm: Some(ld.vector(&n("attn_q_norm.weight"), hp.head_dim_k)?),
        k_norm: Some(ld.vector(&n("attn_k_norm.weight"), hp.head_dim_k)?),
        sinks: None,
    })
}

/// Q, K and V: separate matrices, or views of the rows of one `attn_qkv`.
pub(crate) fn load_qkv(ld: &Loader, n: &dyn Fn(&str) -> String, n_embd: usize, dims: [usize; 3]) -> Result<[QMatrix; 3]> {
    if !ld.has(&n("attn_qkv.weight")) {
        let [q, k, v] = dims;
        return Ok([ld.matrix(&n("attn_q.weight"), n_embd, q)?, ld.matrix(&n("attn_k.weight"), n_embd, k)?,
                   ld.matrix(&n("attn_v.weight"), n_embd, v)?]);
    }
    let total: usize = dims.iter().sum();
    let mut blocks = ld.row_blocks(&n("attn_qkv.weight"), &[n_embd, total], n_embd, &dims)?.into_iter();
    let mut next = || blocks.next().expect("three blocks");
    Ok([next(), next(), next()])
}

/// The second scales of Q, K, V (separate, or one `attn_qkv.scale`) and of the output
/// projection; their `input_scale`s, which llama.cpp loads and never reads, are read and
/// dropped.
pub(crate) fn load_proj_scales(ld: &Loader, n: &dyn Fn(&str) -> String) -> Result<ProjScales> {
    let o = n("attn_output.weight");
    ld.skip_input_scale(&o, 1)?;
    let mut s = ProjScales { o: ld.opt_scale(&o)?, ..ProjScales::default() };
    if ld.has(&n("attn_qkv.weight")) {
        let qkv = n("attn_qkv.weight");
        ld.skip_input_scale(&qkv, 1)?;
        let all = ld.opt_scale(&qkv)?;
        (s.q, s.k, s.v) = (all, all, all);
        return Ok(s);
    }
    let mut each = ["attn_q.weight", "attn_k.weight", "attn_v.weight"].map(|m| {
        ld.skip_input_scale(&n(m), 1)?;
        ld.opt_scale(&n(m))
    }).into_iter();
    let mut next = || each.next().expect("three");
    (s.q, s.k, s.v) = (next()?, next()?, next()?);
    Ok(s)
}

/// The optional biases of Q, K and V: separate, or one `attn_qkv.bias` split in three.
pub(crate) fn load_qkv_biases(ld: &Loader, n: &dyn Fn(&str) -> String, dims: [usize; 3]) -> Result<[Option<Vec<f32>>; 3]> {
    let [q, k, v] = dims;
    if let Some(all) = ld.opt_vector(&n("attn_qkv.bias"), q + k + v)? {
        return Ok([Some(all[..q].to_vec()), Some(all[q..q + k].to_vec()), Some(all[q + k..].to_vec())]);
    }
    Ok([ld.opt_vector(&n("attn_q.bias"), q)?, ld.opt_vector(&n("attn_k.bias"), k)?, ld.opt_vector(&n("attn_v.bias"), v)?])
}

pub(crate) fn load_gated(ld: &Loader, hp: &HParams, parts: &LayerParts, il: usize) -> Result<GatedFfn> {
    load_gated_sized(ld, hp, parts, il, hp.n_ff)
}

/// `load_gated` for a layer of its own width (Gemma 4's per-layer feed_forward_length).
pub(crate) fn load_gated_sized(ld: &Loader, hp: &HParams, parts: &LayerParts, il: usize, n_ff: usize) -> Result<GatedFfn> {
    let n_embd = hp.n_embd;
    let n = |s: &str| format!("blk.{il}.{s}");
    let opt = |name: &str, len: usize| -> Result<Option<Vec<f32>>> {
        if parts.ffn_bias { ld.opt_vector(&n(name), len) } else { Ok(None) }
    };
    let (gate, up) = if parts.fused_gate_up {
        // Phi-3 stores gate and up as one matrix of 2 n_ff rows: gate's rows first.
        let mut blocks = ld.row_blocks(&n("ffn_up.weight"), &[n_embd, 2 * n_ff], n_embd, &[n_ff, n_ff])?;
        let up = blocks.pop().expect("two blocks");
        (blocks.pop().expect("two blocks"), up)
    } else {
        (ld.matrix(&n("ffn_gate.weight"), n_embd, n_ff)?, ld.matrix(&n("ffn_up.weight"), n_embd, n_ff)?)
    };
    let down = ld.matrix(&n("ffn_down.weight"), n_ff, n_embd)?;
    let (gate_b, up_b, down_b) = (opt("ffn_gate.bias", n_ff)?, opt("ffn_up.bias", n_ff)?, opt("ffn_down.bias", n_embd)?);
    // The gate's input scale is read where the file has a gate of its own (not Phi-3's fused one).
    let names: &[&str] = if parts.fused_gate_up { &["ffn_up", "ffn_down"] } else { &["ffn_gate", "ffn_up", "ffn_down"] };
    for m in names {
        ld.skip_input_scale(&n(&format!("{m}.weight")), 1)?;
    }
    let (mut gate_s, mut up_s, mut down_s) = (None, None, None);
    if parts.ffn_scales {
        let scale = |m: &str, w: &QMatrix, bias: bool| ffn_scale(ld, &n(&format!("{m}.weight")), w, bias);
        (gate_s, up_s, down_s) = (scale("ffn_gate", &gate, gate_b.is_some())?, scale("ffn_up", &up, up_b.is_some())?,
                                  scale("ffn_down", &down, down_b.is_some())?);
    }
    Ok(GatedFfn { gate, up, down, gate_b, up_b, down_b, gate_s, up_s, down_s })
}

/// A dense FFN matrix's second scale. llama.cpp's build_ffn multiplies it in after the bias,
/// and asserts that an NVFP4 matrix with a scale has no bias (nor, `lora::targets_of`, an
/// adapter): that scale belongs before them.
fn ffn_scale(ld: &Loader, weight: &str, w: &QMatrix, has_bias: bool) -> Result<Option<f32>> {
    let s = ld.opt_scale(weight)?;
    if s.is_some() && has_bias && w.ty == GgmlType::NVFP4 {
        return Err(EngineError::Unsupported(format!("'{weight}' (NVFP4) with both a scale and a bias (llama.cpp asserts)")));
    }
    Ok(s)
}

/// Layer il's experts (`blk.{il}.ffn_*_exps`, the router, and what `ep` adds), their
/// matrices as views of the rows of the 3-D tensors.
pub(crate) fn load_experts(ld: &Loader, hp: &HParams, il: usize, ep: &ExpertParts) -> Result<Experts> {
    let (n_embd, n_ff, n_exp) = (hp.n_embd, hp.n_ff_exp, hp.n_expert);
    let n = |s: &str| format!("blk.{il}.{s}");
    let per_expert = |name: &str, cols: usize, rows: usize| ld.row_blocks(&n(name), &[cols, rows, n_exp], cols, &vec![rows; n_exp]);
    let opt = |name: &str, len: usize| -> Result<Option<Vec<f32>>> {
        if ep.bias { ld.opt_vector_2d(&n(name), len, n_exp) } else { Ok(None) }
    };
    // Gate and up may come as one `ffn_gate_up_exps` (each expert's gate rows, then its up
    // rows), which llama.cpp's build_moe_ffn splits after one product.
    let fused = ep.gated && ld.has(&n("ffn_gate_up_exps.weight"));
    let mats: &[&str] = match (fused, ep.gated) {
        (true, _) => &["ffn_gate_up_exps", "ffn_down_exps"],
        (false, true) => &["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"],
        (false, false) => &["ffn_up_exps", "ffn_down_exps"],
    };
    for m in mats {
        ld.skip_input_scale(&n(&format!("{m}.weight")), n_exp)?;
    }
    let scales = |name: &str| if ep.scales { ld.opt_vector(&n(name), n_exp) } else { Ok(None) };
    let (gate, up) = if fused {
        let blocks = ld.row_blocks(&n("ffn_gate_up_exps.weight"), &[n_embd, 2 * n_ff, n_exp], n_embd, &vec![n_ff; 2 * n_exp])?;
        let (mut gate, mut up) = (Vec::with_capacity(n_exp), Vec::with_capacity(n_exp));
        for (i, b) in blocks.into_iter().enumerate() {
            if i % 2 == 0 { gate.push(b) } else { up.push(b) }
        }
        (Some(gate), up)
    } else {
        (if ep.gated { Some(per_expert("ffn_gate_exps.weight", n_embd, n_ff)?) } else { None },
         per_expert("ffn_up_exps.weight", n_embd, n_ff)?)
    };
    Ok(Experts {
        // llama.cpp's generic pass reads the scales of separate gate and up experts only.
        gate_s: if ep.gated && !fused { scales("ffn_gate_exps.scale")? } else { None },
        up_s: if fused { None } else { scales("ffn_up_exps.scale")? },
        down_s: scales("ffn_down_exps.scale")?,
        router: ld.matrix(&n("ffn_gate_inp.weight"), n_embd, n_exp)?,
        router_b: if ep.bias { ld.opt_vector(&n("ffn_gate_inp.bias"), n_exp)? } else { None },
        probs_b: if ep.probs_b { Some(ld.vector(&n("exp_probs_b.bias"), n_exp)?) } else { None },
        gate,
        up,
        down: per_expert("ffn_down_exps.weight", n_ff, n_embd)?,
        gate_b: if ep.gated { opt("ffn_gate_exps.bias", n_ff)? } else { None },
        up_b: opt("ffn_up_exps.bias", n_ff)?,
        down_b: opt("ffn_down_exps.bias", n_embd)?,
        shared: ep.shared.map(|sp| load_shared_expert(ld, hp, il, &sp)).transpose()?,
        router_in_scale: None,
    })
}

/// Layer il's shared expert, of hp.n_ff_shexp rows.
fn load_shared_expert(ld: &Loader, hp: &HParams, il: usize, sp: &SharedParts) -> Result<SharedExpert> {
    let (n_embd, n_ff) = (hp.n_embd, hp.n_ff_shexp);
    if n_ff == 0 {
        return Err(ld.error(format!("{}: a shared expert without expert_shared_feed_forward_length", hp.arch)));
    }
    let n = |s: &str| format!("blk.{il}.{s}");
    let mats: &[&str] = if sp.gated { &["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"] } else { &["ffn_up_shexp", "ffn_down_shexp"] };
    for m in mats {
        ld.skip_input_scale(&n(&format!("{m}.weight")), 1)?;
    }
    let scale = |m: &str| if sp.scales { ld.opt_scale(&n(&format!("{m}.weight"))) } else { Ok(None) };
    Ok(SharedExpert {
        gate: if sp.gated { Some(ld.matrix(&n("ffn_gate_shexp.weight"), n_embd, n_ff)?) } else { None },
        up: ld.matrix(&n("ffn_up_shexp.weight"), n_embd, n_ff)?,
        down: ld.matrix(&n("ffn_down_shexp.weight"), n_ff, n_embd)?,
        gate_s: if sp.gated { scale("ffn_gate_shexp")? } else { None },
        up_s: scale("ffn_up_shexp")?,
        down_s: scale("ffn_down_shexp")?,
        gate_inp: if sp.sigmoid_gate { Some(ld.vector(&n("ffn_gate_inp_shexp.weight"), n_embd)?) } else { None },
    })
}
