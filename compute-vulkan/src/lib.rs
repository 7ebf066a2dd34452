//! # compute-vulkan
//!
//! The native Vulkan backend of the compute runtime, on ash with the loader opened at run time
//! (a machine without a loader, driver or device gets a clean `Err` from
//! [`VulkanRuntime`]'s `availability`, never a panic).
//!
//! - Devices: one per physical device (`COMPUTE_VULKAN_DEVICES` overrides the count with logical
//!   devices over them, round robin, to exercise multi-device paths on one GPU).
//! - Memory: compute-core's pools over `vkAllocateMemory` blocks, one `VkBuffer` per block and
//!   kernels bound to sub-ranges; device-local memory on discrete GPUs, the host-visible unified
//!   heap on integrated and CPU devices; blocks bounded by `maxStorageBufferRange`,
//!   `maxBufferSize` and `maxMemoryAllocationSize`.
//! - Kernels: the portable IR compiled to SPIR-V ([`compiler`]) for the features enabled on the
//!   device; pipelines cached per kernel and bounds-check mode, and a `VkPipelineCache` on disk
//!   (`COMPUTE_VULKAN_CACHE_DIR`, else the user cache dir), keyed by device UUID and driver
//!   version.
//! - Execution: logical streams on one compute queue; commands are collected per batch (flushed
//!   on sync, read and a threshold) and a submit thread records them into command buffers and
//!   submits them with a timeline value reserved when the batch closed (the driver's recording
//!   cost leaves the issuing thread; waits may start at once); barriers name only the stages
//!   involved; push descriptors; reads and syncs block in `vkWaitSemaphores`; timestamp queries
//!   for `profile`; graphs as recorded commands appended to the batch at each replay; collectives through host staging.
//! - Validation: `COMPUTE_VULKAN_VALIDATION=1` enables `VK_LAYER_KHRONOS_validation` with a
//!   debug messenger; [`validation_message_count`] counts its warnings and errors.
//!
//! ```no_run
//! use compute_core::{Bytes, ComputeClient};
//! use compute_vulkan::{VulkanDevice, VulkanRuntime};
//!
//! let client = ComputeClient::<VulkanRuntime>::load(&VulkanDevice::default());
//! let handle = client.create(Bytes::from_elems(vec![1u32, 2, 3]));
//! assert_eq!(client.read_one(handle).unwrap().to_elems::<u32>(), vec![1, 2, 3]);
//! ```

mod batch;
mod collective;
pub mod compiler;
mod context;
mod descriptors;
mod device;
mod graph;
mod guard;
mod kernel;
mod launch;
mod ops;
mod profile;
mod raw;
mod runtime;
mod server;
mod storage;
mod transfer;

pub use ash;
pub use compiler::pipeline::{CACHE_DIR_ENV, PipelineCounts, pipeline_counts};
pub use device::{
    DEVICES_ENV, VALIDATION_ENV, VULKAN_DEVICE_TYPE, VulkanDevice, availability, device_count,
    physical_device_count, raw_instance, validation_enabled, validation_message_count,
};
pub use kernel::VulkanKernel;
pub use raw::RawDevice;
pub use runtime::VulkanRuntime;
pub use server::{VulkanInfo, VulkanServer, elem_types};
pub use storage::{VulkanResource, VulkanStorage};
