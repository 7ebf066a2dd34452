//! Device storage: blocks straight from `cuMemAlloc`, carved by compute-core's pools.

use compute_core::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use compute_core::{ServerError, StreamId};
use cudarc::driver::{result, sys};
use hashbrown::HashMap;

use crate::server::CudaServer;

/// Alignment of slice offsets inside a block: more than any vector load needs, and what
/// `cuMemAlloc` itself guarantees.
pub const CUDA_ALIGNMENT: u64 = 256;

/// A byte range of device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaResource {
    /// Device address of the first byte.
    pub ptr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Device storage of one stream's memory manager: each block is one `cuMemAlloc`.
#[derive(Debug, Default)]
pub struct CudaStorage {
    blocks: HashMap<StorageId, (u64, u64)>,
}

impl CudaStorage {
    /// An empty storage. The device's context must be current when blocks are allocated.
    pub fn new() -> Self {
        Self::default()
    }
}

impl ComputeStorage for CudaStorage {
    type Resource = CudaResource;

    fn alignment(&self) -> u64 {
        CUDA_ALIGNMENT
    }

    fn get(&mut self, handle: &StorageHandle) -> Option<CudaResource> {
        let &(base, size) = self.blocks.get(&handle.id)?;
        let end = handle
            .utilization
            .offset
            .checked_add(handle.utilization.size)?;
        if end > size {
            return None;
        }
        Some(CudaResource {
            ptr: base + handle.utilization.offset,
            len: handle.utilization.size,
        })
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, ServerError> {
        let bytes = usize::try_from(size.max(1)).map_err(|_| ServerError::OutOfMemory {
            requested: size,
            reason: "exceeds the address space".into(),
        })?;
        // SAFETY: the server made the device's context current before calling into the pools.
        // Mapped by its result code: only CUDA_ERROR_OUT_OF_MEMORY is out of memory (the pools
        // then release free pages and retry); anything else is the driver's error.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|e| match e.0 {
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => ServerError::OutOfMemory {
                requested: size,
                reason: format!(
                    "cuMemAlloc refused the block: {}",
                    crate::driver::describe(e)
                ),
            },
            _ => crate::driver::driver_error("cuMemAlloc", e),
        })?;
        let id = StorageId::new();
        self.blocks.insert(id, (ptr, size));
        Ok(StorageHandle {
            id,
            utilization: StorageUtilization { offset: 0, size },
        })
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some((ptr, _)) = self.blocks.remove(&id) {
            // SAFETY: allocated by `alloc`; cuMemFree waits for work still using it, and the pools
            // only release blocks no live handle refers to.
            crate::driver::released_raw("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) });
        }
    }

    fn block_count(&self) -> usize {
        self.blocks.len()
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        let ids: Vec<StorageId> = self.blocks.keys().copied().collect();
        for id in ids {
            self.dealloc(id);
        }
    }
}

impl compute_core::storage::ResourceRange for CudaResource {
    fn range_len(&self) -> u64 {
        self.len
    }

    fn range_start(&self) -> u64 {
        self.ptr
    }
}

impl CudaServer {
    /// `memory_cleanup`: release the staging rings and the free memory of `stream`'s pools, put
    /// off while any stream of the device captures.
    pub(crate) fn cleanup_memory(&mut self, stream: StreamId) {
        self.settle_quietly();
        if self.context.bind().is_err() {
            return;
        }
        // Freeing device or pinned memory synchronises the device implicitly, which invalidates
        // a capture running on any stream of it: while one runs, the cleanup waits for a later
        // call (what it would free stays pooled and reusable meanwhile).
        if self.streams.any_capturing() {
            return;
        }
        self.staging.release(&mut self.events);
        self.small_staging.release(&mut self.events);
        if let Some(state) = self.streams.get_mut(stream)
            && state.capture.is_none()
        {
            if let Err(e) = state.queue.wait_idle(&mut self.events) {
                crate::driver::record_release_error(e);
            }
            self.streams.cleanup(stream);
        }
    }
}
