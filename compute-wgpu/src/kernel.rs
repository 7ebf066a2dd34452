//! The wgpu backend's kernel type.

/// A kernel for the wgpu backend: a portable kernel and its id, cheap to clone (see
/// [`BackendKernel`](compute_core::kernel::BackendKernel)).
pub type WgpuKernel = compute_core::kernel::BackendKernel<crate::WgpuRuntime>;
