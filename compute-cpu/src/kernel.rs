//! The CPU backend's kernel type.

/// A kernel for the CPU backend: a portable kernel and its id, cheap to clone (see
/// [`BackendKernel`](compute_core::kernel::BackendKernel)).
pub type CpuKernel = compute_core::kernel::BackendKernel<crate::CpuRuntime>;
