//! Host storage: aligned heap blocks.

use std::alloc::Layout;

use compute_core::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use compute_core::{ServerError, ServerMemory, StreamId};
use hashbrown::HashMap;

/// Alignment of CPU storage blocks and of slice offsets inside them.
pub const CPU_ALIGNMENT: u64 = 64;

/// A byte range of host memory, as kernels and copies see it.
#[derive(Debug, Clone, Copy)]
pub struct CpuResource {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a CpuResource is a plain address range; the runtime orders every access to it through
// stream order and cross-stream waits, and the block outlives every binding that resolved to it.
unsafe impl Send for CpuResource {}
// SAFETY: as above; shared references only expose the address.
unsafe impl Sync for CpuResource {}

impl CpuResource {
    /// Start of the range.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

struct Block {
    ptr: core::ptr::NonNull<u8>,
    layout: Layout,
}

/// Host storage: each block is one zero-initialised, 64-byte aligned heap allocation.
#[derive(Default)]
pub struct CpuStorage {
    blocks: HashMap<StorageId, Block>,
}

// SAFETY: the blocks are owned heap allocations; moving the map between threads is sound.
unsafe impl Send for CpuStorage {}

impl CpuStorage {
    /// An empty storage.
    pub fn new() -> Self {
        Self::default()
    }
}

impl ComputeStorage for CpuStorage {
    type Resource = CpuResource;

    fn alignment(&self) -> u64 {
        CPU_ALIGNMENT
    }

    fn get(&mut self, handle: &StorageHandle) -> Option<CpuResource> {
        let block = self.blocks.get(&handle.id)?;
        let (offset, len) = handle.within(block.layout.size() as u64)?;
        // SAFETY: offset + len is inside the block (checked by `within`).
        let ptr = unsafe { block.ptr.as_ptr().add(offset as usize) };
        Some(CpuResource {
            ptr,
            len: len as usize,
        })
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, ServerError> {
        let oom = |reason: String| ServerError::OutOfMemory {
            requested: size,
            reason,
        };
        let bytes = usize::try_from(size).map_err(|_| oom("exceeds the address space".into()))?;
        let layout = Layout::from_size_align(bytes.max(1), CPU_ALIGNMENT as usize)
            .map_err(|e| oom(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = core::ptr::NonNull::new(raw)
            .ok_or_else(|| oom("the host allocator refused the block".into()))?;
        let id = StorageId::new();
        self.blocks.insert(id, Block { ptr, layout });
        Ok(StorageHandle {
            id,
            utilization: StorageUtilization { offset: 0, size },
        })
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(block) = self.blocks.remove(&id) {
            // SAFETY: allocated in `alloc` with this layout; no binding uses it any more (contract).
            unsafe { std::alloc::dealloc(block.ptr.as_ptr(), block.layout) };
        }
    }

    fn block_count(&self) -> usize {
        self.blocks.len()
    }
}

impl Drop for CpuStorage {
    fn drop(&mut self) {
        let ids: Vec<StorageId> = self.blocks.keys().copied().collect();
        for id in ids {
            self.dealloc(id);
        }
    }
}

impl compute_core::storage::ResourceRange for CpuResource {
    fn range_len(&self) -> u64 {
        self.len as u64
    }

    fn range_start(&self) -> u64 {
        self.ptr as u64
    }
}

/// The memory role: the kit's defaults but for retirement. Device memory is host memory here, so
/// `host_memory_usage` keeps its default of zeros: writes copy straight into the pools and a read
/// copies into the `Bytes` it returns (the caller's); nothing is staged.
impl ServerMemory for crate::server::CpuServer {
    fn retire_stream(&mut self, stream: StreamId, wait: bool) -> bool {
        // Its queued work runs first (queued commands hold the bindings they use); other
        // streams' commands that wait for it hold its progress counter (an `Arc`), not the state.
        // Dropping the state frees its pools and stops its worker thread.
        self.streams.try_retire(stream, |state| {
            if wait {
                state.queue.wait_idle();
                true
            } else {
                state.queue.is_idle()
            }
        })
    }
}
