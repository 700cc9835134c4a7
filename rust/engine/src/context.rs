//! The context: the KV cache, the compute state and decode.
//!
//! decode = validate → apply pending K-shifts → split into micro-batches → place every
//! micro-batch in the cache (all or none) → run the forward pass of each → gather outputs.

use std::sync::Arc;
use std::time::Instant;

use ferrollama_kv::{padded_ctx_size, swa_cache_size, CellExt, KvCells, KvError, RsCells, RsSeqGroup, UBatchView as KvUBatch, VisibleCells};
use ferrollama_tensor::{GgmlType, Threads};

use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::graph::{ControlVector, KvView, UBatchView, Workspace};
use crate::lora::{LoraAdapter, LoraSet};
use crate::kvstore::{KvStore, LayerShape};
use crate::model::Model;
use crate::recurrent::{RsStore, RsUBatch};
use crate::split::{split_equal, split_simple, UBatchPlan};

/// The cache padding llama.cpp's old defragmentation rule used.
const DEFRAG_PAD: u32 = 256;

/// Sequence ids are bitsets of this many bits in the kv crate.
pub const MAX_SEQ: usize = 256;

#[derive(Debug, Clone)]
pub struct ContextParams {
    pub n_ctx: usize,
    pub n_batch: usize,
    pub n_ubatch: usize,
    pub n_seq_max: usize,
    pub n_threads: usize,
    pub n_threads_batch: usize,
    pub type_k: GgmlType,
    pub type_v: GgmlType,
    pub kv_unified: bool,
    pub swa_full: bool,
    pub embeddings: bool,
    pub pooling: Pooling,
    /// Defragment when the fraction of holes in the attended cells passes this (< 0: never).
    pub defrag_thold: f32,
    /// RoPE parameters of the context (llama.cpp's rope_freq_base, yarn_*...; default: the model's).
    pub rope: crate::hparams::RopeOverrides,
    /// Recurrent models: how many tokens of a sequence's last micro-batch can be removed again
    /// with seq_rm (the states before them are kept; llama.cpp's n_rs_seq). 0: none.
    pub n_rs_seq: usize,
    /// Batch-invariant logits: attention over each token's visible cells in position order and
    /// products whose arithmetic does not change with the token count, so that a token gets
    /// the same logits however it is batched, threaded or placed in the cache
    /// (`attention::attend_invariant`, `MatmulScratch::batch_invariant`). Off: llama.cpp's
    /// arithmetic, which changes with the micro-batch size as its kernels do.
    pub batch_invariant: bool,
}

impl ContextParams {
    pub fn new(n_ctx: usize) -> ContextParams {
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        ContextParams {
            n_ctx, n_batch: 2048, n_ubatch: 512, n_seq_max: 1, n_threads: threads, n_threads_batch: threads,
            type_k: GgmlType::F16, type_v: GgmlType::F16, kv_unified: true, swa_full: false,
            embeddings: false, pooling: Pooling::None, defrag_thold: -1.0,
            rope: Default::default(), n_rs_seq: 0, batch_invariant: false,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Perf {
    pub n_p_eval: u64,
    pub t_p_eval_ms: f64,
    pub n_eval: u64,
    pub t_eval_ms: f64,
}

/// One cache of the context: its cells and the layers that store K/V in them.
pub struct Cache {
    pub cells: KvCells,
    pub layers: Vec<usize>,
}

pub struct Context {
    pub model: Arc<Model>,
    pub params: ContextParams,
    /// The full-attention cache first; for interleaved sliding-window models, the sliding one second.
    pub caches: Vec<Cache>,
    /// For each layer, the index of its cache.
    layer_cache: Vec<usize>,
    /// The recurrent states' cells (models with recurrent layers; their rows are in store.rs).
    pub rs: Option<RsCells>,
    pub store: KvStore,
    /// The RoPE this context runs (the model's resolved with params.rope).
    pub rope: crate::ops::RopeParams,
    ws: Workspace,
    threads: Threads,
    threads_batch: Option<Threads>,
    /// One mask buffer per cache.
    masks: Vec<Vec<f32>>,
    /// Per cache, each token's visible cells in position order (batch-invariant contexts).
    visible: Vec<VisibleCells>,
    /// A micro-batch's logits before they go to their rows, when its order is not the batch's.
    logits_tmp: Vec<f32>,
    /// Logits of the last decode's outputs, n_outputs rows of n_vocab, in batch order.
    logits: Vec<f32>,
    /// For each batch index of the last decode: its output row, or -1.
    output_ids: Vec<i32>,
    n_outputs: usize,
    shift_scratch: Vec<f32>,
    /// With params.embeddings: the final normed hidden state of each output, in batch order.
    embd: Vec<f32>,
    /// With pooling: one embedding per sequence of the last batch.
    embd_seq: std::collections::BTreeMap<i32, Vec<f32>>,
    cvec: Option<ControlVector>,
    /// The LoRA adapters set, with their user scales, in the order set.
    loras: Vec<(Arc<LoraAdapter>, f32)>,
    /// Their terms for each product (None without adapters of non-zero scale).
    lora_set: Option<LoraSet>,
    /// Whether a token attends only to cells at its position or before (llama_set_causal_attn;
    /// mtmd turns it off while Gemma 3's image embeddings are decoded).
    causal_attn: bool,
    pub perf: Perf,
}

/// How embeddings of a sequence are pooled (llama_pooling_type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    None,
    Mean,
    Cls,
    Last,
}

impl Pooling {
    /// The pooling type a model's file names (`{arch}.pooling_type`; none when absent).
    pub fn of_model(hp: &crate::hparams::HParams) -> Result<Pooling> {
        Ok(match hp.pooling_type {
            0 => Pooling::None,
            1 => Pooling::Mean,
            2 => Pooling::Cls,
            3 => Pooling::Last,
            4 => return Err(EngineError::Unsupported("rank pooling (a reranker's classifier head)".into())),
            t => return Err(EngineError::Unsupported(format!("{}.pooling_type {t}", hp.arch))),
        })
    }

    pub fn parse(s: &str) -> Result<Pooling> {
        Ok(match s {
            "none" => Pooling::None,
            "mean" => Pooling::Mean,
            "cls" => Pooling::Cls,
            "last" => Pooling::Last,
            o => return Err(EngineError::InvalidArgument(format!("pooling must be none, mean, cls or last, not '{o}'"))),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

impl Context {
    pub fn new(model: Arc<Model>, mut params: ContextParams) -> Result<Context> {
        let hp = &model.hparams;
        model.weights()?;
        if model.arch.is_none() {
            return Err(EngineError::Unsupported(format!("architecture '{}' is not supported", hp.arch)));
        }
        if params.n_ctx == 0 {
            params.n_ctx = hp.n_ctx_train;
        }
        if model.arch.is_some_and(|a| a.encoder) {
            // An encoder computes embeddings only (llama.cpp turns them on for it too), and its
            // K and V are the batch's own f32 values (llama.cpp keeps no cache for it).
            params.embeddings = true;
            params.type_k = GgmlType::F32;
            params.type_v = GgmlType::F32;
        }
        let bad = |m: String| Err(EngineError::InvalidArgument(m));
        if params.n_seq_max == 0 || params.n_seq_max > MAX_SEQ {
            return bad(format!("n_seq_max must be in 1..={MAX_SEQ}, not {}", params.n_seq_max));
        }
        if params.n_batch == 0 || params.n_ubatch == 0 || params.n_threads == 0 || params.n_threads_batch == 0 {
            return bad("n_batch, n_ubatch and thread counts must be positive".into());
        }
        if params.n_ctx > (1 << 24) {
            return bad(format!("n_ctx {} is too large", params.n_ctx));
        }
        // llama.cpp: a micro-batch is never larger than the batch, and n_batch is capped by n_ctx
        // for causal models.
        params.n_batch = params.n_batch.min(params.n_ctx);
        params.n_ubatch = params.n_ubatch.min(params.n_batch);
        // llama.cpp pads the context to a multiple of 256 cells.
        params.n_ctx = padded_ctx_size(params.n_ctx as u32) as usize;
        let (caches, layer_cache) = build_caches(&model, &params)?;
        let shapes: Vec<LayerShape> = (0..hp.n_layer)
            .map(|il| LayerShape {
                cells: if hp.stores_kv(il) { caches[layer_cache[il]].cells.size() as usize } else { 0 },
                geom: hp.kv_geom(il),
            })
            .collect();
        let mut store = new_store(hp, &params, &shapes)?;
        // one recurrent state cell per sequence (llama.cpp: max(1, n_seq_max))
        let rs = match &hp.rs {
            Some(p) => {
                if params.n_rs_seq > 64 || (params.n_rs_seq > 0 && params.n_rs_seq >= params.n_ubatch) {
                    return bad(format!("n_rs_seq must be at most 64 and below n_ubatch ({}), not {}", params.n_ubatch, params.n_rs_seq));
                }
                store.rs = RsStore::new(p, params.n_seq_max, params.n_rs_seq)?;
                Some(RsCells::new(params.n_seq_max as u32).map_err(kv_arg)?)
            }
            None => None,
        };
        let mut ws = Workspace::new(hp, params.n_ubatch);
        ws.mm.batch_invariant = params.batch_invariant;
        let rope = if params.rope == Default::default() { hp.rope } else { hp.rope_train.resolve(&hp.rope, &params.rope)? };
        let threads = Threads::new(params.n_threads);
        let threads_batch = (params.n_threads_batch != params.n_threads).then(|| Threads::new(params.n_threads_batch));
        Ok(Context {
            masks: vec![Vec::new(); caches.len()],
            visible: vec![VisibleCells::default(); caches.len()],
            model, params, rope, caches, layer_cache, rs, store, ws, threads, threads_batch, logits_tmp: Vec::new(),
            logits: Vec::new(), output_ids: Vec::new(), n_outputs: 0, shift_scratch: Vec::new(),
            embd: Vec::new(), embd_seq: Default::default(), cvec: None, loras: Vec::new(), lora_set: None, perf: Perf::default(),
            causal_attn: true,
        })
    }

    pub fn n_vocab(&self) -> usize { self.model.hparams.n_vocab }

    pub fn causal_attn(&self) -> bool { self.causal_attn && !self.is_encoder() }

    /// Causal attention on or off for the next decodes (llama_set_causal_attn). A decoder's
    /// non-causal batch attends to every cell of its sequence, before or after it (sliding
    /// windows still apply), and must fit in one micro-batch; an encoder always attends both
    /// ways, and a recurrent layer has no other way than its order.
    pub fn set_causal_attn(&mut self, causal: bool) -> Result<()> {
        if self.is_encoder() && causal {
            return Err(EngineError::Unsupported("an encoder attends both ways: it has no causal mode".into()));
        }
        if self.rs.is_some() && !causal {
            return Err(EngineError::Unsupported(format!(
                "non-causal attention for '{}': its recurrent layers read tokens in order", self.model.hparams.arch)));
        }
        self.causal_attn = causal;
        Ok(())
    }
    pub fn n_outputs(&self) -> usize { self.n_outputs }

    /// Logits of batch index `i` of the last decode (negative: counted from the last output).
    pub fn logits_ith(&self, i: i64) -> Result<&[f32]> {
        self.check_has_logits()?;
        let row = self.output_row(i)?;
        let nv = self.n_vocab();
        Ok(&self.logits[row * nv..(row + 1) * nv])
    }

    /// The output row of batch index `i` (negative: counted from the last output).
    fn output_row(&self, i: i64) -> Result<usize> {
        Ok(if i < 0 {
            let back = (-i) as usize;
            if back > self.n_outputs {
                return Err(EngineError::InvalidArgument(format!("output index {i} is out of range ({} outputs)", self.n_outputs)));
            }
            self.n_outputs - back
        } else {
            match self.output_ids.get(i as usize) {
                Some(&r) if r >= 0 => r as usize,
                Some(_) => return Err(EngineError::InvalidArgument(format!("batch index {i} did not request logits"))),
                None => return Err(EngineError::InvalidArgument(format!("batch index {i} is out of range ({} tokens)", self.output_ids.len()))),
            }
        })
    }

    /// The embedding (final normed hidden state) of batch index `i` of the last decode.
    pub fn embeddings_ith(&self, i: i64) -> Result<&[f32]> {
        if !self.params.embeddings {
            return Err(EngineError::InvalidArgument("create the context with embeddings=True".into()));
        }
        let d = self.model.hparams.n_embd;
        let row = self.output_row(i)?;
        Ok(&self.embd[row * d..(row + 1) * d])
    }

    /// The pooled embedding of a sequence of the last decode.
    pub fn embeddings_seq(&self, seq: i32) -> Result<&[f32]> {
        if !self.params.embeddings || self.params.pooling == Pooling::None {
            return Err(EngineError::InvalidArgument("create the context with embeddings=True and a pooling type".into()));
        }
        self.embd_seq.get(&seq).map(Vec::as_slice)
            .ok_or_else(|| EngineError::InvalidArgument(format!("sequence {seq} was not in the last batch")))
    }

    /// Sets `adapter` at `scale` (replacing its scale if it is set already): every later
    /// decode adds its terms. The cache keeps what earlier decodes stored (llama.cpp does not
    /// touch it either).
    pub fn set_lora(&mut self, adapter: Arc<LoraAdapter>, scale: f32) -> Result<()> {
        self.check_lora(&adapter, scale)?;
        match self.loras.iter_mut().find(|(a, _)| Arc::ptr_eq(a, &adapter)) {
            Some(entry) => entry.1 = scale,
            None => self.loras.push((adapter, scale)),
        }
        self.resolve_loras();
        Ok(())
    }

    /// Removes an adapter; false when it was not set.
    pub fn remove_lora(&mut self, adapter: &Arc<LoraAdapter>) -> bool {
        let before = self.loras.len();
        self.loras.retain(|(a, _)| !Arc::ptr_eq(a, adapter));
        self.resolve_loras();
        self.loras.len() != before
    }

    pub fn clear_lora(&mut self) {
        self.loras.clear();
        self.resolve_loras();
    }

    /// The adapters set, with their scales, in the order set.
    pub fn loras(&self) -> &[(Arc<LoraAdapter>, f32)] { &self.loras }

    fn check_lora(&self, adapter: &LoraAdapter, scale: f32) -> Result<()> {
        if !adapter.is_for(&self.model) {
            return Err(EngineError::InvalidArgument("the LoRA adapter was loaded for another model".into()));
        }
        if !scale.is_finite() {
            return Err(EngineError::InvalidArgument(format!("a LoRA scale must be a finite number, not {scale}")));
        }
        Ok(())
    }

    /// Rebuilds the products' terms and their scratch from the adapters set.
    fn resolve_loras(&mut self) {
        self.lora_set = LoraSet::new(&self.loras, self.model.hparams.n_layer);
        self.ws.lora = self.lora_set.as_ref().map(|s| s.scratch(self.params.n_ubatch)).unwrap_or_default();
    }

    /// Sets (or with None removes) the control vector added to the outputs of layers
    /// start..=end; `data` holds n_layer rows of n_embd.
    pub fn set_control_vector(&mut self, data: Option<Vec<f32>>, start: usize, end: usize) -> Result<()> {
        let hp = &self.model.hparams;
        self.cvec = match data {
            None => None,
            Some(data) if data.len() == hp.n_layer * hp.n_embd => {
                Some(ControlVector { data, n_embd: hp.n_embd, start, end: end.min(hp.n_layer.saturating_sub(1)) })
            }
            Some(data) => return Err(EngineError::InvalidArgument(format!(
                "a control vector has n_layer x n_embd = {} x {} values, not {}", hp.n_layer, hp.n_embd, data.len()))),
        };
        Ok(())
    }

    /// Starts (true) or stops collecting the input activations' statistics of the weight
    /// matrices (see `actstats`); starting clears what was collected.
    pub fn set_activation_stats(&mut self, on: bool) {
        self.ws.stats = on.then(Box::default);
    }

    /// The statistics collected since `set_activation_stats(true)`, by the model's tensor
    /// names (a fused `attn_qkv` under its own name: Q, K and V see the same input), and
    /// clears them. Empty when not collecting.
    pub fn take_activation_stats(&mut self) -> Vec<(String, crate::actstats::MatrixStats)> {
        let Some(stats) = self.ws.stats.as_deref_mut() else { return Vec::new() };
        let file = &self.model.file;
        let named = std::mem::take(stats).into_named();
        named.into_iter().filter_map(|(name, s)| {
            if file.tensor(&name).is_some() {
                return Some((name, s));
            }
            // Fused matrices: Q's input is attn_qkv's; K, V and Phi-3's gate (rows of ffn_up) add nothing.
            name.strip_suffix(".attn_q.weight").map(|layer| (format!("{layer}.attn_qkv.weight"), s))
        }).collect()
    }

    fn pool_embeddings(&mut self, batch: &Batch) {
        let d = self.model.hparams.n_embd;
        self.embd_seq.clear();
        let mut counts: std::collections::BTreeMap<i32, usize> = Default::default();
        for (i, seqs) in batch.seq_ids.iter().enumerate() {
            let row = &self.embd[i * d..(i + 1) * d];
            for &s in seqs {
                let acc = self.embd_seq.entry(s).or_insert_with(|| vec![0.0; d]);
                let n = counts.entry(s).or_insert(0);
                match self.params.pooling {
                    Pooling::Mean => crate::ops::add_inplace(acc, row),
                    Pooling::Cls if *n == 0 => acc.copy_from_slice(row),
                    Pooling::Last => acc.copy_from_slice(row),
                    _ => {}
                }
                *n += 1;
            }
        }
        if self.params.pooling == Pooling::Mean {
            for (s, acc) in self.embd_seq.iter_mut() {
                crate::ops::scale_inplace(acc, 1.0 / counts[s] as f32);
            }
        }
    }

    /// All outputs of the last decode, n_outputs rows of n_vocab (none for an encoder).
    pub fn logits_all(&self) -> &[f32] { &self.logits[..self.logits.len().min(self.n_outputs * self.n_vocab())] }

    /// An encoder computes embeddings, not logits.
    pub fn check_has_logits(&self) -> Result<()> {
        if self.is_encoder() {
            return Err(EngineError::InvalidArgument(format!(
                "'{}' is an encoder: it has no logits (read ctx.embeddings or ctx.embeddings_seq)", self.model.hparams.arch)));
        }
        Ok(())
    }

    /// Which batch indices give outputs (all of them for pooled embeddings, as llama.cpp
    /// overrides the flags); sizes the logits and embeddings and maps indices to rows.
    fn prepare_outputs(&mut self, batch: &Batch) -> Vec<bool> {
        let all_out = self.params.embeddings && self.params.pooling != Pooling::None;
        let want: Vec<bool> = batch.logits.iter().map(|&l| l || all_out).collect();
        let n_outputs = want.iter().filter(|&&l| l).count();
        let nv = if self.is_encoder() { 0 } else { self.n_vocab() };
        self.logits.resize(n_outputs * nv, 0.0);
        self.output_ids.clear();
        let mut next_out = 0i32;
        for &l in &want {
            self.output_ids.push(if l { next_out += 1; next_out - 1 } else { -1 });
        }
        self.n_outputs = n_outputs;
        if self.params.embeddings {
            self.embd.resize(n_outputs * self.model.hparams.n_embd, 0.0);
        }
        want
    }

    /// Whether the model is an encoder (BERT): embeddings only, no cache kept.
    pub fn is_encoder(&self) -> bool { self.model.arch.is_some_and(|a| a.encoder) }

    /// An encoder's decode: the whole batch in one micro-batch, each token attending to every
    /// token of its sequences in the batch, nothing kept in the cache.
    fn decode_encoder(&mut self, batch: &Batch) -> Result<()> {
        let n = batch.len();
        if n > self.params.n_ubatch {
            return Err(EngineError::InvalidArgument(format!(
                "an encoder attends over its whole input at once: a batch of {n} tokens needs n_ubatch >= {n} (it is {})",
                self.params.n_ubatch)));
        }
        let want = self.prepare_outputs(batch);
        // Attention covers the batch's cells, padded to whole kernel blocks (masked).
        let n_kv = n.next_multiple_of(32).min(self.store.layers[0].cells);
        let mask = &mut self.masks[0];
        mask.clear();
        mask.resize(n * n_kv, f32::NEG_INFINITY);
        for (i, si) in batch.seq_ids.iter().enumerate() {
            for (j, sj) in batch.seq_ids.iter().enumerate() {
                if si.iter().any(|s| sj.contains(s)) {
                    mask[i * n_kv + j] = 0.0;
                }
            }
        }
        let slots: Vec<u32> = (0..n as u32).collect();
        let out_rows: Vec<usize> = (0..n).filter(|&i| want[i]).collect();
        let model = self.model.clone();
        let w = model.weights.as_ref().expect("checked at context creation");
        let views = [KvView { slots: &slots, mask: &self.masks[0], n_kv, visible: None }];
        let ub = UBatchView {
            tokens: &batch.tokens, embd: None, pos: &batch.pos, pos_mrope: None, out_rows: &out_rows, caches: &views, layer_cache: &self.layer_cache,
            cvec: None, lora: self.lora_set.as_ref(), rope_factors: None, rope: &self.rope, rs: None,
        };
        let threads = match (&self.threads_batch, n > 1) {
            (Some(tb), true) => tb,
            _ => &self.threads,
        };
        let arch = model.arch.expect("checked at context creation");
        (arch.forward)(&model, w, &mut self.ws, &mut self.store, &ub, threads, &mut []);
        let rows = out_rows.len() * model.hparams.n_embd;
        self.embd[..rows].copy_from_slice(&self.ws.h[..rows]);
        if self.params.pooling != Pooling::None {
            self.pool_embeddings(batch);
        }
        Ok(())
    }

    pub fn decode(&mut self, batch: &Batch) -> Result<()> {
        let t0 = Instant::now();
        self.validate(batch)?;
        if self.is_encoder() {
            let r = self.decode_encoder(batch);
            self.perf.n_p_eval += batch.len() as u64;
            self.perf.t_p_eval_ms += t0.elapsed().as_secs_f64() * 1e3;
            return r;
        }
        self.apply_pending_shifts();
        if self.params.defrag_thold > 0.0 {
            let thold = self.params.defrag_thold;
            self.defrag_if(|cells| cells.needs_defrag(thold, DEFRAG_PAD));
        }
        let n = batch.len();
        let plans = self.plan_ubatches(batch)?;
        let pos_of: Vec<Vec<i32>> = plans.iter().map(|p| p.idx.iter().map(|&i| batch.pos[i]).collect()).collect();
        let seqs_of: Vec<Vec<Vec<i32>>> = plans.iter().map(|p| p.idx.iter().map(|&i| batch.seq_ids[i].clone()).collect()).collect();
        let mrope_of: Vec<Vec<[i32; 4]>> = plans.iter()
            .map(|p| p.idx.iter().filter_map(|&i| batch.pos_mrope.get(i).copied()).collect())
            .collect();
        let ext_of: Vec<Vec<CellExt>> = self.cell_exts(batch, &plans);
        let views: Vec<KvUBatch> = pos_of.iter().zip(&seqs_of).zip(&ext_of)
            .map(|((p, s), e)| if e.is_empty() { KvUBatch::new(p, s) } else { KvUBatch::new(p, s).with_ext(e) })
            .collect();
        let groups: Vec<Vec<RsSeqGroup>> = plans.iter().zip(&pos_of).zip(&seqs_of)
            .map(|((p, pos), seqs)| rs_groups(p, pos, seqs))
            .collect();
        // Every memory must find room for every micro-batch before anything is written: the
        // recurrent states first, then the caches (llama_memory_hybrid's order).
        if let Some(rs) = &self.rs {
            if !rs.prepare(&groups) {
                return Err(EngineError::Decode(format!(
                    "the batch's sequences find no free recurrent state cell ({} of {} used; one per sequence, n_seq_max)",
                    rs.used(), rs.size())));
            }
        }
        let mut slots: Vec<Vec<Vec<u32>>> = Vec::with_capacity(self.caches.len());
        for cache in &mut self.caches {
            slots.push(cache.cells.prepare(&views).map_err(|e| EngineError::Decode(format!(
                "the batch of {n} tokens does not fit in the KV cache ({} of {} cells used): {e}",
                cache.cells.used(), cache.cells.size()
            )))?);
        }

        let want = self.prepare_outputs(batch);
        for (u, (plan, view)) in plans.iter().zip(&views).enumerate() {
            for (cache, cache_slots) in self.caches.iter_mut().zip(&slots) {
                cache.cells.apply_ubatch(&cache_slots[u], view).map_err(|e| EngineError::Decode(e.to_string()))?;
            }
            let rs_ub = self.place_states(plan, &groups[u])?;
            let out_rows: Vec<usize> = (0..plan.idx.len()).filter(|&i| want[plan.idx[i]]).collect();
            let dest_rows: Vec<usize> = out_rows.iter().map(|&i| self.output_ids[plan.idx[i]] as usize).collect();
            let tokens: Vec<u32> = plan.idx.iter().map(|&i| batch.tokens[i]).collect();
            let embd: Option<Vec<f32>> = batch.has_embeddings()
                .then(|| plan.idx.iter().flat_map(|&i| batch.embd_row(i)).copied().collect());
            let ub_slots: Vec<&[u32]> = slots.iter().map(|s| s[u].as_slice()).collect();
            let pos_mrope = (!batch.pos_mrope.is_empty()).then_some(mrope_of[u].as_slice());
            self.run_ubatch(&tokens, embd.as_deref(), pos_mrope, view, &ub_slots, &out_rows, &dest_rows, rs_ub)?;
        }
        if self.params.embeddings && self.params.pooling != Pooling::None {
            self.pool_embeddings(batch);
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        if n > 1 { self.perf.n_p_eval += n as u64; self.perf.t_p_eval_ms += ms; } else { self.perf.n_eval += 1; self.perf.t_eval_ms += ms; }
        Ok(())
    }

    /// The micro-batches of a batch: in order for an attention-only model, equal splits of
    /// whole sequence groups for a model with recurrent layers (sequential ids for a purely
    /// recurrent one, as llama_memory_recurrent asks; any for a hybrid with one cell array).
    fn plan_ubatches(&self, batch: &Batch) -> Result<Vec<UBatchPlan>> {
        if self.rs.is_none() {
            return Ok(split_simple(batch.len(), self.params.n_ubatch));
        }
        // a rollback covers a group's last micro-batch: keep the tokens it may roll back in one
        let keep_tail = if self.params.n_rs_seq > 0 { self.params.n_rs_seq + 1 } else { 0 };
        split_equal(batch, self.params.n_ubatch, self.caches.is_empty(), keep_tail)
    }

    /// Places a micro-batch's sequence groups in the recurrent cells and moves their states
    /// where the placement says (nothing for an attention-only model).
    fn place_states(&mut self, plan: &UBatchPlan, groups: &[RsSeqGroup]) -> Result<Option<RsUBatch>> {
        let Some(rs) = &mut self.rs else { return Ok(None) };
        let placed = rs.place(groups).map_err(|e| EngineError::Decode(e.to_string()))?;
        self.store.rs.apply(&placed);
        // the mixers keep the states of the group's last tokens (RsStore::token_runs)
        let kept = self.params.n_rs_seq.min(plan.n_seq_tokens.saturating_sub(1)) as u32;
        (0..plan.n_seqs as u32).for_each(|s| rs.set_snapshots(placed.head + s, kept));
        Ok(Some(RsUBatch { head: placed.head as usize, n_seqs: plan.n_seqs, n_seq_tokens: plan.n_seq_tokens }))
    }

    /// Runs one micro-batch; the logits (and embeddings) of its `out_rows` go to the output
    /// rows `dest_rows` (in order and consecutive for a simple split; through a scratch
    /// otherwise).
    #[allow(clippy::too_many_arguments)]
    fn run_ubatch(&mut self, tokens: &[u32], embd: Option<&[f32]>, pos_mrope: Option<&[[i32; 4]]>, view: &KvUBatch, slots: &[&[u32]],
                  out_rows: &[usize], dest_rows: &[usize], rs: Option<RsUBatch>) -> Result<()> {
        let mut n_kvs = Vec::with_capacity(self.caches.len());
        for ((cache, mask), visible) in self.caches.iter().zip(self.masks.iter_mut()).zip(self.visible.iter_mut()) {
            let n_kv = cache.cells.n_kv_window() as usize;
            mask.resize(tokens.len() * n_kv, 0.0);
            cache.cells.fill_mask(view, n_kv as u32, self.causal_attn, mask).map_err(|e| EngineError::Decode(e.to_string()))?;
            if self.params.batch_invariant {
                cache.cells.visible_cells(view, mask, n_kv as u32, visible);
            }
            n_kvs.push(n_kv);
        }
        let model = self.model.clone();
        let w = model.weights.as_ref().expect("checked at context creation");
        let (nv, d) = (model.hparams.n_vocab, model.hparams.n_embd);
        let views: Vec<KvView> = (0..self.caches.len())
            .map(|c| KvView { slots: slots[c], mask: &self.masks[c], n_kv: n_kvs[c], visible: self.params.batch_invariant.then(|| &self.visible[c]) })
            .collect();
        let ub = UBatchView {
            tokens, embd, pos: view.pos, pos_mrope, out_rows, caches: &views, layer_cache: &self.layer_cache, cvec: self.cvec.as_ref(),
            lora: self.lora_set.as_ref(), rope_factors: rope_factors(&model, &self.params), rope: &self.rope, rs,
        };
        let threads = match (&self.threads_batch, tokens.len() > 1) {
            (Some(tb), true) => tb,
            _ => &self.threads,
        };
        let in_place = dest_rows.windows(2).all(|p| p[1] == p[0] + 1);
        let row0 = dest_rows.first().copied().unwrap_or(0);
        let logits = if in_place {
            &mut self.logits[row0 * nv..(row0 + dest_rows.len()) * nv]
        } else {
            self.logits_tmp.resize(dest_rows.len() * nv, 0.0);
            &mut self.logits_tmp[..]
        };
        let arch = model.arch.expect("a context needs a runnable architecture (checked in Context::new)");
        (arch.forward)(&model, w, &mut self.ws, &mut self.store, &ub, threads, logits);
        if !in_place {
            for (k, &r) in dest_rows.iter().enumerate() {
                self.logits[r * nv..(r + 1) * nv].copy_from_slice(&self.logits_tmp[k * nv..(k + 1) * nv]);
            }
        }
        if self.params.embeddings {
            for (k, &r) in dest_rows.iter().enumerate() {
                self.embd[r * d..(r + 1) * d].copy_from_slice(&self.ws.h[k * d..(k + 1) * d]);
            }
        }
        Ok(())
    }

    /// Re-rotates the keys of cells whose position changed since they were computed.
    /// Moves cells down to close the holes of every cache (positions unchanged, K/V moved with
    /// them), so attention no longer walks over empty cells.
    pub fn defrag(&mut self) {
        self.apply_pending_shifts();
        self.defrag_if(|_| true);
    }

    fn defrag_if(&mut self, wanted: impl Fn(&KvCells) -> bool) {
        for cache in &mut self.caches {
            if !wanted(&cache.cells) {
                continue;
            }
            let plan = cache.cells.defrag_plan(u32::MAX);
            for m in &plan {
                for i in 0..m.len {
                    self.store.move_cell((m.src + i) as usize, (m.dst + i) as usize, &cache.layers);
                }
            }
            cache.cells.apply_defrag(&plan).expect("a plan made from these cells applies to them");
        }
    }

    pub(crate) fn apply_pending_shifts(&mut self) {
        let model = self.model.clone();
        let factors = rope_factors(&model, &self.params);
        let hp = &model.hparams;
        let rope = self.rope;
        for cache in &mut self.caches {
            if !cache.cells.has_shift() {
                continue;
            }
            for (cell, delta) in cache.cells.take_shifts() {
                // llama.cpp's K-shift (build_graph_shift) rotates every layer by get_rope_freq_base
                // (and Gemma 4's sliding layers by their own dimensions and factors).
                self.store.shift_cell(cell as usize, delta, &cache.layers,
                                      |il| (hp.swa_rope(&rope, il), hp.layer_rope_factors(il, factors)), &mut self.shift_scratch);
            }
        }
    }

    /// The 2-D position each token of each micro-batch gives its cell, for a model with
    /// M-RoPE (llama.cpp's ext x and y: the width and height positions, which are a text
    /// token's position); empty lists for the other models.
    fn cell_exts(&self, batch: &Batch, plans: &[UBatchPlan]) -> Vec<Vec<CellExt>> {
        let ext = |i: usize| match batch.pos_mrope.get(i) {
            Some(p) => CellExt { x: p[2], y: p[1] },
            None => CellExt { x: batch.pos[i], y: batch.pos[i] },
        };
        let mrope = self.model.hparams.mrope.is_some();
        plans.iter().map(|p| if mrope { p.idx.iter().map(|&i| ext(i)).collect() } else { Vec::new() }).collect()
    }

    /// A batch of embeddings needs rows of the model's input width (its n_embd, more with
    /// DeepStack rows) and a model whose input is its embeddings (not an encoder's); per-layer
    /// embeddings (Gemma 3n, Gemma 4) take the padding token's row, as llama.cpp's graphs do
    /// (`arch::ple::inputs`); M-RoPE positions need a model with M-RoPE.
    fn check_takes_embeddings(&self, batch: &Batch) -> Result<()> {
        let hp = &self.model.hparams;
        if batch.n_embd != hp.n_embd_inp() {
            return Err(EngineError::InvalidArgument(format!(
                "the batch's embeddings have {} values per token, the model's input width is {}", batch.n_embd, hp.n_embd_inp())));
        }
        if !batch.pos_mrope.is_empty() && hp.mrope.is_none() {
            return Err(EngineError::InvalidArgument(format!(
                "the batch gives M-RoPE positions (time, height, width, extra) but '{}' rotates with one position per token", hp.arch)));
        }
        if self.is_encoder() {
            return Err(EngineError::Unsupported(format!(
                "a batch of embeddings for '{}' (an encoder: its input is tokens)", hp.arch)));
        }
        Ok(())
    }

    /// llama_batch_allocr::init's checks: token ids, sequence ids, and positions that continue
    /// each sequence (Y = X + 1), never decrease and never skip.
    fn validate(&self, batch: &Batch) -> Result<()> {
        let bad = |m: String| Err(EngineError::InvalidArgument(m));
        if batch.is_empty() {
            return bad("the batch is empty".into());
        }
        if batch.len() > self.params.n_batch {
            return bad(format!("the batch has {} tokens, more than n_batch = {}", batch.len(), self.params.n_batch));
        }
        if batch.has_embeddings() {
            self.check_takes_embeddings(batch)?;
        }
        if !self.causal_attn && !self.is_encoder() && batch.len() > self.params.n_ubatch {
            return bad(format!(
                "non-causal attention over a batch of {} tokens needs them in one micro-batch: n_ubatch is {}",
                batch.len(), self.params.n_ubatch));
        }
        let n_vocab = self.n_vocab();
        let n_seq = self.params.n_seq_max;
        let mut seq_pos: Vec<std::collections::BTreeSet<i32>> = vec![Default::default(); n_seq];
        let mut last_pos = vec![-1i32; n_seq];
        // The sequence sets a sequence has appeared in must always overlap (llama.cpp refuses
        // "incompatible sequence sets"); coupled sequences must agree in the cache.
        let mut common: Vec<Option<Vec<i32>>> = vec![None; n_seq];
        let mut coupled: Vec<(i32, i32)> = Vec::new();
        for i in 0..batch.len() {
            if batch.tokens[i] as usize >= n_vocab {
                return bad(format!("token {} at batch index {i} is out of range (n_vocab = {n_vocab})", batch.tokens[i]));
            }
            if batch.pos[i] < 0 {
                return bad(format!("position {} at batch index {i} is negative", batch.pos[i]));
            }
            for &s in &batch.seq_ids[i] {
                if s < 0 || s as usize >= n_seq {
                    return bad(format!("sequence id {s} at batch index {i} is out of range (n_seq_max = {n_seq})"));
                }
                let s = s as usize;
                if batch.pos[i] < last_pos[s] {
                    return Err(EngineError::Decode(format!("sequence {s} positions are decreasing in the batch")));
                }
                last_pos[s] = batch.pos[i];
                seq_pos[s].insert(batch.pos[i]);
                let set = &batch.seq_ids[i];
                let cur = common[s].get_or_insert_with(|| set.clone());
                cur.retain(|x| set.contains(x));
                if cur.is_empty() {
                    return Err(EngineError::Decode(format!("sequence {s} belongs to incompatible sequence sets in the batch")));
                }
            }
            for &s1 in &batch.seq_ids[i][1..] {
                coupled.push((s1, batch.seq_ids[i][0]));
            }
        }
        for (a, b) in coupled {
            let range = |s| -> Result<(i32, i32)> { Ok((self.seq_pos_min(s)?, self.seq_pos_max(s)?)) };
            if range(a)? != range(b)? {
                return Err(EngineError::Decode(format!("sequence {a} is coupled to {b} in the batch, but they have diverged in the cache")));
            }
        }
        for (s, set) in seq_pos.iter().enumerate() {
            let (Some(&min), Some(&max)) = (set.first(), set.last()) else { continue };
            let cached_max = self.seq_pos_max(s as i32)?;
            self.check_window_held(s as i32, min)?;
            if self.model.hparams.mrope.is_some() {
                check_mrope_positions(s, cached_max, min, batch.has_embeddings())?;
                continue;
            }
            if cached_max >= 0 && min != cached_max + 1 {
                return Err(EngineError::Decode(format!(
                    "sequence {s}: the cache ends at position {cached_max} but the batch starts at {min}; positions must continue (Y = X + 1)"
                )));
            }
            if (max - min + 1) as usize > set.len() {
                return Err(EngineError::Decode(format!("sequence {s} positions are not continuous in the batch")));
            }
        }
        Ok(())
    }
}

/// llama_batch_allocr::init's rule for a model with M-RoPE, whose positions may jump forward
/// (an image takes fewer positions than tokens): a sequence's text starts after the last
/// position it holds, its embeddings at it or after (an image's tokens share one position).
fn check_mrope_positions(seq: usize, cached_max: i32, min: i32, embeddings: bool) -> Result<()> {
    let ok = cached_max < 0 || if embeddings { cached_max <= min } else { cached_max < min };
    if ok {
        return Ok(());
    }
    let rule = if embeddings { "at or after it" } else { "after it" };
    Err(EngineError::Decode(format!(
        "sequence {seq}: the cache ends at position {cached_max} but the batch starts at {min}; with M-RoPE a batch of {} starts {rule}",
        if embeddings { "embeddings" } else { "tokens" })))
}

/// The outputs of the last decode, as a state blob carries them.
pub(crate) struct Outputs {
    output_ids: Vec<i32>,
    logits: Vec<f32>,
    n_outputs: usize,
}

impl Context {
    pub(crate) fn write_outputs(&self, out: &mut Vec<u8>) {
        out.extend((self.output_ids.len() as u64).to_le_bytes());
        for id in &self.output_ids {
            out.extend(id.to_le_bytes());
        }
        let logits = self.logits_all();
        out.extend((logits.len() as u64).to_le_bytes());
        for l in logits {
            out.extend(l.to_le_bytes());
        }
    }

    pub(crate) fn read_outputs(&self, r: &mut crate::state::BlobReader) -> Result<Outputs> {
        let n = r.len(4, "output id count")?;
        let output_ids: Vec<i32> = r.take(n * 4, "output ids")?.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
        let n_outputs = output_ids.iter().filter(|&&i| i >= 0).count();
        if output_ids.iter().filter(|&&i| i >= 0).enumerate().any(|(k, &i)| i as usize != k) {
            return Err(EngineError::State("the output ids are corrupt".into()));
        }
        let n = r.len(4, "logit count")?;
        if n != n_outputs * self.n_vocab() {
            return Err(EngineError::State("the saved logits do not match the outputs".into()));
        }
        let logits = r.take(n * 4, "logits")?.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        Ok(Outputs { output_ids, logits, n_outputs })
    }

    pub(crate) fn set_outputs(&mut self, o: Outputs) {
        self.output_ids = o.output_ids;
        self.logits = o.logits;
        self.n_outputs = o.n_outputs;
    }
}

/// The RoPE frequency factors of a context (llama_model::get_rope_factors: LongRoPE's choice
/// depends on the context of one sequence).
fn rope_factors<'m>(model: &'m Model, params: &ContextParams) -> Option<&'m [f32]> {
    let n_ctx_seq = if params.kv_unified { params.n_ctx } else { (params.n_ctx / params.n_seq_max).next_multiple_of(256) };
    model.weights.as_ref()?.rope_factors.for_context(n_ctx_seq, model.hparams.n_ctx_orig)
}

/// The sequence groups of an equal split's micro-batch, as the recurrent cells see them:
/// each group's ids and the position of its last token (none for a simple split).
fn rs_groups<'a>(plan: &UBatchPlan, pos: &[i32], seqs: &'a [Vec<i32>]) -> Vec<RsSeqGroup<'a>> {
    (0..plan.n_seqs)
        .map(|s| {
            let last = (s + 1) * plan.n_seq_tokens - 1;
            RsSeqGroup { ids: &seqs[s * plan.n_seq_tokens], last_pos: pos[last] }
        })
        .collect()
}

fn kv_arg(e: KvError) -> EngineError { EngineError::InvalidArgument(e.to_string()) }

/// The K/V storage of the attention layers: a latent cache for latent attention in a split
/// file (V is K's leading part, the V cache type does not apply), else K and V per KV head;
/// the K-shift rotates the keys' RoPE part, which ends latent attention's keys.
fn new_store(hp: &crate::hparams::HParams, p: &ContextParams, shapes: &[LayerShape]) -> Result<KvStore> {
    match hp.latent {
        Some(lp) if lp.split => {
            let cells: Vec<usize> = shapes.iter().map(|sh| sh.cells).collect();
            KvStore::latent(p.type_k, &cells, hp.head_dim_k, hp.head_dim_v, lp.kv_lora_rank)
        }
        Some(_) => {
            let mut store = KvStore::new(p.type_k, p.type_v, shapes)?;
            store.rope_offset = hp.head_dim_k - hp.rope.n_dims;
            Ok(store)
        }
        None => KvStore::new(p.type_k, p.type_v, shapes),
    }
}

/// The caches a model needs: one of n_ctx cells, or for an interleaved sliding-window model a
/// full one for the global layers and a small one (about n_swa + n_ubatch cells, all n_ctx with
/// swa_full) for the sliding layers, as llama_kv_cache_iswa sizes them.
fn build_caches(model: &Model, p: &ContextParams) -> Result<(Vec<Cache>, Vec<usize>)> {
    let hp = &model.hparams;
    let (n_ctx, n_seq) = (p.n_ctx as u32, p.n_seq_max as u32);
    let full = KvCells::new(n_ctx, n_seq).map_err(kv_arg)?;
    // M-RoPE: the cells keep each token's 2-D position (llama.cpp's n_pos_per_embd > 1)
    let full = if hp.mrope.is_some() { full.with_2d_positions() } else { full };
    let attending: Vec<usize> = (0..hp.n_layer).filter(|&il| hp.stores_kv(il)).collect();
    if attending.is_empty() {
        // a state-space model keeps no K/V at all
        return Ok((Vec::new(), vec![0; hp.n_layer]));
    }
    if !hp.has_swa() {
        return Ok((vec![Cache { cells: full, layers: attending }], vec![0; hp.n_layer]));
    }
    // The cells are one array shared by every sequence (llama.cpp's unified layout) whatever
    // kv_unified says, so the window must be held for each sequence: size it as unified.
    let size = swa_cache_size(n_ctx, hp.n_swa as u32, n_seq, true, p.n_ubatch as u32, p.swa_full);
    let swa = KvCells::with_swa(size, n_seq, hp.swa_params()).map_err(kv_arg)?;
    let layer_cache: Vec<usize> = hp.swa_layers.iter().map(|&s| s as usize).collect();
    let layers_of = |c: usize| attending.iter().copied().filter(|&il| layer_cache[il] == c).collect();
    Ok((vec![Cache { cells: full, layers: layers_of(0) }, Cache { cells: swa, layers: layers_of(1) }], layer_cache))
}

/// Sequence operations over every memory: the caches (llama_kv_cache_iswa applies each to
/// both; seq_rm succeeds when both do; positions are reported from the sliding cache, which
/// holds the fewest) and the recurrent states (llama_memory_hybrid: seq_rm asks the states
/// first and stops at their refusal; a sequence's positions are those both memories hold).
impl Context {
    pub fn seq_rm(&mut self, seq: i32, p0: i32, p1: i32) -> Result<bool> {
        self.check_seq(seq, true)?;
        if let Some(rs) = &mut self.rs {
            if !rs.seq_rm(seq, p0, p1).map_err(kv_arg)? {
                return Ok(false);
            }
            if let Some((cell, back)) = rs.take_rollback() {
                self.store.rs.rollback(cell as usize, back as usize);
            }
        }
        let mut ok = true;
        for c in &mut self.caches {
            ok &= c.cells.seq_rm(seq, p0, p1).map_err(kv_arg)?;
        }
        Ok(ok)
    }
    pub fn seq_cp(&mut self, src: i32, dst: i32, p0: i32, p1: i32) -> Result<()> {
        self.check_seq(src, false)?;
        self.check_seq(dst, false)?;
        self.caches.iter_mut().try_for_each(|c| c.cells.seq_cp(src, dst, p0, p1).map_err(kv_arg))?;
        self.rs.as_mut().map_or(Ok(()), |rs| rs.seq_cp(src, dst).map_err(kv_arg))
    }
    pub fn seq_keep(&mut self, seq: i32) -> Result<()> {
        self.check_seq(seq, false)?;
        self.caches.iter_mut().try_for_each(|c| c.cells.seq_keep(seq).map_err(kv_arg))?;
        self.rs.as_mut().map_or(Ok(()), |rs| rs.seq_keep(seq).map_err(kv_arg))
    }
    pub fn seq_add(&mut self, seq: i32, p0: i32, p1: i32, delta: i32) -> Result<()> {
        self.check_seq(seq, false)?;
        if delta != 0 {
            self.check_can_shift()?;
        }
        self.caches.iter_mut().try_for_each(|c| c.cells.seq_add(seq, p0, p1, delta).map_err(kv_arg))?;
        self.rs.as_mut().map_or(Ok(()), |rs| rs.seq_add(seq, p0, p1, delta).map_err(kv_arg))
    }
    pub fn seq_div(&mut self, seq: i32, p0: i32, p1: i32, d: i32) -> Result<()> {
        self.check_seq(seq, false)?;
        if d != 1 {
            self.check_can_shift()?;
        }
        self.caches.iter_mut().try_for_each(|c| c.cells.seq_div(seq, p0, p1, d).map_err(kv_arg))?;
        self.rs.as_mut().map_or(Ok(()), |rs| rs.seq_div(seq, p0, p1, d).map_err(kv_arg))
    }
    /// llama_memory_can_shift: whether the positions of cached keys can move (seq_add,
    /// seq_div), which context shifts and Self-Extend need.
    pub fn can_shift(&self) -> bool {
        self.caches.is_empty() || self.model.hparams.mrope.is_none()
    }
    /// llama_kv_cache::get_can_shift: keys rotated with several positions per token (M-RoPE:
    /// Qwen2-VL, Qwen3-VL, Qwen3.5) cannot be re-rotated to a new position; llama.cpp asserts
    /// (seq_add, seq_div) or aborts on the next decode after moving them, the engine refuses
    /// the move itself (nothing changes).
    fn check_can_shift(&self) -> Result<()> {
        if self.can_shift() {
            return Ok(());
        }
        Err(EngineError::Unsupported(format!(
            "the '{}' model's keys use multi-position RoPE (M-RoPE): their positions cannot be shifted (seq_add / seq_div; llama.cpp: K-shift not supported)",
            self.model.arch.map_or("?", |a| a.name))))
    }
    pub fn seq_pos_min(&self, seq: i32) -> Result<i32> {
        let attn = match self.caches.last() { Some(c) => Some(c.cells.seq_pos_min(seq).map_err(kv_arg)?), None => None };
        let rs = self.rs.as_ref().map(|rs| rs.seq_pos_min(seq));
        Ok(match (attn, rs) { (Some(a), Some(r)) => a.max(r), (a, r) => a.or(r).unwrap_or(-1) })
    }
    pub fn seq_pos_max(&self, seq: i32) -> Result<i32> {
        let attn = match self.caches.last() { Some(c) => Some(c.cells.seq_pos_max(seq).map_err(kv_arg)?), None => None };
        let rs = self.rs.as_ref().map(|rs| rs.seq_pos_max(seq));
        Ok(match (attn, rs) { (Some(a), Some(r)) => a.min(r), (a, r) => a.or(r).unwrap_or(-1) })
    }
    pub fn kv_clear(&mut self) {
        self.caches.iter_mut().for_each(|c| c.cells.clear());
        if let Some(rs) = &mut self.rs {
            rs.clear();
            self.store.rs.clear();
        }
    }
    /// Every cell of the memories as (position, sequence ids): the attention caches' cells,
    /// then the recurrent state cells (one per sequence).
    pub fn cell_list(&self) -> Vec<(i32, Vec<i32>)> {
        let mut all: Vec<(i32, Vec<i32>)> = self.caches.first().map(|c| c.cells.cells()).unwrap_or_default();
        all.extend(self.rs.iter().flat_map(|rs| rs.cells()));
        all
    }
    /// Cells, used cells and the search head, over the same memories as `cell_list`.
    pub fn cells_size(&self) -> u32 {
        self.caches.first().map_or(0, |c| c.cells.size()) + self.rs.as_ref().map_or(0, |rs| rs.size())
    }
    pub fn cells_used(&self) -> u32 {
        self.caches.first().map_or(0, |c| c.cells.used()) + self.rs.as_ref().map_or(0, |rs| rs.used())
    }
    pub fn cells_head(&self) -> u32 { self.caches.first().map_or(0, |c| c.cells.head()) }

    fn check_seq(&self, seq: i32, allow_all: bool) -> Result<()> {
        if (allow_all && seq < 0) || (seq >= 0 && (seq as usize) < self.params.n_seq_max) {
            return Ok(());
        }
        Err(EngineError::InvalidArgument(format!("sequence id {seq} is out of range (n_seq_max = {})", self.params.n_seq_max)))
    }

    /// A token at position `p0` of `seq` attends through the sliding window to the positions
    /// just before it; refuse to decode when the sliding cache has already dropped some of them
    /// while the full cache still has them (a rollback into the window), instead of computing
    /// attention over a silently shortened window.
    /// Whether `seq` can go on at position `p0`: the sliding-window cache still holds the
    /// positions a token there attends to (it reuses cells the window hides, so a sequence cut
    /// back by seq_rm may have lost them: then decode it again from the start).
    pub fn window_held(&self, seq: i32, p0: i32) -> Result<bool> {
        self.check_seq(seq, false)?;
        Ok(self.check_window_held(seq, p0).is_ok())
    }

    fn check_window_held(&self, seq: i32, p0: i32) -> Result<()> {
        let [full, swa] = &self.caches[..] else { return Ok(()) };
        let need_from = self.model.hparams.swa_params().first_visible(p0);
        if need_from >= p0 {
            // the first position of a chunk sees no earlier one
            return Ok(());
        }
        let full_min = full.cells.seq_pos_min(seq).map_err(kv_arg)?;
        let swa_min = swa.cells.seq_pos_min(seq).map_err(kv_arg)?;
        if full_min >= 0 && full_min <= need_from && p0 > 0 && (swa_min < 0 || swa_min > need_from) {
            return Err(EngineError::Decode(format!(
                "sequence {seq}: decoding position {p0} needs positions {need_from}..{p0} in the sliding-window cache, \
                 which now starts at {swa_min}; remove the sequence and decode it again from the start \
                 (or create the context with swa_full=True)"
            )));
        }
        Ok(())
    }
}
