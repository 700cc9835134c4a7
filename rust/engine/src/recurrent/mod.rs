//! Recurrent layers: their weights, the per-sequence states they keep, and the mixers the
//! architectures compose (Mamba-2 here; the gated delta-net and the short convolution beside
//! it). Which cell holds which sequence's state is the kv crate's business (`RsCells`); this
//! file stores the states, moves them as a placement says, and runs the kernels of
//! `ferrollama_tensor::ssm` on them.
//!
//! A micro-batch of a recurrent model holds `n_seqs` sequence groups of `n_seq_tokens` tokens
//! each, group-major (llama.cpp's equal split): group `s` owns rows `s·n_seq_tokens..` of
//! the activations and the states of cell `head + s`.

use ferrollama_kv::RsPlacement;

use crate::error::{EngineError, Result};
use crate::hparams::RsParams;
use crate::model::Loader;

/// Where the sequence groups of a micro-batch keep their states.
#[derive(Debug, Clone, Copy)]
pub struct RsUBatch {
    /// The cell of group 0; group s uses cell `head + s`.
    pub head: usize,
    pub n_seqs: usize,
    pub n_seq_tokens: usize,
}

mod delta_net;
mod mamba2;
mod short_conv;

pub use delta_net::{delta_net_mixer, delta_net_params, DeltaNetFamily, DeltaNetWeights};
pub use mamba2::{mamba2_mixer, mamba2_params, Mamba2Weights};
pub use short_conv::{short_conv_mixer, short_conv_params, ShortConvWeights};

/// The recurrent mixer of a layer.
pub enum RsWeights {
    Mamba2(Mamba2Weights),
    /// LFM2's gated short convolution (a convolution state only).
    ShortConv(ShortConvWeights),
    /// The gated delta net (Qwen3-Next, Qwen3.5).
    DeltaNet(DeltaNetWeights),
}

/// A per-head vector stored as [1, n_head] (ssm_a, ssm_d).
pub(crate) fn head_vector(ld: &Loader, name: &str, n_head: usize) -> Result<Vec<f32>> {
    ld.opt_vector_2d(name, 1, n_head)?.ok_or_else(|| ld.error(format!("missing tensor {name}")))
}

/// The states of the recurrent layers: for each such layer, one convolution row and one
/// recurrent row per cell (f32, as llama.cpp keeps them whatever the KV cache type), in
/// `1 + n_rs_seq` planes: plane 0 holds the current states, plane k the states k tokens
/// back (rollback snapshots of the cell's last micro-batch, llama.cpp's n_rs_seq).
#[derive(Default)]
pub struct RsStore {
    pub n_r: usize,
    pub n_s: usize,
    pub cells: usize,
    /// Snapshot planes beyond the current one.
    pub n_rs_seq: usize,
    /// Per layer: planes × cells × n_r and planes × cells × n_s values (empty for the
    /// attention layers).
    conv: Vec<Vec<f32>>,
    ssm: Vec<Vec<f32>>,
}

impl RsStore {
    pub fn new(rs: &RsParams, cells: usize, n_rs_seq: usize) -> Result<RsStore> {
        let planes = 1 + n_rs_seq;
        let layers = rs.layers.iter().filter(|&&on| on).count();
        // sizes come from the file and the context: refuse what no machine holds
        (rs.n_r + rs.n_s).checked_mul(cells * planes * layers).filter(|&x| x <= 1 << 34)
            .ok_or_else(|| EngineError::InvalidArgument("the recurrent states are too large".into()))?;
        let rows = |on: bool, n: usize| if on { vec![0.0; planes * cells * n] } else { Vec::new() };
        Ok(RsStore {
            n_r: rs.n_r, n_s: rs.n_s, cells, n_rs_seq,
            conv: rs.layers.iter().map(|&on| rows(on, rs.n_r)).collect(),
            ssm: rs.layers.iter().map(|&on| rows(on, rs.n_s)).collect(),
        })
    }

    pub fn bytes(&self) -> usize {
        4 * self.conv.iter().chain(&self.ssm).map(Vec::len).sum::<usize>()
    }

    /// The layers that keep states.
    pub fn layers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.conv.len()).filter(|&il| !self.conv[il].is_empty() || !self.ssm[il].is_empty())
    }

    /// Layer il's current convolution and recurrent states of `cell`.
    pub fn states_mut(&mut self, il: usize, cell: usize) -> (&mut [f32], &mut [f32]) {
        let (nr, ns) = (self.n_r, self.n_s);
        (&mut self.conv[il][cell * nr..(cell + 1) * nr], &mut self.ssm[il][cell * ns..(cell + 1) * ns])
    }

    /// The runs of a group's `n_t` tokens a mixer advances its states over: the whole group
    /// at once, or, when snapshots are kept, the tokens before the last ones at once and the
    /// last ones one by one; with each run, how many tokens back its end is (0: the current
    /// state, else the snapshot plane to save it in with `snapshot`).
    pub fn token_runs(&self, n_t: usize) -> Vec<(std::ops::Range<usize>, usize)> {
        let kept = self.n_rs_seq.min(n_t.saturating_sub(1));
        let head = n_t - kept;
        let mut runs = vec![(0..head, kept)];
        runs.extend((head..n_t).map(|j| (j..j + 1, n_t - 1 - j)));
        runs
    }

    /// Saves layer il's current states of `cell` as the states `back` tokens back.
    pub fn snapshot(&mut self, il: usize, cell: usize, back: usize) {
        let at = back * self.cells + cell;
        for (rows, n) in [(&mut self.conv[il], self.n_r), (&mut self.ssm[il], self.n_s)] {
            if n > 0 && !rows.is_empty() {
                rows.copy_within(cell * n..(cell + 1) * n, at * n);
            }
        }
    }

    /// Makes the states `back` tokens back the current ones of `cell`, in every layer.
    pub fn rollback(&mut self, cell: usize, back: usize) {
        let at = back * self.cells + cell;
        let (nr, ns) = (self.n_r, self.n_s);
        for (rows, n) in self.conv.iter_mut().map(|r| (r, nr)).chain(self.ssm.iter_mut().map(|r| (r, ns))) {
            if n > 0 && !rows.is_empty() {
                rows.copy_within(at * n..(at + 1) * n, cell * n);
            }
        }
    }

    /// Appends cell `cell`'s current states of every recurrent layer (conv then recurrent,
    /// layer by layer) as little-endian f32.
    pub fn read_cell(&self, cell: usize, out: &mut Vec<u8>) {
        for il in self.layers() {
            for (rows, n) in [(&self.conv[il], self.n_r), (&self.ssm[il], self.n_s)] {
                for v in rows.get(cell * n..(cell + 1) * n).unwrap_or(&[]) {
                    out.extend(v.to_le_bytes());
                }
            }
        }
    }

    /// Bytes `read_cell` gives for one cell.
    pub fn cell_bytes(&self) -> usize {
        4 * self.layers().map(|il| {
            (if self.conv[il].is_empty() { 0 } else { self.n_r }) + (if self.ssm[il].is_empty() { 0 } else { self.n_s })
        }).sum::<usize>()
    }

    /// Stores what `read_cell` gave (exactly `cell_bytes()` bytes) as the current states.
    pub fn write_cell(&mut self, cell: usize, mut bytes: &[u8]) {
        let layers: Vec<usize> = self.layers().collect();
        let (nr, ns) = (self.n_r, self.n_s);
        for il in layers {
            for (rows, n) in [(&mut self.conv[il], nr), (&mut self.ssm[il], ns)] {
                let Some(dst) = rows.get_mut(cell * n..(cell + 1) * n) else { continue };
                for (v, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                    *v = f32::from_le_bytes(b.try_into().expect("four bytes"));
                }
                bytes = &bytes[4 * n..];
            }
        }
    }

    /// Moves the current states as a placement says: the zero row first, then each cell of
    /// the range from its source row (through a copy when rows trade places).
    pub fn apply(&mut self, p: &RsPlacement) {
        let moves: Vec<(usize, usize)> = p.copies.iter().enumerate()
            .map(|(i, &src)| (p.head as usize + i, src as usize))
            .filter(|&(dst, src)| dst != src)
            .collect();
        let (nr, ns) = (self.n_r, self.n_s);
        for (rows, n) in self.conv.iter_mut().map(|r| (r, nr)).chain(self.ssm.iter_mut().map(|r| (r, ns))) {
            if rows.is_empty() || n == 0 {
                continue;
            }
            if let Some(z) = p.zero {
                rows[z as usize * n..(z as usize + 1) * n].fill(0.0);
            }
            let sources: Vec<Vec<f32>> = moves.iter().map(|&(_, src)| rows[src * n..(src + 1) * n].to_vec()).collect();
            for (&(dst, _), src) in moves.iter().zip(sources) {
                rows[dst * n..(dst + 1) * n].copy_from_slice(&src);
            }
        }
    }

    /// Clears every state (a cleared memory starts from zeros, as llama.cpp's does).
    pub fn clear(&mut self) {
        self.conv.iter_mut().chain(self.ssm.iter_mut()).for_each(|r| r.fill(0.0));
    }
}

/// The recurrent layers' scratch, sized on first use for the micro-batch (then reused).
#[derive(Default)]
pub struct RsScratch {
    /// The input projection of every token.
    pub proj: Vec<f32>,
    /// The convolution's output.
    pub conv: Vec<f32>,
    /// The mixer's output before the out projection.
    pub y: Vec<f32>,
    /// The gate (z) made contiguous.
    pub z: Vec<f32>,
    /// A mixer's output kept while an attention beside it runs (Falcon-H1).
    pub mixed: Vec<f32>,
    /// The gated delta net's per-head update strengths (beta) and log-decays (g).
    pub beta: Vec<f32>,
    pub decay: Vec<f32>,
    /// A projection whose rows come grouped by key head (Qwen3-Next's `ssm_in`, `ssm_ba`),
    /// before its values are sorted into place.
    pub grouped: Vec<f32>,
    /// Queries and keys repeated for each value head of their key head (Qwen3-Next).
    pub qk: Vec<f32>,
}

/// Grows `v` to `len` values (no allocation once it has been that large).
pub(crate) fn sized(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

/// x = silu(x) over rows of `row` elements, as ggml_silu computes it on this CPU (its vector
/// expf over each row's whole chunks of 8 or 16, libm's over the rest: `glu::silu`).
pub fn silu_inplace(x: &mut [f32], row: usize) {
    ferrollama_tensor::glu::silu(x, row);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short-convolution model keeps a convolution row and no recurrent row (n_s = 0):
    /// moving, saving and restoring a cell handles the empty row.
    #[test]
    fn store_with_a_convolution_row_only() {
        let rs = RsParams { layers: vec![true, false, true], n_r: 4, n_s: 0, d_conv: 3, d_inner: 0, d_state: 0, n_group: 0, dt_rank: 0 };
        let mut store = RsStore::new(&rs, 3, 0).unwrap();
        assert_eq!(store.layers().collect::<Vec<_>>(), [0, 2]);
        assert_eq!((store.bytes(), store.cell_bytes()), (4 * 2 * 3 * 4, 4 * 2 * 4));
        for il in [0, 2] {
            let (conv, ssm) = store.states_mut(il, 1);
            conv.copy_from_slice(&[1.0, 2.0, 3.0, il as f32]);
            assert!(ssm.is_empty());
        }
        store.apply(&RsPlacement { head: 0, copies: vec![1, 1, 2], zero: Some(2) });
        assert_eq!(store.states_mut(2, 0).0, [1.0, 2.0, 3.0, 2.0]);
        assert_eq!(store.states_mut(0, 2).0, [0.0; 4]);
        let mut blob = Vec::new();
        store.read_cell(0, &mut blob);
        assert_eq!(blob.len(), store.cell_bytes());
        store.write_cell(2, &blob);
        assert_eq!(store.states_mut(0, 2).0, [1.0, 2.0, 3.0, 0.0]);
        assert_eq!(store.states_mut(2, 2).0, [1.0, 2.0, 3.0, 2.0]);
    }
}
