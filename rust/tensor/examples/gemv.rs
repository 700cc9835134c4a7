//! Matrix-vector and matrix-matrix throughput on matrices larger than the caches, packed and
//! plain layouts measured alternately (the machine is shared: best and median of the reps):
//! `cargo run --release --example gemv [MB] [reps] [type filter] [threads]`.
//! gemv reports weight GB/s (1 token, from memory and from cache), gemm64 GOPS
//! (2 * rows * cols * 64 / s on a 2 MB slice).
use std::sync::Arc;
use std::time::Instant;

use ferrollama_tensor::{matmul, traits, GgmlType, MatmulScratch, QMatrix, Threads, WeightBytes};

fn random_matrix(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let t = traits(ty).unwrap();
    let mut s = seed | 1;
    let mut x = vec![0f32; cols];
    let mut row = vec![0u8; t.row_bytes(cols)];
    let mut out = Vec::with_capacity(rows * row.len());
    for r in 0..rows {
        if r < 64 {
            for v in x.iter_mut() {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                *v = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
            }
            (t.from_f32_ref.unwrap())(&x, &mut row);
        } else {
            let src = (r % 64) * row.len();
            let n = row.len();
            row.copy_from_slice(&out[src..src + n]);
        }
        out.extend_from_slice(&row);
    }
    out
}

fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() - 1], v[v.len() / 2])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mb: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(96);
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20);
    let filter = args.get(3).cloned().unwrap_or_default();
    let nt: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1);
    let pool = Threads::new(nt);
    let cases = [(GgmlType::Q8_0, 896), (GgmlType::Q5_0, 896), (GgmlType::Q4_K, 4864), (GgmlType::Q6_K, 4864), (GgmlType::Q4_0, 896)];
    for (ty, cols) in cases {
        if !filter.is_empty() && !format!("{ty}").to_lowercase().contains(&filter) {
            continue;
        }
        let rb = traits(ty).unwrap().row_bytes(cols);
        let rows = (mb << 20) / rb / 16 * 16;
        let bytes = Arc::new(random_matrix(ty, rows, cols, 7));
        let sub_rows = ((2 << 20) / rb / 16 * 16).min(rows);
        let sub_bytes = Arc::new(bytes[..sub_rows * rb].to_vec());
        let mats: Vec<(QMatrix, QMatrix)> = [false, true]
            .iter()
            .map(|&p| {
                (QMatrix::with_layout(ty, rows, cols, WeightBytes::Owned(bytes.clone()), p).unwrap(),
                 QMatrix::with_layout(ty, sub_rows, cols, WeightBytes::Owned(sub_bytes.clone()), p).unwrap())
            })
            .collect();
        let x: Vec<f32> = (0..64 * cols).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let mut out = vec![0f32; 64 * rows];
        let mut scratch = MatmulScratch::default();
        let mut res = vec![(Vec::new(), Vec::new(), Vec::new()); 2];
        for _ in 0..reps {
            for (i, (big, sub)) in mats.iter().enumerate() {
                let t0 = Instant::now();
                matmul(big, &x, 1, &mut out, &mut scratch, &pool);
                res[i].0.push((rows * rb) as f64 / t0.elapsed().as_secs_f64() / 1e9);
                let t0 = Instant::now();
                for _ in 0..20 {
                    matmul(sub, &x, 1, &mut out, &mut scratch, &pool);
                }
                res[i].1.push((sub_rows * rb * 20) as f64 / t0.elapsed().as_secs_f64() / 1e9);
                let t0 = Instant::now();
                matmul(sub, &x, 64, &mut out, &mut scratch, &pool);
                res[i].2.push((2 * sub_rows * cols * 64) as f64 / t0.elapsed().as_secs_f64() / 1e9);
            }
        }
        for (i, (a, b, c)) in res.into_iter().enumerate() {
            let ((a1, a2), (b1, b2), (c1, c2)) = (stats(a), stats(b), stats(c));
            println!("{ty:>6} {cols:>5} cols packed={i} threads={nt}: gemv {a1:6.2} GB/s (median {a2:6.2}), from cache {b1:6.2} ({b2:6.2}), gemm64 {c1:6.1} GOPS ({c2:6.1})");
        }
    }
}
