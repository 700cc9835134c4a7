//! One thread's time for one attention task of a prompt at depth (`attn::attend`, llama.cpp's
//! non-flash arithmetic over an F16 cache), in thread CPU time (the machines are shared):
//!
//!   attn_time [DEPTH] [TOKENS] [REPS]
//!
//! Shapes: the heads of one KV head of LFM2-350M (2 of 64 dims), Qwen3.5-0.8B (4 of 256) and
//! Qwen2.5-0.5B (7 of 64); TOKENS consecutive prompt tokens (causal) after DEPTH cells.

use ferrollama_tensor::attn::{attend, v_cols, AttnScratch, DotOrder, Heads};
use ferrollama_tensor::util::f32_to_f16;
use ferrollama_tensor::GgmlType;

#[path = "shared/thread_time.rs"]
mod thread_time;
use thread_time::thread_cpu_seconds;

fn f16_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .flat_map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            f32_to_f16(((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0).to_le_bytes()
        })
        .collect()
}


fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("a number")).collect();
    let (depth, n_t, reps) = (args.first().copied().unwrap_or(8192), args.get(1).copied().unwrap_or(16), args.get(2).copied().unwrap_or(20));
    for (name, group, dim) in [("lfm2-350m", 2usize, 64usize), ("qwen3.5-0.8b", 4, 256), ("qwen2.5-0.5b", 7, 64)] {
        let n_kv = (depth + n_t).next_multiple_of(256);
        let (k, v) = (f16_bytes(n_kv * dim, 1), f16_bytes(n_kv * dim, 2));
        let q: Vec<f32> = (0..n_t * group * dim).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let mask: Vec<f32> = (0..n_t * n_kv).map(|i| if i % n_kv <= depth + i / n_kv { 0.0 } else { f32::NEG_INFINITY }).collect();
        let h = Heads {
            k_type: GgmlType::F16, v_type: GgmlType::F16, k: &k, k_stride: 2 * dim, k_offset: 0, v: &v, v_stride: 2 * dim, v_offset: 0,
            v_cols: v_cols(n_kv), head_dim_k: dim, head_dim_v: dim, n_kv, q: &q, q_stride: group * dim, n_q: group, n_t,
            mask: &mask, mask_stride: n_kv, out_stride: group * dim, scale: 0.125, order_kq: DotOrder::TinyBlas, order_vp: DotOrder::TinyBlas,
        };
        if !h.supported() {
            eprintln!("attn_time: the exact kernel needs AVX-512");
            return;
        }
        let (mut out, mut s) = (vec![0f32; n_t * group * dim], AttnScratch::default());
        attend(&h, &mut out, &mut s);
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            let t0 = thread_cpu_seconds();
            attend(&h, &mut out, &mut s);
            best = best.min(thread_cpu_seconds() - t0);
        }
        let flops = 4.0 * (n_t * group * dim) as f64 * (depth + n_t / 2) as f64;
        println!("{name:>13}: {n_t} tokens x {group} heads of {dim} at depth {depth}: {:8.1} us  {:6.1} GFLOP/s", best * 1e6, flops / best * 1e-9);
    }
}
