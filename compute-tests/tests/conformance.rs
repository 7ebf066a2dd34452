//! The conformance suite, instantiated for every backend enabled by features.

#[cfg(feature = "cpu")]
compute_tests::conformance_suite!(cpu, compute::cpu::CpuRuntime);
#[cfg(feature = "wgpu")]
compute_tests::conformance_suite!(wgpu, compute::wgpu::WgpuRuntime);
#[cfg(feature = "vulkan")]
compute_tests::conformance_suite!(vulkan, compute::vulkan::VulkanRuntime);
#[cfg(feature = "cuda")]
compute_tests::conformance_suite!(cuda, compute::cuda::CudaRuntime);
