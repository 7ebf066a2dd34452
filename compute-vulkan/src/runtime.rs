//! The Vulkan [`Runtime`].

use compute_core::{DeviceId, Runtime, ServerError};

use crate::device::{self, VULKAN_DEVICE_TYPE, VulkanDevice, device_count};
use crate::server::VulkanServer;

/// The Vulkan backend: one device per physical device, each with its own `VkDevice`.
#[derive(Debug, Clone, Copy)]
pub struct VulkanRuntime;

impl Runtime for VulkanRuntime {
    type Server = VulkanServer;
    type Device = VulkanDevice;

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

    fn enumerate_devices(type_id: u16) -> Vec<DeviceId> {
        if type_id != VULKAN_DEVICE_TYPE {
            return Vec::new();
        }
        (0..device_count())
            .map(|i| DeviceId::new(VULKAN_DEVICE_TYPE, i))
            .collect()
    }

    fn enumerate_all_devices() -> Vec<DeviceId> {
        Self::enumerate_devices(VULKAN_DEVICE_TYPE)
    }
}
