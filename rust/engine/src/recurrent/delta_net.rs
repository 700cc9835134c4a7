//! The gated delta net of Qwen3-Next and Qwen3.5 (llama.cpp's build_layer_attn_linear in
//! src/models/qwen3next.cpp and qwen35.cpp, on delta-net-base.cpp's build_conv_state and the
//! fused ggml_gated_delta_net, which llama.cpp's CPU backend runs for prompts and single
//! tokens alike).
//!
//! Per token: a projection to the convolution's channels [q (H_k heads), k (H_k), v (H_v)]
//! and to the output gate z (H_v heads), all heads of S values; per value head an update
//! strength beta = sigmoid(b) and a log-decay g = softplus(alpha + dt_bias) · A. The causal
//! convolution runs over q, k, v (its state: the last d_conv - 1 inputs), then SiLU; q and k
//! are L2-normalized per head; the delta rule updates each value head's S×S state and reads
//! it with q; the output is RMS-normed per head, times silu(z), and projected back.

use ferrollama_tensor::{ssm, QMatrix, Threads};

use crate::actstats::Matrix;
use crate::arch::blocks::{lora_mm, note};
use crate::error::{EngineError, Result};
use crate::graph::{UBatchView, Workspace};
use crate::hparams::RsParams;
use crate::model::Loader;
use crate::ops::{l2_norm_rows, rms_norm_inplace, sigmoid_inplace, swiglu};
use crate::recurrent::{mamba2_params, silu_inplace, sized, RsStore};

/// The two families' tensors and graphs differ in a few places (see `DeltaNetWeights::load`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaNetFamily {
    Qwen3Next,
    /// Qwen3.5 and Qwen3.5-MoE.
    Qwen35,
}

/// A gated delta net mixer.
pub struct DeltaNetWeights {
    input: InputProj,
    gates: GateProj,
    /// conv_dim rows of d_conv taps (no bias).
    conv1d: Vec<f32>,
    /// Per value head: the bias of alpha (`ssm_dt.bias`) and A (-exp(A_log), `ssm_a`).
    dt_b: Vec<f32>,
    a: Vec<f32>,
    /// The RMS norm of each head's output (S values, shared by the heads).
    norm: Vec<f32>,
    out_proj: QMatrix,
    out_proj_s: Option<f32>,
    /// Whether each key head is repeated for its H_v / H_k value heads (value head h reads
    /// key head h / (H_v / H_k)), as Qwen3-Next's graph does with ggml_repeat_4d before the
    /// kernel; Qwen3.5's graph hands the kernel H_k heads and the kernel's broadcast reads
    /// key head h % H_k (its converter orders the value heads for that).
    repeat_keys: bool,
}

/// The projection to q, k, v and z.
enum InputProj {
    /// `attn_qkv` (the convolution's channels) and `attn_gate` (z), with the second scales the
    /// family's graph multiplies in.
    Split { qkv: QMatrix, qkv_s: Option<f32>, z: QMatrix, z_s: Option<f32> },
    /// Qwen3-Next's older `ssm_in`: per key head, its q, its k, then the v and z of its value
    /// heads.
    Grouped(QMatrix),
}

/// The projections to beta and alpha.
enum GateProj {
    /// `ssm_beta` and `ssm_alpha` (Qwen3.5), with their second scales.
    Split { beta: QMatrix, beta_s: Option<f32>, alpha: QMatrix, alpha_s: Option<f32> },
    /// Qwen3-Next's `ssm_ba`: per key head, the betas of its value heads, then their alphas.
    Grouped(QMatrix),
}

/// The mixer's sizes, from `{arch}.ssm.*` as llama.cpp reads them for these families.
#[derive(Clone, Copy)]
struct Dims {
    /// The size of every head (ssm.state_size: S_k = S_v).
    s: usize,
    /// Key heads (ssm.group_count) and value heads (ssm.time_step_rank).
    h_k: usize,
    h_v: usize,
}

impl Dims {
    fn of(rs: &RsParams) -> Dims {
        Dims { s: rs.d_state, h_k: rs.n_group, h_v: rs.dt_rank }
    }
    fn key_dim(&self) -> usize { self.s * self.h_k }
    fn value_dim(&self) -> usize { self.s * self.h_v }
    fn conv_dim(&self) -> usize { 2 * self.key_dim() + self.value_dim() }
    /// Value heads per key head.
    fn per_key(&self) -> usize { self.h_v / self.h_k }
}

/// Reads the sizes of a gated delta net (`{arch}.ssm.*`: the keys, and the convolution and
/// state sizes llama.cpp's n_embd_r / n_embd_s give, are Mamba-2's); `layers` marks the
/// recurrent layers. The state of each value head is S × S with S = state_size, which
/// llama.cpp's graph also takes as inner_size / time_step_rank: the two must agree.
pub fn delta_net_params(file: &ferrollama_gguf::GgufFile, arch: &str, layers: Vec<bool>) -> Result<RsParams> {
    let rs = mamba2_params(file, arch, layers)?;
    if rs.d_inner != rs.d_state * rs.dt_rank {
        return Err(file.error(format!(
            "{arch}: ssm.inner_size {} is not ssm.state_size {} x ssm.time_step_rank {} (each value head holds state_size values)",
            rs.d_inner, rs.d_state, rs.dt_rank)).into());
    }
    if rs.d_state > ssm::MAX_HEAD_DIM {
        return Err(EngineError::Unsupported(format!("{arch}: delta net heads of {} values (at most {})", rs.d_state, ssm::MAX_HEAD_DIM)));
    }
    Ok(rs)
}

impl DeltaNetWeights {
    /// Loads layer il's mixer as llama.cpp's loaders for the family do. Qwen3.5's graph
    /// multiplies in the second scales (`NAME.scale`) of its projections; Qwen3-Next's leaves
    /// them unread, so a file with them is refused (they stay unread here). The input scales
    /// llama.cpp loads and never applies are read and dropped.
    pub fn load(ld: &Loader, rs: &RsParams, n_embd: usize, il: usize, family: DeltaNetFamily) -> Result<DeltaNetWeights> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let d = Dims::of(rs);
        let scaled = family == DeltaNetFamily::Qwen35;
        let mat = |name: &str, cols: usize, rows: usize| -> Result<(QMatrix, Option<f32>)> {
            ld.skip_input_scale(&n(name), 1)?;
            let s = if scaled { ld.opt_scale(&n(name))? } else { None };
            Ok((ld.matrix(&n(name), cols, rows)?, s))
        };
        let input = if family == DeltaNetFamily::Qwen3Next && !ld.has(&n("attn_qkv.weight")) && ld.has(&n("ssm_in.weight")) {
            InputProj::Grouped(mat("ssm_in.weight", n_embd, d.conv_dim() + d.value_dim())?.0)
        } else {
            let ((qkv, qkv_s), (z, z_s)) = (mat("attn_qkv.weight", n_embd, d.conv_dim())?, mat("attn_gate.weight", n_embd, d.value_dim())?);
            InputProj::Split { qkv, qkv_s, z, z_s }
        };
        let gates = match family {
            DeltaNetFamily::Qwen3Next => GateProj::Grouped(ld.matrix(&n("ssm_ba.weight"), n_embd, 2 * d.h_v)?),
            DeltaNetFamily::Qwen35 => {
                let ((beta, beta_s), (alpha, alpha_s)) = (mat("ssm_beta.weight", n_embd, d.h_v)?, mat("ssm_alpha.weight", n_embd, d.h_v)?);
                GateProj::Split { beta, beta_s, alpha, alpha_s }
            }
        };
        let (out_proj, out_proj_s) = mat("ssm_out.weight", d.value_dim(), n_embd)?;
        Ok(DeltaNetWeights {
            input,
            gates,
            conv1d: ld.opt_vector_2d(&n("ssm_conv1d.weight"), rs.d_conv, d.conv_dim())?
                .ok_or_else(|| ld.error(format!("missing tensor {}", n("ssm_conv1d.weight"))))?,
            dt_b: ld.vector(&n("ssm_dt.bias"), d.h_v)?,
            a: ld.vector(&n("ssm_a"), d.h_v)?,
            norm: ld.vector(&n("ssm_norm.weight"), d.s)?,
            out_proj,
            out_proj_s,
            repeat_keys: family == DeltaNetFamily::Qwen3Next,
        })
    }
}

/// ws.o = the gated delta net of ws.h (n tokens of n_embd) for layer il, its states updated.
/// `eps`: the model's RMS epsilon (the L2 norms of q and k and the output norm use it). (LoRA
/// adapters on recurrent layers are refused when the adapter is loaded, so no terms are added
/// here.)
#[allow(clippy::too_many_arguments)]
pub fn delta_net_mixer(rs: &RsParams, w: &DeltaNetWeights, ws: &mut Workspace, store: &mut RsStore, ub: &UBatchView, il: usize,
                       eps: f32, threads: &Threads) {
    let groups = ub.rs.expect("a recurrent layer needs the micro-batch's state cells");
    let n = ub.tokens.len();
    let d = Dims::of(rs);
    let (conv_dim, key_dim, value_dim) = (d.conv_dim(), d.key_dim(), d.value_dim());
    project_inputs(w, &d, ws, n, threads);
    project_gates(w, &d, ws, n, threads);
    note_inputs(w, ws, n);
    let sc = &mut ws.rs;
    let conv = sized(&mut sc.conv, n * conv_dim);
    let y = sized(&mut sc.y, n * value_dim);
    let t = groups.n_seq_tokens;
    for s in 0..groups.n_seqs {
        // the group's tokens at once, or with the states after its last ones kept (n_rs_seq)
        for (run, back) in store.token_runs(t) {
            let rows = s * t + run.start..s * t + run.end;
            let m = rows.len();
            let (conv_state, state) = store.states_mut(il, groups.head + s);
            let conv_out = &mut conv[rows.start * conv_dim..rows.end * conv_dim];
            ssm::ssm_conv(conv_state, &sc.proj[rows.start * conv_dim..], conv_dim, m, &w.conv1d, rs.d_conv, conv_dim, conv_out,
                          threads);
            silu_inplace(conv_out, conv_dim);
            for row in conv_out.chunks_exact_mut(conv_dim) {
                l2_norm_rows(&mut row[..2 * key_dim], d.s, eps);
            }
            let (qk, qk_stride, h_k) = if w.repeat_keys && d.h_k != d.h_v {
                let qk = sized(&mut sc.qk, m * 2 * value_dim);
                repeat_key_heads(conv_out, &d, qk);
                (&*qk, 2 * value_dim, d.h_v)
            } else {
                (&*conv_out, conv_dim, d.h_k)
            };
            let qk_width = h_k * d.s;
            let (g, beta) = (&sc.decay[rows.start * d.h_v..], &sc.beta[rows.start * d.h_v..]);
            ssm::gated_delta_net(state, qk, &qk[qk_width..], qk_stride, &conv_out[2 * key_dim..], conv_dim, g, d.h_v, false, beta,
                                 d.h_v, m, d.s, h_k, d.s, d.h_v, &mut y[rows.start * value_dim..rows.end * value_dim], threads);
            if back > 0 {
                store.snapshot(il, groups.head + s, back);
            }
        }
    }
    // the gated norm: RMSNorm(o) per head, times silu(z)
    rms_norm_inplace(y, &w.norm, eps);
    let z = sized(&mut sc.z, n * value_dim);
    swiglu(z, y, d.s);
    let dim = w.out_proj.rows;
    lora_mm(&w.out_proj, w.out_proj_s, &[], z, n, &mut ws.o[..n * dim], &mut ws.mm, &mut ws.lora, threads);
    note(&mut ws.stats, Matrix::Other("ssm_out"), z, n);
}

/// The activation statistics of the products of ws.h (llama-imatrix's, by tensor name).
fn note_inputs(w: &DeltaNetWeights, ws: &mut Workspace, n: usize) {
    let Some(stats) = ws.stats.as_deref_mut() else { return };
    let inputs: &[&'static str] = match (&w.input, &w.gates) {
        (InputProj::Split { .. }, GateProj::Split { .. }) => &["attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha"],
        (InputProj::Split { .. }, GateProj::Grouped(_)) => &["attn_qkv", "attn_gate", "ssm_ba"],
        (InputProj::Grouped(_), GateProj::Split { .. }) => &["ssm_in", "ssm_beta", "ssm_alpha"],
        (InputProj::Grouped(_), GateProj::Grouped(_)) => &["ssm_in", "ssm_ba"],
    };
    let x = &ws.h[..n * w.out_proj.rows];
    for &name in inputs {
        stats.record(Matrix::Other(name), x, n);
    }
}

/// ws.rs.proj = the convolution's channels (n × conv_dim), ws.rs.z = the gate (n × value_dim).
fn project_inputs(w: &DeltaNetWeights, d: &Dims, ws: &mut Workspace, n: usize, threads: &Threads) {
    let sc = &mut ws.rs;
    let (conv_dim, value_dim) = (d.conv_dim(), d.value_dim());
    let proj = sized(&mut sc.proj, n * conv_dim);
    let z = sized(&mut sc.z, n * value_dim);
    match &w.input {
        InputProj::Split { qkv, qkv_s, z: wz, z_s } => {
            lora_mm(qkv, *qkv_s, &[], &ws.h, n, proj, &mut ws.mm, &mut ws.lora, threads);
            lora_mm(wz, *z_s, &[], &ws.h, n, z, &mut ws.mm, &mut ws.lora, threads);
        }
        InputProj::Grouped(qkvz) => {
            let grouped = sized(&mut sc.grouped, n * qkvz.rows);
            lora_mm(qkvz, None, &[], &ws.h, n, grouped, &mut ws.mm, &mut ws.lora, threads);
            sort_grouped_qkvz(grouped, d, proj, z);
        }
    }
}

/// Splits `ssm_in`'s products (per token, per key head: q, k, the v and z of its value heads)
/// into the convolution's channels [q of every head, k of every head, v of every head] and
/// z, as llama.cpp's legacy build_qkvz does with views and concatenations.
fn sort_grouped_qkvz(grouped: &[f32], d: &Dims, proj: &mut [f32], z: &mut [f32]) {
    let (s, vs) = (d.s, d.per_key() * d.s);
    let (key_dim, value_dim, conv_dim) = (d.key_dim(), d.value_dim(), d.conv_dim());
    for (t, row) in grouped.chunks_exact(conv_dim + value_dim).enumerate() {
        let (p, zt) = (&mut proj[t * conv_dim..(t + 1) * conv_dim], &mut z[t * value_dim..(t + 1) * value_dim]);
        for (gi, head) in row.chunks_exact(2 * s + 2 * vs).enumerate() {
            p[gi * s..(gi + 1) * s].copy_from_slice(&head[..s]);
            p[key_dim + gi * s..key_dim + (gi + 1) * s].copy_from_slice(&head[s..2 * s]);
            p[2 * key_dim + gi * vs..2 * key_dim + (gi + 1) * vs].copy_from_slice(&head[2 * s..2 * s + vs]);
            zt[gi * vs..(gi + 1) * vs].copy_from_slice(&head[2 * s + vs..]);
        }
    }
}

/// ws.rs.beta = sigmoid(b) and ws.rs.decay = softplus(alpha + dt_bias) · A, n × H_v each.
fn project_gates(w: &DeltaNetWeights, d: &Dims, ws: &mut Workspace, n: usize, threads: &Threads) {
    let sc = &mut ws.rs;
    let h_v = d.h_v;
    let beta = sized(&mut sc.beta, n * h_v);
    let decay = sized(&mut sc.decay, n * h_v);
    match &w.gates {
        GateProj::Split { beta: wb, beta_s, alpha: wa, alpha_s } => {
            lora_mm(wb, *beta_s, &[], &ws.h, n, beta, &mut ws.mm, &mut ws.lora, threads);
            lora_mm(wa, *alpha_s, &[], &ws.h, n, decay, &mut ws.mm, &mut ws.lora, threads);
            sigmoid_inplace(beta);
            for row in decay.chunks_exact_mut(h_v) {
                for ((g, &dt), &a) in row.iter_mut().zip(&w.dt_b).zip(&w.a) {
                    *g = ssm::softplus(*g + dt) * a;
                }
            }
        }
        GateProj::Grouped(ba) => {
            let grouped = sized(&mut sc.grouped, n * 2 * h_v);
            lora_mm(ba, None, &[], &ws.h, n, grouped, &mut ws.mm, &mut ws.lora, threads);
            let r = d.per_key();
            for (t, row) in grouped.chunks_exact(2 * h_v).enumerate() {
                for (gi, head) in row.chunks_exact(2 * r).enumerate() {
                    for j in 0..r {
                        let h = gi * r + j;
                        beta[t * h_v + h] = head[j];
                        decay[t * h_v + h] = ssm::softplus(head[r + j] + w.dt_b[h]) * w.a[h];
                    }
                }
            }
            sigmoid_inplace(beta);
        }
    }
}

/// `qk` = each token's q and k with key head h / (H_v / H_k) in value head h's place (t rows
/// of [q of H_v heads, k of H_v heads]), from the convolution's output rows.
fn repeat_key_heads(conv_out: &[f32], d: &Dims, qk: &mut [f32]) {
    let (s, key_dim, value_dim, r) = (d.s, d.key_dim(), d.value_dim(), d.per_key());
    for (row, out) in conv_out.chunks_exact(d.conv_dim()).zip(qk.chunks_exact_mut(2 * value_dim)) {
        for h in 0..d.h_v {
            let src = (h / r) * s;
            out[h * s..(h + 1) * s].copy_from_slice(&row[src..src + s]);
            out[value_dim + h * s..value_dim + (h + 1) * s].copy_from_slice(&row[key_dim + src..key_dim + src + s]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two key heads of two values, each with two value heads: `ssm_in`'s rows per key head
    /// [q, k, v of 2 heads, z of 2 heads] become [q0 q1 | k0 k1 | v0..v3] and [z0..z3].
    #[test]
    fn grouped_qkvz_sorts_into_channels_and_gate() {
        let d = Dims { s: 2, h_k: 2, h_v: 4 };
        let per_group = |g: f32| -> Vec<f32> {
            let tag = |part: f32, n: usize| (0..n).map(move |i| g * 100.0 + part * 10.0 + i as f32);
            tag(1.0, 2).chain(tag(2.0, 2)).chain(tag(3.0, 4)).chain(tag(4.0, 4)).collect()
        };
        let grouped: Vec<f32> = per_group(0.0).into_iter().chain(per_group(1.0)).collect();
        let (mut proj, mut z) = (vec![0.0; d.conv_dim()], vec![0.0; d.value_dim()]);
        sort_grouped_qkvz(&grouped, &d, &mut proj, &mut z);
        assert_eq!(proj, [10.0, 11.0, 110.0, 111.0, 20.0, 21.0, 120.0, 121.0, 30.0, 31.0, 32.0, 33.0, 130.0, 131.0, 132.0, 133.0]);
        assert_eq!(z, [40.0, 41.0, 42.0, 43.0, 140.0, 141.0, 142.0, 143.0]);
    }

    /// Qwen3-Next's repeat: value head h reads key head h / (H_v / H_k).
    #[test]
    fn repeated_key_heads_follow_their_value_heads() {
        let d = Dims { s: 1, h_k: 2, h_v: 4 };
        let row = [1.0, 2.0, 10.0, 20.0, 0.0, 0.0, 0.0, 0.0];
        let mut qk = vec![0.0; 8];
        repeat_key_heads(&row, &d, &mut qk);
        assert_eq!(qk, [1.0, 1.0, 2.0, 2.0, 10.0, 10.0, 20.0, 20.0]);
    }
}
