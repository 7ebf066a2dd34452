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

/// Best seconds of `run` over `reps` rounds, each given a fresh `prepare()` made before its
/// clock starts (inputs that `run` consumes, such as owned host buffers to upload).
pub fn best_prepared<T>(
    reps: usize,
    mut prepare: impl FnMut() -> T,
    mut run: impl FnMut(T),
) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let input = prepare();
        let start = Instant::now();
        run(input);
        best = best.min(start.elapsed().as_secs_f64());
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

/// Seconds per launch of `kernel`, a vec4 copy kernel of 256 units per cube (input, output),
/// over `src` copied into a fresh buffer: `reps` launches back to back with one wait at the end
/// (as the CUDA row does), best of 5: the kernel's bandwidth, not the launch+sync latency.
pub fn copy_kernel_time<R: compute_core::Runtime>(
    client: &compute_core::ComputeClient<R>,
    kernel: <R::Server as compute_core::server::ComputeServer>::Kernel,
    src: compute_core::Bytes,
    reps: usize,
) -> f64 {
    use compute_core::{CubeCount, KernelArguments, block_on};
    let size = src.len();
    let input = client.create(src);
    let output = client.empty(size);
    let count = CubeCount::cover(size / 16, 256);
    let args = KernelArguments::new()
        .buffer(input.clone().binding())
        .buffer(output.clone().binding());
    // SAFETY: the launch covers size / 16 vec4 items of both buffers exactly (the callers pass
    // a multiple of 4096 bytes).
    let copy = || unsafe { client.launch_unchecked(kernel.clone(), count.clone(), args.clone()) };
    copy();
    block_on(client.sync()).expect("sync");
    best_per_call(5, 1, || {
        for _ in 0..reps {
            copy();
        }
        block_on(client.sync()).expect("sync");
    }) / reps as f64
}
