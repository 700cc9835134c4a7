//! A model: the file, its hyper-parameters, its weights (views into the map) and its vocabulary.

use std::path::Path;
use std::sync::Arc;

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::QMatrix;
use ferrollama_vocab::{Vocab, VocabError};

use crate::arch::{arch_info, ArchInfo};
use crate::error::{EngineError, Result};
use crate::hparams::HParams;
use crate::weights::Loader;

/// The weights of one decoder block. Optional tensors are those only some architectures have.
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: QMatrix,
    pub wk: QMatrix,
    pub wv: QMatrix,
    pub wo: QMatrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub bo: Option<Vec<f32>>,
    /// Per-head RMSNorm of Q and K (Gemma 3).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn_gate: QMatrix,
    pub ffn_up: QMatrix,
    pub ffn_down: QMatrix,
    pub post_ffn_norm: Option<Vec<f32>>,
}

pub struct Weights {
    pub tok_embd: QMatrix,
    pub output_norm: Vec<f32>,
    /// The output projection; the token embedding itself when the model ties them.
    pub output: QMatrix,
    pub layers: Vec<LayerWeights>,
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
        let t0 = std::time::Instant::now();
        let file = Arc::new(GgufFile::open(path, use_mmap)?);
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
            if arch.graph == crate::arch::Graph::Gemma3 {
                crate::arch::gemma3::adjust_hparams(&mut hparams, &file)?;
            }
        }
        let vocab = Arc::new(Vocab::from_gguf(&file).map_err(|e| match e {
            VocabError::Unsupported(m) => EngineError::Unsupported(format!("tokenizer: {m}")),
            VocabError::Invalid(m) => file.error(format!("tokenizer: {m}")).into(),
        })?);
        let (weights, repack) = if vocab_only {
            (None, crate::weights::RepackHandle::none())
        } else {
            let (weights, repacking) = load_weights(&file, &hparams)?;
            (Some(weights), repacking.start())
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

fn load_weights(file: &Arc<GgufFile>, hp: &HParams) -> Result<(Weights, crate::weights::Repacking)> {
    let ld = Loader::new(file.clone());
    let (n_embd, n_ff) = (hp.n_embd, hp.n_ff);
    let (q_dim, k_dim, v_dim) = (hp.head_dim_k * hp.n_head, hp.n_embd_k_gqa(), hp.n_embd_v_gqa());
    let tok_embd = ld.matrix("token_embd.weight", n_embd, hp.n_vocab)?;
    let output = ld.opt_matrix("output.weight", n_embd, hp.n_vocab)?.unwrap_or_else(|| tok_embd.clone());
    let mut layers = Vec::with_capacity(hp.n_layer);
    for il in 0..hp.n_layer {
        let n = |s: &str| format!("blk.{il}.{s}");
        layers.push(LayerWeights {
            attn_norm: ld.vector(&n("attn_norm.weight"), n_embd)?,
            wq: ld.matrix(&n("attn_q.weight"), n_embd, q_dim)?,
            wk: ld.matrix(&n("attn_k.weight"), n_embd, k_dim)?,
            wv: ld.matrix(&n("attn_v.weight"), n_embd, v_dim)?,
            wo: ld.matrix(&n("attn_output.weight"), hp.head_dim_v * hp.n_head, n_embd)?,
            bq: ld.opt_vector(&n("attn_q.bias"), q_dim)?,
            bk: ld.opt_vector(&n("attn_k.bias"), k_dim)?,
            bv: ld.opt_vector(&n("attn_v.bias"), v_dim)?,
            bo: ld.opt_vector(&n("attn_output.bias"), n_embd)?,
            q_norm: ld.opt_vector(&n("attn_q_norm.weight"), hp.head_dim_k)?,
            k_norm: ld.opt_vector(&n("attn_k_norm.weight"), hp.head_dim_k)?,
            post_attn_norm: ld.opt_vector(&n("post_attention_norm.weight"), n_embd)?,
            ffn_norm: ld.vector(&n("ffn_norm.weight"), n_embd)?,
            ffn_gate: ld.matrix(&n("ffn_gate.weight"), n_embd, n_ff)?,
            ffn_up: ld.matrix(&n("ffn_up.weight"), n_embd, n_ff)?,
            ffn_down: ld.matrix(&n("ffn_down.weight"), n_ff, n_embd)?,
            post_ffn_norm: ld.opt_vector(&n("post_ffw_norm.weight"), n_embd)?,
        });
    }
    let output_norm = ld.vector("output_norm.weight", n_embd)?;
    Ok((Weights { tok_embd, output_norm, output, layers }, ld.repacking()))
}
