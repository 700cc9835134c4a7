//! `ferrollama.Batch`, `ferrollama.Context` and its `kv` view.

use std::sync::{Mutex, MutexGuard, TryLockError};

use ferrollama_engine::kvstore::parse_cache_type;
use ferrollama_engine::context::Pooling;
use ferrollama_engine::hparams::{RopeOverrides, RopeScaling};
use ferrollama_engine::{Batch, Context, ContextParams};
use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{guard, to_py, BusyError};
use crate::lora::PyLoraAdapter;
use crate::model::PyModel;

fn token_id(t: i64) -> PyResult<u32> {
    u32::try_from(t).map_err(|_| PyValueError::new_err(format!("token {t} is out of range")))
}
fn pos_i32(p: i64) -> PyResult<i32> {
    i32::try_from(p).map_err(|_| PyValueError::new_err(format!("position {p} is out of range")))
}

/// An (n, 4) array of M-RoPE positions (any integer array or nested sequence).
fn mrope_positions(py: Python<'_>, positions: &Bound<'_, PyAny>) -> PyResult<Vec<[i32; 4]>> {
    let arr = py.import("numpy")?.call_method1("asarray", (positions,))?;
    let kind: String = arr.getattr("dtype")?.getattr("kind")?.extract()?;
    let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
    if !matches!(kind.as_str(), "i" | "u") || shape.len() != 2 || shape[1] != 4 {
        return Err(PyValueError::new_err(format!(
            "positions must be an integer array of shape (n_tokens, 4) (time, height, width, extra), not of shape {shape:?} and kind {kind:?}")));
    }
    let values: Vec<Vec<i64>> = arr.call_method0("tolist")?.extract()?;
    values.iter().map(|row| {
        let mut p = [0i32; 4];
        for (out, &v) in p.iter_mut().zip(row) {
            *out = pos_i32(v)?;
        }
        Ok(p)
    }).collect()
}

#[pyclass(name = "Batch", module = "ferrollama")]
pub struct PyBatch {
    pub inner: Batch,
}

#[pymethods]
impl PyBatch {
    #[new]
    #[pyo3(signature = (n_tokens_max=512, n_seq_max=1))]
    fn new(n_tokens_max: usize, n_seq_max: usize) -> PyResult<Self> {
        Ok(PyBatch { inner: Batch::new(n_tokens_max, n_seq_max).map_err(to_py)? })
    }

    /// A batch of consecutive positions of one sequence; logits: "last", "all" or "none".
    #[staticmethod]
    #[pyo3(signature = (tokens, pos0=0, seq_id=0, logits="last"))]
    fn from_tokens(tokens: Vec<i64>, pos0: i64, seq_id: i32, logits: &str) -> PyResult<Self> {
        let tokens = tokens.into_iter().map(token_id).collect::<PyResult<Vec<_>>>()?;
        Ok(PyBatch { inner: Batch::from_tokens(&tokens, pos_i32(pos0)?, seq_id, logits).map_err(to_py)? })
    }

    /// A batch of embedding rows (a 2-D float32 array, one row of the model's input width
    /// Model.n_embd_inp per token) at consecutive positions of one sequence, as mtmd feeds an
    /// image's embeddings; or, with `positions` (an (n_tokens, 4) integer array of time,
    /// height, width and extra positions: a model with M-RoPE only), at those positions
    /// (`pos0` is then unused).
    #[staticmethod]
    #[pyo3(signature = (embd, pos0=0, seq_id=0, logits="last", positions=None))]
    fn from_embeddings(py: Python<'_>, embd: numpy::PyReadonlyArray2<'_, f32>, pos0: i64, seq_id: i32, logits: &str,
                       positions: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let n_embd = embd.as_array().shape()[1];
        let rows = embd.as_array().iter().copied().collect();
        let inner = match positions {
            None => Batch::from_embeddings(rows, n_embd, pos_i32(pos0)?, seq_id, logits),
            Some(p) => Batch::from_embeddings_mrope(rows, n_embd, &mrope_positions(py, p)?, seq_id, logits),
        };
        Ok(PyBatch { inner: inner.map_err(to_py)? })
    }

    /// The width of a batch of embeddings (0 for a batch of tokens).
    #[getter] fn n_embd(&self) -> usize { self.inner.n_embd }
    /// Each entry's M-RoPE positions (time, height, width, extra) where the batch was given
    /// them, else an empty list.
    #[getter] fn positions(&self) -> Vec<[i32; 4]> { self.inner.pos_mrope.clone() }

    #[pyo3(signature = (token, pos, seq_ids=vec![0], logits=false))]
    fn add(&mut self, token: i64, pos: i64, seq_ids: Vec<i32>, logits: bool) -> PyResult<()> {
        self.inner.add(token_id(token)?, pos_i32(pos)?, &seq_ids, logits).map_err(to_py)
    }

    fn clear(&mut self) { self.inner.clear() }
    fn __len__(&self) -> usize { self.inner.len() }
    #[getter] fn tokens(&self) -> Vec<u32> { self.inner.tokens.clone() }
    #[getter] fn pos(&self) -> Vec<i32> { self.inner.pos.clone() }
    #[getter] fn seq_ids(&self) -> Vec<Vec<i32>> { self.inner.seq_ids.clone() }
    #[getter] fn logits(&self) -> Vec<bool> { self.inner.logits.clone() }
    fn __repr__(&self) -> String { format!("Batch(n_tokens={}, n_tokens_max={})", self.inner.len(), self.inner.n_tokens_max()) }
}

#[pyclass(name = "Context", module = "ferrollama", frozen, weakref)]
pub struct PyContext {
    inner: Mutex<Context>,
    #[pyo3(get)]
    model: Py<PyModel>,
}

impl PyContext {
    /// The context, or BusyError when another thread is using it (never a deadlock, never
    /// interleaved state).
    pub fn lock(&self) -> PyResult<MutexGuard<'_, Context>> {
        match self.inner.try_lock() {
            Ok(g) => Ok(g),
            Err(TryLockError::WouldBlock) => Err(BusyError::new_err("this Context is in use by another thread; use one Context per thread")),
            // A panic while locked was turned into an exception; the state it left is still
            // consistent because every mutation validates before it writes.
            Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
        }
    }
}

#[pymethods]
impl PyContext {
    #[new]
    #[pyo3(signature = (model, n_ctx=4096, n_batch=2048, n_ubatch=512, n_seq_max=1, n_threads=None, n_threads_batch=None,
                        type_k="f16", type_v="f16", kv_unified=true, swa_full=false, embeddings=false, pooling=None,
                        defrag_thold=-1.0, rope_scaling_type=None, rope_freq_base=0.0, rope_freq_scale=0.0,
                        yarn_ext_factor=-1.0, yarn_attn_factor=-1.0, yarn_beta_fast=-1.0, yarn_beta_slow=-1.0,
                        yarn_orig_ctx=0, n_rs_seq=0, batch_invariant=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, model: Py<PyModel>, n_ctx: usize, n_batch: usize, n_ubatch: usize, n_seq_max: usize,
           n_threads: Option<usize>, n_threads_batch: Option<usize>, type_k: &str, type_v: &str, kv_unified: bool,
           swa_full: bool, embeddings: bool, pooling: Option<&str>, defrag_thold: f32,
           rope_scaling_type: Option<&str>, rope_freq_base: f32, rope_freq_scale: f32, yarn_ext_factor: f32,
           yarn_attn_factor: f32, yarn_beta_fast: f32, yarn_beta_slow: f32, yarn_orig_ctx: usize,
           n_rs_seq: usize, batch_invariant: bool) -> PyResult<Self> {
        guard(|| {
            let mut p = ContextParams::new(n_ctx);
            let physical = default_threads();
            p.n_batch = n_batch;
            p.n_ubatch = n_ubatch;
            p.n_seq_max = n_seq_max;
            p.n_threads = n_threads.unwrap_or(physical);
            p.n_threads_batch = n_threads_batch.unwrap_or(p.n_threads);
            p.type_k = parse_cache_type(type_k).map_err(to_py)?;
            p.type_v = parse_cache_type(type_v).map_err(to_py)?;
            p.kv_unified = kv_unified;
            p.swa_full = swa_full;
            p.embeddings = embeddings;
            p.defrag_thold = defrag_thold;
            p.n_rs_seq = n_rs_seq;
            p.batch_invariant = batch_invariant;
            p.rope = RopeOverrides {
                scaling: rope_scaling_type.map(|name| RopeScaling::from_name(name).ok_or_else(|| PyValueError::new_err(
                    format!("rope_scaling_type must be none, linear, yarn or longrope, not {name:?}")))).transpose()?,
                freq_base: rope_freq_base, freq_scale: rope_freq_scale, yarn_ext_factor, yarn_attn_factor,
                yarn_beta_fast, yarn_beta_slow, yarn_orig_ctx,
            };
            let m = model.get().inner.clone();
            // Unspecified: the model's own pooling type (llama.cpp's LLAMA_POOLING_TYPE_UNSPECIFIED).
            p.pooling = match pooling {
                Some(name) => Pooling::parse(name),
                None => Pooling::of_model(&m.hparams),
            }.map_err(to_py)?;
            let ctx = py.allow_threads(|| Context::new(m, p)).map_err(to_py)?;
            Ok(PyContext { inner: Mutex::new(ctx), model })
        })
    }

    /// Runs the batch; DecodeError leaves the cache as it was.
    fn decode(&self, py: Python<'_>, batch: &PyBatch) -> PyResult<()> {
        guard(|| {
            let mut ctx = self.lock()?;
            let ctx: &mut Context = &mut ctx;
            let b = &batch.inner;
            py.allow_threads(|| ctx.decode(b)).map_err(to_py)
        })
    }

    /// Logits of batch index i of the last decode (negative: counted from the last output).
    #[pyo3(signature = (i=-1))]
    fn logits<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let ctx = self.lock()?;
        Ok(PyArray1::from_slice(py, ctx.logits_ith(i).map_err(to_py)?))
    }

    /// The embedding of batch index i of the last decode (contexts with embeddings=True).
    #[pyo3(signature = (i=-1))]
    fn embeddings<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let ctx = self.lock()?;
        Ok(PyArray1::from_slice(py, ctx.embeddings_ith(i).map_err(to_py)?))
    }

    /// The pooled embedding of a sequence of the last decode (embeddings=True with pooling).
    fn embeddings_seq<'py>(&self, py: Python<'py>, seq_id: i32) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let ctx = self.lock()?;
        Ok(PyArray1::from_slice(py, ctx.embeddings_seq(seq_id).map_err(to_py)?))
    }

    /// Adds data[il] (shape (n_layer, n_embd)) to the output of each layer il in
    /// [layer_start, layer_end] (llama.cpp's control vectors); None removes it.
    #[pyo3(signature = (data, layer_start=0, layer_end=-1))]
    fn set_control_vector(&self, data: Option<numpy::PyReadonlyArray2<'_, f32>>, layer_start: i64, layer_end: i64) -> PyResult<()> {
        let data = match data {
            Some(a) => Some(a.as_array().iter().copied().collect::<Vec<f32>>()),
            None => None,
        };
        let end = if layer_end < 0 { usize::MAX } else { layer_end as usize };
        let mut ctx = self.lock()?;
        ctx.set_control_vector(data, layer_start.max(0) as usize, end).map_err(to_py)
    }

    /// Starts (True) or stops collecting, during decode, the per-column sums of squared input
    /// activations of each layer matrix (llama-imatrix's statistics); starting clears them.
    fn set_activation_stats(&self, enabled: bool) -> PyResult<()> {
        self.lock()?.set_activation_stats(enabled);
        Ok(())
    }

    /// The statistics collected so far, and clears them: {tensor name: (sums, counts)} with
    /// sums float32 of shape (n_mat, n_cols) (one row per expert) and counts int64 (n_mat,).
    fn take_activation_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let named = self.lock()?.take_activation_stats();
        let out = pyo3::types::PyDict::new(py);
        for (name, s) in named {
            let n_mat = s.counts.len();
            let n_cols = s.sums.len() / n_mat.max(1);
            let sums = PyArray1::from_vec(py, s.sums).reshape([n_mat, n_cols])?;
            let counts = PyArray1::from_vec(py, s.counts.into_iter().map(|c| c as i64).collect());
            out.set_item(name, (sums, counts))?;
        }
        Ok(out)
    }

    /// Adds a LoRA adapter's terms to every later decode, at `scale` (again: a new scale).
    #[pyo3(signature = (adapter, scale=1.0))]
    fn set_lora(&self, adapter: &PyLoraAdapter, scale: f32) -> PyResult<()> {
        let mut ctx = self.lock()?;
        ctx.set_lora(adapter.inner.clone(), scale).map_err(to_py)
    }

    /// Removes an adapter; False when it was not set.
    fn remove_lora(&self, adapter: &PyLoraAdapter) -> PyResult<bool> {
        Ok(self.lock()?.remove_lora(&adapter.inner))
    }

    /// Removes every adapter.
    fn clear_lora(&self) -> PyResult<()> {
        self.lock()?.clear_lora();
        Ok(())
    }

    /// All outputs of the last decode, shape (n_outputs, n_vocab), in batch order.
    fn logits_all<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let ctx = self.lock()?;
        ctx.check_has_logits().map_err(to_py)?;
        let nv = ctx.n_vocab();
        let flat = PyArray1::from_slice(py, ctx.logits_all());
        flat.reshape([ctx.n_outputs(), nv])
    }

    #[getter] fn n_ctx(&self) -> PyResult<usize> { Ok(self.lock()?.params.n_ctx) }
    /// Whether attention is causal (llama_get_causal_attn); set it False to decode a batch
    /// whose tokens see each other both ways (llama_set_causal_attn, as mtmd does for Gemma 3's
    /// images).
    #[getter] fn causal_attn(&self) -> PyResult<bool> { Ok(self.lock()?.causal_attn()) }
    #[setter] fn set_causal_attn(&self, causal: bool) -> PyResult<()> { self.lock()?.set_causal_attn(causal).map_err(to_py) }
    #[getter] fn n_batch(&self) -> PyResult<usize> { Ok(self.lock()?.params.n_batch) }
    #[getter] fn n_ubatch(&self) -> PyResult<usize> { Ok(self.lock()?.params.n_ubatch) }
    #[getter] fn n_seq_max(&self) -> PyResult<usize> { Ok(self.lock()?.params.n_seq_max) }
    /// Tokens of a sequence's last decode that seq_rm can remove again (recurrent models).
    #[getter] fn n_rs_seq(&self) -> PyResult<usize> { Ok(self.lock()?.params.n_rs_seq) }
    #[getter] fn n_threads(&self) -> PyResult<usize> { Ok(self.lock()?.params.n_threads) }
    /// How embeddings are pooled: "none", "mean", "cls" or "last".
    #[getter] fn pooling(&self) -> PyResult<&'static str> { Ok(self.lock()?.params.pooling.name()) }

    #[getter]
    fn perf(&self, py: Python<'_>) -> PyResult<PyObject> {
        let ctx = self.lock()?;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("n_p_eval", ctx.perf.n_p_eval)?;
        d.set_item("t_p_eval_ms", ctx.perf.t_p_eval_ms)?;
        d.set_item("n_eval", ctx.perf.n_eval)?;
        d.set_item("t_eval_ms", ctx.perf.t_eval_ms)?;
        d.set_item("t_load_ms", ctx.model.load_ms)?;
        Ok(d.into_any().unbind())
    }

    /// The KV cache of this context.
    #[getter]
    fn kv(slf: Py<Self>) -> PyKv { PyKv { ctx: slf } }

    /// The whole context (cells, K/V, the last outputs) as bytes.
    fn state_get<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut ctx = self.lock()?;
        let blob = guard(|| ctx.state_get().map_err(to_py))?;
        Ok(PyBytes::new(py, &blob))
    }
    /// Restores a state_get blob; StateError (context unchanged) for a foreign or broken one.
    fn state_set(&self, blob: &[u8]) -> PyResult<()> {
        let mut ctx = self.lock()?;
        guard(|| ctx.state_set(blob).map_err(to_py))
    }
    /// One sequence's cells and K/V as bytes; with partial=True its recurrent states alone.
    #[pyo3(signature = (seq_id, partial=false))]
    fn seq_state_get<'py>(&self, py: Python<'py>, seq_id: i32, partial: bool) -> PyResult<Bound<'py, PyBytes>> {
        let mut ctx = self.lock()?;
        let blob = guard(|| if partial { ctx.seq_state_get_partial(seq_id) } else { ctx.seq_state_get(seq_id) }.map_err(to_py))?;
        Ok(PyBytes::new(py, &blob))
    }
    /// Restores a seq_state_get blob as sequence dst_seq_id (partial: one of recurrent states alone).
    #[pyo3(signature = (blob, dst_seq_id, partial=false))]
    fn seq_state_set(&self, blob: &[u8], dst_seq_id: i32, partial: bool) -> PyResult<()> {
        let mut ctx = self.lock()?;
        guard(|| if partial { ctx.seq_state_set_partial(blob, dst_seq_id) } else { ctx.seq_state_set(blob, dst_seq_id) }.map_err(to_py))
    }
    /// Writes a session file: the tokens the cache holds and the whole state.
    fn state_save(&self, path: std::path::PathBuf, tokens: Vec<i64>) -> PyResult<()> {
        let tokens = tokens.into_iter().map(token_id).collect::<PyResult<Vec<_>>>()?;
        let mut ctx = self.lock()?;
        guard(|| ctx.state_save(&path, &tokens).map_err(to_py))
    }
    /// Restores a session file and returns its tokens.
    fn state_load(&self, path: std::path::PathBuf) -> PyResult<Vec<u32>> {
        let mut ctx = self.lock()?;
        guard(|| ctx.state_load(&path).map_err(to_py))
    }
}

/// Threads for compute: the physical cores (hyper-threads share one core's units, and llama.cpp
/// defaults to the physical count too).
pub(crate) fn default_threads() -> usize {
    let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    physical_cores().unwrap_or(logical).clamp(1, logical)
}

fn physical_cores() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mut cores = std::collections::HashSet::new();
    let (mut phys, mut core) = (None, None);
    for line in info.lines() {
        let val = || line.split(':').nth(1).map(|v| v.trim().to_string());
        if line.starts_with("physical id") { phys = val(); }
        if line.starts_with("core id") { core = val(); }
        if line.trim().is_empty() {
            if let (Some(p), Some(c)) = (phys.take(), core.take()) { cores.insert((p, c)); }
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// `Context.kv`: the sequence operations of llama_memory_seq_*.
#[pyclass(name = "KVCache", module = "ferrollama", frozen)]
pub struct PyKv {
    ctx: Py<PyContext>,
}

#[pymethods]
impl PyKv {
    /// Removes the cells of seq_id in [p0, p1); seq_id < 0: every sequence.
    #[pyo3(signature = (seq_id, p0=-1, p1=-1))]
    fn seq_rm(&self, seq_id: i32, p0: i32, p1: i32) -> PyResult<bool> {
        self.ctx.get().lock()?.seq_rm(seq_id, p0, p1).map_err(to_py)
    }
    #[pyo3(signature = (src, dst, p0=-1, p1=-1))]
    fn seq_cp(&self, src: i32, dst: i32, p0: i32, p1: i32) -> PyResult<()> {
        self.ctx.get().lock()?.seq_cp(src, dst, p0, p1).map_err(to_py)
    }
    fn seq_keep(&self, seq_id: i32) -> PyResult<()> {
        self.ctx.get().lock()?.seq_keep(seq_id).map_err(to_py)
    }
    fn seq_add(&self, seq_id: i32, p0: i32, p1: i32, delta: i32) -> PyResult<()> {
        self.ctx.get().lock()?.seq_add(seq_id, p0, p1, delta).map_err(to_py)
    }
    fn seq_div(&self, seq_id: i32, p0: i32, p1: i32, d: i32) -> PyResult<()> {
        self.ctx.get().lock()?.seq_div(seq_id, p0, p1, d).map_err(to_py)
    }
    fn seq_pos_min(&self, seq_id: i32) -> PyResult<i32> { self.ctx.get().lock()?.seq_pos_min(seq_id).map_err(to_py) }
    fn seq_pos_max(&self, seq_id: i32) -> PyResult<i32> { self.ctx.get().lock()?.seq_pos_max(seq_id).map_err(to_py) }
    /// Whether the sequence can be decoded on at position `pos`: False when the sliding-window
    /// cache no longer holds the positions just before it (cells the window hid were reused
    /// before a seq_rm cut the sequence back); then decode it again from the start.
    fn window_held(&self, seq_id: i32, pos: i32) -> PyResult<bool> { self.ctx.get().lock()?.window_held(seq_id, pos).map_err(to_py) }
    fn clear(&self) -> PyResult<()> { self.ctx.get().lock()?.kv_clear(); Ok(()) }
    /// Whether cached positions can move (seq_add / seq_div): llama_memory_can_shift. False for
    /// keys rotated with several positions per token (M-RoPE), whose shift llama.cpp refuses.
    #[getter] fn can_shift(&self) -> PyResult<bool> { Ok(self.ctx.get().lock()?.can_shift()) }
    /// Bytes of K/V storage of every layer.
    #[getter] fn nbytes(&self) -> PyResult<usize> { Ok(self.ctx.get().lock()?.store.bytes()) }
    /// Cells of each cache: [full] or, for interleaved sliding-window models, [full, sliding].
    #[getter] fn sizes(&self) -> PyResult<Vec<u32>> {
        Ok(self.ctx.get().lock()?.caches.iter().map(|c| c.cells.size()).collect())
    }
    /// Moves cells down to close holes (positions unchanged).
    fn defrag(&self) -> PyResult<()> { self.ctx.get().lock()?.defrag(); Ok(()) }
    #[getter] fn size(&self) -> PyResult<u32> { Ok(self.ctx.get().lock()?.cells_size()) }
    #[getter] fn used(&self) -> PyResult<u32> { Ok(self.ctx.get().lock()?.cells_used()) }
    #[getter] fn head(&self) -> PyResult<u32> { Ok(self.ctx.get().lock()?.cells_head()) }

    /// (pos, frozenset(seq_ids)) per cell; pos -1 for an empty cell.
    fn cells(&self, py: Python<'_>) -> PyResult<Vec<(i32, PyObject)>> {
        let ctx = self.ctx.get().lock()?;
        ctx.cell_list().into_iter()
            .map(|(pos, seqs)| Ok((pos, pyo3::types::PyFrozenSet::new(py, &seqs)?.into_any().unbind())))
            .collect()
    }
}
