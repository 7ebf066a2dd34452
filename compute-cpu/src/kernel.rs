//! The CPU backend's kernel type.

use std::sync::Arc;

use compute_core::kernel::{KernelDefinition, KernelId};

/// A kernel for the CPU backend: a portable kernel and its id, cheap to clone.
///
/// Converting a [`KernelDefinition`] hashes it once; keep and clone the `CpuKernel` to launch the
/// same kernel many times without re-hashing.
#[derive(Debug, Clone)]
pub struct CpuKernel {
    pub(crate) definition: Arc<KernelDefinition>,
    pub(crate) id: KernelId,
}

impl CpuKernel {
    /// The kernel's stable id (the plan cache key).
    pub fn id(&self) -> KernelId {
        self.id
    }

    /// The portable kernel.
    pub fn definition(&self) -> &KernelDefinition {
        &self.definition
    }
}

impl From<KernelDefinition> for CpuKernel {
    fn from(definition: KernelDefinition) -> Self {
        let id = definition.id();
        Self {
            definition: Arc::new(definition),
            id,
        }
    }
}
