//! CUDA devices, by driver ordinal.

use compute_core::{Device, DeviceId};

/// The device type id of CUDA GPUs.
pub const CUDA_DEVICE_TYPE: u16 = 1;

/// A CUDA GPU, by its driver ordinal (`CUDA_VISIBLE_DEVICES` order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CudaDevice {
    /// Driver ordinal of the GPU.
    pub index: u32,
}

impl CudaDevice {
    /// The GPU with driver ordinal `index`.
    pub const fn new(index: u32) -> Self {
        Self { index }
    }
}

impl Device for CudaDevice {
    fn to_id(&self) -> DeviceId {
        DeviceId::new(CUDA_DEVICE_TYPE, self.index)
    }

    fn from_id(id: DeviceId) -> Self {
        Self { index: id.index_id }
    }
}
