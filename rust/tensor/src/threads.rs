//! The worker threads a context computes with.

/// A fixed set of worker threads. `run(n_tasks, f)` calls `f(task)` for every task index
/// in 0..n_tasks spread over the threads and returns when all are done.
pub struct Threads {
    pool: rayon::ThreadPool,
    n_threads: usize,
}

impl Threads {
    pub fn new(n_threads: usize) -> Threads {
        let n_threads = n_threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n_threads)
            .thread_name(|i| format!("ferrollama-{i}"))
            .build()
            .expect("spawning worker threads");
        Threads { pool, n_threads }
    }
    pub fn n_threads(&self) -> usize { self.n_threads }
    pub fn run(&self, n_tasks: usize, f: impl Fn(usize) + Sync + Send) {
        use rayon::prelude::*;
        self.pool.install(|| (0..n_tasks).into_par_iter().for_each(|t| f(t)));
    }
}
