//! The Vulkan [`Runtime`].

use compute_core::{Runtime, ServerError};

use crate::device::{self, VULKAN_DEVICE_TYPE, VulkanDevice, device_count};
use crate::server::VulkanServer;

/// The Vulkan backend: one device per physical device, each with its own `VkDevice`.
#[derive(Debug, Clone, Copy)]
pub struct VulkanRuntime;

impl Runtime for VulkanRuntime {
    type Server = VulkanServer;
    type Device = VulkanDevice;
    const DEVICE_TYPE: u16 = VULKAN_DEVICE_TYPE;

    fn name() -> &'static str {
        "vulkan"
    }

    fn availability() -> Result<(), String> {
        device::availability()
    }

    fn create_server(device: &VulkanDevice) -> Result<VulkanServer, ServerError> {
        let (instance, physical) =
            device::physical_of(*device).map_err(ServerError::Unavailable)?;
        VulkanServer::new(*device, instance, physical)
    }

    fn device_count() -> u32 {
        device_count()
    }
}
