//! Raw device storage: the allocator a backend gives to [`MemoryManagement`](crate::memory::MemoryManagement).

use core::sync::atomic::{AtomicU64, Ordering};

use crate::error::ServerError;

/// Identifies one block of storage allocated from the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageId(pub u64);

impl StorageId {
    /// A fresh, process-wide unique id.
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        StorageId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl Default for StorageId {
    fn default() -> Self {
        Self::new()
    }
}

/// A byte range inside one storage block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StorageUtilization {
    /// Offset of the range from the start of the block, in bytes.
    pub offset: u64,
    /// Length of the range in bytes.
    pub size: u64,
}

/// A range of one storage block: what a slice of a pool resolves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StorageHandle {
    /// The block.
    pub id: StorageId,
    /// The range inside the block.
    pub utilization: StorageUtilization,
}

impl StorageHandle {
    /// The range's offset and size when it lies inside its block of `block_size` bytes (what a
    /// storage's `get` checks before it hands the range out), `None` when it does not.
    #[inline]
    pub fn within(&self, block_size: u64) -> Option<(u64, u64)> {
        let (offset, size) = (self.utilization.offset, self.utilization.size);
        (offset.checked_add(size)? <= block_size).then_some((offset, size))
    }

    /// Offset of the range from the start of its block.
    pub fn offset(&self) -> u64 {
        self.utilization.offset
    }

    /// Size of the range in bytes.
    #[inline]
    pub fn size(&self) -> u64 {
        self.utilization.size
    }

    /// The sub-range `[offset_start, size - offset_end)` of this range.
    ///
    /// Offsets past the range are clamped, so the result is always inside `self`.
    #[inline]
    pub fn offset_range(&self, offset_start: u64, offset_end: u64) -> StorageHandle {
        let size = self.utilization.size;
        let start = offset_start.min(size);
        let end = size.saturating_sub(offset_end).max(start);
        StorageHandle {
            id: self.id,
            utilization: StorageUtilization {
                offset: self.utilization.offset + start,
                size: end - start,
            },
        }
    }
}

/// The byte range a [`ComputeStorage::Resource`] stands for, in terms every backend can give:
/// what `get_resource` returns can be checked against the handle it came from.
pub trait ResourceRange {
    /// Length of the range in bytes (the handle's size).
    fn range_len(&self) -> u64;
    /// Position of the range's first byte: the address on backends with flat addresses (a host
    /// pointer on the CPU, a device pointer on CUDA), the offset in the block's buffer on wgpu and
    /// Vulkan. Two ranges of one block are as far apart as their handles' offsets.
    fn range_start(&self) -> u64;
}

/// A storage handle is its own range (the resource of test storages and of backends that
/// resolve to block offsets).
impl ResourceRange for StorageHandle {
    fn range_len(&self) -> u64 {
        self.size()
    }

    fn range_start(&self) -> u64 {
        self.offset()
    }
}

/// The raw allocator of a backend: big blocks straight from the driver.
///
/// Implementations do no pooling; [`MemoryManagement`](crate::memory::MemoryManagement) carves the
/// blocks into slices. Every call is made with the server lock held, from one thread at a time.
pub trait ComputeStorage: Send + 'static {
    /// What a byte range resolves to on this backend (a pointer and length, a buffer and offset).
    type Resource: Send + Clone + core::fmt::Debug + ResourceRange;

    /// Alignment, in bytes, that every slice offset inside a block must have.
    fn alignment(&self) -> u64;

    /// Resolve a range of a live block to a backend resource.
    ///
    /// Returns `None` when the block was deallocated.
    fn get(&mut self, handle: &StorageHandle) -> Option<Self::Resource>;

    /// Allocate one block of exactly `size` bytes from the driver.
    ///
    /// A driver refusal (out of memory, a size over the device limit) is an `Err`, never a panic.
    fn alloc(&mut self, size: u64) -> Result<StorageHandle, ServerError>;

    /// Release a block. The caller guarantees no pending work still uses it.
    fn dealloc(&mut self, id: StorageId);

    /// Number of blocks currently allocated from the driver.
    fn block_count(&self) -> usize;
}

/// A storage resource handed to the user by [`ComputeClient::get_resource`](crate::ComputeClient::get_resource).
///
/// It keeps the allocation it came from alive for as long as it lives, so the resource stays valid.
#[derive(Debug)]
pub struct ManagedResource<Res> {
    resource: Res,
    _keep_alive: crate::handle::Handle,
}

impl<Res> ManagedResource<Res> {
    /// Wrap a resource, keeping `handle`'s allocation alive with it.
    pub fn new(resource: Res, handle: crate::handle::Handle) -> Self {
        Self {
            resource,
            _keep_alive: handle,
        }
    }

    /// The backend resource.
    pub fn resource(&self) -> &Res {
        &self.resource
    }
}
