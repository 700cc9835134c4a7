//! Quantized weight matrices and the matrix product.

use std::ops::Range;
use std::sync::Arc;

use crate::{traits, GgmlType, TensorError, Threads, TypeTraits};

/// The bytes of a weight matrix: a range of a shared buffer (the model file's map) or an
/// owned buffer (a repacked layout, a test matrix).
#[derive(Clone)]
pub enum WeightBytes {
    Shared { owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize> },
    Owned(Arc<Vec<u8>>),
}

impl WeightBytes {
    pub fn bytes(&self) -> &[u8] {
        match self {
            WeightBytes::Shared { owner, range } => &(**owner).as_ref()[range.clone()],
            WeightBytes::Owned(v) => v,
        }
    }
}

/// A row-major matrix of `rows` rows of `cols` elements of type `ty` (ggml's ne0 = cols).
#[derive(Clone)]
pub struct QMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    traits: &'static TypeTraits,
    data: WeightBytes,
}

impl QMatrix {
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: WeightBytes) -> Result<QMatrix, TensorError> {
        let traits = traits(ty).ok_or(TensorError::Unsupported(ty))?;
        if cols % traits.block_size != 0 {
            return Err(TensorError::Shape(format!("{cols} columns is not a multiple of {ty}'s block size")));
        }
        let want = traits.row_bytes(cols) * rows;
        if data.bytes().len() != want {
            return Err(TensorError::Shape(format!(
                "{rows}x{cols} {ty} needs {want} bytes, found {}", data.bytes().len()
            )));
        }
        Ok(QMatrix { ty, rows, cols, traits, data })
    }
    pub fn traits(&self) -> &'static TypeTraits { self.traits }
    pub fn row_bytes(&self) -> usize { self.traits.row_bytes(self.cols) }
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data.bytes()[r * rb..(r + 1) * rb]
    }
    /// Row `r` as f32 (embedding lookup).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        (self.traits.to_f32)(self.row(r), &mut out[..self.cols]);
    }
}

/// Buffers a matrix product reuses between calls (the quantized activations).
#[derive(Default)]
pub struct MatmulScratch {
    quantized: Vec<u8>,
}

/// out[t * w.rows + r] = w.row(r) · x[t * w.cols ..], for t in 0..n_tokens, with the
/// activations first converted to the weight type's `vec_dot_type`.
pub fn matmul(w: &QMatrix, x: &[f32], n_tokens: usize, out: &mut [f32], scratch: &mut MatmulScratch, threads: &Threads) {
    assert!(x.len() >= n_tokens * w.cols && out.len() >= n_tokens * w.rows);
    let dot_traits = traits(w.traits.vec_dot_type).expect("vec_dot types are in the table");
    let xrow = dot_traits.row_bytes(w.cols);
    scratch.quantized.resize(xrow * n_tokens, 0);
    let from_f32 = dot_traits.from_f32.expect("vec_dot types can be quantized");
    for t in 0..n_tokens {
        from_f32(&x[t * w.cols..(t + 1) * w.cols], &mut scratch.quantized[t * xrow..(t + 1) * xrow]);
    }
    let quantized = &scratch.quantized;
    let out_ptr = SendPtr(out.as_mut_ptr());
    let rows_per_task = 16;
    let n_tasks = w.rows.div_ceil(rows_per_task);
    threads.run(n_tasks, |task| {
        let out_ptr = &out_ptr;
        let rows = task * rows_per_task..((task + 1) * rows_per_task).min(w.rows);
        for r in rows {
            let wr = w.row(r);
            for t in 0..n_tokens {
                let v = (w.traits.vec_dot)(w.cols, wr, &quantized[t * xrow..(t + 1) * xrow]);
                // SAFETY: each (t, r) is written by exactly one task.
                unsafe { *out_ptr.0.add(t * w.rows + r) = v };
            }
        }
    });
}

struct SendPtr(*mut f32);
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}
