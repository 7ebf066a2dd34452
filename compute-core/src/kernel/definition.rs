//! A built, validated kernel and its launch checks.

use serde::{Deserialize, Serialize};

use super::hash::{KernelId, stable_hash};
use super::ir::Block;
use super::scalar::ScalarValue;
use super::types::{BufferDecl, Item, LocalArrayDecl, ScalarDecl, SharedDecl, VarDecl};
use crate::error::ServerError;

/// A portable kernel, as [`KernelBuilder::build`](super::KernelBuilder::build) returns it.
///
/// Every backend compiles this type. It is plain data: clone it, compare it, serialise it; its
/// [`id`](Self::id) is a stable hash for compile caches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelDefinition {
    pub(crate) name: String,
    pub(crate) cube_dim: [u32; 3],
    pub(crate) buffers: Vec<BufferDecl>,
    pub(crate) scalars: Vec<ScalarDecl>,
    pub(crate) shared: Vec<SharedDecl>,
    pub(crate) locals: Vec<LocalArrayDecl>,
    pub(crate) vars: Vec<VarDecl>,
    pub(crate) values: Vec<Item>,
    pub(crate) body: Block,
}

/// What a launch binds to one buffer parameter, for [`KernelDefinition::check_launch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferLaunchInfo {
    /// Size of the bound memory in bytes.
    pub len_bytes: u64,
    /// Rank of the attached tensor metadata (0 for a plain buffer).
    pub rank: usize,
}

impl KernelDefinition {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Units per cube in x, y, z.
    pub fn cube_dim(&self) -> [u32; 3] {
        self.cube_dim
    }

    /// Number of units per cube.
    pub fn cube_size(&self) -> u32 {
        self.cube_dim.iter().product()
    }

    /// Buffer parameters, in binding order.
    pub fn buffers(&self) -> &[BufferDecl] {
        &self.buffers
    }

    /// Scalar parameters, in argument order.
    pub fn scalars(&self) -> &[ScalarDecl] {
        &self.scalars
    }

    /// Shared memory arrays.
    pub fn shared(&self) -> &[SharedDecl] {
        &self.shared
    }

    /// Local arrays.
    pub fn local_arrays(&self) -> &[LocalArrayDecl] {
        &self.locals
    }

    /// Mutable variables.
    pub fn vars(&self) -> &[VarDecl] {
        &self.vars
    }

    /// The type of every SSA value, indexed by [`ValueId`](super::ValueId).
    pub fn values(&self) -> &[Item] {
        &self.values
    }

    /// The kernel body.
    pub fn body(&self) -> &Block {
        &self.body
    }

    /// Bytes of shared memory one cube uses (each array rounded up to 16 bytes).
    pub fn shared_memory_bytes(&self) -> usize {
        self.shared
            .iter()
            .map(|s| s.size_bytes().next_multiple_of(16))
            .sum()
    }

    /// The kernel's stable id: the same kernel has the same id in every process, on every platform.
    pub fn id(&self) -> KernelId {
        stable_hash(self)
    }

    /// Check a launch's arguments against the parameters: buffer count, scalar count and types,
    /// buffer sizes a multiple of the buffer's item size.
    pub fn check_launch(
        &self,
        buffers: &[BufferLaunchInfo],
        scalars: &[ScalarValue],
    ) -> Result<(), ServerError> {
        let invalid = |msg: String| Err(ServerError::InvalidArgument(msg));
        if buffers.len() != self.buffers.len() {
            return invalid(format!(
                "kernel `{}` takes {} buffers, the launch binds {}",
                self.name,
                self.buffers.len(),
                buffers.len()
            ));
        }
        if scalars.len() != self.scalars.len() {
            return invalid(format!(
                "kernel `{}` takes {} scalars, the launch passes {}",
                self.name,
                self.scalars.len(),
                scalars.len()
            ));
        }
        for (decl, info) in self.buffers.iter().zip(buffers) {
            let item = decl.item().size() as u64;
            if info.len_bytes % item != 0 {
                return invalid(format!(
                    "buffer `{}` of kernel `{}` holds {} bytes, not a multiple of its item {} ({item} bytes)",
                    decl.name,
                    self.name,
                    info.len_bytes,
                    decl.item()
                ));
            }
        }
        for (decl, value) in self.scalars.iter().zip(scalars) {
            if value.elem_type() != decl.elem {
                return invalid(format!(
                    "scalar `{}` of kernel `{}` is {}, the launch passes {}",
                    decl.name,
                    self.name,
                    decl.elem,
                    value.elem_type()
                ));
            }
        }
        Ok(())
    }
}
