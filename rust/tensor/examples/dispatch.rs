//! Measures the cost of one `Threads::run` dispatch (two trivial tasks) and of a run over
//! many tasks, for pools of 1 and 2 threads.
use ferrollama_tensor::Threads;
use std::time::Instant;

fn main() {
    for n in [1usize, 2] {
        let pool = Threads::new(n);
        let iters = 200_000;
        let t0 = Instant::now();
        for _ in 0..iters {
            pool.run(2, |t| {
                std::hint::black_box(t);
            });
        }
        let dt = t0.elapsed().as_secs_f64() / iters as f64;
        println!("threads={n}: {:.2} us per dispatch", dt * 1e6);
    }
}
