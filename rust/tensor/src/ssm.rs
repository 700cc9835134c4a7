//! The kernels of recurrent and hybrid models, as ggml-cpu computes them (llama.cpp as
//! vendored in llama-cpp-python 0.3.36, ggml/src/ggml-cpu/ops.cpp):
//!
//! - `ssm_conv`: the causal depthwise convolution of Mamba, Qwen3.5's / Qwen3-Next's gated
//!   delta net layers and LFM2's short convolutions (`ggml_ssm_conv` on the concatenation of
//!   the rolling conv state and the new inputs, plus the copy of the window's tail back into
//!   the state that `build_conv_state` makes);
//! - `ssm_scan`: Mamba-2's selective scan (`ggml_ssm_scan` with a scalar A per head, K = 1);
//! - `gated_delta_net`: the gated delta rule in its recurrent form (`ggml_gated_delta_net`,
//!   K = 1), with a scalar gate per head or Kimi's per-channel gate (KDA).
//!
//! Each works on one sequence (the engine calls them once per sequence of a micro-batch),
//! in f32, without allocating, and splits its work over the pool by channels or heads when
//! it is large enough to pay for the dispatch.
//!
//! The scalar code here is the specification: the same elementwise operations as ggml's
//! (no fused multiply-adds), each reduction summed in index order.

use crate::threads::{SendPtr, Threads};

/// The widest head (S_v) `gated_delta_net` takes: its per-channel gate lives on the stack.
pub const MAX_HEAD_DIM: usize = 512;

/// Multiply-adds below which a kernel stays on the caller's thread: publishing a job to the
/// pool costs a few microseconds, about as long as this much arithmetic.
const PARALLEL_WORK: usize = 1 << 15;

/// Channels per ssm_conv task when the work is split (a multiple of every vector width).
const CONV_CHANNELS_PER_TASK: usize = 256;

/// ggml_compute_softplus_f32: log(1 + exp(x)), or x itself past 20 (where the two agree in
/// f32 and exp would soon overflow).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// The number of tasks to split `units` independent pieces of `work` multiply-adds into:
/// one (the caller's thread) when the whole is small, else one per piece.
fn tasks_for(work: usize, units: usize, threads: &Threads) -> usize {
    if threads.n_threads() == 1 || work < PARALLEL_WORK {
        1
    } else {
        units
    }
}

// ------------------------------------------------------------------------- ssm_conv

/// ggml_ssm_conv for one sequence, with its rolling state (build_conv_state + ggml_ssm_conv):
///
/// - `state`: `channels` rows of `d_conv - 1` values, channel-major (row c = the last
///   d_conv - 1 inputs of channel c, oldest first) — llama.cpp's conv-state layout; updated in
///   place to the last d_conv - 1 inputs after the n_t tokens (for n_t < d_conv - 1 part of the
///   old state remains, shifted).
/// - `x`: n_t token rows, row t at `x[t*x_stride .. t*x_stride + channels]` (token-major; a
///   stride because x is often a column range of a wider projection).
/// - `weight`: `channels` rows of `d_conv` taps (ssm_conv1d.weight as ggml stores it:
///   [d_conv, channels]).
/// - `out`: n_t rows of `channels` (token-major, contiguous):
///   `out[t][c] = sum_{i<d_conv} window[c][t+i] * weight[c][i]`, where
///   `window[c] = state[c] ++ x[..][c]`; summed in i order as ggml does.
///
/// The bias and the activation that follow in the models are the caller's.
#[allow(clippy::too_many_arguments)]
pub fn ssm_conv(state: &mut [f32], x: &[f32], x_stride: usize, n_t: usize, weight: &[f32], d_conv: usize, channels: usize, out: &mut [f32], threads: &Threads) {
    assert!(d_conv >= 1, "ssm_conv: d_conv must be at least 1");
    assert_eq!(state.len(), channels * (d_conv - 1), "ssm_conv: state is channels x (d_conv - 1)");
    assert_eq!(weight.len(), channels * d_conv, "ssm_conv: weight is channels x d_conv");
    assert!(out.len() >= n_t * channels, "ssm_conv: out holds n_t rows of channels");
    assert!(n_t == 0 || (x_stride >= channels && x.len() >= (n_t - 1) * x_stride + channels), "ssm_conv: x holds n_t rows of channels at x_stride");
    let n_tasks = tasks_for(n_t * d_conv * channels, channels.div_ceil(CONV_CHANNELS_PER_TASK), threads);
    let per_task = if n_tasks == 1 { channels } else { CONV_CHANNELS_PER_TASK };
    let (state_p, out_p) = (SendPtr(state.as_mut_ptr()), SendPtr(out.as_mut_ptr()));
    threads.run(n_tasks, |task| {
        let c0 = task * per_task;
        let c1 = (c0 + per_task).min(channels);
        if c0 >= c1 {
            return;
        }
        let part = ConvPart { state: state_p.get(), x, x_stride, n_t, weight, d_conv, out: out_p.get(), channels };
        // SAFETY: the tasks' channel ranges are disjoint, and a range's state rows and
        // output columns belong to it alone; the lengths were checked above.
        unsafe { conv_channels_scalar(&part, c0, c1) };
    });
}

/// ssm_conv's operands, shared by the tasks; each task writes its own channels of `state`
/// and `out` through the raw pointers.
struct ConvPart<'a> {
    state: *mut f32,
    x: &'a [f32],
    x_stride: usize,
    n_t: usize,
    weight: &'a [f32],
    d_conv: usize,
    out: *mut f32,
    channels: usize,
}

/// ssm_conv on channels c0..c1, one channel at a time.
///
/// SAFETY: `part.state` and `part.out` valid for the lengths `ssm_conv` checks, and no other
/// thread touching channels c0..c1 of them meanwhile.
unsafe fn conv_channels_scalar(part: &ConvPart, c0: usize, c1: usize) {
    let taps_before = part.d_conv - 1;
    for c in c0..c1 {
        let state = std::slice::from_raw_parts_mut(part.state.add(c * taps_before), taps_before);
        let weight = &part.weight[c * part.d_conv..(c + 1) * part.d_conv];
        let input = |t: usize| part.x[t * part.x_stride + c];
        let window = |j: usize| if j < taps_before { state[j] } else { input(j - taps_before) };
        for t in 0..part.n_t {
            let mut sum = 0f32;
            for (i, &w) in weight.iter().enumerate() {
                sum += window(t + i) * w;
            }
            *part.out.add(t * part.channels + c) = sum;
        }
        // The new state is the window's last taps_before values; reading ahead of the write
        // (index n_t + j > j) lets the shift happen in place.
        for j in 0..taps_before {
            let w = part.n_t + j;
            state[j] = if w < taps_before { state[w] } else { input(w - taps_before) };
        }
    }
}

// ------------------------------------------------------------------------- ssm_scan

/// ggml_ssm_scan for one sequence, K = 1, Mamba-2 only (a scalar A per head,
/// `a.len() == n_head`; Mamba-1's A of d_state values per channel is not supported and
/// panics):
///
/// - `state`: [d_state, head_dim, n_head] (d_state fastest), updated in place;
/// - `x`: n_t token rows of head_dim*n_head at stride `x_stride`;
/// - `dt`: n_t rows of n_head at stride `dt_stride`, raw: softplus is applied here as ggml's
///   ggml_compute_softplus_f32 (`log(1 + exp(x))`, or x for x > 20);
/// - `b`, `c`: n_t rows of d_state*n_group at stride `bc_stride` (each its own slice, both
///   with that stride); head h uses group h / (n_head / n_group) (repeat_interleave);
/// - `y`: n_t rows of head_dim*n_head (contiguous).
///
/// For head h and token t, with dt' = softplus(dt[t][h]) and dA = exp(dt' * A[h]), every row
/// (head_dim of them) of d_state values: s = s*dA + B*(x*dt'), y = sum s*C in index order.
#[allow(clippy::too_many_arguments)]
pub fn ssm_scan(
    state: &mut [f32],
    x: &[f32],
    x_stride: usize,
    dt: &[f32],
    dt_stride: usize,
    a: &[f32],
    b: &[f32],
    c: &[f32],
    bc_stride: usize,
    n_t: usize,
    d_state: usize,
    head_dim: usize,
    n_head: usize,
    n_group: usize,
    y: &mut [f32],
    threads: &Threads,
) {
    assert_eq!(a.len(), n_head, "ssm_scan: A must hold one value per head (Mamba-2); Mamba-1's per-state A is not supported");
    assert!(n_group >= 1 && n_head % n_group == 0, "ssm_scan: n_head must be a multiple of n_group");
    assert_eq!(state.len(), d_state * head_dim * n_head, "ssm_scan: state is [d_state, head_dim, n_head]");
    assert!(y.len() >= n_t * head_dim * n_head, "ssm_scan: y holds n_t rows of head_dim*n_head");
    let rows_fit = |s: &[f32], stride: usize, width: usize| n_t == 0 || (stride >= width && s.len() >= (n_t - 1) * stride + width);
    assert!(rows_fit(x, x_stride, head_dim * n_head), "ssm_scan: x holds n_t rows of head_dim*n_head at x_stride");
    assert!(rows_fit(dt, dt_stride, n_head), "ssm_scan: dt holds n_t rows of n_head at dt_stride");
    assert!(rows_fit(b, bc_stride, d_state * n_group) && rows_fit(c, bc_stride, d_state * n_group), "ssm_scan: B and C hold n_t rows of d_state*n_group at bc_stride");
    let heads_per_group = n_head / n_group;
    let head_state = d_state * head_dim;
    let n_tasks = tasks_for(n_t * head_state * n_head, n_head, threads);
    let heads_per_task = n_head.div_ceil(n_tasks.max(1));
    let (state_p, y_p) = (SendPtr(state.as_mut_ptr()), SendPtr(y.as_mut_ptr()));
    threads.run(n_tasks, |task| {
        for h in task * heads_per_task..((task + 1) * heads_per_task).min(n_head) {
            // SAFETY: head h's state is its own, disjoint from the other tasks' heads.
            let state_h = unsafe { std::slice::from_raw_parts_mut(state_p.get().add(h * head_state), head_state) };
            let group = h / heads_per_group;
            for t in 0..n_t {
                let dt_soft_plus = softplus(dt[t * dt_stride + h]);
                let d_a = (dt_soft_plus * a[h]).exp();
                let x_t = &x[t * x_stride + h * head_dim..][..head_dim];
                let b_t = &b[t * bc_stride + group * d_state..][..d_state];
                let c_t = &c[t * bc_stride + group * d_state..][..d_state];
                // SAFETY: head h's columns of row t are written by this task only; in bounds
                // (y's length checked above).
                let y_t = unsafe { std::slice::from_raw_parts_mut(y_p.get().add(t * head_dim * n_head + h * head_dim), head_dim) };
                scan_head_token_scalar(state_h, x_t, dt_soft_plus, d_a, b_t, c_t, y_t);
            }
        }
    });
}

/// One head, one token of ssm_scan: `state` is head_dim rows of d_state (= b.len()) values.
fn scan_head_token_scalar(state: &mut [f32], x: &[f32], dt_soft_plus: f32, d_a: f32, b: &[f32], c: &[f32], y: &mut [f32]) {
    for ((row, &xi), yi) in state.chunks_exact_mut(b.len()).zip(x).zip(y.iter_mut()) {
        let x_dt = xi * dt_soft_plus;
        let mut sum = 0f32;
        for ((s, &bi), &ci) in row.iter_mut().zip(b).zip(c) {
            *s = *s * d_a + bi * x_dt;
            sum += *s * ci;
        }
        *yi = sum;
    }
}

// ------------------------------------------------------------------ gated_delta_net

/// ggml_gated_delta_net (K = 1) for one sequence: the recurrent form ggml uses for prompts
/// and single tokens alike.
///
/// - `state`: [S_v, S_v, H_v] stored transposed as ggml does (`state[h][j*S_v + i] = S[i][j]`),
///   updated in place;
/// - `q`, `k`: n_t rows of S_k*H_k at stride `qk_stride` (each its own slice); head h of v
///   uses q/k head h % H_k (ggml's tiled broadcast: iq1 = iv1 % neq1); S_k must equal S_v;
/// - `v`: n_t rows of S_v*H_v at stride `v_stride`;
/// - `g`: n_t rows at stride `g_stride` of H_v values (`kda == false`: a scalar gate per head)
///   or of H_v*S_v values (`kda == true`: one per channel i of S); the log of the decay;
/// - `beta`: n_t rows of H_v at stride `beta_stride`;
/// - `out`: n_t rows of S_v*H_v (contiguous), scaled by 1/sqrt(S_v) as ggml does.
///
/// Per head and token: S *= exp(g) (row i of S by exp(g[i]) for KDA); then for every
/// column j, delta[j] = (v[j] - sum_i S[i][j] k[i]) * beta; S[i][j] += k[i] delta[j];
/// out[j] = sum_i S[i][j] q[i] / sqrt(S_v). The sums run in i order.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    qk_stride: usize,
    v: &[f32],
    v_stride: usize,
    g: &[f32],
    g_stride: usize,
    kda: bool,
    beta: &[f32],
    beta_stride: usize,
    n_t: usize,
    s_k: usize,
    h_k: usize,
    s_v: usize,
    h_v: usize,
    out: &mut [f32],
    threads: &Threads,
) {
    assert_eq!(s_k, s_v, "gated_delta_net: S_k must equal S_v");
    assert!(s_v <= MAX_HEAD_DIM, "gated_delta_net: S_v {s_v} > {MAX_HEAD_DIM}");
    assert!(h_k >= 1 && h_v % h_k == 0, "gated_delta_net: H_v must be a multiple of H_k");
    assert_eq!(state.len(), s_v * s_v * h_v, "gated_delta_net: state is [S_v, S_v, H_v]");
    assert!(out.len() >= n_t * s_v * h_v, "gated_delta_net: out holds n_t rows of S_v*H_v");
    let rows_fit = |s: &[f32], stride: usize, width: usize| n_t == 0 || (stride >= width && s.len() >= (n_t - 1) * stride + width);
    let g_width = if kda { h_v * s_v } else { h_v };
    assert!(rows_fit(q, qk_stride, s_k * h_k) && rows_fit(k, qk_stride, s_k * h_k), "gated_delta_net: q and k hold n_t rows of S_k*H_k at qk_stride");
    assert!(rows_fit(v, v_stride, s_v * h_v), "gated_delta_net: v holds n_t rows of S_v*H_v at v_stride");
    assert!(rows_fit(g, g_stride, g_width), "gated_delta_net: g holds n_t rows of H_v (or H_v*S_v for KDA) at g_stride");
    assert!(rows_fit(beta, beta_stride, h_v), "gated_delta_net: beta holds n_t rows of H_v at beta_stride");
    let head_state = s_v * s_v;
    let scale = 1.0 / (s_v as f32).sqrt();
    let n_tasks = tasks_for(2 * n_t * head_state * h_v, h_v, threads);
    let heads_per_task = h_v.div_ceil(n_tasks.max(1));
    let (state_p, out_p) = (SendPtr(state.as_mut_ptr()), SendPtr(out.as_mut_ptr()));
    threads.run(n_tasks, |task| {
        let mut decay = [0f32; MAX_HEAD_DIM];
        for h in task * heads_per_task..((task + 1) * heads_per_task).min(h_v) {
            // SAFETY: head h's state is its own, disjoint from the other tasks' heads.
            let state_h = unsafe { std::slice::from_raw_parts_mut(state_p.get().add(h * head_state), head_state) };
            let qk_head = (h % h_k) * s_k;
            for t in 0..n_t {
                let q_t = &q[t * qk_stride + qk_head..][..s_v];
                let k_t = &k[t * qk_stride + qk_head..][..s_v];
                let v_t = &v[t * v_stride + h * s_v..][..s_v];
                let decay = &mut decay[..if kda { s_v } else { 1 }];
                let g_t = &g[t * g_stride + h * decay.len()..][..decay.len()];
                for (d, &gi) in decay.iter_mut().zip(g_t) {
                    *d = gi.exp();
                }
                // SAFETY: head h's columns of row t are written by this task only; in bounds
                // (out's length checked above).
                let out_t = unsafe { std::slice::from_raw_parts_mut(out_p.get().add(t * s_v * h_v + h * s_v), s_v) };
                let token = DeltaToken { q: q_t, k: k_t, v: v_t, decay, beta: beta[t * beta_stride + h], scale };
                delta_head_token_scalar(state_h, &token, out_t);
            }
        }
    });
}

/// One head's operands for one token of the gated delta net.
struct DeltaToken<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    /// exp(g): one value (the scalar gate) or S_v (KDA, per row i of S).
    decay: &'a [f32],
    beta: f32,
    scale: f32,
}

/// One head, one token of the gated delta net on the transposed state (row j of `state` is
/// column j of S). ggml makes four passes over the state (decay, deltas, rank-1 update,
/// outputs); each touches row j only with row j's own values, so one pass doing the four
/// steps row by row gives the same numbers.
fn delta_head_token_scalar(state: &mut [f32], tok: &DeltaToken, out: &mut [f32]) {
    let s_v = tok.v.len();
    for (j, row) in state.chunks_exact_mut(s_v).enumerate() {
        if tok.decay.len() == 1 {
            row.iter_mut().for_each(|s| *s *= tok.decay[0]);
        } else {
            row.iter_mut().zip(tok.decay).for_each(|(s, &d)| *s *= d);
        }
        let delta = (tok.v[j] - dot_in_order(row, tok.k)) * tok.beta;
        row.iter_mut().zip(tok.k).for_each(|(s, &ki)| *s += ki * delta);
        out[j] = dot_in_order(row, tok.q) * tok.scale;
    }
}

/// sum a[i] * b[i] in f32, in index order.
fn dot_in_order(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |s, (&x, &y)| s + x * y)
}
