//! The machine's peaks, measured where the benchmarks run, and a closing table that sets each
//! benchmarked kernel's rate beside the peak that bounds it: memory read bandwidth for one
//! token (every weight read once), the VPDPBUSD (int8) or FMA (f32) rate for batches.
//!
//! The table re-times each case (median of 15 calls after 3 warm-up calls): criterion's
//! figures above it are the careful ones; this one is for the ratios.

use std::time::{Duration, Instant};

use criterion::Criterion;

/// A benchmark binary's main: criterion's cases (with its command-line options), then the
/// peaks and the table of the cases `bench` timed into the report.
pub fn run(bench: fn(&mut Criterion, &mut Report)) {
    let mut c = Criterion::default().configure_from_args();
    let mut report = Report::from_args();
    bench(&mut c, &mut report);
    c.final_summary();
    report.print(&Peak::measure());
}

/// What bounds a kernel, and so which peak its rate is compared with (the attention
/// benchmark uses only `Memory`).
#[derive(Clone, Copy)]
#[allow(dead_code)]
pub enum Bound {
    /// Bytes read from memory.
    Memory,
    /// int8 multiply-adds (2 operations each), VPDPBUSD.
    Int8,
    /// f32 multiply-adds (2 operations each), FMA.
    F32,
}

/// Peaks by thread count (index 0: one thread, 1: two threads).
pub struct Peak {
    read_gbs: [f64; 2],
    int8_gops: Option<[f64; 2]>,
    f32_gflops: Option<[f64; 2]>,
}

impl Peak {
    pub fn measure() -> Peak {
        let per_threads = |f: &dyn Fn(usize) -> f64| [f(1), f(2)];
        Peak {
            read_gbs: per_threads(&read_bandwidth),
            int8_gops: simd_supported().then(|| per_threads(&|t| on_threads(t, |n| unsafe { x86::dpbusd_ops(n) }))),
            f32_gflops: simd_supported().then(|| per_threads(&|t| on_threads(t, |n| unsafe { x86::fma_ops(n) }))),
        }
    }

    fn of(&self, bound: Bound, threads: usize) -> Option<f64> {
        let i = threads.clamp(1, 2) - 1;
        match bound {
            Bound::Memory => Some(self.read_gbs[i]),
            Bound::Int8 => self.int8_gops.map(|p| p[i]),
            Bound::F32 => self.f32_gflops.map(|p| p[i]),
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn simd_supported() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni")
}
#[cfg(not(target_arch = "x86_64"))]
fn simd_supported() -> bool {
    false
}

/// GB/s of reading a 256 MiB buffer (far beyond the caches), split over `threads` threads;
/// the best of 3 passes.
fn read_bandwidth(threads: usize) -> f64 {
    let words: Vec<u64> = vec![1; (256 << 20) / 8];
    let part = words.len() / threads;
    let best = (0..3)
        .map(|_| {
            let start = Instant::now();
            std::thread::scope(|s| {
                for chunk in words.chunks(part) {
                    s.spawn(move || std::hint::black_box(chunk.iter().fold(0u64, |a, &w| a.wrapping_add(w))));
                }
            });
            start.elapsed()
        })
        .min()
        .unwrap_or(Duration::MAX);
    (words.len() * 8) as f64 / best.as_secs_f64() / 1e9
}

/// G operations per second of `kernel(iterations) -> operations` run on `threads` threads at
/// once; the best of 3.
fn on_threads(threads: usize, kernel: impl Fn(u64) -> f64 + Sync) -> f64 {
    const ITERATIONS: u64 = 2_000_000;
    (0..3)
        .map(|_| {
            let start = Instant::now();
            let ops: f64 = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads).map(|_| s.spawn(|| kernel(ITERATIONS))).collect();
                handles.into_iter().map(|h| h.join().expect("peak kernel")).sum()
            });
            ops / start.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Twelve independent VPDPBUSD chains (more than latency x throughput), 64 int8
    /// multiply-adds each per instruction; returns the operations done.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn dpbusd_ops(iterations: u64) -> f64 {
        let (a, b) = std::hint::black_box((_mm512_set1_epi8(3), _mm512_set1_epi8(-2)));
        let mut acc = [_mm512_setzero_si512(); 12];
        for _ in 0..iterations {
            for v in acc.iter_mut() {
                *v = _mm512_dpbusd_epi32(*v, a, b);
            }
        }
        std::hint::black_box(acc);
        (iterations * 12 * 64 * 2) as f64
    }

    /// Twelve independent 16-lane FMA chains; returns the operations done.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma_ops(iterations: u64) -> f64 {
        let (a, b) = std::hint::black_box((_mm512_set1_ps(0.999), _mm512_set1_ps(1e-3)));
        let mut acc = [_mm512_setzero_ps(); 12];
        for _ in 0..iterations {
            for v in acc.iter_mut() {
                *v = _mm512_fmadd_ps(*v, a, b);
            }
        }
        std::hint::black_box(acc);
        (iterations * 12 * 16 * 2) as f64
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    pub unsafe fn dpbusd_ops(_: u64) -> f64 { 0.0 }
    pub unsafe fn fma_ops(_: u64) -> f64 { 0.0 }
}

struct Row {
    name: String,
    threads: usize,
    bound: Bound,
    /// Bytes or operations per call.
    amount: f64,
    seconds: f64,
}

/// The cases a benchmark ran, re-timed for the table.
pub struct Report {
    filter: Option<regex::Regex>,
    rows: Vec<Row>,
}

impl Report {
    /// Keeps the cases that criterion's command-line filter (the first free argument, a
    /// regular expression) selects.
    pub fn from_args() -> Report {
        let filter = std::env::args().skip(1).find(|a| !a.starts_with('-')).and_then(|f| regex::Regex::new(&f).ok());
        Report { filter, rows: Vec::new() }
    }

    /// Times `call` (doing `amount` bytes or operations) for the table, if selected.
    pub fn time(&mut self, name: &str, threads: usize, bound: Bound, amount: f64, mut call: impl FnMut()) {
        if self.filter.as_ref().is_some_and(|f| !f.is_match(name)) {
            return;
        }
        for _ in 0..3 {
            call();
        }
        let mut times: Vec<f64> = (0..15)
            .map(|_| {
                let start = Instant::now();
                call();
                start.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        self.rows.push(Row { name: name.to_string(), threads, bound, amount, seconds: times[times.len() / 2] });
    }

    /// Prints the peaks and every case's rate as a share of its peak (markdown).
    pub fn print(&self, peak: &Peak) {
        if self.rows.is_empty() {
            return;
        }
        let show = |p: Option<[f64; 2]>| p.map_or("n/a".to_string(), |p| format!("{:.1} (1 thread), {:.1} (2 threads)", p[0], p[1]));
        println!("\n## Against the machine's peak\n");
        println!("- memory read bandwidth, GB/s: {:.1} (1 thread), {:.1} (2 threads)", peak.read_gbs[0], peak.read_gbs[1]);
        println!("- VPDPBUSD int8, GOPS: {}", show(peak.int8_gops));
        println!("- FMA f32, GFLOPS: {}\n", show(peak.f32_gflops));
        println!("| case | threads | rate | peak | share |");
        println!("|---|---|---|---|---|");
        for r in &self.rows {
            let rate = r.amount / r.seconds / 1e9;
            let unit = match r.bound { Bound::Memory => "GB/s", Bound::Int8 => "GOPS", Bound::F32 => "GFLOPS" };
            match peak.of(r.bound, r.threads) {
                Some(p) => println!("| {} | {} | {rate:.1} {unit} | {p:.1} {unit} | {:.0} % |", r.name, r.threads, 100.0 * rate / p),
                None => println!("| {} | {} | {rate:.1} {unit} | n/a | |", r.name, r.threads),
            }
        }
    }
}
