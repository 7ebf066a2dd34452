//! Device storage: blocks straight from `cuMemAlloc`, carved by compute-core's pools.

use compute_core::backend::ServerKit;
use compute_core::handle::Handle;
use compute_core::memory::{MemoryPoolsConfig, MemoryUsage, PoolConfigError};
use compute_core::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use compute_core::{
    Bytes, HostMemoryUsage, MemoryLayout, MemoryLayoutDescriptor, ServerError, ServerMemory,
    StreamId,
};
use cudarc::driver::{result, sys};
use hashbrown::HashMap;

use crate::driver::Raw;
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
        let (offset, len) = handle.within(size)?;
        Some(CudaResource {
            ptr: base + offset,
            len,
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

/// The memory role: the kit's rules after the copy team has settled, with the context bound,
/// the staging rings and the completed work's retirement kept in step.
impl ServerMemory for CudaServer {
    fn create(
        &mut self,
        descriptors: &[MemoryLayoutDescriptor],
        stream: StreamId,
    ) -> Result<Vec<MemoryLayout>, ServerError> {
        // The pools may hand back blocks to the driver: the DMAs into them must be enqueued.
        self.settle()?;
        self.kit_create(descriptors, stream)
    }

    fn create_buffer(&mut self, size: u64, stream: StreamId) -> Result<Handle, ServerError> {
        // As for `create`: the DMAs into blocks the pools may hand back must be enqueued.
        self.settle()?;
        self.kit_create_buffer(size, stream)
    }

    fn memory_usage(&mut self, stream: StreamId) -> Result<MemoryUsage, ServerError> {
        self.context.bind()?;
        if let Some(state) = self.streams.get_mut(stream) {
            // What completed work kept alive (a dropped graph's buffers, say) is free by now:
            // report it so, without waiting for a later call to retire it.
            state.queue.retire_completed(&mut self.events);
        }
        self.stream(stream)?;
        Ok(self.streams.memory_usage(stream))
    }

    /// [`ServerMemory::host_memory_usage`](compute_core::ServerMemory::host_memory_usage): the
    /// pinned host memory of this server's `PinnedPool` (its own: no other server shares it),
    /// in whole size classes as `cuMemHostAlloc` allocated them. Counted: the slots of the two
    /// staging rings (`StagingRing`, `staging` and `small_staging`), the pinned staging of
    /// strided pageable writes, the buffers of reads whose future has not finished, and the free
    /// buffers the pool keeps for reuse (at most 2 GiB; freed when the pool drops). Not counted:
    /// what a read returned (a pinned buffer the caller holds; it is counted again, as free,
    /// once dropped back into the pool), bytes the `staging` call moved into pinned memory and
    /// buffers taken with `PinnedPool::take` (the caller's too, even while a write copies from
    /// them), the driver's own staging of pageable copies, and the device pools
    /// ([`memory_usage`](compute_core::ServerMemory::memory_usage)).
    ///
    /// `bytes_reserved` is all the server's pinned memory: what it holds plus the free buffers.
    /// `bytes_in_use` is what it holds less the ring slots no copy may still read from (checked
    /// with `cuEventQuery` / `cuStreamQuery`, without blocking): ring slots still being copied
    /// into or read by a DMA, strided write staging whose copy is not seen complete yet, and
    /// reads not collected. Completed work on streams that do not capture is retired first (when
    /// no stream captures), so after a sync of every stream, with every read's future finished,
    /// nothing is in use.
    fn host_memory_usage(&mut self) -> HostMemoryUsage {
        let bound = self.context.bind().is_ok();
        // Dropping what completed work kept alive may free pinned memory, which would
        // invalidate a capture running on any stream of the device: not while one runs.
        if bound && !self.streams.any_capturing() {
            for (_, state) in self.streams.iter_mut() {
                state.queue.retire_completed(&mut self.events);
            }
        }
        let pool = self.pinned.usage();
        let idle = if bound {
            let streams = &self.streams;
            let capturing = |raw: Raw<sys::CUstream>| {
                streams
                    .iter()
                    .any(|(_, state)| state.capture.is_some() && state.queue.raw.0 == raw.0)
            };
            // Issues are made in order: once the last is done, every piece's DMA is enqueued.
            let issued = self
                .issuing
                .as_ref()
                .is_none_or(|(issue, _)| issue.is_done());
            // Small writes are copied and enqueued on the server's thread.
            self.staging.idle_bytes(issued, &capturing)
                + self.small_staging.idle_bytes(true, &capturing)
        } else {
            0
        };
        debug_assert!(
            self.staging.reserved_bytes() + self.small_staging.reserved_bytes() <= pool.held,
            "the staging rings' slots are the server's pinned buffers"
        );
        HostMemoryUsage {
            bytes_reserved: pool.cached + pool.held,
            bytes_in_use: pool.held.saturating_sub(idle),
        }
    }

    /// `memory_cleanup`: release the staging rings and the free memory of `stream`'s pools, put
    /// off while any stream of the device captures.
    fn memory_cleanup(&mut self, stream: StreamId) {
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

    /// `retire_stream`: drop the stream when it is idle (waited for, with `wait`), not capturing
    /// and holding no live handle.
    fn retire_stream(&mut self, stream: StreamId, wait: bool) -> bool {
        let Some(raw) = self.streams.get(stream).map(|s| s.queue.raw) else {
            return true;
        };
        if self.context.bind().is_err() {
            return false;
        }
        // A capturing stream is not retired, and not even queried: a status query of a
        // capturing stream invalidates its capture.
        if self.streams.is_capturing(stream) {
            return false;
        }
        if wait {
            // The copy team's driver calls may target the stream.
            self.settle_quietly();
        } else {
            // Without waiting: nothing handed to the copy team, and the stream idle.
            if self.issuing.is_some() {
                return false;
            }
            // SAFETY: the stream is alive (owned by its state).
            let idle = unsafe { sys::cuStreamQuery(raw.0) } == sys::CUresult::CUDA_SUCCESS;
            if !idle {
                return false;
            }
        }
        let (staging, small_staging, events) =
            (&mut self.staging, &mut self.small_staging, &mut self.events);
        // Retired when not capturing (checked again), idle and holding no live handle. Dropping
        // the state frees its pools' device memory (the stream is idle by then) and synchronizes
        // and destroys the CUDA stream and its events.
        self.streams.try_retire(stream, |state| {
            // A staging slot whose copies ran on the stream gets its closing event now (the
            // stream is destroyed below); then its work completes and releases what it kept
            // alive.
            staging.close_on(state.queue.raw, events).is_ok()
                && small_staging.close_on(state.queue.raw, events).is_ok()
                && state.queue.wait_idle(events).is_ok()
        })
    }

    fn configure_memory_pools(
        &mut self,
        config: &MemoryPoolsConfig,
        stream: StreamId,
    ) -> Result<bool, PoolConfigError> {
        config.resolve(&self.streams.properties().memory)?;
        self.settle_quietly();
        // Binds the context (the rebuild frees blocks) and creates the stream if needed; the
        // layout is kept for later streams even when that fails.
        let created = self.stream(stream).is_ok();
        let applied = self.streams.configure_memory_pools(config, stream)?;
        Ok(created && applied)
    }

    fn staging(&mut self, bytes: &mut [&mut Bytes], file_only: bool) -> Result<(), ServerError> {
        self.stage_bytes(bytes, file_only)
    }
}
