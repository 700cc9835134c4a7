//! The calling thread's CPU time, shared by the timing examples (`#[path]`-included: a file in a
//! subdirectory without main.rs is not an example of its own).

/// The calling thread's CPU time in seconds: on one thread, what the kernel cost, whatever
/// else shares the cores (wall time counts the time the thread waits for a core).
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a plain libc call filling a local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
