//! A built, validated kernel and its launch checks.

use std::sync::{Arc, OnceLock};

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
/// [`id`](Self::id) is a stable hash for compile caches, computed on first use and then shared by
/// the definition and every clone of it (made before or after), so converting the same definition
/// into a backend kernel twice (`def.clone().into()`) hashes it once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelDefinition {
    /// The id once computed, shared between clones (not part of the hash, the comparison or the
    /// serialised form). A definition is never changed after `build`, so the id stays valid.
    #[serde(skip)]
    pub(crate) id_cache: IdCache,
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

/// The shared, lazily computed id of a [`KernelDefinition`] and its clones.
#[derive(Clone, Default)]
pub(crate) struct IdCache(Arc<OnceLock<KernelId>>);

impl IdCache {
    /// Whether the id has been computed (for tests).
    #[cfg(test)]
    pub(crate) fn is_set(&self) -> bool {
        self.0.get().is_some()
    }
}

impl core::fmt::Debug for IdCache {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0.get() {
            Some(id) => write!(f, "{id:?}"),
            None => f.write_str("(not computed)"),
        }
    }
}

/// Every cache compares equal: equality of definitions is equality of their contents.
impl PartialEq for IdCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
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
    ///
    /// Saturates at `u32::MAX` for dimensions whose product overflows (such a kernel fails
    /// [`validate`](Self::validate)).
    pub fn cube_size(&self) -> u32 {
        self.cube_dim.iter().fold(1u32, |n, &d| n.saturating_mul(d))
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
    ///
    /// Hashed on the first call and kept: later calls, on this definition or any clone of it,
    /// return the kept id.
    pub fn id(&self) -> KernelId {
        *self.id_cache.0.get_or_init(|| stable_hash(self))
    }

    /// Check a launch's arguments against the parameters: buffer count, scalar count and types,
    /// buffer sizes a multiple of the buffer's item size, tensor metadata of equal shape and
    /// strides ranks.
    #[inline]
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
            // Item sizes are almost always powers of two: a mask instead of a division on the
            // launch path.
            let rest = if item.is_power_of_two() {
                bytes & (item as u64 - 1)
            } else {
                bytes % item as u64
            };
            if rest != 0 {
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
    #[inline]
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
