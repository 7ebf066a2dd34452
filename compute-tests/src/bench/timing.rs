//! Timing helpers: best of several repetitions, each long enough to be above timer noise.

use std::time::{Duration, Instant};

/// Seconds per call of `f`, the best of `reps` repetitions of `iters` calls each.
pub fn best_per_call(reps: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        for _ in 0..iters {
            f();
        }
        best = best.min(start.elapsed().as_secs_f64() / iters as f64);
    }
    best
}

/// Best seconds of each closure over `rounds` rounds that run them one after the other, so that
/// host noise that comes and goes (a busy neighbour of the VM) hits ours and the baseline alike.
pub fn best_alternating(rounds: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    let mut best = vec![f64::INFINITY; fs.len()];
    for _ in 0..rounds {
        for (f, b) in fs.iter_mut().zip(best.iter_mut()) {
            let start = Instant::now();
            f();
            *b = b.min(start.elapsed().as_secs_f64());
        }
    }
    best
}

/// How many calls of `f` fit in about `target`, measured with one probe call (at least 1).
pub fn calibrate(target: Duration, mut f: impl FnMut()) -> usize {
    let start = Instant::now();
    f();
    let once = start.elapsed().as_secs_f64().max(1e-9);
    ((target.as_secs_f64() / once) as usize).clamp(1, 1_000_000)
}

/// Print a progress line for a long benchmark step.
pub fn progress(what: &str) {
    eprintln!("bench: {what} ...");
}
