//! Logical CPU devices.

use compute_core::{Device, DeviceId};

/// The device type id of CPU devices.
pub const CPU_DEVICE_TYPE: u16 = 0;

/// How many logical CPU devices exist when `COMPUTE_CPU_DEVICES` is not set.
pub const DEFAULT_DEVICE_COUNT: u32 = 4;

/// A logical CPU device. Several exist (see [`device_count`]) so that transfers between clients
/// and collectives can be exercised without a GPU; they share the host's cores and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CpuDevice {
    /// Index of the logical device.
    pub index: u32,
}

impl CpuDevice {
    /// The logical device with the given index.
    pub const fn new(index: u32) -> Self {
        Self { index }
    }
}

impl Device for CpuDevice {
    fn to_id(&self) -> DeviceId {
        DeviceId::new(CPU_DEVICE_TYPE, self.index)
    }

    fn from_id(id: DeviceId) -> Self {
        Self { index: id.index_id }
    }
}

/// Number of logical CPU devices: `COMPUTE_CPU_DEVICES` if set to a positive number, else
/// [`DEFAULT_DEVICE_COUNT`].
pub fn device_count() -> u32 {
    compute_core::env::positive::<u32>("COMPUTE_CPU_DEVICES").unwrap_or(DEFAULT_DEVICE_COUNT)
}

/// Total host memory in bytes, from `/proc/meminfo` where it exists.
pub fn host_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
