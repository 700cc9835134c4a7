//! `ferrollama.Model`: a GGUF model, memory-mapped.

use std::sync::{Arc, Mutex, OnceLock};

use ferrollama_engine::Model;
use ferrollama_gguf::{Array, Value};
use ferrollama_sampling::TokenPieces;
use ferrollama_vocab::{StreamDecoder, Vocab, VocabError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::errors::{guard, to_py, UnsupportedError};

/// One entry of the tensor table.
#[pyclass(name = "TensorInfo", module = "ferrollama", frozen)]
pub struct PyTensorInfo {
    #[pyo3(get)]
    pub name: String,
    #[pyo3(get, name = "type")]
    pub ty: String,
    pub shape: Vec<usize>,
    #[pyo3(get)]
    pub offset: usize,
    #[pyo3(get)]
    pub nbytes: usize,
}

#[pymethods]
impl PyTensorInfo {
    /// ggml's ne: the row length first.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        pyo3::types::PyTuple::new(py, &self.shape)
    }
    fn __repr__(&self) -> String {
        format!("TensorInfo(name={:?}, type={:?}, shape={:?}, offset={}, nbytes={})", self.name, self.ty, self.shape, self.offset, self.nbytes)
    }
}

#[pyclass(name = "Model", module = "ferrollama", frozen, weakref)]
pub struct PyModel {
    pub inner: Arc<Model>,
    pieces: OnceLock<Arc<TokenPieces>>,
}

impl PyModel {
    /// Every token's piece and the end-of-generation ids, for the samplers (built once).
    pub fn token_pieces(&self) -> Arc<TokenPieces> {
        self.pieces.get_or_init(|| crate::samplers::build_pieces(&self.inner.vocab)).clone()
    }
    fn token(&self, t: i64) -> PyResult<u32> {
        let n = self.inner.vocab.n_tokens();
        u32::try_from(t).ok().filter(|&t| (t as usize) < n)
            .ok_or_else(|| PyValueError::new_err(format!("token {t} is out of range (n_vocab = {n})")))
    }
}

fn vocab_err(e: VocabError) -> PyErr {
    match e {
        VocabError::Unsupported(m) => UnsupportedError::new_err(m),
        VocabError::Invalid(m) => PyValueError::new_err(m),
    }
}

/// Text bytes of a str or bytes argument.
fn text_bytes(text: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(s) = text.downcast::<pyo3::types::PyString>() {
        return Ok(s.to_cow()?.as_bytes().to_vec());
    }
    if let Ok(b) = text.downcast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    Err(PyValueError::new_err("text must be str or bytes"))
}

/// kv_overrides as GGUF values: bool, int, float or str, as llama.cpp's overrides are typed.
fn override_values(d: &Bound<'_, pyo3::types::PyDict>) -> PyResult<Vec<(String, ferrollama_gguf::Value)>> {
    use ferrollama_gguf::Value;
    let mut out = Vec::with_capacity(d.len());
    for (k, v) in d.iter() {
        let key: String = k.extract().map_err(|_| PyValueError::new_err("kv_overrides keys must be str"))?;
        let value = if v.is_instance_of::<pyo3::types::PyBool>() {
            Value::Bool(v.extract()?)
        } else if v.is_instance_of::<pyo3::types::PyInt>() {
            Value::I64(v.extract().map_err(|_| PyValueError::new_err(format!("kv_overrides[{key:?}]: not a 64-bit integer")))?)
        } else if v.is_instance_of::<pyo3::types::PyFloat>() {
            Value::F64(v.extract()?)
        } else if let Ok(text) = v.extract::<String>() {
            Value::Str(text.into_bytes())
        } else {
            return Err(PyValueError::new_err(format!(
                "kv_overrides[{key:?}]: a value must be bool, int, float or str, not {}", v.get_type().name()?)));
        };
        out.push((key, value));
    }
    Ok(out)
}

#[pymethods]
impl PyModel {
    #[new]
    #[pyo3(signature = (path, use_mmap=true, vocab_only=false, kv_overrides=None))]
    fn new(py: Python<'_>, path: std::path::PathBuf, use_mmap: bool, vocab_only: bool,
           kv_overrides: Option<&Bound<'_, pyo3::types::PyDict>>) -> PyResult<Self> {
        let overrides = match kv_overrides {
            Some(d) => override_values(d)?,
            None => Vec::new(),
        };
        guard(|| {
            let model = py.allow_threads(|| Model::load_with_overrides(&path, use_mmap, vocab_only, &overrides))
                .map_err(to_py)?;
            Ok(PyModel { inner: Arc::new(model), pieces: OnceLock::new() })
        })
    }

    #[getter] fn arch(&self) -> &str { self.inner.arch_name() }
    #[getter] fn n_vocab(&self) -> usize { self.inner.hparams.n_vocab }
    #[getter] fn n_ctx_train(&self) -> usize { self.inner.hparams.n_ctx_train }
    #[getter] fn n_embd(&self) -> usize { self.inner.hparams.n_embd }
    /// The width of an input embedding row (llama_model_n_embd_inp): n_embd, and n_embd more
    /// per DeepStack layer (Qwen3-VL).
    #[getter] fn n_embd_inp(&self) -> usize { self.inner.hparams.n_embd_inp() }
    /// Whether the model rotates with M-RoPE (llama.cpp's rope types MROPE and IMROPE: Qwen2-VL,
    /// Qwen3-VL, Qwen3.5): each token has four positions, an image's tokens 2-D ones.
    #[getter] fn uses_mrope(&self) -> bool { self.inner.hparams.mrope.is_some() }
    #[getter] fn n_layer(&self) -> usize { self.inner.hparams.n_layer }
    #[getter] fn n_head(&self) -> usize { self.inner.hparams.n_head }
    #[getter] fn n_head_kv(&self) -> usize { self.inner.hparams.n_head_kv }
    #[getter] fn n_params(&self) -> usize { self.inner.n_params() }
    /// Whether the model has recurrent layers (llama_model_is_recurrent or _is_hybrid): its
    /// memory keeps one state per sequence, which seq_rm cannot rewind beyond the context's
    /// n_rs_seq snapshots.
    #[getter] fn is_recurrent(&self) -> bool { self.inner.hparams.rs.is_some() }
    /// Whether it also has attention layers (llama_model_is_hybrid).
    #[getter] fn is_hybrid(&self) -> bool { self.inner.hparams.rs.is_some() && self.inner.hparams.kv_layers.iter().any(|&k| k) }
    #[getter] fn size(&self) -> usize { self.inner.size() }
    /// Weight matrices still waiting for their repacked copy (made on a thread after
    /// loading; results are the same before and after, only the speed differs).
    #[getter] fn repack_pending(&self) -> usize { self.inner.repack_pending() }
    /// Waits (without the GIL) until every weight matrix has its repacked copy, at most
    /// `timeout` seconds (None: as long as it takes); True when they all do.
    #[pyo3(signature = (timeout=None))]
    fn wait_repacked(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let limit = match timeout {
            None => std::time::Duration::MAX,
            Some(t) if t.is_finite() && t >= 0.0 => std::time::Duration::from_secs_f64(t.min(1e9)),
            Some(t) => return Err(pyo3::exceptions::PyValueError::new_err(format!("timeout must be a non-negative number of seconds, not {t}"))),
        };
        Ok(py.allow_threads(|| self.inner.wait_repacked(limit)))
    }
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

    /// Token ids of `text` (str or bytes); add_special adds BOS/EOS as the vocabulary says,
    /// parse_special recognizes control and user-defined tokens written in the text.
    #[pyo3(signature = (text, add_special=true, parse_special=false))]
    fn tokenize(&self, py: Python<'_>, text: &Bound<'_, PyAny>, add_special: bool, parse_special: bool) -> PyResult<Vec<u32>> {
        let bytes = text_bytes(text)?;
        let vocab = &self.inner.vocab;
        guard(|| py.allow_threads(|| vocab.tokenize(&bytes, add_special, parse_special)).map_err(vocab_err))
    }

    /// The bytes a token stands for (special tokens rendered only with special=True).
    #[pyo3(signature = (token, special=false))]
    fn token_to_piece<'py>(&self, py: Python<'py>, token: i64, special: bool) -> PyResult<Bound<'py, PyBytes>> {
        let t = self.token(token)?;
        Ok(PyBytes::new(py, &self.inner.vocab.token_to_piece(t, special)))
    }

    /// The text of a token sequence (invalid UTF-8 replaced by U+FFFD).
    #[pyo3(signature = (tokens, remove_special=false, unparse_special=false))]
    fn detokenize(&self, tokens: Vec<i64>, remove_special: bool, unparse_special: bool) -> PyResult<String> {
        let ids = tokens.into_iter().map(|t| self.token(t)).collect::<PyResult<Vec<_>>>()?;
        let bytes = self.inner.vocab.detokenize(&ids, remove_special, unparse_special);
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The bytes of a token sequence as llama_detokenize writes them (a piece may end inside a
    /// UTF-8 character).
    #[pyo3(signature = (tokens, remove_special=false, unparse_special=false))]
    fn detokenize_bytes<'py>(&self, py: Python<'py>, tokens: Vec<i64>, remove_special: bool, unparse_special: bool) -> PyResult<Bound<'py, PyBytes>> {
        let ids = tokens.into_iter().map(|t| self.token(t)).collect::<PyResult<Vec<_>>>()?;
        Ok(PyBytes::new(py, &self.inner.vocab.detokenize(&ids, remove_special, unparse_special)))
    }

    /// The token's text as stored in the vocabulary.
    fn token_text<'py>(&self, py: Python<'py>, token: i64) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, self.inner.vocab.token_text(self.token(token)?)))
    }
    fn token_score(&self, token: i64) -> PyResult<f32> { Ok(self.inner.vocab.token_score(self.token(token)?)) }
    /// llama.cpp's token attribute bits (normal 4, control 8, user-defined 16, byte 32, ...).
    fn token_attr(&self, token: i64) -> PyResult<u32> { Ok(self.inner.vocab.token_attr(self.token(token)?).0) }
    /// End of generation (eos, eot, eom and the model's end-of-generation list)?
    fn is_eog(&self, token: i64) -> PyResult<bool> { Ok(self.inner.vocab.is_eog(self.token(token)?)) }
    fn is_control(&self, token: i64) -> PyResult<bool> { Ok(self.inner.vocab.is_control(self.token(token)?)) }

    #[getter] fn bos(&self) -> Option<u32> { self.inner.vocab.bos() }
    #[getter] fn eos(&self) -> Option<u32> { self.inner.vocab.eos() }
    #[getter] fn eot(&self) -> Option<u32> { self.inner.vocab.eot() }
    #[getter] fn eom(&self) -> Option<u32> { self.inner.vocab.eom() }
    #[getter] fn nl(&self) -> Option<u32> { self.inner.vocab.nl() }
    #[getter] fn pad(&self) -> Option<u32> { self.inner.vocab.pad() }
    #[getter] fn sep(&self) -> Option<u32> { self.inner.vocab.sep() }
    #[getter] fn fim_pre(&self) -> Option<u32> { self.inner.vocab.fim_pre() }
    #[getter] fn fim_suf(&self) -> Option<u32> { self.inner.vocab.fim_suf() }
    #[getter] fn fim_mid(&self) -> Option<u32> { self.inner.vocab.fim_mid() }
    #[getter] fn add_bos(&self) -> bool { self.inner.vocab.add_bos() }
    #[getter] fn add_eos(&self) -> bool { self.inner.vocab.add_eos() }
    #[getter] fn eog_tokens(&self) -> Vec<u32> { self.inner.vocab.eog_tokens().to_vec() }
    /// The address of the vocabulary, what llama.cpp's `llama_model_get_vocab` gives: the first
    /// argument of the C function `ferrollama_llama_tokenize`, valid while this model lives.
    #[getter] fn vocab_ptr(&self) -> usize { Arc::as_ptr(&self.inner.vocab) as usize }
    /// The tokenizer model (tokenizer.ggml.model) and pre-tokenizer (tokenizer.ggml.pre).
    #[getter] fn vocab_type(&self) -> String { self.inner.vocab.model_kind().to_string() }
    #[getter] fn vocab_pre(&self) -> String { self.inner.vocab.pre().to_string() }

    /// The GGUF's tokenizer.chat_template, or None.
    #[getter]
    fn chat_template(&self) -> Option<String> {
        self.inner.file.get_str("tokenizer.chat_template").map(str::to_string)
    }

    /// A streaming detokenizer: push tokens, get text that never ends inside a character.
    #[pyo3(signature = (special=false))]
    fn stream_decoder(&self, special: bool) -> PyStreamDecoder {
        PyStreamDecoder { inner: Mutex::new(StreamDecoder::new(self.inner.vocab.clone(), special)), model: self.inner.clone() }
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

pub(crate) fn value_to_py(py: Python<'_>, v: &Value) -> PyResult<PyObject> {
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

/// Turns tokens into text as they come, holding back bytes that end inside a character.
#[pyclass(name = "StreamDecoder", module = "ferrollama", frozen)]
pub struct PyStreamDecoder {
    inner: Mutex<StreamDecoder<Arc<Vocab>>>,
    model: Arc<Model>,
}

#[pymethods]
impl PyStreamDecoder {
    /// The text completed by this token (possibly empty).
    fn push(&self, token: i64) -> PyResult<String> {
        let n = self.model.vocab.n_tokens();
        let t = u32::try_from(token).ok().filter(|&t| (t as usize) < n)
            .ok_or_else(|| PyValueError::new_err(format!("token {token} is out of range (n_vocab = {n})")))?;
        Ok(self.inner.lock().unwrap_or_else(|p| p.into_inner()).push(t))
    }
    /// Whatever is held back, with incomplete characters replaced by U+FFFD.
    fn flush(&self) -> String { self.inner.lock().unwrap_or_else(|p| p.into_inner()).flush() }
}
