//! The Python extension `ferrollama._core`: conversion, exceptions, GIL release and numpy
//! views over the engine. No logic the engine does not have.

mod c_api;
mod context;
mod errors;
mod lora;
mod model;
mod projector;
mod quantize;
mod samplers;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<model::PyModel>()?;
    m.add_class::<model::PyTensorInfo>()?;
    m.add_class::<context::PyBatch>()?;
    m.add_class::<context::PyContext>()?;
    m.add_class::<context::PyKv>()?;
    m.add_class::<lora::PyLoraAdapter>()?;
    m.add_class::<projector::PyProjector>()?;
    m.add_class::<projector::PyAudioProjector>()?;
    m.add_function(wrap_pyfunction!(projector::projector_has_audio, m)?)?;
    m.add_function(wrap_pyfunction!(projector::projector_has_vision, m)?)?;
    m.add_class::<model::PyStreamDecoder>()?;
    samplers::register(m)?;
    m.add_function(wrap_pyfunction!(quantize::quantize, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // the kernels' instruction-set level in this process (FERROLLAMA_ISA caps it)
    m.add("KERNEL_ISA", ferrollama_tensor::dispatch::active_isa().name())?;
    let archs: Vec<&str> = ferrollama_engine::arch::ARCHS.iter().map(|a| a.name).collect();
    m.add("SUPPORTED_ARCHITECTURES", pyo3::types::PyTuple::new(m.py(), archs)?)?;
    Ok(())
}
