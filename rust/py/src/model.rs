//! `ferrollama.Model`: a GGUF model, memory-mapped.

use std::sync::Arc;

use ferrollama_engine::Model;
use ferrollama_gguf::{Array, Value};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::errors::{guard, to_py};

/// One entry of the tensor table.
#[pyclass(name = "TensorInfo", module = "ferrollama", frozen, get_all)]
pub struct PyTensorInfo {
    pub name: String,
    #[pyo3(name = "type")]
    pub ty: String,
    pub shape: Vec<usize>,
    pub offset: usize,
    pub nbytes: usize,
}

#[pymethods]
impl PyTensorInfo {
    fn __repr__(&self) -> String {
        format!("TensorInfo(name={:?}, type={:?}, shape={:?}, offset={}, nbytes={})", self.name, self.ty, self.shape, self.offset, self.nbytes)
    }
}

#[pyclass(name = "Model", module = "ferrollama", frozen)]
pub struct PyModel {
    pub inner: Arc<Model>,
}

#[pymethods]
impl PyModel {
    #[new]
    #[pyo3(signature = (path, use_mmap=true, vocab_only=false))]
    fn new(py: Python<'_>, path: std::path::PathBuf, use_mmap: bool, vocab_only: bool) -> PyResult<Self> {
        guard(|| {
            let model = py.allow_threads(|| Model::load(&path, use_mmap, vocab_only)).map_err(to_py)?;
            Ok(PyModel { inner: Arc::new(model) })
        })
    }

    #[getter] fn arch(&self) -> &str { &self.inner.hparams.arch }
    #[getter] fn n_vocab(&self) -> usize { self.inner.hparams.n_vocab }
    #[getter] fn n_ctx_train(&self) -> usize { self.inner.hparams.n_ctx_train }
    #[getter] fn n_embd(&self) -> usize { self.inner.hparams.n_embd }
    #[getter] fn n_layer(&self) -> usize { self.inner.hparams.n_layer }
    #[getter] fn n_head(&self) -> usize { self.inner.hparams.n_head }
    #[getter] fn n_head_kv(&self) -> usize { self.inner.hparams.n_head_kv }
    #[getter] fn n_params(&self) -> usize { self.inner.n_params() }
    #[getter] fn size(&self) -> usize { self.inner.size() }
    #[getter] fn path(&self) -> String { self.inner.file.path().display().to_string() }

    /// Every GGUF metadata key with its value (arrays as lists, strings as str).
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.inner.file.metadata {
            d.set_item(k, value_to_py(py, v)?)?;
        }
        Ok(d)
    }

    #[getter]
    fn tensors(&self) -> Vec<PyTensorInfo> {
        self.inner.file.tensors.iter().map(|t| PyTensorInfo {
            name: t.name.clone(), ty: t.ggml_type.name().to_string(), shape: t.shape.clone(),
            offset: t.offset, nbytes: t.nbytes,
        }).collect()
    }

    fn __repr__(&self) -> String {
        format!("Model(path={:?}, arch={:?}, n_params={})", self.inner.file.path().display().to_string(), self.inner.hparams.arch, self.inner.n_params())
    }
}

fn str_to_py(py: Python<'_>, s: &[u8]) -> PyObject {
    match std::str::from_utf8(s) {
        Ok(s) => s.into_pyobject(py).unwrap().into_any().unbind(),
        Err(_) => PyBytes::new(py, s).into_any().unbind(),
    }
}

fn value_to_py(py: Python<'_>, v: &Value) -> PyResult<PyObject> {
    Ok(match v {
        Value::U8(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::I8(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::U16(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::I16(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::U32(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::I32(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::U64(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::I64(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::F32(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::F64(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::Bool(x) => x.into_pyobject(py)?.to_owned().into_any().unbind(),
        Value::Str(s) => str_to_py(py, s),
        Value::Array(a) => array_to_py(py, a)?,
    })
}

fn array_to_py(py: Python<'_>, a: &Array) -> PyResult<PyObject> {
    Ok(match a {
        Array::U8(v) => PyList::new(py, v)?.into_any().unbind(),
        Array::I8(v) => PyList::new(py, v)?.into_any().unbind(),
        Array::U16(v) => PyList::new(py, v)?.into_any().unbind(),
        Array::I16(v) => PyList::new(py, v)?.into_any().unbind(),
        Array::U32(v) => PyList::new(py, v)?.into_any().unbind(),
        Array::I32(v) => PyList::new(py, v)?.into_any().unbind(),
        Array::U64(v) => PyList::new(py, v)?.into_any().unbind(),
        Array::I64(v) => PyList::new(py, v)?.into_any().unbind(),
        Array::F32(v) => PyList::new(py, v)?.into_any().unbind(),
        Array::F64(v) => PyList::new(py, v)?.into_any().unbind(),
        Array::Bool(v) => PyList::new(py, v)?.into_any().unbind(),
        Array::Str(v) => PyList::new(py, v.iter().map(|s| str_to_py(py, s)))?.into_any().unbind(),
        Array::Array(v) => PyList::new(py, v.iter().map(|x| array_to_py(py, x)).collect::<PyResult<Vec<_>>>()?)?.into_any().unbind(),
    })
}
