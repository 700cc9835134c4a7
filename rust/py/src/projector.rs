//! `ferrollama._core.Projector`: a projector file (mmproj) and its image encoder. Decoding and
//! preprocessing images is Python's (`ferrollama.media`); this takes the preprocessed pixels.

use std::sync::Arc;

use ferrollama_engine::vision::{AudioProjector, Projector};
use ferrollama_tensor::Threads;
use numpy::{PyArray2, PyArrayMethods, PyReadonlyArray2, PyReadonlyArray3};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::{guard, to_py};

/// The encoder's threads (default: the physical cores), 1..=1024.
fn encoder_threads(n_threads: Option<usize>) -> PyResult<Threads> {
    let n_threads = n_threads.unwrap_or_else(crate::context::default_threads);
    if n_threads == 0 || n_threads > 1024 {
        return Err(PyValueError::new_err(format!("n_threads must be in 1..=1024, not {n_threads}")));
    }
    Ok(Threads::new(n_threads))
}

/// An encoder's output as a numpy array of rows of `width`.
fn embedding_rows(py: Python<'_>, embd: Vec<f32>, width: usize) -> PyResult<Bound<'_, PyArray2<f32>>> {
    let rows = embd.len() / width;
    numpy::PyArray1::from_vec(py, embd).reshape([rows, width])
}

#[pyclass(name = "Projector", module = "ferrollama._core", frozen)]
pub struct PyProjector {
    inner: Arc<Projector>,
    threads: Threads,
}

#[pymethods]
impl PyProjector {
    #[new]
    #[pyo3(signature = (path, n_threads=None, use_mmap=true))]
    fn new(py: Python<'_>, path: std::path::PathBuf, n_threads: Option<usize>, use_mmap: bool) -> PyResult<Self> {
        let threads = encoder_threads(n_threads)?;
        guard(|| {
            let proj = py.allow_threads(|| Projector::load(&path, use_mmap)).map_err(to_py)?;
            Ok(PyProjector { inner: Arc::new(proj), threads })
        })
    }

    /// The embeddings of a preprocessed image: `pixels` of shape (ny, nx, 3), float32,
    /// normalized; returns (n_output_tokens, n_embd_out) float32.
    fn encode_pixels<'py>(&self, py: Python<'py>, pixels: PyReadonlyArray3<'py, f32>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let shape = pixels.as_array().shape().to_vec();
        let (ny, nx) = (shape[0], shape[1]);
        if shape[2] != 3 {
            return Err(PyValueError::new_err(format!("pixels must have shape (ny, nx, 3), not {shape:?}")));
        }
        let values: Vec<f32> = pixels.as_array().iter().copied().collect();
        let embd = guard(|| py.allow_threads(|| self.inner.encode(&values, nx, ny, &self.threads)).map_err(to_py))?;
        embedding_rows(py, embd, self.inner.params.n_embd_out)
    }

    /// How many embedding rows an image preprocessed to nx × ny pixels gives.
    fn n_output_tokens(&self, nx: usize, ny: usize) -> usize { self.inner.n_output_tokens(nx, ny) }

    #[getter] fn projector_type(&self) -> &'static str { self.inner.params.projector.name() }
    #[getter] fn image_size(&self) -> usize { self.inner.params.image_size }
    #[getter] fn patch_size(&self) -> usize { self.inner.params.patch_size }
    #[getter] fn image_mean(&self) -> [f32; 3] { self.inner.params.image_mean }
    #[getter] fn image_std(&self) -> [f32; 3] { self.inner.params.image_std }
    #[getter] fn n_merge(&self) -> usize { self.inner.params.n_merge }
    /// The preprocessing's longest edge (clip.vision.preproc_image_size); 0 when the file has none.
    #[getter] fn image_longest_edge(&self) -> usize { self.inner.params.image_longest_edge }
    /// LLaVA 1.6's anyres resolutions, (width, height) pairs (empty: none).
    #[getter] fn grid_pinpoints(&self) -> Vec<(usize, usize)> { self.inner.params.grid_pinpoints.iter().map(|&[w, h]| (w, h)).collect() }
    /// MiniCPM-V's version (2 for 2.5, 3 for 2.6...; 0 for other projector types): its slices' tokens.
    #[getter] fn minicpmv_version(&self) -> u32 { self.inner.params.minicpmv_version }
    /// The width of the encoder.
    #[getter] fn n_embd(&self) -> usize { self.inner.params.n_embd }
    /// The width of the output rows (the text model's n_embd).
    #[getter] fn n_embd_out(&self) -> usize { self.inner.params.n_embd_out }
    #[getter] fn n_threads(&self) -> usize { self.threads.n_threads() }
    #[getter] fn path(&self) -> std::path::PathBuf { self.inner.path().to_path_buf() }
    fn __repr__(&self) -> String {
        format!("Projector({:?}, type={}, image_size={})", self.inner.path(), self.inner.params.projector.name(), self.inner.params.image_size)
    }
}

/// Whether the projector file at `path` holds an audio encoder (load it with AudioProjector).
#[pyfunction]
pub fn projector_has_audio(py: Python<'_>, path: std::path::PathBuf) -> PyResult<bool> {
    guard(|| py.allow_threads(|| ferrollama_engine::vision::whisper::has_audio_encoder(&path)).map_err(to_py))
}

/// Whether the projector file at `path` holds a vision encoder beside an audio one
/// (Qwen2.5-Omni's: load it with both Projector and AudioProjector).
#[pyfunction]
pub fn projector_has_vision(py: Python<'_>, path: std::path::PathBuf) -> PyResult<bool> {
    guard(|| py.allow_threads(|| ferrollama_engine::vision::whisper::has_vision_encoder(&path)).map_err(to_py))
}

/// `ferrollama._core.AudioProjector`: a projector file (mmproj) with an audio encoder (Whisper's,
/// with Ultravox's, Qwen2-Audio's or Voxtral's head). The spectrogram is Python's (`ferrollama.generation.audio`); this takes
/// a chunk of it.
#[pyclass(name = "AudioProjector", module = "ferrollama._core", frozen)]
pub struct PyAudioProjector {
    inner: Arc<AudioProjector>,
    threads: Threads,
}

#[pymethods]
impl PyAudioProjector {
    #[new]
    #[pyo3(signature = (path, n_threads=None, use_mmap=true))]
    fn new(py: Python<'_>, path: std::path::PathBuf, n_threads: Option<usize>, use_mmap: bool) -> PyResult<Self> {
        let threads = encoder_threads(n_threads)?;
        guard(|| {
            let proj = py.allow_threads(|| AudioProjector::load(&path, use_mmap)).map_err(to_py)?;
            Ok(PyAudioProjector { inner: Arc::new(proj), threads })
        })
    }

    /// The embeddings of a chunk of log-mel spectrogram: `mel` of shape (n_mel, n_frames),
    /// float32; returns (n_output_tokens, n_embd_out) float32.
    fn encode_mel<'py>(&self, py: Python<'py>, mel: PyReadonlyArray2<'py, f32>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let shape = mel.as_array().shape().to_vec();
        if shape[0] != self.inner.params.n_mel {
            return Err(PyValueError::new_err(format!("mel must have shape ({}, n_frames), not {shape:?}", self.inner.params.n_mel)));
        }
        let values: Vec<f32> = mel.as_array().iter().copied().collect();
        let embd = guard(|| py.allow_threads(|| self.inner.encode(&values, shape[1], &self.threads)).map_err(to_py))?;
        embedding_rows(py, embd, self.inner.params.n_embd_out)
    }

    /// How many embedding rows a chunk of n_frames mel frames gives.
    fn n_output_tokens(&self, n_frames: usize) -> usize { self.inner.n_output_tokens(n_frames) }

    #[getter] fn projector_type(&self) -> &'static str { self.inner.params.projector.name() }
    #[getter] fn n_mel(&self) -> usize { self.inner.params.n_mel }
    #[getter] fn sample_rate(&self) -> usize { self.inner.params.sample_rate }
    #[getter] fn stack_factor(&self) -> usize { self.inner.params.stack_factor }
    /// The width of the encoder.
    #[getter] fn n_embd(&self) -> usize { self.inner.params.n_embd }
    /// The width of the output rows (the text model's n_embd).
    #[getter] fn n_embd_out(&self) -> usize { self.inner.params.n_embd_out }
    #[getter] fn n_threads(&self) -> usize { self.threads.n_threads() }
    #[getter] fn path(&self) -> std::path::PathBuf { self.inner.path().to_path_buf() }
    fn __repr__(&self) -> String {
        format!("AudioProjector({:?}, type={}, n_mel={})", self.inner.path(), self.inner.params.projector.name(), self.inner.params.n_mel)
    }
}
