//! Vocabulary load time, step by step, and the memory the loaded vocabulary holds.
//!
//! cargo run --release -p ferrollama-vocab --example load_time [-- [-n RUNS] FILE.gguf...]
//!
//! Each file's GGUF metadata is parsed once, then the vocabulary is built RUNS times (default
//! 21); the medians of the whole build and of each step are printed (a shared machine is noisy:
//! medians, not means). The first build of the process is also shown on its own: it pays
//! for what is built once per process (Unicode tables, pre-tokenizer data) and for fresh
//! memory, as a program loading one model does. Memory comes from a counting allocator, in
//! that first build: "held" is what the vocabulary keeps allocated once built (with the
//! per-process tables it made), "peak" the most allocated at once while building it (the
//! GGUF metadata, already parsed, is counted in neither). Files that do not exist are skipped.
//! Default files: the Qwen2.5 and Gemma 3 models of /work/cache/models.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ferrollama_gguf::GgufFile;
use ferrollama_vocab::Vocab;

/// The system allocator, counting the bytes currently allocated and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            if new_size >= layout.size() {
                let live = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size - layout.size();
                PEAK.fetch_max(live, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const DEFAULT_FILES: &[&str] = &[
    "/work/cache/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "/work/cache/models/gemma-3-270m-q4_k_m.gguf",
];

fn ms(d: Duration) -> f64 { d.as_secs_f64() * 1e3 }

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn mib(bytes: usize) -> f64 { bytes as f64 / 1048576.0 }

/// What the first build of a vocabulary in the process cost.
struct FirstBuild {
    time: Duration,
    phases: ferrollama_vocab::LoadPhases,
    /// Bytes allocated after the build that were not before.
    held: usize,
    /// The most bytes allocated at once during the build, beyond those allocated before.
    peak: usize,
    n_tokens: usize,
}

/// Builds the vocabulary once, counting what it holds and the peak while building.
fn first_build(file: &GgufFile) -> FirstBuild {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let t = Instant::now();
    let (vocab, phases) = Vocab::from_gguf_timed(file).expect("load vocab");
    let time = t.elapsed();
    let held = LIVE.load(Ordering::Relaxed) - before;
    let peak = PEAK.load(Ordering::Relaxed) - before;
    FirstBuild { time, phases, held, peak, n_tokens: vocab.n_tokens() }
}

fn report(path: &str, runs: usize) {
    let t = Instant::now();
    let file = match GgufFile::open(path, true) {
        Ok(f) => f,
        Err(e) => {
            println!("{path}: skipped ({e})");
            return;
        }
    };
    let parse = t.elapsed();
    let first = first_build(&file);
    let mut totals = Vec::with_capacity(runs);
    let mut steps: Vec<(&'static str, Vec<f64>)> = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let (vocab, phases) = Vocab::from_gguf_timed(&file).expect("load vocab");
        totals.push(ms(t.elapsed()));
        drop(vocab);
        for (i, (name, d)) in phases.into_iter().enumerate() {
            if steps.len() <= i {
                steps.push((name, Vec::new()));
            }
            steps[i].1.push(ms(d));
        }
    }
    println!("{path}: {} tokens; GGUF metadata parsed once in {:.1} ms", first.n_tokens, ms(parse));
    println!("  {:<22} {:>8} {:>8}   (ms; median of {runs} runs, min {:.1})", "vocab build", "first", "median", totals.iter().copied().fold(f64::MAX, f64::min));
    println!("  {:<22} {:8.2} {:8.2}", "total", ms(first.time), median(totals.clone()));
    for ((name, times), (_, first_time)) in steps.into_iter().zip(&first.phases) {
        println!("    {name:<20} {:8.2} {:8.2}", ms(*first_time), median(times));
    }
    println!(
        "  memory (first build): held {:.1} MiB ({:.0} bytes/token), peak while building {:.1} MiB",
        mib(first.held),
        first.held as f64 / first.n_tokens as f64,
        mib(first.peak)
    );
}

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    let mut runs = 21;
    let mut files = Vec::new();
    while let Some(arg) = args.next() {
        if arg == "-n" {
            runs = args.next().and_then(|s| s.parse().ok()).expect("-n RUNS");
        } else {
            files.push(arg);
        }
    }
    if files.is_empty() {
        files = DEFAULT_FILES.iter().map(|s| s.to_string()).collect();
    }
    for path in &files {
        report(path, runs.max(1));
    }
}
