//! The attention kernel (`attn::attend`, llama.cpp's non-flash arithmetic) over an F16 cache
//! on the real models' shapes, one thread, reporting the bytes of cached keys and values
//! read per second (the cache is larger than L2 at 4096 cells: memory bandwidth is the
//! ceiling of a decoded token).
//!
//! - decode: one token, the query heads of one KV head, n_kv cells, in a cache laid out as
//!   the engine's (each KV head's rows one block, V set-major; the last head's block is read);
//! - batch: eight tokens of a prompt block (tinyBLAS order, rows converted once);
//! - seq8: two tokens of a decode step of eight sequences (the engine's task), each seeing
//!   its own 192 of the 1536 cells: its 128 prompt cells, then every eighth cell, as a
//!   batched decode interleaves them; the rate counts the cells each token sees.
//!
//! On a CPU without AVX-512 the AVX2 kernel (`attn_avx2`) runs instead.
//!
//! A closing table sets each rate beside the machine's read bandwidth (see `peak`).

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use ferrollama_tensor::attn::{attend, v_cols, AttnScratch, DotOrder, Heads};
use ferrollama_tensor::attn_avx2;
use ferrollama_tensor::util::f32_to_f16;
use ferrollama_tensor::GgmlType;

struct Shape {
    name: &'static str,
    n_head_kv: usize,
    group: usize,
    head_dim: usize,
}

const SHAPES: [Shape; 2] = [
    Shape { name: "qwen2.5-0.5b", n_head_kv: 2, group: 7, head_dim: 64 },
    Shape { name: "gemma3-270m", n_head_kv: 1, group: 4, head_dim: 256 },
];

fn f16_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .flat_map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            f32_to_f16(((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0).to_le_bytes()
        })
        .collect()
}

mod peak;
use peak::{Bound, Report};

fn bench(c: &mut Criterion, report: &mut Report) {
    for sh in &SHAPES {
        for (kind, n_kv, n_t) in [("decode", 4096usize, 1usize), ("decode", 512, 1), ("batch8", 512, 8), ("seq8", 1536, 2)] {
            let row = sh.n_head_kv * sh.head_dim;
            let (k, v) = (f16_bytes(n_kv * row, 1), f16_bytes(n_kv * row, 2));
            let q: Vec<f32> = (0..n_t * sh.group * sh.head_dim).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
            // Causal over the last n_t positions, or each token its sequence's cells.
            let seq8 = kind == "seq8";
            let sees = |t: usize, j: usize| if seq8 { if j < 1024 { j / 128 == t } else { (j - 1024) % 8 == t } } else { j <= n_kv - n_t + t };
            let mask: Vec<f32> = (0..n_t * n_kv).map(|i| if sees(i / n_kv, i % n_kv) { 0.0 } else { f32::NEG_INFINITY }).collect();
            // Bytes of keys and values the tokens see.
            let seen = (0..n_t).map(|t| (0..n_kv).filter(|&j| sees(t, j)).count()).max().unwrap_or(0) * if seq8 { n_t } else { 1 };
            let bytes = (2 * seen * sh.head_dim * 2) as u64;
            let order = if n_t > 1 { DotOrder::TinyBlas } else { DotOrder::VecDot };
            let h = Heads {
                k_type: GgmlType::F16, v_type: GgmlType::F16, k: &k, k_stride: 2 * sh.head_dim, k_offset: 2 * (row - sh.head_dim) * n_kv,
                v: &v, v_stride: 2 * sh.head_dim, v_offset: 2 * (row - sh.head_dim) * n_kv, v_cols: v_cols(n_kv), head_dim_k: sh.head_dim, head_dim_v: sh.head_dim,
                n_kv, q: &q, q_stride: sh.group * sh.head_dim, n_q: sh.group, n_t, mask: &mask, mask_stride: n_kv,
                out_stride: sh.group * sh.head_dim, scale: 0.125, order_kq: order, order_vp: order,
            };
            // Without AVX-512, the AVX2 kernel (ggml_vec_dot's order for every token).
            let h = if h.supported() { h } else { Heads { order_kq: DotOrder::VecDot, order_vp: DotOrder::VecDot, ..h } };
            let avx2 = !h.supported();
            if avx2 && !attn_avx2::supported(&h) {
                eprintln!("attention bench: neither AVX-512 nor AVX2 on this CPU");
                return;
            }
            let mut out = vec![0f32; n_t * sh.group * sh.head_dim];
            let (mut s, mut s2) = (AttnScratch::default(), attn_avx2::Avx2Scratch::default());
            let mut attend = |h: &Heads, out: &mut [f32]| {
                if avx2 {
                    // SAFETY: `out` holds every output of the call.
                    unsafe { attn_avx2::attend_raw(h, out.as_mut_ptr(), &mut s2) }
                } else {
                    attend(h, out, &mut s)
                }
            };
            let mut g = c.benchmark_group(format!("attn/{}/{kind}/{n_kv}", sh.name));
            g.throughput(Throughput::Bytes(bytes));
            g.warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2)).sample_size(30);
            g.bench_with_input(BenchmarkId::new("heads", sh.group), &(), |b, _| b.iter(|| attend(&h, &mut out)));
            g.finish();
            let name = format!("attn/{}/{kind}/{n_kv}/heads/{}", sh.name, sh.group);
            report.time(&name, 1, Bound::Memory, bytes as f64, || attend(&h, &mut out));
        }
    }
}

fn main() {
    peak::run(bench);
}
