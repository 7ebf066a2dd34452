//! The backends compiled into this build, for the probe and bench binaries.

use compute_core::Runtime;

/// A compiled-in backend: its name and availability.
pub struct BackendEntry {
    /// Backend name.
    pub name: &'static str,
    /// Availability probe.
    pub availability: fn() -> Result<(), String>,
}

/// Every backend enabled by this build's features.
#[allow(clippy::vec_init_then_push)]
pub fn enabled() -> Vec<BackendEntry> {
    #[allow(unused_mut)]
    let mut list = Vec::new();
    #[cfg(feature = "cpu")]
    list.push(BackendEntry {
        name: compute_cpu::CpuRuntime::name(),
        availability: compute_cpu::CpuRuntime::availability,
    });
    #[cfg(feature = "wgpu")]
    list.push(BackendEntry {
        name: compute_wgpu::WgpuRuntime::name(),
        availability: compute_wgpu::WgpuRuntime::availability,
    });
    #[cfg(feature = "cuda")]
    list.push(BackendEntry {
        name: compute_cuda::CudaRuntime::name(),
        availability: compute_cuda::CudaRuntime::availability,
    });
    list
}

/// Keep the `Runtime` import used when no backend feature is on.
#[allow(dead_code)]
fn _uses_runtime<R: Runtime>() {}
