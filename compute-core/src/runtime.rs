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

    /// Every device of type `type_id`.
    fn enumerate_devices(type_id: u16) -> Vec<DeviceId>;

    /// Every device of every type.
    fn enumerate_all_devices() -> Vec<DeviceId>;
}
