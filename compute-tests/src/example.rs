//! Backend choice for the examples: `COMPUTE_BACKEND=cpu|wgpu|vulkan|cuda` names one (xtask's
//! test-all runs each example on every available backend that way); unset, the first available
//! of cuda, vulkan, wgpu, cpu among those compiled in.

use compute_core::Runtime;

/// An example's work, generic over the runtime: `Err` with a message when a check fails.
pub trait Program {
    /// Run on runtime `R`.
    fn run<R: Runtime>(&self) -> Result<(), String>;
}

/// The env var naming the backend an example runs on.
pub const BACKEND_ENV: &str = "COMPUTE_BACKEND";

/// Run `program` on the chosen backend and return the process exit code: 0 when it verified, 1
/// when a check failed or the backend is not available (with the reason on stderr).
pub fn run_example(program: &impl Program) -> i32 {
    let wanted = std::env::var(BACKEND_ENV).ok().filter(|s| !s.is_empty());
    let mut tried: Vec<String> = Vec::new();
    macro_rules! try_backend {
        ($feature:literal, $runtime:ty) => {
            #[cfg(feature = $feature)]
            if wanted.as_deref().is_none_or(|w| w == $feature) {
                match <$runtime as Runtime>::availability() {
                    Ok(()) => {
                        return match program.run::<$runtime>() {
                            Ok(()) => 0,
                            Err(e) => {
                                eprintln!("FAILED on {}: {e}", $feature);
                                1
                            }
                        };
                    }
                    Err(reason) => tried.push(format!("{}: {reason}", $feature)),
                }
            }
        };
    }
    try_backend!("cuda", compute_cuda::CudaRuntime);
    try_backend!("vulkan", compute_vulkan::VulkanRuntime);
    try_backend!("wgpu", compute_wgpu::WgpuRuntime);
    try_backend!("cpu", compute_cpu::CpuRuntime);
    match wanted {
        Some(w) if tried.is_empty() => {
            eprintln!("backend `{w}` is not compiled into this build (enable its feature)")
        }
        _ => eprintln!("no backend available ({})", tried.join("; ")),
    }
    1
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
