//! [`BackendKernel`]: the kernel type every backend launches.

use core::marker::PhantomData;
use std::sync::Arc;

use super::{KernelDefinition, KernelId};

/// A portable kernel kept for launching on the servers of backend `B` (its runtime type): the
/// definition and its stable id, cheap to clone.
///
/// Converting a [`KernelDefinition`] hashes it once; keep and clone the kernel to launch the same
/// kernel many times without re-hashing (the id is the key of the backend's compile cache). `B`
/// only keeps one backend's kernels apart from another's.
pub struct BackendKernel<B> {
    definition: Arc<KernelDefinition>,
    id: KernelId,
    backend: PhantomData<fn() -> B>,
}

impl<B> BackendKernel<B> {
    /// The kernel's stable id (the compile cache key).
    pub fn id(&self) -> KernelId {
        self.id
    }

    /// The portable kernel.
    pub fn definition(&self) -> &KernelDefinition {
        &self.definition
    }
}

impl<B> From<KernelDefinition> for BackendKernel<B> {
    fn from(definition: KernelDefinition) -> Self {
        let id = definition.id();
        Self {
            definition: Arc::new(definition),
            id,
            backend: PhantomData,
        }
    }
}

impl<B> Clone for BackendKernel<B> {
    fn clone(&self) -> Self {
        Self {
            definition: self.definition.clone(),
            id: self.id,
            backend: PhantomData,
        }
    }
}

impl<B> core::fmt::Debug for BackendKernel<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BackendKernel")
            .field("definition", &self.definition)
            .field("id", &self.id)
            .finish()
    }
}
