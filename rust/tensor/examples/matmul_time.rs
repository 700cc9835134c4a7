//! Times the engine's matrix product on given weights, for benches/type_products.py (which times
//! ggml's on the same bytes and alternates the two):
//!
//!   matmul_time TYPE ROWS COLS TOKENS THREADS REPS WEIGHTS_FILE COPIES
//!
//! WEIGHTS_FILE holds one ROWSxCOLS matrix of TYPE as the file format stores it. COPIES copies of
//! it are multiplied in turn, so that a product reads its weights from memory rather than from a
//! cache the previous one warmed (as a model's matrices are read). The activations are
//! `((i * 7919) % 1000) / 1000 - 0.5`, as the Python side makes them. Prints one JSON line: the
//! seconds of one product, per rep (each rep is one pass over the copies, after one warm-up pass),
//! and "cpu_seconds", the same in the calling thread's CPU time (the whole product's with THREADS 1,
//! which runs on the calling thread; a measure that other processes' load does not inflate).

use std::sync::Arc;
use std::time::Instant;

use ferrollama_tensor::{matmul, GgmlType, MatmulScratch, QMatrix, Threads, WeightBytes};

#[path = "shared/thread_time.rs"]
mod thread_time;
use thread_time::thread_cpu_seconds;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        eprintln!("usage: matmul_time TYPE ROWS COLS TOKENS THREADS REPS WEIGHTS_FILE COPIES (bad or missing {what})");
        std::process::exit(2)
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ty = GgmlType::from_name(&arg::<String>(&args, 1, "TYPE")).unwrap_or_else(|| {
        eprintln!("unknown type {}", args[1]);
        std::process::exit(2)
    });
    let (rows, cols, tokens): (usize, usize, usize) = (arg(&args, 2, "ROWS"), arg(&args, 3, "COLS"), arg(&args, 4, "TOKENS"));
    let (threads, reps): (usize, usize) = (arg(&args, 5, "THREADS"), arg(&args, 6, "REPS"));
    let bytes = std::fs::read(arg::<String>(&args, 7, "WEIGHTS_FILE")).expect("weights file");
    let copies: usize = arg(&args, 8, "COPIES");
    let matrices: Vec<QMatrix> = (0..copies.max(1))
        .map(|_| QMatrix::new(ty, rows, cols, WeightBytes::Owned(Arc::new(bytes.clone()))).expect("a valid matrix"))
        .collect();
    let x: Vec<f32> = (0..tokens * cols).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let mut out = vec![0f32; tokens * rows];
    let mut scratch = MatmulScratch::default();
    let pool = Threads::new(threads);
    let mut pass = || {
        let (start, cpu) = (Instant::now(), thread_cpu_seconds());
        for m in &matrices {
            matmul(m, &x, tokens, &mut out, &mut scratch, &pool);
        }
        let n = matrices.len() as f64;
        (start.elapsed().as_secs_f64() / n, (thread_cpu_seconds() - cpu) / n)
    };
    pass();
    let (times, cpu): (Vec<String>, Vec<String>) = (0..reps).map(|_| pass()).map(|(w, c)| (format!("{w:.9}"), format!("{c:.9}"))).unzip();
    println!("{{\"seconds\": [{}], \"cpu_seconds\": [{}], \"checksum\": {}}}", times.join(", "), cpu.join(", "),
             out.iter().map(|v| *v as f64).sum::<f64>());
}

