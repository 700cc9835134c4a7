//! `ferrollama.LoraAdapter`: a LoRA adapter GGUF loaded against a model.

use std::sync::Arc;

use ferrollama_engine::lora::LoraAdapter;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{guard, to_py};
use crate::model::{value_to_py, PyModel};

#[pyclass(name = "LoraAdapter", module = "ferrollama", frozen)]
pub struct PyLoraAdapter {
    pub inner: Arc<LoraAdapter>,
    /// The model it was loaded for (kept alive with it).
    #[pyo3(get)]
    model: Py<PyModel>,
}

#[pymethods]
impl PyLoraAdapter {
    #[new]
    fn new(py: Python<'_>, model: Py<PyModel>, path: std::path::PathBuf) -> PyResult<Self> {
        guard(|| {
            let m = model.get().inner.clone();
            let adapter = py.allow_threads(|| LoraAdapter::load(&m, &path)).map_err(to_py)?;
            Ok(PyLoraAdapter { inner: Arc::new(adapter), model })
        })
    }

    #[getter] fn path(&self) -> String { self.inner.file.path().display().to_string() }
    /// adapter.lora.alpha (0: the scale applies as given; else scale · alpha / rank).
    #[getter] fn alpha(&self) -> f32 { self.inner.alpha }
    /// The base tensors the adapter changes, with the rank of each pair.
    #[getter] fn ranks(&self) -> std::collections::BTreeMap<String, usize> { self.inner.ranks.clone() }
    /// Tensors of the file that are not applied, as llama.cpp does not apply them (norms).
    #[getter] fn skipped(&self) -> Vec<String> { self.inner.skipped.clone() }

    /// Every GGUF metadata key of the adapter file with its value.
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.inner.file.metadata {
            d.set_item(k, value_to_py(py, v)?)?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("LoraAdapter({:?}, alpha={}, n_pairs={})", self.path(), self.inner.alpha, self.inner.ranks.len())
    }
}
