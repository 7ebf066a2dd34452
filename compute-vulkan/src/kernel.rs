//! The Vulkan backend's kernel type.

/// A kernel for the Vulkan backend: a portable kernel and its id, cheap to clone (see
/// [`BackendKernel`](compute_core::kernel::BackendKernel)).
pub type VulkanKernel = compute_core::kernel::BackendKernel<crate::VulkanRuntime>;
