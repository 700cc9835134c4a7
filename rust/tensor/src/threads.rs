//! The worker threads a context computes with.

/// A fixed set of worker threads. `run(n_tasks, f)` calls `f(task)` for every task index
/// in 0..n_tasks spread over the threads and returns when all are done.
pub struct Threads {
    pool: rayon::ThreadPool,
    n_threads: usize,
}

impl Threads {
    /// A pool of `n_threads` workers (at least one).
    pub fn new(n_threads: usize) -> Threads {
        let n_threads = n_threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n_threads)
            .thread_name(|i| format!("ferrollama-{i}"))
            .build()
            .expect("spawning worker threads");
        Threads { pool, n_threads }
    }
    /// The number of workers.
    pub fn n_threads(&self) -> usize { self.n_threads }
    /// Calls `f(task)` for every task in 0..n_tasks on the workers; returns when all are done.
    pub fn run(&self, n_tasks: usize, f: impl Fn(usize) + Sync + Send) {
        use rayon::prelude::*;
        if self.n_threads == 1 || n_tasks == 1 {
            // One worker: run on the calling thread rather than hand over to the pool and wait.
            (0..n_tasks).for_each(f);
            return;
        }
        self.pool.install(|| (0..n_tasks).into_par_iter().for_each(|t| f(t)));
    }
}
