//! Weights as typed views into the model file's map: matrices stay quantized in place,
//! small vectors (norms, biases) are converted to f32 once.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use ferrollama_gguf::{GgufFile, TensorInfo};
use ferrollama_tensor::{traits, PackJob, QMatrix, TensorError, WeightBytes};

use crate::error::{EngineError, Result};

/// The model file's bytes, shared by every weight view.
struct FileBytes(Arc<GgufFile>);

impl AsRef<[u8]> for FileBytes {
    fn as_ref(&self) -> &[u8] { self.0.bytes() }
}

/// Looks tensors up by llama.cpp's names (LLM_TN) and checks their shapes.
pub struct Loader {
    file: Arc<GgufFile>,
    bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    /// The repacking left to do, in load order (see `Repacking`).
    jobs: RefCell<Vec<Repack>>,
    /// The names of the tensors the architecture has read: every other tensor of the file is
    /// one the engine would ignore, which loading refuses (`check_all_used`).
    used: RefCell<BTreeSet<String>>,
}

/// One matrix's repacking, and where its bytes lie in the file.
struct Repack {
    name: String,
    job: PackJob,
    range: std::ops::Range<usize>,
}

/// Source bytes repacked and published at a time: small next to the weights (the extra
/// memory while copying), large next to a page and a syscall.
const PART_BYTES: usize = 1 << 20;

/// The repacking of a model's matrices, run after loading on a thread of its own: loading
/// returns as soon as the file is mapped, the first products run on the rows in place (the
/// same bits), and each matrix switches to its packed copy when it is ready.
pub(crate) struct Repacking {
    file: Arc<GgufFile>,
    jobs: Vec<Repack>,
}

impl Repacking {
    /// Starts the thread (nothing to do: no thread). Layers first, in order, then the
    /// embedding and output matrices: the order a decode uses them.
    pub fn start(mut self) -> RepackHandle {
        // Matrices still waiting for their copy (shared with the model's handle).
        let pending = Arc::new(AtomicUsize::new(self.jobs.len()));
        let left = pending.clone();
        let cancel = Arc::new(AtomicBool::new(false));
        if self.jobs.is_empty() {
            return RepackHandle { pending, cancel, thread: None };
        }
        self.jobs.sort_by_key(|r| !r.name.starts_with("blk."));
        let stop = cancel.clone();
        let spawned = std::thread::Builder::new().name("ferrollama-repack".into()).spawn(move || {
            ferrollama_tensor::threads::block_async_signals();
            ferrollama_tensor::threads::lower_this_threads_priority();
            for r in self.jobs {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                // One thread, so that the decodes that run meanwhile keep the cores. Each
                // part's file pages are dropped as soon as the products read its copy
                // (embedding lookups and leftover rows read a few back), so the process
                // never holds much of the weights twice.
                r.job.run_in_parts(PART_BYTES, |done| {
                    // From the matrix's start, not just this part: pages of parts released
                    // before come back mapped while the copying goes on (measured on Gemma's
                    // 170 MiB embedding after a first decode had read it in place: 25 MiB
                    // behind the copy, in blocks of MiBs, on Linux 6.18 and ext4; likely the
                    // page cache's large folios mapped whole on a fault). An madvise over
                    // pages already dropped costs a page-table walk: milliseconds in all.
                    self.file.release(r.range.start, done.end);
                    !stop.load(Ordering::Acquire)
                });
                left.fetch_sub(1, Ordering::AcqRel);
            }
        });
        let thread = match spawned {
            Ok(t) => Some(t),
            Err(_) => {
                // No thread (resource limits): the matrices stay in place, correct and slower.
                pending.store(0, Ordering::Release);
                None
            }
        };
        RepackHandle { pending, cancel, thread }
    }
}

/// The model's side of the repacking thread. Dropping it (with the model) stops the thread
/// after the part it is copying and waits for it: once a model is gone, nothing reads its
/// file any more (the file may then be rewritten).
pub(crate) struct RepackHandle {
    pub pending: Arc<AtomicUsize>,
    cancel: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RepackHandle {
    /// No repacking (a vocab-only model).
    pub fn none() -> RepackHandle {
        RepackHandle { pending: Arc::default(), cancel: Arc::default(), thread: None }
    }
}

impl Drop for RepackHandle {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // A panic there only lost the remaining copies: nothing to report at drop.
            let _ = t.join();
        }
    }
}

impl Loader {
    pub fn new(file: Arc<GgufFile>) -> Loader {
        let bytes = Arc::new(FileBytes(file.clone()));
        Loader { file, bytes, jobs: RefCell::new(Vec::new()), used: RefCell::new(BTreeSet::new()) }
    }

    /// An error about the file.
    pub fn error(&self, msg: impl Into<String>) -> EngineError { self.file.error(msg.into()).into() }

    /// The shape of a tensor, if the file has it.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> { self.file.tensor(name).map(|t| t.shape.clone()) }

    /// The file the tensors come from (its metadata, for the loaders that need a key).
    pub fn file(&self) -> &GgufFile { &self.file }

    /// Whether the file has a tensor of this name.
    pub fn has(&self, name: &str) -> bool { self.file.tensor(name).is_some() }

    /// Leaves the tensors `other` picks to another reader of the same file (a projector file's
    /// other encoder, which its own loader checks): `check_all_used` passes over them.
    pub fn leave_to_other(&self, other: impl Fn(&str) -> bool) {
        let mut used = self.used.borrow_mut();
        used.extend(self.file.tensors.iter().map(|t| t.name.as_str()).filter(|n| other(n)).map(str::to_string));
    }

    /// Refuses a file with tensors the architecture did not read: computing without one
    /// would give wrong results with no error (Llama 3's `rope_freqs` was such a tensor).
    pub fn check_all_used(&self, arch: &str) -> Result<()> {
        let used = self.used.borrow();
        let unused: Vec<&str> = self.file.tensors.iter().map(|t| t.name.as_str()).filter(|n| !used.contains(*n)).collect();
        match unused.as_slice() {
            [] => Ok(()),
            [one] => Err(EngineError::Unsupported(format!("tensor '{one}' is not used by the engine's '{arch}' architecture"))),
            [first, ..] => Err(EngineError::Unsupported(format!(
                "{} tensors are not used by the engine's '{arch}' architecture: '{first}' and {} more", unused.len(), unused.len() - 1))),
        }
    }

    /// The repacking the loaded matrices wait for.
    pub(crate) fn repacking(self) -> Repacking {
        Repacking { file: self.file, jobs: self.jobs.into_inner() }
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        let t = self.file.tensor(name).ok_or_else(|| self.file.error(format!("missing tensor '{name}'")))?;
        self.used.borrow_mut().insert(name.to_string());
        Ok(t)
    }

    /// A matrix of `rows` rows of `cols` elements (ggml ne = [cols, rows]).
    pub fn matrix(&self, name: &str, cols: usize, rows: usize) -> Result<QMatrix> {
        Ok(self.row_blocks(name, &[cols, rows], cols, &[rows])?.pop().expect("one block"))
    }

    /// A matrix stored as consecutive blocks of rows, one view each (no copy): fused
    /// projections (`attn_qkv` is Q's rows, then K's, then V's) and the experts of a 3-D
    /// expert tensor (`ffn_up_exps` of shape [cols, rows, n_expert]). A product over a block
    /// computes the same dot products as over the whole, bit for bit.
    pub fn row_blocks(&self, name: &str, shape: &[usize], cols: usize, block_rows: &[usize]) -> Result<Vec<QMatrix>> {
        let t = self.info(name)?;
        if !same_shape(&t.shape, shape) {
            return Err(self.file.error(format!("tensor '{name}' has shape {:?}, expected {shape:?}", t.shape)).into());
        }
        let tr = traits(t.ggml_type).ok_or_else(|| unsupported_type(name, t.ggml_type))?;
        if cols % tr.block_size != 0 {
            return Err(self.file.error(format!("tensor '{name}': {cols} columns is not a multiple of {}'s block size", t.ggml_type)).into());
        }
        let row_bytes = tr.row_bytes(cols);
        let mut start = self.file.data_offset + t.offset;
        let mut blocks = Vec::with_capacity(block_rows.len());
        for &rows in block_rows {
            let range = start..start + rows * row_bytes;
            let data = WeightBytes::Shared { owner: self.bytes.clone(), range: range.clone() };
            let (m, job) = QMatrix::new_deferred(t.ggml_type, rows, cols, data).map_err(|e| match e {
                TensorError::Unsupported(ty) => unsupported_type(name, ty),
                TensorError::Shape(s) => self.file.error(format!("tensor '{name}': {s}")).into(),
            })?;
            if let Some(job) = job {
                self.jobs.borrow_mut().push(Repack { name: name.to_string(), job, range: range.clone() });
            }
            blocks.push(m);
            start = range.end;
        }
        Ok(blocks)
    }

    pub fn opt_matrix(&self, name: &str, cols: usize, rows: usize) -> Result<Option<QMatrix>> {
        if self.file.tensor(name).is_none() { return Ok(None); }
        self.matrix(name, cols, rows).map(Some)
    }

    /// A vector of `len` values converted to f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.info(name)?;
        if t.n_elements() != len || t.shape[0] != len {
            return Err(self.file.error(format!("tensor '{name}' has shape {:?}, expected [{len}]", t.shape)).into());
        }
        let tr = traits(t.ggml_type).ok_or_else(|| unsupported_type(name, t.ggml_type))?;
        let mut out = vec![0.0; len];
        (tr.to_f32)(self.file.tensor_data(t), &mut out);
        Ok(out)
    }

    /// A matrix of `n` rows of `len` values converted to f32 (ggml ne = [len, n]): the
    /// per-expert biases.
    pub fn opt_vector_2d(&self, name: &str, len: usize, n: usize) -> Result<Option<Vec<f32>>> {
        let Some(t) = self.file.tensor(name) else { return Ok(None) };
        if !same_shape(&t.shape, &[len, n]) {
            return Err(self.file.error(format!("tensor '{name}' has shape {:?}, expected [{len}, {n}]", t.shape)).into());
        }
        self.info(name)?;
        let tr = traits(t.ggml_type).ok_or_else(|| unsupported_type(name, t.ggml_type))?;
        let mut out = vec![0.0; len * n];
        (tr.to_f32)(self.file.tensor_data(t), &mut out);
        Ok(Some(out))
    }

    /// The second scale of the matrix `weight` (a name ending in `.weight`): its one-value
    /// `NAME.scale` tensor, if the file has one.
    pub fn opt_scale(&self, weight: &str) -> Result<Option<f32>> {
        Ok(self.opt_vector(&sibling(weight, "scale"), 1)?.map(|s| s[0]))
    }

    /// Reads `NAME.input_scale` of the matrix `weight` (`len` values: 1, or one per expert)
    /// if the file has it, and drops it: an NVFP4 conversion writes the activations' scale,
    /// which llama.cpp loads and never applies (its CPU products quantize activations to
    /// Q8_0 whatever it says).
    pub fn skip_input_scale(&self, weight: &str, len: usize) -> Result<()> {
        self.opt_vector(&sibling(weight, "input_scale"), len).map(|_| ())
    }

    /// Marks a tensor of the file as read without loading it: llama.cpp's loaders create some
    /// tensors with TENSOR_SKIP (a multi-token-prediction head's, for plain decoding), which
    /// counts them present and never uses them. `required`: llama.cpp refuses a file without
    /// it all the same.
    pub fn skip(&self, name: &str, required: bool) -> Result<()> {
        if self.file.tensor(name).is_some() || required {
            self.info(name)?;
        }
        Ok(())
    }

    pub fn opt_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if self.file.tensor(name).is_none() { return Ok(None); }
        self.vector(name, len).map(Some)
    }
}

/// Whether two shapes are one up to trailing dimensions of 1, as ggml's (always 4-D) are: a
/// converter writes Mamba-2's one-group `ssm_norm` as [2048, 1], llama-quantize (and ferrollama's
/// quantize) as [2048].
fn same_shape(a: &[usize], b: &[usize]) -> bool {
    let trim = |s: &[usize]| s.len() - s.iter().rev().take_while(|&&d| d == 1).count();
    a[..trim(a)] == b[..trim(b)]
}

/// `blk.0.attn_q.weight` -> `blk.0.attn_q.SUFFIX`.
fn sibling(weight: &str, suffix: &str) -> String {
    format!("{}.{suffix}", weight.strip_suffix(".weight").unwrap_or(weight))
}

fn unsupported_type(name: &str, ty: ferrollama_tensor::GgmlType) -> EngineError {
    EngineError::Unsupported(format!("tensor '{name}' has type {ty}, which the engine does not support"))
}

#[cfg(test)]
mod tests {
    use super::same_shape;

    #[test]
    fn shapes_are_equal_up_to_trailing_dimensions_of_one() {
        assert!(same_shape(&[2048], &[2048, 1]));
        assert!(same_shape(&[2048, 1], &[2048]));
        assert!(same_shape(&[64, 4, 1, 1], &[64, 4]));
        assert!(!same_shape(&[2048, 2], &[2048]));
        assert!(!same_shape(&[1, 2048], &[2048]));
    }
}
