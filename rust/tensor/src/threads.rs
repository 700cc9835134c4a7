//! The worker threads a context computes with: a persistent pool whose workers spin briefly
//! between jobs (a forward pass dispatches hundreds of short jobs per token, and waking a
//! sleeping thread costs tens of microseconds) and park when the pool stays idle.
//!
//! `run(n_tasks, f)` publishes one job; the caller and the workers claim task indices from
//! a shared counter until none are left, so a thread that is slowed down by a neighbour
//! simply claims fewer tasks and all threads finish together.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins for the next job before it parks.
const SPIN_BEFORE_PARK: Duration = Duration::from_micros(300);
/// Spin iterations between two looks at the clock (and yields while waiting for workers).
const SPIN_BATCH: u32 = 64;

/// The job being run: a borrowed closure, erased to a raw pointer. Valid from the moment
/// its epoch is published until every worker has left it (`run` waits for that).
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    n_tasks: usize,
}

struct Shared {
    /// Incremented once per published job (and on shutdown).
    epoch: AtomicUsize,
    job: UnsafeCell<Job>,
    /// The next unclaimed task index of the current job.
    next: AtomicUsize,
    /// Workers that have not yet finished the current job.
    active: AtomicUsize,
    shutdown: AtomicBool,
    /// A task panicked on a worker; `run` re-raises on the caller.
    panicked: AtomicBool,
    /// Parked workers wait here for the next epoch.
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread inside `run` while no worker reads it (all
// workers have finished the previous job and the new epoch is not yet published); workers
// read it only after observing the new epoch (release/acquire on `epoch`).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of worker threads. `run(n_tasks, f)` calls `f(task)` for every task index
/// in 0..n_tasks spread over the threads (the calling thread is one of them) and returns
/// when all are done.
pub struct Threads {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
    /// Serializes `run` calls made through a shared reference from several threads.
    running: Mutex<()>,
}

impl Threads {
    /// A pool of `n_threads` threads (at least one): the caller and n_threads - 1 workers.
    pub fn new(n_threads: usize) -> Threads {
        let n_threads = n_threads.max(1);
        let noop: &'static (dyn Fn(usize) + Sync) = &|_| {};
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new(Job { f: noop as *const _, n_tasks: 0 }),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("ferrollama-{i}"))
                    .spawn(move || {
                        block_async_signals();
                        worker_loop(&s)
                    })
                    .expect("spawning worker threads")
            })
            .collect();
        Threads { shared, workers, n_threads, running: Mutex::new(()) }
    }

    /// The number of threads, the caller included.
    pub fn n_threads(&self) -> usize { self.n_threads }

    /// Calls `f(task)` for every task in 0..n_tasks on the threads; returns when all are done.
    pub fn run(&self, n_tasks: usize, f: impl Fn(usize) + Sync + Send) {
        if self.n_threads == 1 || n_tasks <= 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let _serial = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let f_dyn: &(dyn Fn(usize) + Sync) = &f;
        // SAFETY: erases the lifetime of `f`; it outlives the job because this function
        // does not return before every worker has decremented `active`.
        let f_ptr: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f_dyn) };
        // SAFETY: no worker reads `job` now (all finished the previous job, see above).
        unsafe { *s.job.get() = Job { f: f_ptr, n_tasks } };
        s.next.store(0, Ordering::Relaxed);
        s.active.store(self.workers.len(), Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| claim_tasks(s, &f, n_tasks)));
        wait_for_workers(s);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a task panicked on a worker thread");
        }
    }
}

/// Gives the calling thread a low priority (nice 10) where the OS allows it: for the
/// repacking thread, which must not take a core from the decodes running meanwhile. On two
/// cores, Qwen2.5-0.5B: load to first decode 229 ms at nice 0, 139 ms at nice 10; while one
/// sequence generates without pause the copies are done after 2.2 s (nice 19: 4.3 s).
pub fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: a plain libc call; on Linux the nice value is per thread and `who` 0 is the
    // calling thread. A failure (a sandbox forbidding it) leaves the priority as it was.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 10);
    }
}

/// Blocks, in the calling thread, the signals that are not about its own faults, so that
/// the kernel hands them (Ctrl-C's SIGINT above all) to a thread that expects them. The
/// library's threads call it first: a SIGINT delivered to one of them would not interrupt the
/// main thread's blocking read, and Python, whose handler runs on the main thread, would
/// only see it after the next line of input.
pub fn block_async_signals() {
    #[cfg(unix)]
    // SAFETY: plain libc calls on a local, initialized signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for fault in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS] {
            libc::sigdelset(&mut set, fault);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Runs tasks of the current job until the counter passes n_tasks.
fn claim_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync), n_tasks: usize) {
    loop {
        let t = s.next.fetch_add(1, Ordering::Relaxed);
        if t >= n_tasks {
            return;
        }
        f(t);
    }
}

fn wait_for_workers(s: &Shared) {
    let mut spins = 0u32;
    while s.active.load(Ordering::Acquire) != 0 {
        std::hint::spin_loop();
        spins += 1;
        if spins % (SPIN_BATCH * 16) == 0 {
            // A worker may have been descheduled by a busy neighbour: let it run.
            std::thread::yield_now();
        }
    }
}

fn worker_loop(s: &Shared) {
    let mut seen = 0usize;
    loop {
        seen = wait_for_epoch(s, seen);
        if s.shutdown.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: the epoch was published after `job` was written (release/acquire).
        let job = unsafe { *s.job.get() };
        // SAFETY: the caller of `run` keeps the closure alive until `active` reaches zero.
        let f = unsafe { &*job.f };
        if catch_unwind(AssertUnwindSafe(|| claim_tasks(s, f, job.n_tasks))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.active.fetch_sub(1, Ordering::Release);
    }
}

/// Waits until the epoch differs from `seen`: spins for a while, then parks.
fn wait_for_epoch(s: &Shared, seen: usize) -> usize {
    let start = Instant::now();
    loop {
        for _ in 0..SPIN_BATCH {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                return e;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() > SPIN_BEFORE_PARK {
            break;
        }
    }
    let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
    s.sleeping.fetch_add(1, Ordering::SeqCst);
    let e = loop {
        let e = s.epoch.load(Ordering::SeqCst);
        if e != seen {
            break e;
        }
        g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
    };
    s.sleeping.fetch_sub(1, Ordering::SeqCst);
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_task_runs_exactly_once_over_many_jobs() {
        for n in [1, 2, 3, 5] {
            let pool = Threads::new(n);
            for job in 0..2000usize {
                let n_tasks = job % 37;
                let hits: Vec<AtomicU64> = (0..n_tasks).map(|_| AtomicU64::new(0)).collect();
                pool.run(n_tasks, |t| {
                    hits[t].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{n} threads, job {job}");
            }
        }
    }

    #[test]
    fn parked_workers_wake_for_the_next_job() {
        let pool = Threads::new(2);
        let sum = AtomicU64::new(0);
        pool.run(8, |t| {
            sum.fetch_add(t as u64, Ordering::Relaxed);
        });
        std::thread::sleep(SPIN_BEFORE_PARK * 4);
        pool.run(8, |t| {
            sum.fetch_add(t as u64, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 2 * 28);
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_pool_survives() {
        let pool = Threads::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(64, |t| assert!(t != 40, "task 40"))));
        assert!(r.is_err());
        let count = AtomicU64::new(0);
        pool.run(64, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 64);
    }

    /// Ctrl-C must reach the thread that waits for it (Python's main thread), not a worker.
    #[cfg(target_os = "linux")]
    #[test]
    fn workers_leave_sigint_to_the_other_threads() {
        let pool = Threads::new(3);
        pool.run(16, |_| {}); // the workers have started
        let blocked = |status: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with("SigBlk:"))?;
            u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok()
        };
        let sigint_bit = 1u64 << (libc::SIGINT - 1);
        let mut workers = 0;
        for task in std::fs::read_dir("/proc/self/task").expect("procfs") {
            let dir = task.expect("task entry").path();
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if name.trim_end().starts_with("ferrollama-") {
                let status = std::fs::read_to_string(dir.join("status")).expect("task status");
                assert_ne!(blocked(&status).expect("SigBlk line") & sigint_bit, 0, "{name} does not block SIGINT");
                workers += 1;
            }
        }
        assert!(workers >= 2, "found {workers} worker threads");
        // The calling thread keeps its mask.
        let me = std::fs::read_to_string("/proc/thread-self/status").expect("own status");
        assert_eq!(blocked(&me).expect("SigBlk line") & sigint_bit, 0);
    }
}

/// A pointer the tasks of one `Threads::run` write through, each to its own part (raw
/// pointers are neither Send nor Sync; the caller vouches for the disjointness).
pub struct SendPtr<T>(pub *mut T);

impl<T> SendPtr<T> {
    /// The pointer (a method, so that closures capture the wrapper, not its field).
    #[inline]
    pub fn get(&self) -> *mut T { self.0 }
}

// SAFETY: the tasks write disjoint parts of what the pointer points at (see the callers).
unsafe impl<T> Sync for SendPtr<T> {}
unsafe impl<T> Send for SendPtr<T> {}
