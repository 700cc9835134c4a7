//! Weights as typed views into the model file's map: matrices stay quantized in place,
//! small vectors (norms, biases) are converted to f32 once.

use std::sync::Arc;

use ferrollama_gguf::{GgufFile, TensorInfo};
use ferrollama_tensor::{traits, QMatrix, TensorError, WeightBytes};

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
}

impl Loader {
    pub fn new(file: Arc<GgufFile>) -> Loader {
        let bytes = Arc::new(FileBytes(file.clone()));
        Loader { file, bytes }
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
        let m = QMatrix::new(t.ggml_type, rows, cols, data).map_err(|e| match e {
            TensorError::Unsupported(ty) => EngineError::Unsupported(format!("tensor '{name}' has type {ty}, which the engine does not support")),
            TensorError::Shape(s) => self.file.error(format!("tensor '{name}': {s}")).into(),
        })?;
        if m.is_packed() {
            // The products read the repacked copy: the file's pages need not stay resident
            // (embedding lookups and leftover rows read a few back).
            self.file.release(start, t.nbytes);
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
