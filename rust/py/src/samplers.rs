//! `ferrollama.samplers`: llama.cpp's samplers and the chain, over numpy logits.

use std::sync::{Arc, Mutex};

use ferrollama_sampling::{self as smp, Candidates, Chain, Sampler, SamplingError, TokenPieces};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::context::PyContext;
use crate::errors::{guard, Error, GrammarError};
use crate::model::PyModel;

pub fn to_py(e: SamplingError) -> PyErr {
    match e {
        SamplingError::Grammar(g) => GrammarError::new_err(g.to_string()),
        SamplingError::JsonSchema(m) => GrammarError::new_err(format!("JSON schema: {m}")),
        SamplingError::NoSelection | SamplingError::NoCandidates => Error::new_err(e.to_string()),
        other => PyValueError::new_err(other.to_string()),
    }
}

/// A sampler. Its state is copied into a Chain when the chain is built.
#[pyclass(name = "Sampler", module = "ferrollama.samplers", subclass, frozen)]
pub struct PySampler {
    inner: Mutex<Box<dyn Sampler>>,
}

impl PySampler {
    fn init(s: impl Sampler + 'static) -> PyClassInitializer<PySampler> {
        PyClassInitializer::from(PySampler { inner: Mutex::new(Box::new(s)) })
    }
    fn boxed(&self) -> Box<dyn Sampler> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone_box()
    }
}

#[pymethods]
impl PySampler {
    #[getter]
    fn name(&self) -> &'static str { self.inner.lock().unwrap_or_else(|p| p.into_inner()).name() }
    fn __repr__(&self) -> String { format!("<sampler {}>", self.name()) }
}

macro_rules! sampler_class {
    ($rust:ident, $py:literal, ($($arg:ident : $ty:ty),*), $sig:literal, $build:expr) => {
        #[pyclass(name = $py, module = "ferrollama.samplers", extends = PySampler, frozen)]
        pub struct $rust;
        #[pymethods]
        impl $rust {
            #[new]
            #[pyo3(text_signature = $sig)]
            fn new($($arg: $ty),*) -> PyResult<PyClassInitializer<Self>> {
                let s = $build;
                Ok(PySampler::init(s).add_subclass($rust))
            }
        }
    };
}

sampler_class!(Greedy, "Greedy", (), "()", smp::Greedy::new());
sampler_class!(Dist, "Dist", (seed: u32), "(seed)", smp::Dist::new(seed));
sampler_class!(TopK, "TopK", (k: i32), "(k)", smp::TopK::new(k));
sampler_class!(Temp, "Temp", (t: f32), "(t)", smp::Temp::new(t).map_err(to_py)?);
sampler_class!(TopNSigma, "TopNSigma", (n: f32), "(n)", smp::TopNSigma::new(n).map_err(to_py)?);
sampler_class!(MirostatV2, "MirostatV2", (seed: u32, tau: f32, eta: f32), "(seed, tau, eta)",
    smp::MirostatV2::new(seed, tau, eta).map_err(to_py)?);
sampler_class!(TempExt, "TempExt", (t: f32, delta: f32, exponent: f32), "(t, delta, exponent)",
    smp::TempExt::new(t, delta, exponent).map_err(to_py)?);

#[pyclass(name = "TopP", module = "ferrollama.samplers", extends = PySampler, frozen)]
pub struct TopP;
#[pymethods]
impl TopP {
    #[new]
    #[pyo3(signature = (p, min_keep=1))]
    fn new(p: f32, min_keep: usize) -> PyResult<PyClassInitializer<Self>> {
        Ok(PySampler::init(smp::TopP::new(p, min_keep).map_err(to_py)?).add_subclass(TopP))
    }
}

#[pyclass(name = "MinP", module = "ferrollama.samplers", extends = PySampler, frozen)]
pub struct MinP;
#[pymethods]
impl MinP {
    #[new]
    #[pyo3(signature = (p, min_keep=1))]
    fn new(p: f32, min_keep: usize) -> PyResult<PyClassInitializer<Self>> {
        Ok(PySampler::init(smp::MinP::new(p, min_keep).map_err(to_py)?).add_subclass(MinP))
    }
}

#[pyclass(name = "Typical", module = "ferrollama.samplers", extends = PySampler, frozen)]
pub struct Typical;
#[pymethods]
impl Typical {
    #[new]
    #[pyo3(signature = (p, min_keep=1))]
    fn new(p: f32, min_keep: usize) -> PyResult<PyClassInitializer<Self>> {
        Ok(PySampler::init(smp::Typical::new(p, min_keep).map_err(to_py)?).add_subclass(Typical))
    }
}

#[pyclass(name = "XTC", module = "ferrollama.samplers", extends = PySampler, frozen)]
pub struct Xtc;
#[pymethods]
impl Xtc {
    #[new]
    #[pyo3(signature = (p, threshold=0.1, min_keep=1, seed=0))]
    fn new(p: f32, threshold: f32, min_keep: usize, seed: u32) -> PyResult<PyClassInitializer<Self>> {
        Ok(PySampler::init(smp::Xtc::new(p, threshold, min_keep, seed).map_err(to_py)?).add_subclass(Xtc))
    }
}

#[pyclass(name = "MirostatV1", module = "ferrollama.samplers", extends = PySampler, frozen)]
pub struct MirostatV1;
#[pymethods]
impl MirostatV1 {
    #[new]
    #[pyo3(signature = (n_vocab, seed, tau, eta, m=100))]
    fn new(n_vocab: i32, seed: u32, tau: f32, eta: f32, m: i32) -> PyResult<PyClassInitializer<Self>> {
        Ok(PySampler::init(smp::MirostatV1::new(n_vocab, seed, tau, eta, m).map_err(to_py)?).add_subclass(MirostatV1))
    }
}

#[pyclass(name = "Penalties", module = "ferrollama.samplers", extends = PySampler, frozen)]
pub struct Penalties;
#[pymethods]
impl Penalties {
    #[new]
    #[pyo3(signature = (last_n=64, repeat=1.0, freq=0.0, present=0.0))]
    fn new(last_n: i32, repeat: f32, freq: f32, present: f32) -> PyResult<PyClassInitializer<Self>> {
        Ok(PySampler::init(smp::Penalties::new(last_n, repeat, freq, present).map_err(to_py)?).add_subclass(Penalties))
    }
}

#[pyclass(name = "LogitBias", module = "ferrollama.samplers", extends = PySampler, frozen)]
pub struct LogitBias;
#[pymethods]
impl LogitBias {
    /// biases: {token: bias} or [(token, bias), ...] (a token may be named twice: the biases add).
    /// n_vocab defaults to the largest biased token + 1; give the model's for bounds checks.
    #[new]
    #[pyo3(signature = (biases, n_vocab=None))]
    fn new(biases: &Bound<'_, PyAny>, n_vocab: Option<usize>) -> PyResult<PyClassInitializer<Self>> {
        let pairs: Vec<(u32, f32)> = match biases.downcast::<PyDict>() {
            Ok(d) => d.iter().map(|(k, v)| Ok((k.extract()?, v.extract()?))).collect::<PyResult<_>>()?,
            Err(_) => biases.extract()?,
        };
        let n = n_vocab.unwrap_or_else(|| pairs.iter().map(|p| p.0 as usize + 1).max().unwrap_or(0));
        Ok(PySampler::init(smp::LogitBias::new(n, pairs).map_err(to_py)?).add_subclass(LogitBias))
    }
}

#[pyclass(name = "DRY", module = "ferrollama.samplers", extends = PySampler, frozen)]
pub struct Dry;
#[pymethods]
impl Dry {
    #[new]
    #[pyo3(signature = (model, multiplier=0.0, base=1.75, allowed_length=2, penalty_last_n=-1,
                        seq_breakers=vec!["\n".to_string(), ":".to_string(), "\"".to_string(), "*".to_string()]))]
    fn new(model: &PyModel, multiplier: f32, base: f32, allowed_length: i32, penalty_last_n: i32,
           seq_breakers: Vec<String>) -> PyResult<PyClassInitializer<Self>> {
        let pieces = model.token_pieces();
        let vocab = model.inner.vocab.clone();
        let tokenize = move |b: &[u8]| vocab.tokenize(b, false, false).unwrap_or_default();
        let breakers: Vec<&str> = seq_breakers.iter().map(String::as_str).collect();
        let n_ctx_train = model.inner.hparams.n_ctx_train as i32;
        let d = smp::Dry::new(&pieces, &tokenize, n_ctx_train, multiplier, base, allowed_length, penalty_last_n, &breakers)
            .map_err(to_py)?;
        Ok(PySampler::init(d).add_subclass(Dry))
    }
}

#[pyclass(name = "Infill", module = "ferrollama.samplers", extends = PySampler, frozen)]
pub struct Infill;
#[pymethods]
impl Infill {
    #[new]
    fn new(model: &PyModel) -> PyResult<PyClassInitializer<Self>> {
        let v = &model.inner.vocab;
        let eot = v.eot().or(v.eos()).ok_or_else(|| PyValueError::new_err("the vocabulary has no end-of-text token"))?;
        Ok(PySampler::init(smp::Infill::new(model.token_pieces(), eot)).add_subclass(Infill))
    }
}

/// A GBNF grammar constraint (llama.cpp's syntax); malformed grammars raise GrammarError
/// with the line and column.
#[pyclass(name = "Grammar", module = "ferrollama.samplers", extends = PySampler, frozen)]
pub struct Grammar;
#[pymethods]
impl Grammar {
    #[new]
    #[pyo3(signature = (model, gbnf, root="root"))]
    fn new(model: &PyModel, gbnf: &str, root: &str) -> PyResult<PyClassInitializer<Self>> {
        Ok(PySampler::init(smp::Grammar::new(model.token_pieces(), gbnf, root).map_err(to_py)?).add_subclass(Grammar))
    }

    /// A grammar from a JSON schema (a dict or a JSON string), as llama.cpp converts it.
    #[staticmethod]
    fn from_json_schema(py: Python<'_>, model: &PyModel, schema: &Bound<'_, PyAny>) -> PyResult<Py<Grammar>> {
        let text: String = match schema.downcast::<PyString>() {
            Ok(s) => s.to_string(),
            Err(_) => py.import("json")?.call_method1("dumps", (schema,))?.extract()?,
        };
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| PyValueError::new_err(format!("the schema is not valid JSON: {e}")))?;
        let g = smp::Grammar::from_json_schema(model.token_pieces(), &value).map_err(to_py)?;
        Py::new(py, PySampler::init(g).add_subclass(Grammar))
    }

    /// The GBNF text llama.cpp's converter makes from a JSON schema.
    #[staticmethod]
    fn json_schema_to_gbnf(py: Python<'_>, schema: &Bound<'_, PyAny>) -> PyResult<String> {
        let text: String = match schema.downcast::<PyString>() {
            Ok(s) => s.to_string(),
            Err(_) => py.import("json")?.call_method1("dumps", (schema,))?.extract()?,
        };
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| PyValueError::new_err(format!("the schema is not valid JSON: {e}")))?;
        smp::json_schema::to_gbnf(&value).map_err(to_py)
    }
}

/// The candidates a chain left: ids, logits and p in llama.cpp's order, and the selected index.
#[pyclass(name = "Candidates", module = "ferrollama.samplers", frozen, get_all)]
pub struct PyCandidates {
    ids: Py<PyArray1<u32>>,
    logits: Py<PyArray1<f32>>,
    p: Py<PyArray1<f32>>,
    /// Index into the arrays of the selected token, or -1.
    selected: i64,
    sorted: bool,
}

#[pymethods]
impl PyCandidates {
    fn __len__(&self, py: Python<'_>) -> usize { self.ids.bind(py).len().unwrap_or(0) }
    /// The selected token id, or None.
    #[getter]
    fn token(&self, py: Python<'_>) -> PyResult<Option<u32>> {
        if self.selected < 0 { return Ok(None); }
        Ok(Some(self.ids.bind(py).get_item(self.selected)?.extract()?))
    }
}

fn candidates_to_py(py: Python<'_>, c: &Candidates) -> PyCandidates {
    PyCandidates {
        ids: PyArray1::from_iter(py, c.data.iter().map(|d| d.id)).unbind(),
        logits: PyArray1::from_iter(py, c.data.iter().map(|d| d.logit)).unbind(),
        p: PyArray1::from_iter(py, c.data.iter().map(|d| d.p)).unbind(),
        selected: c.selected.map_or(-1, |s| s as i64),
        sorted: c.sorted,
    }
}

/// Samplers applied in order (llama_sampler_chain).
#[pyclass(name = "Chain", module = "ferrollama.samplers", frozen)]
pub struct PyChain {
    inner: Mutex<Chain>,
    scratch: Mutex<Candidates>,
}

impl PyChain {
    fn chain(&self) -> std::sync::MutexGuard<'_, Chain> { self.inner.lock().unwrap_or_else(|p| p.into_inner()) }
}

#[pymethods]
impl PyChain {
    #[new]
    #[pyo3(signature = (samplers=Vec::new()))]
    fn new(samplers: Vec<PyRef<'_, PySampler>>) -> Self {
        let chain = Chain::new(samplers.iter().map(|s| s.boxed()).collect());
        PyChain { inner: Mutex::new(chain), scratch: Mutex::new(Candidates::from_logits(&[])) }
    }

    /// Applies the chain to an unsorted array of logits (ids 0..n), as llama_sampler_apply.
    fn apply(&self, py: Python<'_>, logits: PyReadonlyArray1<'_, f32>) -> PyResult<PyCandidates> {
        guard(|| {
            let logits = logits.as_slice()?;
            let mut c = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
            c.fill_from_logits(logits);
            self.chain().apply(&mut c);
            Ok(candidates_to_py(py, &c))
        })
    }

    /// Samples a token from logits (grammar fast path), without accepting it.
    fn sample_logits(&self, logits: PyReadonlyArray1<'_, f32>) -> PyResult<u32> {
        guard(|| self.chain().sample(logits.as_slice()?).map_err(to_py))
    }

    /// Applies the chain to ctx.logits(i), selects a token, accepts it and returns it.
    #[pyo3(signature = (ctx, i=-1))]
    fn sample(&self, py: Python<'_>, ctx: &PyContext, i: i64) -> PyResult<u32> {
        guard(|| {
            let c = ctx.lock()?;
            let logits = c.logits_ith(i).map_err(crate::errors::to_py)?;
            let mut guard = self.chain();
            let chain: &mut Chain = &mut guard;
            let token = py.allow_threads(|| chain.sample_and_accept(logits)).map_err(to_py)?;
            Ok(token)
        })
    }

    fn accept(&self, token: u32) { self.chain().accept(token) }
    fn reset(&self) { self.chain().reset() }
    #[getter]
    fn names(&self) -> Vec<&'static str> { self.chain().names() }
    /// The candidates as the last sample left them.
    fn last_candidates(&self, py: Python<'_>) -> PyCandidates { candidates_to_py(py, self.chain().last_candidates()) }
    fn __len__(&self) -> usize { self.chain().len() }
    fn __repr__(&self) -> String { format!("Chain({})", self.chain().names().join(" -> ")) }
}

/// Classifier-free guidance: l = scale * (log_softmax(l) - log_softmax(g)) + log_softmax(g).
#[pyfunction]
fn apply_guidance<'py>(py: Python<'py>, logits: PyReadonlyArray1<'_, f32>, guidance: PyReadonlyArray1<'_, f32>, scale: f32)
                       -> PyResult<Bound<'py, PyArray1<f32>>> {
    let mut l = logits.as_slice()?.to_vec();
    let mut g = guidance.as_slice()?.to_vec();
    smp::apply_guidance(&mut l, &mut g, scale).map_err(to_py)?;
    Ok(PyArray1::from_vec(py, l))
}

pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let m = PyModule::new(parent.py(), "samplers")?;
    m.add_class::<PySampler>()?;
    m.add_class::<Greedy>()?;
    m.add_class::<Dist>()?;
    m.add_class::<TopK>()?;
    m.add_class::<TopP>()?;
    m.add_class::<MinP>()?;
    m.add_class::<Typical>()?;
    m.add_class::<Temp>()?;
    m.add_class::<TempExt>()?;
    m.add_class::<Xtc>()?;
    m.add_class::<TopNSigma>()?;
    m.add_class::<MirostatV1>()?;
    m.add_class::<MirostatV2>()?;
    m.add_class::<Penalties>()?;
    m.add_class::<LogitBias>()?;
    m.add_class::<Dry>()?;
    m.add_class::<Infill>()?;
    m.add_class::<Grammar>()?;
    m.add_class::<PyCandidates>()?;
    m.add_class::<PyChain>()?;
    m.add_function(wrap_pyfunction!(apply_guidance, &m)?)?;
    parent.add_submodule(&m)?;
    Ok(())
}

/// The vocabulary as the samplers see it (built once per model).
pub fn build_pieces(vocab: &ferrollama_vocab::Vocab) -> Arc<TokenPieces> {
    let n = vocab.n_tokens() as u32;
    Arc::new(TokenPieces {
        pieces: (0..n).map(|t| vocab.token_to_piece(t, true)).collect(),
        eog: vocab.eog_tokens().to_vec(),
    })
}
