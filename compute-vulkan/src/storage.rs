//! Vulkan storage: one `VkDeviceMemory` block per storage block with one `VkBuffer` over all of
//! it; slices are sub-ranges of that buffer (descriptors at aligned offsets).

use std::sync::Arc;

use ash::vk;
use compute_core::ServerError;
use compute_core::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use hashbrown::HashMap;

use crate::context::{Context, STORAGE_USAGE};

/// A byte range of one storage block's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VulkanResource {
    /// The buffer of the whole block.
    pub buffer: vk::Buffer,
    /// Start of the range in the buffer, in bytes.
    pub offset: u64,
    /// Length of the range in bytes.
    pub size: u64,
    /// Size of the whole buffer, in bytes.
    pub block_size: u64,
}

/// One block: a buffer bound to its own allocation.
#[derive(Debug)]
pub(crate) struct Block {
    pub(crate) buffer: vk::Buffer,
    pub(crate) memory: vk::DeviceMemory,
    pub(crate) size: u64,
}

/// Blocks released by the pools, to be destroyed once the work submitted before their release
/// has completed (the server tags and frees them).
pub(crate) type Retired = Arc<spin::Mutex<Vec<Block>>>;

/// Storage blocks of one Vulkan device.
pub struct VulkanStorage {
    ctx: Arc<Context>,
    alignment: u64,
    max_block: u64,
    blocks: HashMap<StorageId, Block>,
    retired: Retired,
}

impl VulkanStorage {
    pub(crate) fn new(ctx: Arc<Context>, alignment: u64, max_block: u64, retired: Retired) -> Self {
        Self {
            ctx,
            alignment,
            max_block,
            blocks: HashMap::new(),
            retired,
        }
    }
}

impl ComputeStorage for VulkanStorage {
    type Resource = VulkanResource;

    fn alignment(&self) -> u64 {
        self.alignment
    }

    fn get(&mut self, handle: &StorageHandle) -> Option<VulkanResource> {
        let block = self.blocks.get(&handle.id)?;
        let end = handle
            .utilization
            .offset
            .checked_add(handle.utilization.size)?;
        if end > block.size {
            return None;
        }
        Some(VulkanResource {
            buffer: block.buffer,
            offset: handle.utilization.offset,
            size: handle.utilization.size,
            block_size: block.size,
        })
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, ServerError> {
        if size > self.max_block {
            let limits = self.ctx.limits();
            return Err(ServerError::OutOfMemory {
                requested: size,
                reason: format!(
                    "larger than the Vulkan device's largest block of {} bytes (maxStorageBufferRange = {}, maxBufferSize = {}, maxMemoryAllocationSize = {})",
                    self.max_block,
                    limits.max_storage_buffer_range,
                    self.ctx.max_buffer_size,
                    self.ctx.max_memory_allocation_size
                ),
            });
        }
        // Blocks are padded to 4 bytes so that copies and fills of whole words stay inside.
        let padded = size.max(4).next_multiple_of(4);
        let (buffer, memory, _) =
            self.ctx
                .alloc_buffer(padded, STORAGE_USAGE, self.ctx.storage_type, false)?;
        let id = StorageId::new();
        self.blocks.insert(
            id,
            Block {
                buffer,
                memory,
                size: padded,
            },
        );
        Ok(StorageHandle {
            id,
            utilization: StorageUtilization { offset: 0, size },
        })
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(block) = self.blocks.remove(&id) {
            self.retired.lock().push(block);
        }
    }

    fn block_count(&self) -> usize {
        self.blocks.len()
    }
}

impl Drop for VulkanStorage {
    fn drop(&mut self) {
        // Live blocks of a dropped stream state go through the same deferred release.
        let mut retired = self.retired.lock();
        retired.extend(self.blocks.drain().map(|(_, b)| b));
    }
}

impl compute_core::storage::ResourceRange for VulkanResource {
    fn range_len(&self) -> u64 {
        self.size
    }

    fn range_start(&self) -> u64 {
        self.offset
    }
}
