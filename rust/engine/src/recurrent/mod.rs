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

pub use delta_net::{delta_net_mixer, delta_net_params, DeltaNetFamily, DeltaNetWeights};
pub use mamba2::{mamba2_mixer, mamba2_params, Mamba2Weights};

/// The recurrent mixer of a layer.
pub enum RsWeights {
    Mamba2(Mamba2Weights),
    /// The gated delta net (Qwen3-Next, Qwen3.5).
    DeltaNet(DeltaNetWeights),
}

/// A per-head vector stored as [1, n_head] (ssm_a, ssm_d).
pub(crate) fn head_vector(ld: &Loader, name: &str, n_head: usize) -> Result<Vec<f32>> {
    ld.opt_vector_2d(name, 1, n_head)?.ok_or_else(|| ld.error(format!("missing tensor {name}")))
}

/// The states of the recurrent layers: for each such layer, one convolution row and one
/// recurrent row per cell (f32, as llama.cpp keeps them whatever the KV cache type).
#[derive(Default)]
pub struct RsStore {
    pub n_r: usize,
    pub n_s: usize,
    pub cells: usize,
    /// Per layer: cells × n_r and cells × n_s values (empty for the attention layers).
    conv: Vec<Vec<f32>>,
    ssm: Vec<Vec<f32>>,
}

impl RsStore {
    pub fn new(rs: &RsParams, cells: usize) -> Result<RsStore> {
        let per_cell = rs.n_r.checked_add(rs.n_s).and_then(|x| x.checked_mul(cells))
            .filter(|&x| x <= 1 << 34)
            .ok_or_else(|| EngineError::InvalidArgument("the recurrent state is too large".into()))?;
        let _ = per_cell;
        let rows = |on: bool, n: usize| if on { vec![0.0; cells * n] } else { Vec::new() };
        Ok(RsStore {
            n_r: rs.n_r, n_s: rs.n_s, cells,
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

    /// Layer il's convolution and recurrent states of `cell`.
    pub fn states_mut(&mut self, il: usize, cell: usize) -> (&mut [f32], &mut [f32]) {
        let (nr, ns) = (self.n_r, self.n_s);
        (&mut self.conv[il][cell * nr..(cell + 1) * nr], &mut self.ssm[il][cell * ns..(cell + 1) * ns])
    }

    /// Appends cell `cell`'s states of every recurrent layer (conv then recurrent, layer by
    /// layer) as little-endian f32.
    pub fn read_cell(&self, cell: usize, out: &mut Vec<u8>) {
        for il in self.layers().collect::<Vec<_>>() {
            for (rows, n) in [(&self.conv[il], self.n_r), (&self.ssm[il], self.n_s)] {
                for v in &rows[cell * n..(cell + 1) * n] {
                    out.extend(v.to_le_bytes());
                }
            }
        }
    }

    /// Bytes `read_cell` gives for one cell.
    pub fn cell_bytes(&self) -> usize {
        4 * (self.n_r + self.n_s) * self.layers().count()
    }

    /// Stores what `read_cell` gave (exactly `cell_bytes()` bytes).
    pub fn write_cell(&mut self, cell: usize, mut bytes: &[u8]) {
        for il in self.layers().collect::<Vec<_>>() {
            let (nr, ns) = (self.n_r, self.n_s);
            for (rows, n) in [(&mut self.conv[il], nr), (&mut self.ssm[il], ns)] {
                for (v, b) in rows[cell * n..(cell + 1) * n].iter_mut().zip(bytes.chunks_exact(4)) {
                    *v = f32::from_le_bytes(b.try_into().expect("four bytes"));
                }
                bytes = &bytes[4 * n..];
            }
        }
    }

    /// Moves the states as a placement says: the zero row first, then each cell of the
    /// range from its source row (through a copy when rows trade places).
    pub fn apply(&mut self, p: &RsPlacement) {
        let moves: Vec<(usize, usize)> = p.copies.iter().enumerate()
            .map(|(i, &src)| (p.head as usize + i, src as usize))
            .filter(|&(dst, src)| dst != src)
            .collect();
        let (nr, ns) = (self.n_r, self.n_s);
        for (rows, n) in self.conv.iter_mut().map(|r| (r, nr)).chain(self.ssm.iter_mut().map(|r| (r, ns))) {
            if rows.is_empty() {
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

/// x = silu(x) elementwise (ggml_silu with libm's expf).
pub fn silu_inplace(x: &mut [f32]) {
    for v in x {
        *v /= 1.0 + (-*v).exp();
    }
}

