//! What a device is and what it can do.

use serde::{Deserialize, Serialize};

use crate::elem::ElemType;
use crate::memory::MemoryDeviceProperties;
use crate::profile::TimingMethod;

/// The width of a vectorised load or store, in elements.
pub type VectorSize = u8;

/// Optional features of a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    /// Element types kernels may use on this device.
    pub elem_types: Vec<ElemType>,
    /// Plane (subgroup/warp) operations.
    pub plane_ops: bool,
    /// Atomic operations on global and shared memory.
    pub atomics: bool,
    /// Graph capture and replay.
    pub graphs: bool,
    /// Device-side timestamps for `profile`.
    pub device_timestamps: bool,
    /// Collectives between devices of this runtime.
    pub collectives: bool,
}

impl Features {
    /// Whether kernels may use `elem`.
    pub fn supports(&self, elem: ElemType) -> bool {
        self.elem_types.contains(&elem)
    }
}

/// The local-array budget per unit of backends without a documented hardware limit (64 KiB):
/// large enough for register tiles and small per-unit buffers, small enough that a cube of
/// units never needs more than a few tens of MiB of private memory.
pub const DEFAULT_MAX_PRIVATE_BYTES_PER_UNIT: u64 = 64 * 1024;

/// Limits of the device's compute units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HardwareProperties {
    /// Smallest plane (subgroup) size.
    pub plane_size_min: u32,
    /// Largest plane (subgroup) size.
    pub plane_size_max: u32,
    /// Most units in one cube.
    pub max_units_per_cube: u32,
    /// Largest cube dimension in x, y, z.
    pub max_cube_dim: [u32; 3],
    /// Largest cube count in x, y, z.
    pub max_cube_count: [u32; 3],
    /// Shared memory available to one cube, in bytes.
    pub max_shared_memory_bytes: u64,
    /// Number of compute units (SMs, cores).
    pub num_compute_units: u32,
    /// Widest useful load or store, in bytes.
    pub max_load_bytes: u32,
    /// Most bytes of local arrays one unit may declare (checked before a kernel compiles).
    pub max_private_bytes_per_unit: u64,
}

/// Everything a client can ask of a device: its name, limits, memory and features.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceProperties {
    /// Human-readable device name.
    pub name: String,
    /// Backend name (`cpu`, `wgpu`, `vulkan`, `cuda`).
    pub backend: String,
    /// Memory limits.
    pub memory: MemoryDeviceProperties,
    /// Total device memory in bytes, if known.
    pub memory_total: Option<u64>,
    /// Compute limits.
    pub hardware: HardwareProperties,
    /// Optional features.
    pub features: Features,
    /// How `profile` measures time on this device.
    pub timing: TimingMethod,
    /// Row alignment, in bytes, of pitched tensors (`None`: tensors are always contiguous).
    pub pitch_alignment: Option<usize>,
}
