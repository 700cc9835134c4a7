//! The statistics an importance matrix is made of (llama-imatrix's collector): for each weight
//! matrix, the sum over the tokens of the squared input activations, per input column, and
//! how many rows were summed. A context collects them only when asked
//! (`Context::set_activation_stats`); otherwise the forward pass pays one branch per product.
//!
//! What is collected follows llama-imatrix's `collect_imatrix`: the products by a layer's
//! matrices (`blk.*`), dense ones only in micro-batches of at least 16 tokens, the experts'
//! always, each expert with its own count; sums in f32 in token order.

use std::collections::BTreeMap;

/// llama-imatrix skips dense products of fewer rows than this ("why are small batches ignored").
pub const MIN_ROWS: usize = 16;

/// A weight matrix of a decoder layer, by what it feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Matrix {
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    FfnGate,
    FfnUp,
    FfnDown,
    FfnGateInp,
    FfnGateExps,
    FfnUpExps,
    FfnDownExps,
    FfnGateShexp,
    FfnUpShexp,
    FfnDownShexp,
    FfnGateInpShexp,
    /// Any other matrix of a layer, by its name in the file (`ssm_in`, `ssm_out`, ...: the
    /// recurrent mixers' products).
    Other(&'static str),
}

impl Matrix {
    /// llama.cpp's tensor name of this matrix in layer `il`.
    pub fn tensor_name(self, il: usize) -> String {
        let part = match self {
            Matrix::AttnQ => "attn_q",
            Matrix::AttnK => "attn_k",
            Matrix::AttnV => "attn_v",
            Matrix::AttnOutput => "attn_output",
            Matrix::FfnGate => "ffn_gate",
            Matrix::FfnUp => "ffn_up",
            Matrix::FfnDown => "ffn_down",
            Matrix::FfnGateInp => "ffn_gate_inp",
            Matrix::FfnGateExps => "ffn_gate_exps",
            Matrix::FfnUpExps => "ffn_up_exps",
            Matrix::FfnDownExps => "ffn_down_exps",
            Matrix::FfnGateShexp => "ffn_gate_shexp",
            Matrix::FfnUpShexp => "ffn_up_shexp",
            Matrix::FfnDownShexp => "ffn_down_shexp",
            Matrix::FfnGateInpShexp => "ffn_gate_inp_shexp",
            Matrix::Other(name) => name,
        };
        format!("blk.{il}.{part}.weight")
    }
}

/// One matrix's sums: `sums` holds n_mat rows of n_cols (one per expert; one for a dense
/// matrix), `counts` the rows summed into each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MatrixStats {
    pub sums: Vec<f32>,
    pub counts: Vec<u64>,
}

/// The statistics of every matrix seen so far, by (layer, matrix).
#[derive(Debug, Default)]
pub struct ActivationStats {
    layer: usize,
    by_matrix: BTreeMap<(usize, Matrix), MatrixStats>,
}

impl ActivationStats {
    /// The layer the following products belong to.
    pub fn begin_layer(&mut self, il: usize) {
        self.layer = il;
    }

    fn entry(&mut self, m: Matrix, n_cols: usize, n_mat: usize) -> &mut MatrixStats {
        let e = self.by_matrix.entry((self.layer, m)).or_default();
        if e.sums.is_empty() {
            e.sums = vec![0.0; n_cols * n_mat];
            e.counts = vec![0; n_mat];
        }
        e
    }

    /// A dense product of `x` (n_rows rows of n_cols) by matrix m of the current layer.
    pub fn record(&mut self, m: Matrix, x: &[f32], n_rows: usize) {
        if n_rows < MIN_ROWS || n_rows == 0 {
            return;
        }
        let n_cols = x.len() / n_rows;
        let e = self.entry(m, n_cols, 1);
        for row in x[..n_rows * n_cols].chunks_exact(n_cols) {
            add_squares(&mut e.sums, row);
        }
        e.counts[0] += n_rows as u64;
    }

    /// A product of `x` (n_rows rows) by matrix `mat` of the n_mat matrices of a 3-D weight
    /// broadcast over its third dimension (latent attention's per-head attn_k_b, attn_v_b):
    /// llama.cpp keeps each matrix's sums apart, as for experts, and skips small batches, as
    /// for the other dense products.
    pub fn record_of(&mut self, m: Matrix, mat: usize, n_mat: usize, x: &[f32], n_rows: usize) {
        if n_rows < MIN_ROWS || n_rows == 0 {
            return;
        }
        let n_cols = x.len() / n_rows;
        self.record_expert(m, mat, n_mat, n_cols, x[..n_rows * n_cols].chunks_exact(n_cols));
    }

    /// Rows of expert `expert` (of n_expert) of matrix m, in the order llama.cpp sums them.
    pub fn record_expert<'a>(&mut self, m: Matrix, expert: usize, n_expert: usize, n_cols: usize,
                             rows: impl Iterator<Item = &'a [f32]>) {
        let e = self.entry(m, n_cols, n_expert);
        let acc = &mut e.sums[expert * n_cols..(expert + 1) * n_cols];
        let mut n = 0u64;
        for row in rows {
            add_squares(acc, row);
            n += 1;
        }
        e.counts[expert] += n;
    }

    /// The statistics by llama.cpp tensor name (layer order, then matrix order).
    pub fn into_named(self) -> Vec<(String, MatrixStats)> {
        self.by_matrix.into_iter().map(|((il, m), s)| (m.tensor_name(il), s)).collect()
    }
}

fn add_squares(acc: &mut [f32], x: &[f32]) {
    for (a, v) in acc.iter_mut().zip(x) {
        *a += v * v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_products_below_16_rows_are_not_counted() {
        let mut s = ActivationStats::default();
        s.record(Matrix::AttnQ, &[1.0; 15 * 2], 15);
        assert!(s.into_named().is_empty());
    }

    #[test]
    fn sums_squares_per_column_and_counts_rows() {
        let mut s = ActivationStats::default();
        s.begin_layer(3);
        let x: Vec<f32> = (0..32).map(|i| (i % 2) as f32 + 1.0).collect();
        s.record(Matrix::FfnDown, &x, 16);
        s.record(Matrix::FfnDown, &x, 16);
        let named = s.into_named();
        assert_eq!(named[0].0, "blk.3.ffn_down.weight");
        assert_eq!(named[0].1, MatrixStats { sums: vec![32.0, 128.0], counts: vec![32] });
    }

    #[test]
    fn each_expert_has_its_row_of_sums_and_its_count() {
        let mut s = ActivationStats::default();
        let row = [2.0f32, 3.0];
        s.record_expert(Matrix::FfnUpExps, 1, 3, 2, [&row[..], &row[..]].into_iter());
        let named = s.into_named();
        assert_eq!(named[0].1, MatrixStats { sums: vec![0.0, 0.0, 8.0, 18.0, 0.0, 0.0], counts: vec![0, 2, 0] });
    }
}
