//! Times the recurrent kernels (`ssm`) at real models' shapes, at every instruction-set level
//! this CPU has:
//!
//!   ssm_time [THREADS] [REPS] [FILTER]
//!
//! (FILTER: time only the kernels whose name contains it, e.g. `delta`.)
//!
//! - the gated delta net and its convolution at Qwen3.5-0.8B's (S = 128, H_k = H_v = 16,
//!   6144 conv channels, 4 taps; 18 of its 24 layers are linear attention);
//! - the scan and convolution of Mamba-2 at Granite-4.0-H-350M's (d_state 128, 48 heads of
//!   32, one group, 1792 conv channels; 28 Mamba layers) and Granite-4.0-H-1B's (48 heads of
//!   64, 3328 conv channels; 36 Mamba layers).
//!
//! Each kernel runs over one state per layer in turn, as a forward pass does, so a state comes
//! from wherever the others have pushed it (a 1-token delta net reads and writes 1 MiB per
//! layer); the line "1, cached" runs one layer's state over and over (the arithmetic alone),
//! and so does "512" (a prompt reuses each state 512 times anyway), which keeps each timed
//! pass short enough to fit between the scheduler's preemptions on a busy machine.
//! Prints, per kernel and token count, the nanoseconds per token and layer. The states start
//! on 64-byte boundaries, or FERROLLAMA_SSM_MISALIGN floats past one.

use std::time::Instant;

use ferrollama_tensor::ssm::{gated_delta_net_on, ssm_conv_on, ssm_scan_on};
use ferrollama_tensor::{Isa, Threads};

#[path = "shared/thread_time.rs"]
mod thread_time;
use thread_time::thread_cpu_seconds;

/// Reproducible inputs without a dependency: a xorshift in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A state buffer starting `misalign` floats past a 64-byte boundary (0: aligned, as the
/// engine's state store places them; a vector load across two cache lines costs two).
struct State {
    buf: Vec<f32>,
    start: usize,
    len: usize,
}

impl State {
    fn new(values: Vec<f32>, misalign: usize) -> State {
        let mut buf = vec![0f32; values.len() + 16 + misalign];
        let start = buf.as_ptr().align_offset(64) + misalign;
        buf[start..start + values.len()].copy_from_slice(&values);
        State { buf, start, len: values.len() }
    }
    fn get(&mut self) -> &mut [f32] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// The floats by which states start past a 64-byte boundary: FERROLLAMA_SSM_MISALIGN, else 0.
fn misalign() -> usize {
    std::env::var("FERROLLAMA_SSM_MISALIGN").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// One timed kernel: runs `n_t` tokens on layer `layer`'s state.
trait Kernel {
    fn name(&self) -> String;
    fn layers(&self) -> usize;
    fn run(&mut self, isa: Isa, layer: usize, n_t: usize, threads: &Threads);
}

struct Delta {
    s: usize,
    h: usize,
    layers: usize,
    states: Vec<State>,
    qkv: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    out: Vec<f32>,
}

impl Delta {
    fn new(s: usize, h: usize, layers: usize, max_t: usize) -> Delta {
        let mut qkv = values(max_t * 3 * s * h, 1);
        // L2-normalized q and k heads, as the models feed them.
        for t in 0..max_t {
            for head in qkv[t * 3 * s * h..t * 3 * s * h + 2 * s * h].chunks_exact_mut(s) {
                let norm = head.iter().map(|v| v * v).sum::<f32>().sqrt();
                head.iter_mut().for_each(|v| *v /= norm);
            }
        }
        Delta {
            s,
            h,
            layers,
            states: (0..layers).map(|l| State::new(values(s * s * h, 10 + l as u64).iter().map(|v| v * 0.1).collect(), misalign())).collect(),
            qkv,
            g: values(max_t * h, 2).iter().map(|v| -0.3 + 0.25 * v).collect(),
            beta: values(max_t * h, 3).iter().map(|v| 0.5 + 0.4 * v).collect(),
            out: vec![0.0; max_t * s * h],
        }
    }
}

impl Kernel for Delta {
    fn name(&self) -> String {
        format!("gated_delta_net S={} H={}", self.s, self.h)
    }
    fn layers(&self) -> usize {
        self.layers
    }
    fn run(&mut self, isa: Isa, layer: usize, n_t: usize, threads: &Threads) {
        let (s, h) = (self.s, self.h);
        let stride = 3 * s * h;
        let (q, k, v) = (&self.qkv[..], &self.qkv[s * h..], &self.qkv[2 * s * h..]);
        gated_delta_net_on(isa, self.states[layer].get(), q, k, stride, v, stride, &self.g, h, false, &self.beta, h, n_t, s, h, s, h, &mut self.out, threads);
    }
}

struct Scan {
    d_state: usize,
    head_dim: usize,
    n_head: usize,
    layers: usize,
    states: Vec<State>,
    /// Per token: x, B, C, dt (Mamba-2's xBC then dt).
    rows: Vec<f32>,
    a: Vec<f32>,
    y: Vec<f32>,
}

impl Scan {
    fn new(d_state: usize, head_dim: usize, n_head: usize, layers: usize, max_t: usize) -> Scan {
        let stride = head_dim * n_head + 2 * d_state + n_head;
        Scan {
            d_state,
            head_dim,
            n_head,
            layers,
            states: (0..layers).map(|l| State::new(values(d_state * head_dim * n_head, 20 + l as u64), misalign())).collect(),
            rows: values(max_t * stride, 4),
            a: values(n_head, 5).iter().map(|v| -1.0 - v.abs()).collect(),
            y: vec![0.0; max_t * head_dim * n_head],
        }
    }
}

impl Kernel for Scan {
    fn name(&self) -> String {
        format!("ssm_scan d_state={} head_dim={} n_head={}", self.d_state, self.head_dim, self.n_head)
    }
    fn layers(&self) -> usize {
        self.layers
    }
    fn run(&mut self, isa: Isa, layer: usize, n_t: usize, threads: &Threads) {
        let d_inner = self.head_dim * self.n_head;
        let stride = d_inner + 2 * self.d_state + self.n_head;
        let r = &self.rows[..];
        let (b, c, dt) = (&r[d_inner..], &r[d_inner + self.d_state..], &r[d_inner + 2 * self.d_state..]);
        ssm_scan_on(isa, self.states[layer].get(), r, stride, dt, stride, &self.a, b, c, stride, n_t, self.d_state, self.head_dim, self.n_head, 1, &mut self.y, threads);
    }
}

struct Conv {
    channels: usize,
    d_conv: usize,
    layers: usize,
    states: Vec<State>,
    x: Vec<f32>,
    weight: Vec<f32>,
    out: Vec<f32>,
}

impl Conv {
    fn new(channels: usize, d_conv: usize, layers: usize, max_t: usize) -> Conv {
        Conv {
            channels,
            d_conv,
            layers,
            states: (0..layers).map(|l| State::new(values(channels * (d_conv - 1), 30 + l as u64), misalign())).collect(),
            x: values(max_t * channels, 6),
            weight: values(channels * d_conv, 7),
            out: vec![0.0; max_t * channels],
        }
    }
}

impl Kernel for Conv {
    fn name(&self) -> String {
        format!("ssm_conv channels={} d_conv={}", self.channels, self.d_conv)
    }
    fn layers(&self) -> usize {
        self.layers
    }
    fn run(&mut self, isa: Isa, layer: usize, n_t: usize, threads: &Threads) {
        ssm_conv_on(isa, self.states[layer].get(), &self.x, self.channels, n_t, &self.weight, self.d_conv, self.channels, &mut self.out, threads);
    }
}

/// Nanoseconds per token and layer: the best of `reps` passes over `layers` layers (after one
/// warm-up pass); CPU time on one thread, wall time on more.
fn time(kernel: &mut dyn Kernel, isa: Isa, n_t: usize, layers: usize, reps: usize, threads: &Threads) -> f64 {
    let wall = Instant::now();
    let clock = || if threads.n_threads() == 1 { thread_cpu_seconds() } else { wall.elapsed().as_secs_f64() };
    let mut pass = || {
        let start = clock();
        for layer in 0..layers {
            kernel.run(isa, layer, n_t, threads);
        }
        (clock() - start) * 1e9 / (layers * n_t) as f64
    };
    pass();
    (0..reps).map(|_| pass()).fold(f64::INFINITY, f64::min)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n_threads: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let filter = args.get(3).cloned().unwrap_or_default();
    let threads = Threads::new(n_threads);
    let levels: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|l| l.available()).collect();
    let max_t = 512;
    let mut kernels: Vec<(&str, Box<dyn Kernel>)> = vec![
        ("Qwen3.5-0.8B", Box::new(Delta::new(128, 16, 18, max_t))),
        ("Qwen3.5-0.8B", Box::new(Conv::new(6144, 4, 18, max_t))),
        ("Granite-4.0-H-350M", Box::new(Scan::new(128, 32, 48, 28, max_t))),
        ("Granite-4.0-H-350M", Box::new(Conv::new(1792, 4, 28, max_t))),
        ("Granite-4.0-H-1B", Box::new(Scan::new(128, 64, 48, 36, max_t))),
        ("Granite-4.0-H-1B", Box::new(Conv::new(3328, 4, 36, max_t))),
    ];
    println!("{n_threads} thread(s); ns per token and layer, best of {reps}");
    let header: Vec<String> = levels.iter().map(|l| format!("{:>10}", l.name())).collect();
    println!("{:<20} {:<44} {:>9} {}", "model", "kernel", "n_t", header.join(" "));
    for (model, kernel) in kernels.iter_mut().filter(|(_, k)| k.name().contains(&filter)) {
        for (n_t, label, layers) in [(1, "1", kernel.layers()), (1, "1, cached", 1), (512, "512", 1)] {
            let times: Vec<String> = levels.iter().map(|&isa| format!("{:>10.0}", time(kernel.as_mut(), isa, n_t, layers, reps, &threads))).collect();
            println!("{:<20} {:<44} {:>9} {}", model, kernel.name(), label, times.join(" "));
        }
    }
}
