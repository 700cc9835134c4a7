//! Python exceptions and the conversion of engine errors (and of any panic) into them.

use std::panic::{catch_unwind, AssertUnwindSafe};

use ferrollama_engine::EngineError;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

create_exception!(ferrollama, Error, PyException, "Base class of every ferrollama error.");
create_exception!(ferrollama, GGUFError, Error, "A malformed or unreadable GGUF file.");
create_exception!(ferrollama, UnsupportedError, Error, "An architecture, tensor type or tokenizer the engine lacks.");
create_exception!(ferrollama, DecodeError, Error, "A decode that failed; the cache is as it was before the call.");
create_exception!(ferrollama, StateError, Error, "A state blob or session file that cannot be restored.");
create_exception!(ferrollama, BusyError, Error, "An object used from two threads at once.");
create_exception!(ferrollama, GrammarError, Error, "A malformed GBNF grammar or an unconvertible JSON schema.");

pub fn to_py(e: EngineError) -> PyErr {
    match e {
        EngineError::Gguf(g) => GGUFError::new_err(g.to_string()),
        EngineError::Unsupported(m) => UnsupportedError::new_err(m),
        EngineError::Decode(m) => DecodeError::new_err(m),
        EngineError::InvalidArgument(m) => PyValueError::new_err(m),
        EngineError::State(m) => StateError::new_err(m),
    }
}

/// Runs `f`, turning a panic into `ferrollama.Error` so that no Rust panic reaches Python
/// as an abort or a PanicException.
pub fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload.downcast_ref::<String>().cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::new_err(format!("internal error: {msg}")))
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("GGUFError", py.get_type::<GGUFError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("DecodeError", py.get_type::<DecodeError>())?;
    m.add("StateError", py.get_type::<StateError>())?;
    m.add("BusyError", py.get_type::<BusyError>())?;
    m.add("GrammarError", py.get_type::<GrammarError>())?;
    Ok(())
}
