//! The Mamba-2 mixer (llama.cpp's build_mamba2_layer), shared by mamba2, granitehybrid,
//! falcon-h1 and nemotron_h.

use ferrollama_tensor::{ssm, QMatrix, Threads};

use crate::actstats::Matrix;
use crate::arch::blocks::{lora_mm, note};
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::RsParams;
use crate::model::Loader;
use crate::ops::{add_bias, rms_norm_inplace};
use crate::recurrent::{head_vector, silu_inplace, sized, RsStore};

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
    note(&mut ws.stats, Matrix::Other("ssm_in"), &ws.h[..n * w.in_proj.cols], n);
    let conv = sized(&mut sc.conv, n * conv_dim);
    let y = sized(&mut sc.y, n * d_inner);
    let t = g.n_seq_tokens;
    for s in 0..g.n_seqs {
        // dt = dt + dt_bias, in place in the projection (softplus is the scan's)
        for tok in s * t..(s + 1) * t {
            add_bias(&mut proj[tok * width + d_inner + conv_dim..(tok + 1) * width], &w.dt_b);
        }
        for (run, back) in store.token_runs(t) {
            let rows = s * t + run.start..s * t + run.end;
            let (conv_state, ssm_state) = store.states_mut(il, g.head + s);
            let conv_out = &mut conv[rows.start * conv_dim..rows.end * conv_dim];
            ssm::ssm_conv(conv_state, &proj[rows.start * width + d_inner..], width, rows.len(), &w.conv1d, rs.d_conv, conv_dim,
                          conv_out, threads);
            for row in conv_out.chunks_exact_mut(conv_dim) {
                add_bias(row, &w.conv1d_b);
                silu_inplace(row, conv_dim);
            }
            ssm::ssm_scan(ssm_state, conv_out, conv_dim, &proj[rows.start * width + d_inner + conv_dim..], width, &w.a,
                          &conv_out[d_inner..], &conv_out[d_inner + n_group * d_state..], conv_dim, rows.len(), d_state,
                          head_dim, n_head, n_group, &mut y[rows.start * d_inner..rows.end * d_inner], threads);
            if back > 0 {
                store.snapshot(il, g.head + s, back);
            }
        }
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
    note(&mut ws.stats, Matrix::Other("ssm_out"), z, n);
}
