//! `ferrollama._core.quantize`: the tensor crate's quantizers (what llama-quantize writes),
//! for `ferrollama quantize`: ggml's reference quantizers, or with an importance matrix the
//! weighted ones (quantize_row_*_impl with quant_weights).

use ferrollama_tensor::scalar::weighted::quantize_row_weighted;
use ferrollama_tensor::{traits, GgmlType};
use numpy::{PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::errors::UnsupportedError;

/// Quantizes rows of float32 (shape (n_rows, n_per_row)) to `type` ("Q4_K", "q8_0", ...);
/// returns uint8 of shape (n_rows, row_bytes). `imatrix` (float32, n_per_row importance weights
/// shared by every row) selects the weighted quantizer, for the types that have one.
#[pyfunction]
#[pyo3(signature = (rows, r#type, imatrix=None))]
pub fn quantize<'py>(py: Python<'py>, rows: PyReadonlyArray2<'_, f32>, r#type: &str,
                     imatrix: Option<PyReadonlyArray1<'_, f32>>) -> PyResult<Bound<'py, PyArray2<u8>>> {
    let ty = GgmlType::from_name(r#type).ok_or_else(|| PyValueError::new_err(format!("unknown tensor type {type:?}")))?;
    let tr = traits(ty).ok_or_else(|| UnsupportedError::new_err(format!("tensor type {ty} is not supported")))?;
    if imatrix.is_none() && tr.from_f32_ref.is_none() {
        return Err(UnsupportedError::new_err(format!("no quantizer for {ty} without an importance matrix")));
    }
    let shape = rows.shape();
    let (n_rows, n_per_row) = (shape[0], shape[1]);
    if n_per_row % tr.block_size != 0 {
        return Err(PyValueError::new_err(format!("{n_per_row} values per row is not a multiple of {ty}'s block size {}", tr.block_size)));
    }
    let weights: Option<Vec<f32>> = imatrix.map(|w| w.as_array().iter().copied().collect());
    if let Some(w) = &weights {
        if w.len() != n_per_row {
            return Err(PyValueError::new_err(format!("the importance matrix has {} values; the rows have {n_per_row}", w.len())));
        }
        if !w.iter().all(|v| v.is_finite()) {
            return Err(PyValueError::new_err("the importance matrix has non-finite values"));
        }
    }
    let row_bytes = tr.row_bytes(n_per_row);
    if n_rows == 0 || row_bytes == 0 {
        return numpy::PyArray1::from_vec(py, Vec::new()).reshape([n_rows, row_bytes]);
    }
    let src = rows.as_array();
    let mut out = vec![0u8; n_rows * row_bytes];
    // Rows are independent: split them between the cores (llama-quantize's nthread), each
    // thread converting its rows with a scratch row of its own. The bytes do not depend on the split.
    let n_threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(n_rows.max(1));
    let rows_per_thread = n_rows.div_ceil(n_threads).max(1);
    let weights = weights.as_deref();
    let unweighted = py.allow_threads(|| {
        std::thread::scope(|scope| {
            let parts: Vec<_> = out.chunks_mut(rows_per_thread * row_bytes).enumerate().map(|(part, dst)| {
                let src = &src;
                scope.spawn(move || {
                    let mut row = vec![0f32; n_per_row];
                    for (i, dst) in dst.chunks_exact_mut(row_bytes).enumerate() {
                        for (d, s) in row.iter_mut().zip(src.row(part * rows_per_thread + i).iter()) {
                            *d = *s;
                        }
                        match (weights, tr.from_f32_ref) {
                            (Some(w), _) => quantize_row_weighted(ty, &row, w, dst)?,
                            (None, Some(quant)) => quant(&row, dst),
                            (None, None) => return None,
                        }
                    }
                    Some(())
                })
            }).collect();
            // a quantizer that panicked is reported, not taken for a missing one
            parts.into_iter().map(|p| p.join()).collect::<Result<Vec<Option<()>>, _>>()
        })
    });
    let Ok(parts) = unweighted else {
        return Err(PyRuntimeError::new_err(format!("the {ty} quantizer failed")));
    };
    let unweighted = parts.into_iter().collect::<Option<Vec<()>>>();
    if unweighted.is_none() {
        return Err(UnsupportedError::new_err(format!("{ty} has no quantizer that takes an importance matrix")));
    }
    numpy::PyArray1::from_vec(py, out).reshape([n_rows, row_bytes])
}
