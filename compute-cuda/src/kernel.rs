//! The CUDA backend's kernel type.

/// A kernel for the CUDA backend: a portable kernel and its id, cheap to clone (see
/// [`BackendKernel`](compute_core::kernel::BackendKernel)).
pub type CudaKernel = compute_core::kernel::BackendKernel<crate::CudaRuntime>;
