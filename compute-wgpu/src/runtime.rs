//! The wgpu [`Runtime`].

use compute_core::{Runtime, ServerError};

use crate::device::{self, WGPU_DEVICE_TYPE, WgpuDevice, device_count};
use crate::server::WgpuServer;

/// The wgpu backend: one logical device per adapter (at least
/// [`MIN_LOGICAL_DEVICES`](crate::MIN_LOGICAL_DEVICES)), each with its own `wgpu::Device`.
#[derive(Debug, Clone, Copy)]
pub struct WgpuRuntime;

impl Runtime for WgpuRuntime {
    type Server = WgpuServer;
    type Device = WgpuDevice;
    const DEVICE_TYPE: u16 = WGPU_DEVICE_TYPE;

    fn name() -> &'static str {
        "wgpu"
    }

    fn availability() -> Result<(), String> {
        device::availability()
    }

    fn create_server(device: &WgpuDevice) -> Result<WgpuServer, ServerError> {
        let (_instance, adapter) = device::adapter_of(*device).map_err(ServerError::Unavailable)?;
        WgpuServer::new(*device, &adapter)
    }

    fn device_count() -> u32 {
        device_count()
    }
}
