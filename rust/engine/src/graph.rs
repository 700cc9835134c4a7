//! What one forward pass over a micro-batch needs: the tokens and where they go in the
//! cache, and the scratch buffers a context allocates once.

use ferrollama_tensor::MatmulScratch;

use crate::hparams::HParams;

/// Where a micro-batch's tokens sit in one cache, and what they may attend to.
pub struct KvView<'a> {
    /// The cell of each token.
    pub slots: &'a [u32],
    /// n_tokens rows of n_kv entries (0 or -inf).
    pub mask: &'a [f32],
    /// The cells attention covers (0..n_kv).
    pub n_kv: usize,
    /// Each token's visible cells in position order: set in batch-invariant contexts, whose
    /// attention sums over these lists (`attention::attend_invariant`).
    pub visible: Option<&'a ferrollama_kv::VisibleCells>,
}

pub struct UBatchView<'a> {
    pub tokens: &'a [u32],
    /// The input embeddings of a batch of embeddings (one row of the model's input width,
    /// HParams::n_embd_inp, per token; then the tokens are placeholders).
    pub embd: Option<&'a [f32]>,
    pub pos: &'a [i32],
    /// Each token's four M-RoPE positions (time, height, width, extra) where the batch gave
    /// them (an image's embeddings); None: a text token's (pos, pos, pos, 0).
    pub pos_mrope: Option<&'a [[i32; 4]]>,
    /// Indices (into this micro-batch) of the tokens whose logits are wanted, in order.
    pub out_rows: &'a [usize],
    /// Each cache of the context (one, or a full and a sliding-window one).
    pub caches: &'a [KvView<'a>],
    /// For each layer, the index of its cache in `caches`.
    pub layer_cache: &'a [usize],
    /// A control vector to add to the layers' outputs.
    pub cvec: Option<&'a ControlVector>,
    /// The LoRA adapters' terms to add to the products.
    pub lora: Option<&'a crate::lora::LoraSet>,
    /// The RoPE frequency factors the context uses (RopeFactors::for_context).
    pub rope_factors: Option<&'a [f32]>,
    /// The context's RoPE (the model's, unless the context overrides it: RopeOverrides).
    pub rope: &'a crate::ops::RopeParams,
    /// The micro-batch's sequence groups and their state cells (recurrent and hybrid models).
    pub rs: Option<crate::recurrent::RsUBatch>,
}

/// Directions added to the output of layers `start..=end` (llama.cpp's control vectors).
#[derive(Debug, Clone)]
pub struct ControlVector {
    /// n_layer rows of n_embd: row `il` is added after layer `il`.
    pub data: Vec<f32>,
    pub n_embd: usize,
    pub start: usize,
    pub end: usize,
}

impl ControlVector {
    /// Adds the direction of layer `il` (if in range) to every row of `x`.
    pub fn apply(&self, il: usize, x: &mut [f32]) {
        if il < self.start || il > self.end {
            return;
        }
        let dir = &self.data[il * self.n_embd..(il + 1) * self.n_embd];
        for row in x.chunks_exact_mut(self.n_embd) {
            crate::ops::add_inplace(row, dir);
        }
    }
}

impl<'a> UBatchView<'a> {
    /// Token t's four M-RoPE positions (llama.cpp gives a text token its position on the
    /// first three axes and 0 on the extra one).
    pub fn mrope_pos(&self, t: usize) -> [i32; 4] {
        match self.pos_mrope {
            Some(p) => p[t],
            None => [self.pos[t], self.pos[t], self.pos[t], 0],
        }
    }

    /// Layer `il`'s LoRA terms (none without adapters).
    pub fn lora_layer(&self, il: usize) -> crate::lora::LayerLora<'a> {
        self.lora.map(|l| l.layer(il)).unwrap_or_default()
    }

    /// Where layer `il`'s keys and values go and what its tokens may attend to.
    pub fn kv(&self, il: usize) -> &KvView<'_> {
        &self.caches[self.layer_cache[il]]
    }
}

/// Scratch buffers sized for n_ubatch tokens, allocated once per context.
pub struct Workspace {
    pub x: Vec<f32>,
    pub h: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub attn: Vec<f32>,
    pub o: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub rope_cache: Vec<f32>,
    /// RoPE cache of the sliding-window layers, when their base differs.
    pub rope_cache_swa: Vec<f32>,
    pub mm: MatmulScratch,
    /// The mixture-of-experts block's buffers (empty for a dense model).
    pub moe: crate::moe::MoeScratch,
    /// The LoRA products' buffers (sized when adapters are set).
    pub lora: crate::lora::LoraScratch,
    /// The input activations' statistics, while a context collects them (else None).
    pub stats: Option<Box<crate::actstats::ActivationStats>>,
    /// The recurrent layers' buffers (empty for an attention-only model).
    pub rs: crate::recurrent::RsScratch,
    /// Gated attention's Q projection, each head's query and gate side by side (sized on
    /// first use; empty for the other models).
    pub q_gated: Vec<f32>,
    /// Per-layer embeddings: each token's inputs of every layer, and one layer's gate (sized
    /// on first use; empty for the other models).
    pub ple: Vec<f32>,
    pub ple_gate: Vec<f32>,
    /// A second block output kept while another is computed (Gemma 4's dense FFN beside its
    /// experts; sized on first use).
    pub aux: Vec<f32>,
    /// Latent attention's buffers (sized on first use; empty for the other models).
    pub latent: crate::arch::latent::LatentScratch,
    /// The attention's output of a parallel block, kept while its FFN runs (sized on first
    /// use; empty for the other models).
    pub parallel_attn: Vec<f32>,
    /// Gemma 3n's streams and routing (sized on first use; empty for the other models).
    pub altup: crate::arch::gemma3n::AltUpScratch,
}

impl Workspace {
    pub fn new(hp: &HParams, n_ubatch: usize) -> Workspace {
        let q_dim = hp.n_head * hp.max_head_dim_k();
        let attn_dim = hp.n_head * hp.max_head_dim_v();
        Workspace {
            x: vec![0.0; n_ubatch * hp.n_embd],
            h: vec![0.0; n_ubatch * hp.n_embd],
            q: vec![0.0; n_ubatch * q_dim],
            k: vec![0.0; n_ubatch * hp.n_head_kv * hp.max_head_dim_k()],
            v: vec![0.0; n_ubatch * hp.n_head_kv * hp.max_head_dim_v()],
            attn: vec![0.0; n_ubatch * attn_dim],
            o: vec![0.0; n_ubatch * hp.n_embd.max(attn_dim)],
            gate: vec![0.0; n_ubatch * hp.n_ff],
            up: vec![0.0; n_ubatch * hp.n_ff],
            rope_cache: vec![0.0; n_ubatch * hp.rope.n_dims],
            rope_cache_swa: if hp.has_swa() { vec![0.0; n_ubatch * hp.max_n_rot()] } else { Vec::new() },
            mm: MatmulScratch::default(),
            moe: crate::moe::MoeScratch::new(hp, n_ubatch),
            lora: Default::default(),
            stats: None,
            rs: Default::default(),
            q_gated: Vec::new(),
            ple: Vec::new(),
            ple_gate: Vec::new(),
            aux: Vec::new(),
            latent: Default::default(),
            parallel_attn: Vec::new(),
            altup: Default::default(),
        }
    }
}
