//! Vulkan storage: one `VkDeviceMemory` block per storage block with one `VkBuffer` over all of
//! it; slices are sub-ranges of that buffer (descriptors at aligned offsets).

use std::sync::Arc;

use ash::vk;
use compute_core::backend::ServerKit;
use compute_core::memory::{MemoryPoolsConfig, MemoryUsage, PoolConfigError};
use compute_core::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use compute_core::{HostMemoryUsage, ServerError, ServerMemory, StreamId};
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
        let (offset, len) = handle.within(block.size)?;
        Some(VulkanResource {
            buffer: block.buffer,
            offset,
            size: len,
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

/// The memory role: the kit's defaults, with the resolve cache, the deferred block release and
/// the batch's recycling kept in step.
impl ServerMemory for crate::server::VulkanServer {
    fn memory_usage(&mut self, stream: StreamId) -> Result<MemoryUsage, ServerError> {
        // Release what completed submissions kept (released graphs' buffers among them).
        self.recorder.recycle();
        Ok(self.stream(stream)?.memory.memory_usage())
    }

    /// The host-visible staging memory of the device, which every transfer path takes from
    /// `Context::take_staging` — the linear chunks of writes and launch info (the open batch's,
    /// those of submissions in flight, a captured graph's), the readback buffers of reads and of
    /// collective rounds, the upload buffers of collective rounds — and the pool that keeps
    /// returned ones for reuse (at most 2 GiB; `memory_cleanup` on an idle device frees it).
    ///
    /// `bytes_reserved` is all of it, allocated and not freed; `bytes_in_use` the buffers not in
    /// the pool: those of the open batch, of submissions not yet recycled, of reads whose future
    /// has not finished, of collective rounds running, and of live graphs. Submissions that
    /// completed are recycled first, so after a sync (and with every read's future finished)
    /// only live graphs' chunks stay in use. Not counted: the `Bytes` a read returns (the
    /// caller's), the caller's data of a write (dropped after its copy into staging), and the
    /// device pools, host visible or not ([`memory_usage`](compute_core::ServerMemory::memory_usage)).
    fn host_memory_usage(&mut self) -> HostMemoryUsage {
        // Staging of completed submissions goes back to the pool here, on this thread.
        self.recorder.recycle();
        let (bytes_reserved, bytes_in_use) = self.ctx.staging_usage();
        HostMemoryUsage {
            bytes_reserved,
            bytes_in_use,
        }
    }

    fn memory_cleanup(&mut self, stream: StreamId) {
        self.forget_resolved();
        self.streams.cleanup(stream);
        self.drain_retired();
        self.recorder.recycle();
        if self.recorder.is_empty()
            && self
                .ctx
                .completed()
                .is_ok_and(|c| c >= self.ctx.last_submitted())
        {
            self.ctx.trim_staging();
        }
    }

    fn retire_stream(&mut self, stream: StreamId, _wait: bool) -> bool {
        if self.streams.get(stream).is_none() {
            return true;
        }
        // Submissions that use the stream's buffers keep their bindings (in-use slices) until
        // they complete; a released graph's bindings go at the recycle.
        self.recorder.recycle();
        // Dropping the state hands its blocks to the deferred release (freed once the
        // submissions so far have completed), drained here.
        if !self.streams.try_retire(stream, |_| true) {
            return false;
        }
        // A guard error still kept for the stream has no caller left to report it to.
        self.stream_errors.forget(stream);
        self.forget_resolved();
        self.drain_retired();
        true
    }

    fn configure_memory_pools(
        &mut self,
        config: &MemoryPoolsConfig,
        stream: StreamId,
    ) -> Result<bool, PoolConfigError> {
        self.forget_resolved();
        let rebuilt = self.streams.configure_memory_pools(config, stream);
        self.drain_retired();
        rebuilt
    }
}
