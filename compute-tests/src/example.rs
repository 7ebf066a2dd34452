//! Backend choice for the examples, through the facade's `Backend::best()`:
//! `COMPUTE_BACKEND=cpu|wgpu|vulkan|cuda` names one (xtask's test-all runs each example on every
//! available backend that way); unset, the first available of cuda, vulkan, wgpu, cpu.

use compute_core::Runtime;

/// An example's work, generic over the runtime: `Err` with a message when a check fails.
pub trait Program {
    /// Run on runtime `R`.
    fn run<R: Runtime>(&self) -> Result<(), String>;
}

/// Run `program` on the backend `compute::Backend::best()` picks (`COMPUTE_BACKEND` names one)
/// and return the process exit code: 0 when it verified, 1 when a check failed or no backend
/// could run (with the reason on stderr).
pub fn run_example(program: &impl Program) -> i32 {
    struct Job<'p, P>(&'p P);
    impl<P: Program> compute::RunOn for Job<'_, P> {
        type Output = Result<(), String>;
        fn run<R: Runtime>(self, _client: compute_core::ComputeClient<R>) -> Self::Output {
            self.0.run::<R>()
        }
    }
    let choice = match compute::Backend::best() {
        Ok(choice) => choice,
        Err(e) => {
            eprintln!("no backend to run on: {e}");
            return 1;
        }
    };
    println!("backend: {choice}");
    match choice.run(Job(program)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            eprintln!("FAILED on {choice}: {e}");
            1
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// Deterministic inputs in [-1, 1) (xorshift), for the examples' checks.
pub fn inputs(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}
