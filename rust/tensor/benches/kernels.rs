//! Matrix-product throughput for the weight types of the real models (Qwen2.5-0.5B and
//! Gemma 3 270M Q4_K_M: Q4_K, Q6_K, Q5_0, Q8_0; F16 and F32 for attention), on the
//! 896x4864 (ffn_up/gate: 4864 rows of 896) and 4864x896 (ffn_down: 896 rows of 4864)
//! shapes, with 1 and 2 threads.
//!
//! gemv (1 token) reports bytes of weights streamed per second; gemm8 (8 tokens: a decode
//! step of 8 sequences) and gemm64 (64 tokens: a prompt) report elements per second as
//! 2 * rows * cols * tokens operations, i.e. the "elem/s" figure is OPS.
//!
//! A closing table sets each rate beside the machine's peak (see `peak`).

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use ferrollama_tensor::{matmul, traits, GgmlType, MatmulScratch, QMatrix, Threads, WeightBytes};

fn matrix(ty: GgmlType, rows: usize, cols: usize) -> QMatrix {
    let mut seed = 0x1234_5678u64;
    let x: Vec<f32> = (0..cols)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect();
    let t = traits(ty).expect("type in table");
    let mut row = vec![0u8; t.row_bytes(cols)];
    (t.from_f32_ref.expect("quantizable"))(&x, &mut row);
    let bytes: Vec<u8> = (0..rows).flat_map(|_| row.iter().copied()).collect();
    QMatrix::new(ty, rows, cols, WeightBytes::Owned(Arc::new(bytes))).expect("valid matrix")
}

mod peak;
use peak::{Bound, Report};

/// Bytes of weights a case cycles through: twice this machine's 32 MiB L3.
const COLD_BYTES: usize = 64 << 20;

fn bench(c: &mut Criterion, report: &mut Report) {
    let pools = [Threads::new(1), Threads::new(2)];
    let cases = [
        (GgmlType::Q4_K, &[(896usize, 4864usize)][..]),
        (GgmlType::Q6_K, &[(896, 4864)][..]),
        (GgmlType::Q5_0, &[(4864, 896), (896, 4864)][..]),
        (GgmlType::Q8_0, &[(4864, 896), (896, 4864)][..]),
        (GgmlType::F16, &[(4864, 896)][..]),
        (GgmlType::F32, &[(4864, 896)][..]),
    ];
    for (ty, shapes) in cases {
        for &(rows, cols) in shapes {
            // Copies enough to exceed the last-level cache, used in turn: a model's
            // matrices reach a product from memory, not from a cache a previous call warmed.
            let one = matrix(ty, rows, cols);
            let weight_bytes = (one.row_bytes() * rows) as u64;
            let copies: Vec<QMatrix> = (0..(COLD_BYTES / weight_bytes as usize).max(1)).map(|_| matrix(ty, rows, cols)).collect();
            let mut turn = 0usize;
            let mut next = move || {
                turn = (turn + 1) % copies.len();
                copies[turn].clone()
            };
            for n_tokens in [1usize, 8, 64] {
                let x: Vec<f32> = (0..n_tokens * cols).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
                let mut out = vec![0f32; n_tokens * rows];
                let mut scratch = MatmulScratch::default();
                let kind = if n_tokens == 1 { "gemv".to_string() } else { format!("gemm{n_tokens}") };
                let mut g = c.benchmark_group(format!("{kind}/{ty}/{cols}x{rows}"));
                g.throughput(if n_tokens == 1 { Throughput::Bytes(weight_bytes) } else { Throughput::Elements((2 * rows * cols * n_tokens) as u64) });
                g.warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2)).sample_size(20);
                for pool in &pools {
                    g.bench_with_input(BenchmarkId::new("threads", pool.n_threads()), &n_tokens, |b, &n| {
                        b.iter(|| matmul(&next(), &x, n, &mut out, &mut scratch, pool))
                    });
                }
                g.finish();
                let (bound, amount) = match (n_tokens, ty) {
                    (1, _) => (Bound::Memory, weight_bytes as f64),
                    (_, GgmlType::F16 | GgmlType::F32) => (Bound::F32, (2 * rows * cols * n_tokens) as f64),
                    _ => (Bound::Int8, (2 * rows * cols * n_tokens) as f64),
                };
                for pool in &pools {
                    let name = format!("{kind}/{ty}/{cols}x{rows}/threads/{}", pool.n_threads());
                    report.time(&name, pool.n_threads(), bound, amount, || matmul(&next(), &x, n_tokens, &mut out, &mut scratch, pool));
                }
            }
        }
    }
}

fn main() {
    peak::run(bench);
}
