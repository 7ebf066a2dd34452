//! The CUDA backend's kernel type.

use std::sync::Arc;

use compute_core::kernel::{KernelDefinition, KernelId};

/// A kernel for the CUDA backend: a portable kernel and its id, cheap to clone.
///
/// Converting a [`KernelDefinition`] hashes it once; keep and clone the `CudaKernel` to launch the
/// same kernel many times without re-hashing (the id is the module cache key).
#[derive(Debug, Clone)]
pub struct CudaKernel {
    pub(crate) definition: Arc<KernelDefinition>,
    pub(crate) id: KernelId,
}

impl CudaKernel {
    /// The kernel's stable id.
    pub fn id(&self) -> KernelId {
        self.id
    }

    /// The portable kernel.
    pub fn definition(&self) -> &KernelDefinition {
        &self.definition
    }
}

impl From<KernelDefinition> for CudaKernel {
    fn from(definition: KernelDefinition) -> Self {
        let id = definition.id();
        Self {
            definition: Arc::new(definition),
            id,
        }
    }
}
