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
        name: compute::cpu::CpuRuntime::name(),
        availability: compute::cpu::CpuRuntime::availability,
    });
    #[cfg(feature = "wgpu")]
    list.push(BackendEntry {
        name: compute::wgpu::WgpuRuntime::name(),
        availability: compute::wgpu::WgpuRuntime::availability,
    });
    #[cfg(feature = "vulkan")]
    list.push(BackendEntry {
        name: compute::vulkan::VulkanRuntime::name(),
        availability: compute::vulkan::VulkanRuntime::availability,
    });
    #[cfg(feature = "cuda")]
    list.push(BackendEntry {
        name: compute::cuda::CudaRuntime::name(),
        availability: compute::cuda::CudaRuntime::availability,
    });
    list
}

/// Checks run after every conformance test of backend `name`: with
/// `COMPUTE_VULKAN_VALIDATION=1`, the Khronos validation layer must have reported nothing.
///
/// # Panics
/// Panics (fails the test) when a check fails.
pub fn after_test(name: &str, test: &str) {
    #[cfg(feature = "vulkan")]
    if name == "vulkan" && compute::vulkan::validation_enabled() {
        let count = compute::vulkan::validation_message_count();
        assert_eq!(
            count, 0,
            "vulkan::{test}: the validation layer reported {count} warnings/errors so far in this process (printed above)"
        );
    }
    let _ = (name, test);
}

/// Keep the `Runtime` import used when no backend feature is on.
#[allow(dead_code)]
fn _uses_runtime<R: Runtime>() {}
