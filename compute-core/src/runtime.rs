//! [`Runtime`]: a backend as generic code sees it.

use crate::device::{Device, DeviceId};
use crate::error::ServerError;
use crate::server::ComputeServer;

/// A backend: its server and device types, device enumeration and availability.
///
/// Framework code is written once, generic over `R: Runtime`, and runs on every backend.
pub trait Runtime: Send + Sync + Sized + 'static {
    /// The backend's server.
    type Server: ComputeServer;
    /// The backend's device type.
    type Device: Device + Default;

    /// Short backend name: `cpu`, `wgpu`, `vulkan` or `cuda`.
    fn name() -> &'static str;

    /// Whether the backend's driver is present and has at least one device; the reason if not.
    fn availability() -> Result<(), String>;

    /// Start the server of `device`.
    fn create_server(device: &Self::Device) -> Result<Self::Server, ServerError>;

    /// The type id of the backend's devices (`DeviceId::type_id`).
    const DEVICE_TYPE: u16;

    /// How many devices the backend has (its devices' indices are `0..device_count()`).
    fn device_count() -> u32;

    /// Every device of type `type_id`: the backend's devices for its [`DEVICE_TYPE`](Self::DEVICE_TYPE),
    /// none for another type.
    fn enumerate_devices(type_id: u16) -> Vec<DeviceId> {
        if type_id != Self::DEVICE_TYPE {
            return Vec::new();
        }
        (0..Self::device_count())
            .map(|i| DeviceId::new(Self::DEVICE_TYPE, i))
            .collect()
    }

    /// Every device of every type (a backend has devices of one type).
    fn enumerate_all_devices() -> Vec<DeviceId> {
        Self::enumerate_devices(Self::DEVICE_TYPE)
    }
}
