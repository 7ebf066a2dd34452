//! A bare logical device created exactly like the server's (same queue family, features and
//! extensions), for interop and for raw-ash baselines that isolate the runtime's overhead.

use std::sync::Arc;

use ash::vk;
use compute_core::ServerError;

use crate::compiler::SpirvCaps;
use crate::context::Context;
use crate::device::{VulkanDevice, physical_of};

/// A logical device of its own on the physical device behind a [`VulkanDevice`], with one
/// compute queue that only its holder submits to.
pub struct RawDevice {
    ctx: Arc<Context>,
    queue: vk::Queue,
}

impl RawDevice {
    /// Create the device (same features and extensions as the server's).
    ///
    /// # Errors
    /// The reason when Vulkan is unavailable, the device does not exist or creation fails.
    pub fn new(device: VulkanDevice) -> Result<Self, ServerError> {
        let (instance, physical) = physical_of(device).map_err(ServerError::Unavailable)?;
        let ctx = Arc::new(Context::new(instance, physical)?);
        // SAFETY: the context created queue 0 of its family.
        let queue = unsafe { ctx.device.get_device_queue(ctx.family, 0) };
        Ok(Self { ctx, queue })
    }

    /// The ash device.
    pub fn device(&self) -> &ash::Device {
        &self.ctx.device
    }

    /// The compute queue (queue 0 of [`family`](Self::family)); externally synchronised by the
    /// holder of this `RawDevice`.
    pub fn queue(&self) -> vk::Queue {
        self.queue
    }

    /// The queue family.
    pub fn family(&self) -> u32 {
        self.ctx.family
    }

    /// Memory type the server uses for storage blocks.
    pub fn storage_memory_type(&self) -> u32 {
        self.ctx.storage_type
    }

    /// Memory type the server uses for staging (host visible and coherent).
    pub fn staging_memory_type(&self) -> u32 {
        self.ctx.staging_type
    }

    /// What kernels compile for on this device.
    pub fn caps(&self) -> SpirvCaps {
        self.ctx.caps
    }

    /// The device's limits.
    pub fn limits(&self) -> vk::PhysicalDeviceLimits {
        *self.ctx.limits()
    }

    /// Whether the `synchronization2` feature is enabled (as on the server's device, whose
    /// barriers then use `vkCmdPipelineBarrier2`).
    pub fn synchronization2(&self) -> bool {
        self.ctx.sync2
    }

    /// VK_KHR_push_descriptor functions, when the device has them.
    pub fn push_descriptor(&self) -> Option<&ash::khr::push_descriptor::Device> {
        self.ctx.push_descriptor.as_ref()
    }
}
