//! The recurrent kernels (ssm_conv, ssm_scan, gated_delta_net) against hand-checked tiny
//! cases and against references written here in ggml's own shape (the concatenated conv
//! window, the token-outer scan, the delta net's four passes with its dots summed in f64 as
//! ggml's scalar build does); running n tokens at once must equal running them one at a time
//! (bit for bit: the per-token arithmetic does not depend on how many tokens a call has), and
//! the split over threads must not change a bit either.

mod common;

use common::Rng;
use ferrollama_tensor::ssm::{gated_delta_net, gated_delta_net_on, softplus, ssm_conv, ssm_conv_on, ssm_scan, ssm_scan_on};
use ferrollama_tensor::{Isa, Threads};

/// The SIMD levels this CPU has.
fn simd_levels() -> Vec<Isa> {
    let found: Vec<Isa> = [Isa::Avx2, Isa::Avx512].into_iter().filter(|l| l.available()).collect();
    if found.is_empty() {
        eprintln!("no SIMD level on this CPU: only the scalar kernels exist here");
    }
    found
}

/// |got - want| <= tol * (|want| + rms(want)) everywhere: relative, with the vector's typical
/// size as the floor where a sum cancels to near zero.
fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let rms = (want.iter().map(|w| (*w as f64).powi(2)).sum::<f64>() / want.len().max(1) as f64).sqrt() as f32;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (w.abs() + rms), "{what}[{i}]: {g} vs {w} (rms {rms})");
    }
}

/// `s[from..]`, or nothing when a call of no tokens has no rows to slice.
fn tail(s: &[f32], from: usize) -> &[f32] {
    s.get(from..).unwrap_or(&[])
}

fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}[{i}]: {g} vs {w}");
    }
}

// ------------------------------------------------------------------------- ssm_conv

/// One sequence's ssm_conv operands; x is a column range (from `x_offset`) of wider rows.
struct Conv {
    channels: usize,
    d_conv: usize,
    n_t: usize,
    x_stride: usize,
    x_offset: usize,
    state: Vec<f32>,
    x: Vec<f32>,
    weight: Vec<f32>,
}

impl Conv {
    fn random(rng: &mut Rng, channels: usize, d_conv: usize, n_t: usize) -> Conv {
        let (x_stride, x_offset) = (channels + 7, 3);
        Conv {
            channels,
            d_conv,
            n_t,
            x_stride,
            x_offset,
            state: rng.vec(channels * (d_conv - 1), 1.0),
            x: rng.vec(x_offset + n_t * x_stride, 1.0),
            weight: rng.vec(channels * d_conv, 0.5),
        }
    }

    /// Runs tokens t0..t1 through the kernel: (their outputs, the state after them).
    fn run(&self, state: &mut [f32], t0: usize, t1: usize, threads: &Threads) -> Vec<f32> {
        let mut out = vec![f32::NAN; (t1 - t0) * self.channels];
        let x = &self.x[self.x_offset + t0 * self.x_stride..];
        ssm_conv(state, x, self.x_stride, t1 - t0, &self.weight, self.d_conv, self.channels, &mut out, threads);
        out
    }

    fn run_on(&self, isa: Isa, state: &mut [f32], threads: &Threads) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.n_t * self.channels];
        let x = &self.x[self.x_offset..];
        ssm_conv_on(isa, state, x, self.x_stride, self.n_t, &self.weight, self.d_conv, self.channels, &mut out, threads);
        out
    }

    /// ggml's way: conv_x = concat(state, transpose(x)) per channel, a dot per window, and
    /// the state copied back from conv_x's last d_conv - 1 columns.
    fn reference(&self) -> (Vec<f32>, Vec<f32>) {
        let (nc, keep) = (self.d_conv, self.d_conv - 1);
        let ncs = keep + self.n_t;
        let mut conv_x = vec![0f32; self.channels * ncs];
        for c in 0..self.channels {
            conv_x[c * ncs..c * ncs + keep].copy_from_slice(&self.state[c * keep..(c + 1) * keep]);
            for t in 0..self.n_t {
                conv_x[c * ncs + keep + t] = self.x[self.x_offset + t * self.x_stride + c];
            }
        }
        let mut out = vec![0f32; self.n_t * self.channels];
        for t in 0..self.n_t {
            for c in 0..self.channels {
                let mut sumf = 0f32;
                for i0 in 0..nc {
                    sumf += conv_x[c * ncs + t + i0] * self.weight[c * nc + i0];
                }
                out[t * self.channels + c] = sumf;
            }
        }
        let state = (0..self.channels).flat_map(|c| conv_x[c * ncs + self.n_t..c * ncs + ncs].to_vec()).collect();
        (out, state)
    }
}

#[test]
fn ssm_conv_hand_checked() {
    let one = Threads::new(1);
    // Two channels, three taps: windows [1 2 | 5 7] and [3 4 | 6 8].
    let mut state = vec![1.0, 2.0, 3.0, 4.0];
    let x = [5.0, 6.0, -1.0, 7.0, 8.0, -1.0]; // rows of 2 at stride 3
    let weight = [1.0, 10.0, 100.0, 0.5, 0.0, 2.0];
    let mut out = [0f32; 4];
    ssm_conv(&mut state, &x, 3, 2, &weight, 3, 2, &mut out, &one);
    assert_eq!(out, [521.0, 13.5, 752.0, 18.0]);
    assert_eq!(state, [5.0, 7.0, 6.0, 8.0]);
    // One token keeps the newest old value, shifted to the front.
    let mut out = [0f32; 2];
    ssm_conv(&mut state, &[9.0, 10.0], 2, 1, &weight, 3, 2, &mut out, &one);
    assert_eq!(out, [5.0 + 70.0 + 900.0, 3.0 + 0.0 + 20.0]);
    assert_eq!(state, [7.0, 9.0, 8.0, 10.0]);
    // d_conv 1 has no state: a plain per-channel scale.
    let mut none: [f32; 0] = [];
    ssm_conv(&mut none, &[2.0, 3.0], 2, 1, &[4.0, 5.0], 1, 2, &mut out, &one);
    assert_eq!(out, [8.0, 15.0]);
}

#[test]
fn ssm_conv_matches_ggmls_window_and_is_continuous() {
    let mut rng = Rng::new(11);
    let (one, two) = (Threads::new(1), Threads::new(2));
    for (channels, d_conv) in [(1, 4), (37, 4), (1792, 4), (6144, 4), (50, 3), (29, 2), (21, 7)] {
        for n_t in [1, 2, 3, 5, 17] {
            let case = Conv::random(&mut rng, channels, d_conv, n_t);
            let what = format!("channels {channels} d_conv {d_conv} n_t {n_t}");
            let (want_out, want_state) = case.reference();
            let mut state = case.state.clone();
            let out = case.run(&mut state, 0, n_t, &two);
            assert_close(&out, &want_out, 1e-6, &format!("{what}: out"));
            assert_close(&state, &want_state, 0.0, &format!("{what}: state"));
            // One token at a time, on one thread: the same bits.
            let mut state_1 = case.state.clone();
            let out_1: Vec<f32> = (0..n_t).flat_map(|t| case.run(&mut state_1, t, t + 1, &one)).collect();
            assert_bits(&out_1, &out, &format!("{what}: token by token, out"));
            assert_bits(&state_1, &state, &format!("{what}: token by token, state"));
        }
    }
}

// ------------------------------------------------------------------------- ssm_scan

/// One sequence's ssm_scan operands: x, dt, B and C columns of one wider row per token,
/// as Mamba-2's xBC and zxBCdt views are.
struct Scan {
    d_state: usize,
    head_dim: usize,
    n_head: usize,
    n_group: usize,
    n_t: usize,
    state: Vec<f32>,
    a: Vec<f32>,
    /// Per token: x (head_dim*n_head), B, C (d_state*n_group each), dt (n_head), padding.
    rows: Vec<f32>,
    stride: usize,
}

impl Scan {
    fn random(rng: &mut Rng, d_state: usize, head_dim: usize, n_head: usize, n_group: usize, n_t: usize) -> Scan {
        let d_inner = head_dim * n_head;
        let stride = d_inner + 2 * d_state * n_group + n_head + 3;
        let mut rows = rng.vec(n_t * stride, 1.0);
        for t in 0..n_t {
            // dt around softplus's knee and past its cut at 20.
            for h in 0..n_head {
                rows[t * stride + d_inner + 2 * d_state * n_group + h] = rng.uniform() * 4.0 - 2.0 + if h == 1 { 22.0 } else { 0.0 };
            }
        }
        Scan {
            d_state,
            head_dim,
            n_head,
            n_group,
            n_t,
            state: rng.vec(d_state * d_inner, 1.0),
            a: (0..n_head).map(|_| -(rng.uniform() + 1.0) * 0.5).collect(),
            rows,
            stride,
        }
    }

    fn offsets(&self) -> (usize, usize, usize, usize) {
        let d_inner = self.head_dim * self.n_head;
        let bc = self.d_state * self.n_group;
        (0, d_inner, d_inner + bc, d_inner + 2 * bc)
    }

    fn run(&self, state: &mut [f32], t0: usize, t1: usize, threads: &Threads) -> Vec<f32> {
        let (x, b, c, dt) = self.offsets();
        let r = &self.rows[t0 * self.stride..];
        let mut y = vec![f32::NAN; (t1 - t0) * self.head_dim * self.n_head];
        let s = self.stride;
        ssm_scan(state, &r[x..], s, &r[dt..], s, &self.a, &r[b..], &r[c..], s, t1 - t0, self.d_state, self.head_dim, self.n_head, self.n_group, &mut y, threads);
        y
    }

    fn run_on(&self, isa: Isa, state: &mut [f32], threads: &Threads) -> Vec<f32> {
        let (x, b, c, dt) = self.offsets();
        let (r, s) = (&self.rows[..], self.stride);
        let mut y = vec![f32::NAN; self.n_t * self.head_dim * self.n_head];
        ssm_scan_on(isa, state, tail(r, x), s, tail(r, dt), s, &self.a, tail(r, b), tail(r, c), s, self.n_t, self.d_state, self.head_dim, self.n_head, self.n_group, &mut y, threads);
        y
    }

    /// ggml_compute_forward_ssm_scan_f32's scalar loops: tokens outer, heads, rows, states.
    fn reference(&self) -> (Vec<f32>, Vec<f32>) {
        let (xo, bo, co, dto) = self.offsets();
        let (nc, nr, nh) = (self.d_state, self.head_dim, self.n_head);
        let mut s = self.state.clone();
        let mut y = vec![0f32; self.n_t * nr * nh];
        for i2 in 0..self.n_t {
            let row = &self.rows[i2 * self.stride..];
            for h in 0..nh {
                let dt_soft_plus = if row[dto + h] > 20.0 { row[dto + h] } else { (1.0 + row[dto + h].exp()).ln() };
                let d_a = (dt_soft_plus * self.a[h]).exp();
                let g = h / (nh / self.n_group);
                for i1 in 0..nr {
                    let ii = i1 + h * nr;
                    let x_dt = row[xo + ii] * dt_soft_plus;
                    let mut sumf = 0f32;
                    for i0 in 0..nc {
                        let (i, ig) = (i0 + ii * nc, i0 + g * nc);
                        let state = (s[i] * d_a) + (row[bo + ig] * x_dt);
                        sumf += state * row[co + ig];
                        s[i] = state;
                    }
                    y[i2 * nr * nh + ii] = sumf;
                }
            }
        }
        (y, s)
    }
}

#[test]
fn softplus_is_ggmls() {
    assert_eq!(softplus(0.0), 2f32.ln());
    assert_eq!(softplus(20.5), 20.5);
    assert_eq!(softplus(20.0), (1.0 + 20f32.exp()).ln());
    assert_eq!(softplus(-30.0), (1.0 + (-30f32).exp()).ln());
}

#[test]
fn ssm_scan_hand_checked() {
    let one = Threads::new(1);
    // One head of one row, d_state 2; A = 0 makes dA = 1, dt = 32 is past softplus's cut.
    let mut state = vec![1.0, 2.0];
    let mut y = [0f32];
    ssm_scan(&mut state, &[0.5], 1, &[32.0], 1, &[0.0], &[1.0, -1.0], &[2.0, 3.0], 2, 1, 2, 1, 1, 1, &mut y, &one);
    assert_eq!(state, [17.0, -14.0]); // s*1 + B*(0.5*32)
    assert_eq!(y, [34.0 - 42.0]);
    // Four heads in two groups (heads 0, 1 read group 0; heads 2, 3 group 1), head_dim 1,
    // d_state 1; dt = 0: softplus = ln 2, and A = -1 gives dA = exp(-ln 2).
    let mut state = vec![1.0, 1.0, 1.0, 1.0];
    let mut y = [0f32; 4];
    let (b, c) = ([1.0, 10.0], [1.0, 100.0]);
    ssm_scan(&mut state, &[1.0, 2.0, 3.0, 4.0], 4, &[0.0; 4], 4, &[-1.0; 4], &b, &c, 2, 1, 1, 1, 4, 2, &mut y, &one);
    let (sp, da) = (2f32.ln(), (-(2f32.ln())).exp());
    let want_state = [da + sp, da + 2.0 * sp, da + 10.0 * (3.0 * sp), da + 10.0 * (4.0 * sp)];
    assert_eq!(state, want_state);
    assert_eq!(y, [want_state[0], want_state[1], 100.0 * want_state[2], 100.0 * want_state[3]]);
}

#[test]
#[should_panic(expected = "Mamba-1")]
fn ssm_scan_refuses_mamba1() {
    let mut state = vec![0f32; 4];
    let mut y = [0f32; 2];
    ssm_scan(&mut state, &[0.0; 2], 2, &[0.0; 2], 2, &[0.0; 4], &[0.0; 2], &[0.0; 2], 2, 1, 2, 1, 2, 1, &mut y, &Threads::new(1));
}

#[test]
fn ssm_scan_matches_ggmls_loops_and_is_continuous() {
    let mut rng = Rng::new(12);
    let (one, two) = (Threads::new(1), Threads::new(2));
    for (d_state, head_dim, n_head, n_group) in [(16, 4, 2, 1), (128, 32, 48, 1), (64, 8, 6, 3), (128, 64, 8, 2), (19, 3, 4, 4), (1, 1, 1, 1)] {
        for n_t in [1, 3, 17] {
            let case = Scan::random(&mut rng, d_state, head_dim, n_head, n_group, n_t);
            let what = format!("d_state {d_state} head_dim {head_dim} n_head {n_head} n_group {n_group} n_t {n_t}");
            let (want_y, want_state) = case.reference();
            let mut state = case.state.clone();
            let y = case.run(&mut state, 0, n_t, &two);
            assert_close(&y, &want_y, 1e-5, &format!("{what}: y"));
            assert_close(&state, &want_state, 1e-6, &format!("{what}: state"));
            let mut state_1 = case.state.clone();
            let y_1: Vec<f32> = (0..n_t).flat_map(|t| case.run(&mut state_1, t, t + 1, &one)).collect();
            assert_bits(&y_1, &y, &format!("{what}: token by token, y"));
            assert_bits(&state_1, &state, &format!("{what}: token by token, state"));
        }
    }
}

// ------------------------------------------------------------------ gated_delta_net

/// One sequence's gated delta net operands: q, k, v columns of one wider row per token (the
/// convolved qkv of Qwen3.5), g and beta rows of their own.
struct Delta {
    s: usize,
    h_k: usize,
    h_v: usize,
    n_t: usize,
    kda: bool,
    state: Vec<f32>,
    qkv: Vec<f32>,
    qkv_stride: usize,
    g: Vec<f32>,
    g_stride: usize,
    beta: Vec<f32>,
    beta_stride: usize,
}

impl Delta {
    fn random(rng: &mut Rng, s: usize, h_k: usize, h_v: usize, kda: bool, n_t: usize) -> Delta {
        let qkv_stride = 2 * s * h_k + s * h_v + 5;
        let mut qkv = rng.vec(n_t * qkv_stride, 1.0);
        // q and k are L2-normalized per head in the models; keep them so here.
        for t in 0..n_t {
            for head in qkv[t * qkv_stride..t * qkv_stride + 2 * s * h_k].chunks_exact_mut(s) {
                let norm = head.iter().map(|v| v * v).sum::<f32>().sqrt();
                head.iter_mut().for_each(|v| *v /= norm);
            }
        }
        let g_width = if kda { h_v * s } else { h_v };
        let (g_stride, beta_stride) = (g_width + 2, h_v + 1);
        Delta {
            s,
            h_k,
            h_v,
            n_t,
            kda,
            state: rng.vec(s * s * h_v, 0.3),
            qkv,
            qkv_stride,
            // log-decays between about -0.02 and -1, betas in (0, 1), as sigmoids give them.
            g: (0..n_t * g_stride).map(|_| -0.02 - 0.5 * (rng.uniform() + 1.0)).collect(),
            g_stride,
            beta: (0..n_t * beta_stride).map(|_| 1.0 / (1.0 + (-2.0 * rng.uniform()).exp())).collect(),
            beta_stride,
        }
    }

    fn run(&self, state: &mut [f32], t0: usize, t1: usize, threads: &Threads) -> Vec<f32> {
        let (s, h_k, h_v) = (self.s, self.h_k, self.h_v);
        let r = &self.qkv[t0 * self.qkv_stride..];
        let (q, k, v) = (r, &r[s * h_k..], &r[2 * s * h_k..]);
        let mut out = vec![f32::NAN; (t1 - t0) * s * h_v];
        let g = &self.g[t0 * self.g_stride..];
        let beta = &self.beta[t0 * self.beta_stride..];
        gated_delta_net(state, q, k, self.qkv_stride, v, self.qkv_stride, g, self.g_stride, self.kda, beta, self.beta_stride, t1 - t0, s, h_k, s, h_v, &mut out, threads);
        out
    }

    fn run_on(&self, isa: Isa, state: &mut [f32], threads: &Threads) -> Vec<f32> {
        let (s, h_k, h_v) = (self.s, self.h_k, self.h_v);
        let r = &self.qkv[..];
        let (q, k, v) = (r, tail(r, s * h_k), tail(r, 2 * s * h_k));
        let mut out = vec![f32::NAN; self.n_t * s * h_v];
        gated_delta_net_on(isa, state, q, k, self.qkv_stride, v, self.qkv_stride, &self.g, self.g_stride, self.kda, &self.beta, self.beta_stride, self.n_t, s, h_k, s, h_v, &mut out, threads);
        out
    }

    /// ggml_compute_forward_gated_delta_net_one_chunk: per head, per token, the decay over the
    /// whole state, all deltas, the rank-1 update, all outputs; dots in f64 (ggml_float).
    fn reference(&self) -> (Vec<f32>, Vec<f32>) {
        let (sv, h_k, h_v) = (self.s, self.h_k, self.h_v);
        let scale = 1.0 / (sv as f32).sqrt();
        let mut state = self.state.clone();
        let mut out = vec![0f32; self.n_t * sv * h_v];
        let mut delta = vec![0f32; sv];
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum::<f64>() as f32;
        for iv1 in 0..h_v {
            let s_out = &mut state[iv1 * sv * sv..(iv1 + 1) * sv * sv];
            let iq1 = iv1 % h_k;
            for t in 0..self.n_t {
                let row = &self.qkv[t * self.qkv_stride..];
                let q_d = &row[iq1 * sv..][..sv];
                let k_d = &row[sv * h_k + iq1 * sv..][..sv];
                let v_d = &row[2 * sv * h_k + iv1 * sv..][..sv];
                let beta_val = self.beta[t * self.beta_stride + iv1];
                if self.kda {
                    let g_d = &self.g[t * self.g_stride + iv1 * sv..][..sv];
                    for (d, g) in delta.iter_mut().zip(g_d) {
                        *d = g.exp();
                    }
                    for j in 0..sv {
                        for i in 0..sv {
                            s_out[j * sv + i] *= delta[i];
                        }
                    }
                } else {
                    let eg = self.g[t * self.g_stride + iv1].exp();
                    s_out.iter_mut().for_each(|s| *s *= eg);
                }
                for j in 0..sv {
                    delta[j] = (v_d[j] - dot(&s_out[j * sv..(j + 1) * sv], k_d)) * beta_val;
                }
                for j in 0..sv {
                    for i in 0..sv {
                        s_out[j * sv + i] += k_d[i] * delta[j];
                    }
                }
                for j in 0..sv {
                    out[t * sv * h_v + iv1 * sv + j] = dot(&s_out[j * sv..(j + 1) * sv], q_d) * scale;
                }
            }
        }
        (out, state)
    }
}

#[test]
fn gated_delta_net_hand_checked() {
    let one = Threads::new(1);
    // S_v = 2, one head. The state is stored transposed: [a b c d] holds S[0][0] = a,
    // S[1][0] = b, S[0][1] = c, S[1][1] = d. k = e0 reads and writes row 0 of S (the stored
    // elements 0 and 2); q = e1 reads row 1 (elements 1 and 3).
    let (a, b, c, d) = (1.0, 2.0, 3.0, 4.0);
    let mut state = vec![a, b, c, d];
    let (q, k, v) = ([0.0, 1.0], [1.0, 0.0], [5.0, 9.0]);
    let mut out = [0f32; 2];
    // g = 0: no decay; beta = 1/2: row 0 of S moves halfway to v.
    gated_delta_net(&mut state, &q, &k, 2, &v, 2, &[0.0], 1, false, &[0.5], 1, 1, 2, 1, 2, 1, &mut out, &one);
    assert_eq!(state, [(a + 5.0) / 2.0, b, (c + 9.0) / 2.0, d]);
    let scale = 1.0 / 2f32.sqrt();
    assert_eq!(out, [b * scale, d * scale]);
    // KDA with g = [0, -1000]: row 1 of S decays to zero, row 0 is kept, and beta = 1 writes
    // v into row 0; q = [1, 1] reads the sum of the rows, now v.
    gated_delta_net(&mut state, &[1.0, 1.0], &k, 2, &v, 2, &[0.0, -1000.0], 2, true, &[1.0], 1, 1, 2, 1, 2, 1, &mut out, &one);
    assert_eq!(state, [5.0, 0.0, 9.0, 0.0]);
    assert_eq!(out, [5.0 * scale, 9.0 * scale]);
    // Two value heads sharing one q/k head; head 1's scalar gate halves its state first
    // (g = ln 1/2, exp rounding aside) and beta = 0 leaves it at that.
    let mut state = vec![0.0, 0.0, 0.0, 0.0, 2.0, 4.0, 6.0, 8.0];
    let mut out = [0f32; 4];
    let half = (0.5f32).ln();
    gated_delta_net(&mut state, &[1.0, 0.0], &[1.0, 0.0], 2, &[1.0, 2.0, 0.0, 0.0], 4, &[0.0, half], 2, false, &[1.0, 0.0], 2, 1, 2, 1, 2, 2, &mut out, &one);
    let eg = half.exp();
    assert_eq!(state, [1.0, 0.0, 2.0, 0.0, 2.0 * eg, 4.0 * eg, 6.0 * eg, 8.0 * eg]);
    assert_eq!(out, [scale, 2.0 * scale, 2.0 * eg * scale, 6.0 * eg * scale]);
}

#[test]
fn gated_delta_net_matches_ggmls_passes_and_is_continuous() {
    let mut rng = Rng::new(13);
    let (one, two) = (Threads::new(1), Threads::new(2));
    for (s, h_k, h_v) in [(16, 1, 1), (64, 2, 4), (128, 16, 16), (128, 2, 6), (20, 3, 3), (1, 1, 2)] {
        for kda in [false, true] {
            for n_t in [1, 3, 17] {
                let case = Delta::random(&mut rng, s, h_k, h_v, kda, n_t);
                let what = format!("S {s} H_k {h_k} H_v {h_v} kda {kda} n_t {n_t}");
                let (want_out, want_state) = case.reference();
                let mut state = case.state.clone();
                let out = case.run(&mut state, 0, n_t, &two);
                assert_close(&out, &want_out, 1e-5, &format!("{what}: out"));
                assert_close(&state, &want_state, 1e-5, &format!("{what}: state"));
                let mut state_1 = case.state.clone();
                let out_1: Vec<f32> = (0..n_t).flat_map(|t| case.run(&mut state_1, t, t + 1, &one)).collect();
                assert_bits(&out_1, &out, &format!("{what}: token by token, out"));
                assert_bits(&state_1, &state, &format!("{what}: token by token, state"));
            }
        }
    }
}

// ------------------------------------------------------------------ SIMD against scalar

/// Every level's ssm_conv against the scalar one: channels that leave partial vectors,
/// 2 to 9 taps (9 is past the vector kernels' limit), 1, 3 and 17 tokens (both the few-token
/// and the prompt kernels). Bit for bit: each output is summed in the scalar order.
#[test]
fn ssm_conv_simd_matches_scalar() {
    let mut rng = Rng::new(21);
    let two = Threads::new(2);
    for isa in simd_levels() {
        for (channels, d_conv) in [(1, 4), (7, 4), (37, 4), (100, 3), (1792, 4), (6149, 4), (45, 2), (33, 7), (40, 9), (8, 4), (16, 4)] {
            for n_t in [1, 2, 3, 4, 17, 40] {
                let case = Conv::random(&mut rng, channels, d_conv, n_t);
                let what = format!("{} channels {channels} d_conv {d_conv} n_t {n_t}", isa.name());
                let (mut want_state, mut state) = (case.state.clone(), case.state.clone());
                let want = case.run_on(Isa::Scalar, &mut want_state, &two);
                let got = case.run_on(isa, &mut state, &two);
                assert_bits(&got, &want, &format!("{what}: out"));
                assert_bits(&state, &want_state, &format!("{what}: state"));
            }
        }
    }
}

/// Every level's ssm_scan against the scalar one on d_state 16/64/128 and odd sizes (rows in
/// groups of eight, four and one; partial vectors): the new state bit for bit (the same
/// products and sums), y within 1e-5 (its sum's order).
#[test]
fn ssm_scan_simd_matches_scalar() {
    let mut rng = Rng::new(22);
    let two = Threads::new(2);
    for isa in simd_levels() {
        for (d_state, head_dim, n_head, n_group) in [(16, 3, 2, 1), (64, 5, 6, 3), (128, 64, 4, 1), (128, 32, 48, 1), (19, 7, 4, 2), (24, 13, 2, 1), (8, 1, 1, 1), (1, 2, 2, 1)] {
            for n_t in [1, 3, 17] {
                let case = Scan::random(&mut rng, d_state, head_dim, n_head, n_group, n_t);
                let what = format!("{} d_state {d_state} head_dim {head_dim} n_head {n_head} n_group {n_group} n_t {n_t}", isa.name());
                let (mut want_state, mut state) = (case.state.clone(), case.state.clone());
                let want = case.run_on(Isa::Scalar, &mut want_state, &two);
                let got = case.run_on(isa, &mut state, &two);
                assert_close(&got, &want, 1e-5, &format!("{what}: y"));
                assert_bits(&state, &want_state, &format!("{what}: state"));
            }
        }
    }
}

/// Every level's gated delta net against the scalar one on S_v 16/64/128 and odd sizes (rows
/// in groups of eight, four and one; partial vectors), scalar and per-channel gates, 1, 3
/// and 17 tokens (two tiles): outputs and state within 1e-5 (the dots' order and fused
/// multiply-adds differ, and their differences feed the next tokens).
#[test]
fn gated_delta_net_simd_matches_scalar() {
    let mut rng = Rng::new(23);
    let two = Threads::new(2);
    for isa in simd_levels() {
        for (s, h_k, h_v) in [(16, 1, 2), (64, 2, 4), (128, 16, 16), (128, 1, 3), (20, 3, 3), (13, 1, 2), (7, 1, 1), (1, 1, 1)] {
            for kda in [false, true] {
                for n_t in [1, 3, 17] {
                    let case = Delta::random(&mut rng, s, h_k, h_v, kda, n_t);
                    let what = format!("{} S {s} H_k {h_k} H_v {h_v} kda {kda} n_t {n_t}", isa.name());
                    let (mut want_state, mut state) = (case.state.clone(), case.state.clone());
                    let want = case.run_on(Isa::Scalar, &mut want_state, &two);
                    let got = case.run_on(isa, &mut state, &two);
                    assert_close(&got, &want, 1e-5, &format!("{what}: out"));
                    assert_close(&state, &want_state, 1e-5, &format!("{what}: state"));
                }
            }
        }
    }
}

/// No tokens: every kernel leaves its state as it was, on every level.
#[test]
fn zero_tokens_change_nothing() {
    let mut rng = Rng::new(24);
    let one = Threads::new(1);
    for isa in [Isa::Scalar].into_iter().chain(simd_levels()) {
        let conv = Conv::random(&mut rng, 37, 4, 0);
        let mut state = conv.state.clone();
        assert!(conv.run_on(isa, &mut state, &one).is_empty());
        assert_bits(&state, &conv.state, &format!("{}: ssm_conv state", isa.name()));
        let scan = Scan::random(&mut rng, 16, 4, 2, 1, 0);
        let mut state = scan.state.clone();
        assert!(scan.run_on(isa, &mut state, &one).is_empty());
        assert_bits(&state, &scan.state, &format!("{}: ssm_scan state", isa.name()));
        let delta = Delta::random(&mut rng, 16, 1, 2, true, 0);
        let mut state = delta.state.clone();
        assert!(delta.run_on(isa, &mut state, &one).is_empty());
        assert_bits(&state, &delta.state, &format!("{}: gated_delta_net state", isa.name()));
    }
}
