//! The Vulkan backend's kernel type.

use std::sync::Arc;

use compute_core::kernel::{KernelDefinition, KernelId};

/// A kernel for the Vulkan backend: a portable kernel and its id, cheap to clone.
///
/// Converting a [`KernelDefinition`] hashes it once; keep and clone the `VulkanKernel` to launch the
/// same kernel many times without re-hashing. Compiled pipelines are cached per server by id.
#[derive(Debug, Clone)]
pub struct VulkanKernel {
    pub(crate) definition: Arc<KernelDefinition>,
    pub(crate) id: KernelId,
}

impl VulkanKernel {
    /// The kernel's stable id (the pipeline cache key).
    pub fn id(&self) -> KernelId {
        self.id
    }

    /// The portable kernel.
    pub fn definition(&self) -> &KernelDefinition {
        &self.definition
    }
}

impl From<KernelDefinition> for VulkanKernel {
    fn from(definition: KernelDefinition) -> Self {
        let id = definition.id();
        Self {
            definition: Arc::new(definition),
            id,
        }
    }
}
