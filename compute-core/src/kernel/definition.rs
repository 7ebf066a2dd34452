//! A built, validated kernel and its launch checks.

use serde::{Deserialize, Serialize};

use super::hash::{KernelId, stable_hash};
use super::ir::Block;
use super::types::{BufferDecl, Item, LocalArrayDecl, ScalarDecl, SharedDecl, VarDecl};
use crate::error::LaunchError;
use crate::handle::{CubeCount, KernelArguments};
use crate::properties::HardwareProperties;

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
    /// buffer sizes a multiple of the buffer's item size, tensor metadata of equal shape and
    /// strides ranks.
    pub fn check_arguments(&self, arguments: &KernelArguments) -> Result<(), LaunchError> {
        let kernel = || self.name.clone();
        let count = |what, expected, found| LaunchError::ArgumentCount {
            kernel: kernel(),
            what,
            expected,
            found,
        };
        if arguments.buffers.len() != self.buffers.len() {
            return Err(count(
                "buffers",
                self.buffers.len(),
                arguments.buffers.len(),
            ));
        }
        if arguments.scalars.len() != self.scalars.len() {
            return Err(count(
                "scalars",
                self.scalars.len(),
                arguments.scalars.len(),
            ));
        }
        for (decl, arg) in self.buffers.iter().zip(&arguments.buffers) {
            let item = decl.item().size();
            let bytes = arg.binding.size();
            if bytes % item as u64 != 0 {
                return Err(LaunchError::BufferSize {
                    kernel: kernel(),
                    name: decl.name.clone(),
                    bytes,
                    item_size: item,
                });
            }
            if arg.shape.rank() != arg.strides.rank() {
                return Err(LaunchError::MetadataRank {
                    kernel: kernel(),
                    name: decl.name.clone(),
                    shape: arg.shape.0.clone(),
                    strides: arg.strides.0.clone(),
                });
            }
        }
        for (decl, value) in self.scalars.iter().zip(&arguments.scalars) {
            if value.elem_type() != decl.elem {
                return Err(LaunchError::ScalarType {
                    kernel: kernel(),
                    name: decl.name.clone(),
                    expected: decl.elem,
                    found: value.elem_type(),
                });
            }
        }
        Ok(())
    }
}

impl CubeCount {
    /// Check the count against the device: a static count within `max_cube_count` on every
    /// axis (a zero axis is an empty launch), a dynamic count bound to at least 12 bytes at an
    /// offset that is a multiple of 4.
    ///
    /// A dynamic count's values are only known when the launch runs; backends guard them there
    /// (a count over the limit runs as an empty dispatch and queues
    /// [`LaunchError::CubeCountTooLarge`] on the stream).
    pub fn check(&self, hardware: &HardwareProperties) -> Result<(), LaunchError> {
        match self {
            CubeCount::Static(x, y, z) => {
                let count = [*x, *y, *z];
                if count
                    .iter()
                    .zip(hardware.max_cube_count)
                    .any(|(&c, m)| c > m)
                {
                    return Err(LaunchError::CubeCountTooLarge {
                        count,
                        maximum: hardware.max_cube_count,
                    });
                }
                Ok(())
            }
            CubeCount::Dynamic(binding) => {
                let offset = binding.handle().slice_offset_start();
                let size = binding.size();
                if !offset.is_multiple_of(4) || size < 12 {
                    return Err(LaunchError::DynamicCount { offset, size });
                }
                Ok(())
            }
        }
    }
}
