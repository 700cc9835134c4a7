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
//! (no fused multiply-adds), each reduction summed in index order. The AVX2 and AVX-512
//! kernels (`simd::ssm_x86`), chosen by `active_isa()`, differ only in the order of the
//! scan's and the delta net's dot products and in their fused multiply-adds (ssm_conv and
//! the scan's state come out bit for bit the same). The `*_on` variants take the instruction
//! set from the caller (tests, timings).
//!
//! In both recurrences every row of a head's state evolves on its own (a row of the scan's
//! state is one channel of x; a row of the delta net's transposed state is one column of S),
//! so the kernels walk the state row by row through a tile of tokens: a row meets
//! TOKEN_TILE tokens while it is in L1, where going token by token would stream the whole
//! state (64 KiB a head for S_v = 128) through the caches once per token. The arithmetic of
//! each element is the same in either order.

use crate::dispatch::{active_isa, Isa};
use crate::threads::{SendPtr, Threads};

/// The widest head (S_v) `gated_delta_net` takes: a tile of tokens' q, k and decays are
/// copied to the stack.
pub const MAX_HEAD_DIM: usize = 256;

/// Tokens a head's state rows are walked through at a time (see the module's comment); the
/// delta net copies their q, k and decays to the stack (3 * TOKEN_TILE * MAX_HEAD_DIM floats).
const TOKEN_TILE: usize = 16;

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

/// One instruction-set level's kernels: ssm_conv's on a range of channels, ssm_scan's and
/// the delta net's on one head for a tile of tokens.
struct Kernels {
    conv: unsafe fn(&ConvPart, usize, usize),
    /// The most taps `conv` takes (wider convolutions run the scalar kernel).
    conv_max_taps: usize,
    scan: unsafe fn(&mut [f32], &mut [ScanToken]),
    delta: unsafe fn(&mut [f32], &mut [DeltaToken]),
}

impl Kernels {
    fn conv_for(&self, d_conv: usize) -> unsafe fn(&ConvPart, usize, usize) {
        if d_conv <= self.conv_max_taps { self.conv } else { conv_channels_scalar }
    }
}

/// The kernels of `isa`, which this CPU must have.
fn kernels(isa: Isa) -> Kernels {
    assert!(isa.available(), "the {} kernels need a CPU with {0}", isa.name());
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            use crate::simd::ssm_x86::{avx2 as k, MAX_TAPS};
            Kernels { conv: k::conv_channels, conv_max_taps: MAX_TAPS, scan: k::scan_head, delta: k::delta_head }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            use crate::simd::ssm_x86::{avx512 as k, MAX_TAPS};
            Kernels { conv: k::conv_channels, conv_max_taps: MAX_TAPS, scan: k::scan_head, delta: k::delta_head }
        }
        _ => Kernels { conv: conv_channels_scalar, conv_max_taps: usize::MAX, scan: scan_head_scalar, delta: delta_head_scalar },
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
    ssm_conv_on(active_isa(), state, x, x_stride, n_t, weight, d_conv, channels, out, threads)
}

/// `ssm_conv` with the kernels of `isa` (tests and timings compare the levels); panics if
/// this CPU lacks it.
#[allow(clippy::too_many_arguments)]
pub fn ssm_conv_on(isa: Isa, state: &mut [f32], x: &[f32], x_stride: usize, n_t: usize, weight: &[f32], d_conv: usize, channels: usize, out: &mut [f32], threads: &Threads) {
    let conv = kernels(isa).conv_for(d_conv);
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
        // output columns belong to it alone; the lengths were checked above; the CPU has
        // the kernels' level (`kernels`).
        unsafe { conv(&part, c0, c1) };
    });
}

/// ssm_conv's operands, shared by the tasks; each task writes its own channels of `state`
/// and `out` through the raw pointers.
pub(crate) struct ConvPart<'a> {
    pub(crate) state: *mut f32,
    pub(crate) x: &'a [f32],
    pub(crate) x_stride: usize,
    pub(crate) n_t: usize,
    pub(crate) weight: &'a [f32],
    pub(crate) d_conv: usize,
    pub(crate) out: *mut f32,
    pub(crate) channels: usize,
}

/// ssm_conv on channels c0..c1, token by token (each token's row of x and out in order, as
/// ggml walks them), then the channels' new states.
///
/// SAFETY: `part.state` and `part.out` valid for the lengths `ssm_conv` checks, and no other
/// thread touching channels c0..c1 of them meanwhile.
pub(crate) unsafe fn conv_channels_scalar(part: &ConvPart, c0: usize, c1: usize) {
    let keep = part.d_conv - 1;
    // Element j of channel c's window: the state, then the inputs.
    let window = |c: usize, j: usize| if j < keep { *part.state.add(c * keep + j) } else { part.x[(j - keep) * part.x_stride + c] };
    for t in 0..part.n_t {
        for c in c0..c1 {
            let mut sum = 0f32;
            for (i, &w) in part.weight[c * part.d_conv..(c + 1) * part.d_conv].iter().enumerate() {
                sum += window(c, t + i) * w;
            }
            *part.out.add(t * part.channels + c) = sum;
        }
    }
    // The new state is the window's last `keep` values; reading ahead of the write (index
    // n_t + j > j) lets the shift happen in place.
    for c in c0..c1 {
        for j in 0..keep {
            *part.state.add(c * keep + j) = window(c, part.n_t + j);
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
    ssm_scan_on(active_isa(), state, x, x_stride, dt, dt_stride, a, b, c, bc_stride, n_t, d_state, head_dim, n_head, n_group, y, threads)
}

/// `ssm_scan` with the kernels of `isa`; panics if this CPU lacks it.
#[allow(clippy::too_many_arguments)]
pub fn ssm_scan_on(
    isa: Isa,
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
    let scan = kernels(isa).scan;
    let heads_per_group = n_head / n_group;
    let head_state = d_state * head_dim;
    if head_state == 0 {
        return; // no state, no outputs (and rows of zero values could not be walked)
    }
    let n_tasks = tasks_for(n_t * head_state * n_head, n_head, threads);
    let heads_per_task = n_head.div_ceil(n_tasks.max(1));
    let (state_p, y_p) = (SendPtr(state.as_mut_ptr()), SendPtr(y.as_mut_ptr()));
    threads.run(n_tasks, |task| {
        for h in task * heads_per_task..((task + 1) * heads_per_task).min(n_head) {
            // SAFETY: head h's state is its own, disjoint from the other tasks' heads.
            let state_h = unsafe { std::slice::from_raw_parts_mut(state_p.get().add(h * head_state), head_state) };
            let group = h / heads_per_group;
            for t0 in (0..n_t).step_by(TOKEN_TILE) {
                let n = (n_t - t0).min(TOKEN_TILE);
                let mut tokens: [ScanToken; TOKEN_TILE] = std::array::from_fn(|i| {
                    if i >= n {
                        return ScanToken::default();
                    }
                    let t = t0 + i;
                    let dt_soft_plus = softplus(dt[t * dt_stride + h]);
                    ScanToken {
                        x: &x[t * x_stride + h * head_dim..][..head_dim],
                        dt_soft_plus,
                        d_a: (dt_soft_plus * a[h]).exp(),
                        b: &b[t * bc_stride + group * d_state..][..d_state],
                        c: &c[t * bc_stride + group * d_state..][..d_state],
                        // SAFETY: head h's columns of row t are written by this task only; in
                        // bounds (y's length checked above).
                        y: unsafe { std::slice::from_raw_parts_mut(y_p.get().add(t * head_dim * n_head + h * head_dim), head_dim) },
                    }
                });
                // SAFETY: the CPU has the kernels' level (`kernels`).
                unsafe { scan(state_h, &mut tokens[..n]) };
            }
        }
    });
}

/// One head's operands for one token of ssm_scan.
#[derive(Default)]
pub(crate) struct ScanToken<'a> {
    /// The head's head_dim inputs.
    pub(crate) x: &'a [f32],
    pub(crate) dt_soft_plus: f32,
    /// exp(dt_soft_plus * A[h]).
    pub(crate) d_a: f32,
    /// The head's group's d_state values of B and C.
    pub(crate) b: &'a [f32],
    pub(crate) c: &'a [f32],
    /// The head's head_dim outputs.
    pub(crate) y: &'a mut [f32],
}

/// One head of ssm_scan through a tile of tokens: `state` is head_dim rows of d_state
/// values, each taken through all the tokens in turn.
fn scan_head_scalar(state: &mut [f32], tokens: &mut [ScanToken]) {
    let Some(d_state) = tokens.first().map(|t| t.b.len()) else { return };
    for (r, row) in state.chunks_exact_mut(d_state).enumerate() {
        for tok in tokens.iter_mut() {
            let x_dt = tok.x[r] * tok.dt_soft_plus;
            let mut sum = 0f32;
            for ((s, &bi), &ci) in row.iter_mut().zip(tok.b).zip(tok.c) {
                *s = *s * tok.d_a + bi * x_dt;
                sum += *s * ci;
            }
            tok.y[r] = sum;
        }
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
/// out[j] = sum_i S[i][j] q[i] / sqrt(S_v). The sums run in i order. S_v is at most
/// MAX_HEAD_DIM (256); q and k are used as given (the models L2-normalize them before).
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
    gated_delta_net_on(active_isa(), state, q, k, qk_stride, v, v_stride, g, g_stride, kda, beta, beta_stride, n_t, s_k, h_k, s_v, h_v, out, threads)
}

/// `gated_delta_net` with the kernels of `isa`; panics if this CPU lacks it.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net_on(
    isa: Isa,
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
    let delta_head = kernels(isa).delta;
    let head_state = s_v * s_v;
    if head_state == 0 {
        return; // no state, no outputs (and rows of zero values could not be walked)
    }
    let scale = 1.0 / (s_v as f32).sqrt();
    let n_tasks = tasks_for(2 * n_t * head_state * h_v, h_v, threads);
    let heads_per_task = h_v.div_ceil(n_tasks.max(1));
    let (state_p, out_p) = (SendPtr(state.as_mut_ptr()), SendPtr(out.as_mut_ptr()));
    let decay_len = if kda { s_v } else { 1 };
    threads.run(n_tasks, |task| {
        let mut tile = [0f32; 3 * TOKEN_TILE * MAX_HEAD_DIM];
        for h in task * heads_per_task..((task + 1) * heads_per_task).min(h_v) {
            // SAFETY: head h's state is its own, disjoint from the other tasks' heads.
            let state_h = unsafe { std::slice::from_raw_parts_mut(state_p.get().add(h * head_state), head_state) };
            let qk_head = (h % h_k) * s_k;
            for t0 in (0..n_t).step_by(TOKEN_TILE) {
                let n = (n_t - t0).min(TOKEN_TILE);
                // The tile's q and k rows side by side: in place they lie a multiple of 4 KiB
                // apart (rows of the fused qkv projection), in the same few L1 sets, and a tile
                // of them would keep evicting each other while every row of the state passes.
                let (q_tile, rest) = tile.split_at_mut(TOKEN_TILE * s_v);
                let (k_tile, decay_tile) = rest.split_at_mut(TOKEN_TILE * s_v);
                for i in 0..n {
                    let t = t0 + i;
                    q_tile[i * s_v..(i + 1) * s_v].copy_from_slice(&q[t * qk_stride + qk_head..][..s_v]);
                    k_tile[i * s_v..(i + 1) * s_v].copy_from_slice(&k[t * qk_stride + qk_head..][..s_v]);
                    let g_t = &g[t * g_stride + h * decay_len..][..decay_len];
                    decay_tile[i * decay_len..(i + 1) * decay_len].iter_mut().zip(g_t).for_each(|(d, &gi)| *d = gi.exp());
                }
                let (q_tile, k_tile, decay_tile) = (&*q_tile, &*k_tile, &*decay_tile);
                let mut tokens: [DeltaToken; TOKEN_TILE] = std::array::from_fn(|i| {
                    if i >= n {
                        return DeltaToken::default();
                    }
                    let t = t0 + i;
                    DeltaToken {
                        q: &q_tile[i * s_v..(i + 1) * s_v],
                        k: &k_tile[i * s_v..(i + 1) * s_v],
                        v: &v[t * v_stride + h * s_v..][..s_v],
                        decay: &decay_tile[i * decay_len..(i + 1) * decay_len],
                        beta: beta[t * beta_stride + h],
                        scale,
                        // SAFETY: head h's columns of row t are written by this task only; in
                        // bounds (out's length checked above).
                        out: unsafe { std::slice::from_raw_parts_mut(out_p.get().add(t * s_v * h_v + h * s_v), s_v) },
                    }
                });
                // SAFETY: the CPU has the kernels' level (`kernels`).
                unsafe { delta_head(state_h, &mut tokens[..n]) };
            }
        }
    });
}

/// One head's operands for one token of the gated delta net.
#[derive(Default)]
pub(crate) struct DeltaToken<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) k: &'a [f32],
    pub(crate) v: &'a [f32],
    /// exp(g): one value (the scalar gate) or S_v (KDA, per row i of S).
    pub(crate) decay: &'a [f32],
    pub(crate) beta: f32,
    pub(crate) scale: f32,
    /// The head's S_v outputs.
    pub(crate) out: &'a mut [f32],
}

/// One head of the gated delta net through a tile of tokens, on the transposed state (row j
/// of `state` is column j of S). For each token ggml makes four passes over the state (decay,
/// deltas, rank-1 update, outputs); each touches row j only with row j's own values, so doing
/// the four steps row by row, and a row through all the tokens before the next, gives the
/// same numbers.
fn delta_head_scalar(state: &mut [f32], tokens: &mut [DeltaToken]) {
    let Some(s_v) = tokens.first().map(|t| t.v.len()) else { return };
    for (j, row) in state.chunks_exact_mut(s_v).enumerate() {
        for tok in tokens.iter_mut() {
            if tok.decay.len() == 1 {
                row.iter_mut().for_each(|s| *s *= tok.decay[0]);
            } else {
                row.iter_mut().zip(tok.decay).for_each(|(s, &d)| *s *= d);
            }
            let delta = (tok.v[j] - dot_in_order(row, tok.k)) * tok.beta;
            row.iter_mut().zip(tok.k).for_each(|(s, &ki)| *s += ki * delta);
            tok.out[j] = dot_in_order(row, tok.q) * tok.scale;
        }
    }
}

/// sum a[i] * b[i] in f32, in index order.
fn dot_in_order(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |s, (&x, &y)| s + x * y)
}
