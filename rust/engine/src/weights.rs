//! Weights as typed views into the model file's map: matrices stay quantized in place,
//! small vectors (norms, biases) are converted to f32 once.

use std::cell::RefCell;
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
pub(crate) struct Loader {
    file: Arc<GgufFile>,
    bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    /// The repacking left to do, in load order (see `Repacking`).
    jobs: RefCell<Vec<Repack>>,
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
        Loader { file, bytes, jobs: RefCell::new(Vec::new()) }
    }

    /// The repacking the loaded matrices wait for.
    pub fn repacking(self) -> Repacking {
        Repacking { file: self.file, jobs: self.jobs.into_inner() }
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.file.tensor(name).ok_or_else(|| self.file.error(format!("missing tensor '{name}'")).into())
    }

    /// A matrix of `rows` rows of `cols` elements (ggml ne = [cols, rows]).
    pub fn matrix(&self, name: &str, cols: usize, rows: usize) -> Result<QMatrix> {
        let t = self.info(name)?;
        if t.shape != [cols, rows] {
            return Err(self.file.error(format!("tensor '{name}' has shape {:?}, expected [{cols}, {rows}]", t.shape)).into());
        }
        let start = self.file.data_offset + t.offset;
        let data = WeightBytes::Shared { owner: self.bytes.clone(), range: start..start + t.nbytes };
        let (m, job) = QMatrix::new_deferred(t.ggml_type, rows, cols, data).map_err(|e| match e {
            TensorError::Unsupported(ty) => EngineError::Unsupported(format!("tensor '{name}' has type {ty}, which the engine does not support")),
            TensorError::Shape(s) => self.file.error(format!("tensor '{name}': {s}")).into(),
        })?;
        if let Some(job) = job {
            self.jobs.borrow_mut().push(Repack { name: name.to_string(), job, range: start..start + t.nbytes });
        }
        Ok(m)
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
        let tr = traits(t.ggml_type).ok_or_else(|| {
            EngineError::Unsupported(format!("tensor '{name}' has type {}, which the engine does not support", t.ggml_type))
        })?;
        let mut out = vec![0.0; len];
        (tr.to_f32)(self.file.tensor_data(t), &mut out);
        Ok(out)
    }

    pub fn opt_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if self.file.tensor(name).is_none() { return Ok(None); }
        self.vector(name, len).map(Some)
    }
}
