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
use ferrollama_tensor::{ssm, QMatrix, Threads};

use crate::arch::blocks::lora_mm;
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::RsParams;
use crate::model::Loader;
use crate::ops::{add_bias, rms_norm_inplace};

/// Where the sequence groups of a micro-batch keep their states.
#[derive(Debug, Clone, Copy)]
pub struct RsUBatch {
    /// The cell of group 0; group s uses cell `head + s`.
    pub head: usize,
    pub n_seqs: usize,
    pub n_seq_tokens: usize,
}

/// The recurrent mixer of a layer.
pub enum RsWeights {
    Mamba2(Mamba2Weights),
}

/// A Mamba-2 mixer (llama.cpp's build_mamba2_layer).
pub struct Mamba2Weights {
    /// n_embd → z (d_inner), xBC (d_inner + 2·n_group·d_state), dt (n_head).
    pub in_proj: QMatrix,
    pub in_proj_s: Option<f32>,
    /// conv_dim rows of d_conv taps, and the convolution's bias.
    pub conv1d: Vec<f32>,
    pub conv1d_b: Vec<f32>,
    pub dt_b: Vec<f32>,
    /// Per head: A (the decay rate, -exp(A_log)) and D (the skip).
    pub a: Vec<f32>,
    pub d: Vec<f32>,
    /// The grouped RMSNorm of the gated output (d_inner values: n_group groups).
    pub norm: Option<Vec<f32>>,
    pub out_proj: QMatrix,
    pub out_proj_s: Option<f32>,
}

impl Mamba2Weights {
    /// Loads `blk.{il}.ssm_*` as llama.cpp's mamba2 / granitehybrid / falcon-h1 / nemotron_h
    /// loaders do (`norm`: whether the group norm is there).
    pub fn load(ld: &Loader, rs: &RsParams, n_embd: usize, il: usize, norm: bool) -> Result<Mamba2Weights> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let conv_dim = rs.d_inner + 2 * rs.n_group * rs.d_state;
        let d_in_proj = rs.d_inner + conv_dim + rs.dt_rank;
        for m in ["ssm_in.weight", "ssm_out.weight"] {
            ld.skip_input_scale(&n(m), 1)?;
        }
        Ok(Mamba2Weights {
            in_proj: ld.matrix(&n("ssm_in.weight"), n_embd, d_in_proj)?,
            in_proj_s: ld.opt_scale(&n("ssm_in.weight"))?,
            conv1d: ld.opt_vector_2d(&n("ssm_conv1d.weight"), rs.d_conv, conv_dim)?
                .ok_or_else(|| ld.error(format!("missing tensor {}", n("ssm_conv1d.weight"))))?,
            conv1d_b: ld.vector(&n("ssm_conv1d.bias"), conv_dim)?,
            dt_b: ld.vector(&n("ssm_dt.bias"), rs.dt_rank)?,
            a: head_vector(ld, &n("ssm_a"), rs.dt_rank)?,
            d: head_vector(ld, &n("ssm_d"), rs.dt_rank)?,
            norm: if norm { Some(head_norm(ld, &n("ssm_norm.weight"), rs)?) } else { None },
            out_proj: ld.matrix(&n("ssm_out.weight"), rs.d_inner, n_embd)?,
            out_proj_s: ld.opt_scale(&n("ssm_out.weight"))?,
        })
    }
}

/// A per-head vector stored as [1, n_head] (ssm_a, ssm_d).
fn head_vector(ld: &Loader, name: &str, n_head: usize) -> Result<Vec<f32>> {
    ld.opt_vector_2d(name, 1, n_head)?.ok_or_else(|| ld.error(format!("missing tensor {name}")))
}

/// The group norm's weights, stored as [d_inner / n_group, n_group].
fn head_norm(ld: &Loader, name: &str, rs: &RsParams) -> Result<Vec<f32>> {
    ld.opt_vector_2d(name, rs.d_inner / rs.n_group, rs.n_group)?.ok_or_else(|| ld.error(format!("missing tensor {name}")))
}

/// Reads the Mamba-2 sizes (`{arch}.ssm.*`) every Mamba-2 family shares; `layers` marks the
/// recurrent layers.
pub fn mamba2_params(file: &ferrollama_gguf::GgufFile, arch: &str, layers: Vec<bool>) -> Result<RsParams> {
    let m = crate::hparams::Meta { file, arch };
    let (d_conv, d_inner, d_state) = (m.usize("ssm.conv_kernel")?, m.usize("ssm.inner_size")?, m.usize("ssm.state_size")?);
    let (dt_rank, n_group) = (m.usize("ssm.time_step_rank")?, m.usize("ssm.group_count")?);
    for (k, v) in [("conv_kernel", d_conv), ("inner_size", d_inner), ("state_size", d_state), ("time_step_rank", dt_rank),
                   ("group_count", n_group)] {
        if v == 0 || v > 1 << 16 {
            return Err(file.error(format!("{arch}.ssm.{k} = {v} is out of range")).into());
        }
    }
    if d_inner % dt_rank != 0 || d_inner % n_group != 0 || dt_rank % n_group != 0 {
        return Err(file.error(format!(
            "{arch}: ssm.inner_size {d_inner} must be a multiple of time_step_rank {dt_rank} and group_count {n_group}, \
             and the heads of the groups")).into());
    }
    let conv_dim = d_inner + 2 * n_group * d_state;
    Ok(RsParams { layers, n_r: (d_conv - 1) * conv_dim, n_s: d_state * d_inner, d_conv, d_inner, d_state, n_group, dt_rank })
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
}

/// Grows `v` to `len` values (no allocation once it has been that large).
fn sized(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
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

/// ws.o = the Mamba-2 mixer of ws.h (n tokens of n_embd) for layer il, its states updated.
/// `eps`: the group norm's epsilon. (LoRA adapters on recurrent layers are refused when the
/// adapter is loaded, so no terms are added here.)
#[allow(clippy::too_many_arguments)]
pub fn mamba2_mixer(rs: &RsParams, w: &Mamba2Weights, ws: &mut Workspace, store: &mut RsStore, ub: &UBatchView, il: usize,
                    eps: f32, threads: &Threads) {
    let g = ub.rs.expect("a recurrent layer needs the micro-batch's state cells");
    let n = ub.tokens.len();
    let d = w.out_proj.rows;
    let (d_inner, n_head, d_state, n_group) = (rs.d_inner, rs.dt_rank, rs.d_state, rs.n_group);
    let head_dim = d_inner / n_head;
    let conv_dim = d_inner + 2 * n_group * d_state;
    let width = w.in_proj.rows;
    let sc = &mut ws.rs;
    let proj = sized(&mut sc.proj, n * width);
    lora_mm(&w.in_proj, w.in_proj_s, &[], &ws.h, n, proj, &mut ws.mm, &mut ws.lora, threads);
    let conv = sized(&mut sc.conv, n * conv_dim);
    let y = sized(&mut sc.y, n * d_inner);
    let t = g.n_seq_tokens;
    for s in 0..g.n_seqs {
        let rows = s * t..(s + 1) * t;
        let (conv_state, ssm_state) = store.states_mut(il, g.head + s);
        let conv_out = &mut conv[rows.start * conv_dim..rows.end * conv_dim];
        ssm::ssm_conv(conv_state, &proj[rows.start * width + d_inner..], width, t, &w.conv1d, rs.d_conv, conv_dim, conv_out, threads);
        for row in conv_out.chunks_exact_mut(conv_dim) {
            add_bias(row, &w.conv1d_b);
            silu_inplace(row);
        }
        // dt = dt + dt_bias, in place in the projection (softplus is the scan's)
        for tok in rows.clone() {
            let dt = &mut proj[tok * width + d_inner + conv_dim..(tok + 1) * width];
            add_bias(dt, &w.dt_b);
        }
        ssm::ssm_scan(ssm_state, conv_out, conv_dim, &proj[rows.start * width + d_inner + conv_dim..], width, &w.a,
                      &conv_out[d_inner..], &conv_out[d_inner + n_group * d_state..], conv_dim, t, d_state, head_dim, n_head,
                      n_group, &mut y[rows.start * d_inner..rows.end * d_inner], threads);
    }
    // y += x·D, then y = silu(z)·y, then the grouped norm
    let z = sized(&mut sc.z, n * d_inner);
    for tok in 0..n {
        let (yr, xr) = (&mut y[tok * d_inner..(tok + 1) * d_inner], &conv[tok * conv_dim..tok * conv_dim + d_inner]);
        for (h, (yh, xh)) in yr.chunks_exact_mut(head_dim).zip(xr.chunks_exact(head_dim)).enumerate() {
            for (a, &b) in yh.iter_mut().zip(xh) {
                *a += b * w.d[h];
            }
        }
        z[tok * d_inner..(tok + 1) * d_inner].copy_from_slice(&proj[tok * width..tok * width + d_inner]);
    }
    crate::ops::swiglu(z, y, d_inner);
    if let Some(norm) = &w.norm {
        // one RMSNorm per group of d_inner / n_group values, each with its slice of the weights
        let group = d_inner / n_group;
        for row in z.chunks_exact_mut(d_inner) {
            for (part, wg) in row.chunks_exact_mut(group).zip(norm.chunks_exact(group)) {
                rms_norm_inplace(part, wg, eps);
            }
        }
    }
    lora_mm(&w.out_proj, w.out_proj_s, &[], z, n, &mut ws.o[..n * d], &mut ws.mm, &mut ws.lora, threads);
}
