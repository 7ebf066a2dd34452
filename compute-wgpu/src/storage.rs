//! wgpu storage: one `wgpu::Buffer` per block, and the server's cache of resolved bindings.

use compute_core::memory::SliceId;
use compute_core::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use compute_core::{HostMemoryUsage, ServerError, ServerMemory, StreamId};
use hashbrown::HashMap;

/// Usages of every storage block: bound to kernels, copied from and to, and read as an indirect
/// dispatch count.
pub const STORAGE_USAGES: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST)
    .union(wgpu::BufferUsages::INDIRECT);

/// A byte range of one wgpu buffer.
#[derive(Debug, Clone)]
pub struct WgpuResource {
    /// The buffer (a whole storage block).
    pub buffer: wgpu::Buffer,
    /// Start of the range in the buffer, in bytes.
    pub offset: u64,
    /// Length of the range in bytes.
    pub size: u64,
}

/// Storage blocks of one wgpu device.
pub struct WgpuStorage {
    device: wgpu::Device,
    alignment: u64,
    max_buffer_size: u64,
    buffers: HashMap<StorageId, wgpu::Buffer>,
    freed: Option<crate::batch::FreedBuffers>,
}

impl WgpuStorage {
    /// Storage on `device`, slices aligned to `alignment`, blocks of at most `max_buffer_size`.
    pub fn new(device: wgpu::Device, alignment: u64, max_buffer_size: u64) -> Self {
        Self {
            device,
            alignment,
            max_buffer_size,
            buffers: HashMap::new(),
            freed: None,
        }
    }

    /// Report dropped blocks to `freed` (the server's bind group cache lets go of them).
    pub(crate) fn with_freed(mut self, freed: crate::batch::FreedBuffers) -> Self {
        self.freed = Some(freed);
        self
    }
}

impl ComputeStorage for WgpuStorage {
    type Resource = WgpuResource;

    fn alignment(&self) -> u64 {
        self.alignment
    }

    fn get(&mut self, handle: &StorageHandle) -> Option<WgpuResource> {
        let buffer = self.buffers.get(&handle.id)?;
        let (offset, len) = handle.within(buffer.size())?;
        Some(WgpuResource {
            buffer: buffer.clone(),
            offset,
            size: len,
        })
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, ServerError> {
        if size > self.max_buffer_size {
            return Err(ServerError::OutOfMemory {
                requested: size,
                reason: format!(
                    "larger than the wgpu device's max_buffer_size ({} bytes)",
                    self.max_buffer_size
                ),
            });
        }
        // wgpu buffers are zero-initialised; sizes are padded to the copy alignment.
        let padded = size.max(4).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("compute-wgpu block"),
            size: padded,
            usage: STORAGE_USAGES,
            mapped_at_creation: false,
        });
        if let Some(error) = compute_core::block_on(scope.pop()) {
            return Err(ServerError::OutOfMemory {
                requested: size,
                reason: format!("the wgpu device refused a buffer of {padded} bytes: {error}"),
            });
        }
        let id = StorageId::new();
        self.buffers.insert(id, buffer);
        Ok(StorageHandle {
            id,
            utilization: StorageUtilization { offset: 0, size },
        })
    }

    fn dealloc(&mut self, id: StorageId) {
        // Dropping (not destroying) the buffer: wgpu keeps it alive until submitted work that
        // uses it has finished.
        if let (Some(buffer), Some(freed)) = (self.buffers.remove(&id), &self.freed) {
            freed.lock().push(buffer);
        }
    }

    fn block_count(&self) -> usize {
        self.buffers.len()
    }
}

impl compute_core::storage::ResourceRange for WgpuResource {
    fn range_len(&self) -> u64 {
        self.size
    }

    fn range_start(&self) -> u64 {
        self.offset
    }
}

/// What a binding resolves to: a slice (ids are never reused) and the sub-range the handle views.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResolveKey {
    pub(crate) stream: StreamId,
    pub(crate) slice: SliceId,
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// Resources of the last few bindings resolved, so that launches repeating their arguments skip
/// the pool lookups. Sound because a slice keeps its storage for its whole life, slice ids are
/// never reused, and a binding presented to the server keeps its slice alive. Cleared at every
/// submission, so a cached block is not held past the batch that uses it.
#[derive(Default)]
pub(crate) struct ResolveCache {
    entries: [Option<(ResolveKey, WgpuResource)>; 4],
    next: usize,
}

impl ResolveCache {
    pub(crate) fn get(&self, key: &ResolveKey) -> Option<WgpuResource> {
        self.entries
            .iter()
            .flatten()
            .find(|(k, _)| k == key)
            .map(|(_, r)| r.clone())
    }

    pub(crate) fn insert(&mut self, key: ResolveKey, resource: WgpuResource) {
        self.entries[self.next] = Some((key, resource));
        self.next = (self.next + 1) % self.entries.len();
    }

    pub(crate) fn clear(&mut self) {
        if self.entries.iter().any(Option::is_some) {
            self.entries = Default::default();
        }
    }
}

/// The memory role: the kit's defaults but for cleanup, retirement and the host memory count.
impl ServerMemory for crate::server::WgpuServer {
    fn memory_cleanup(&mut self, stream: StreamId) {
        self.streams.cleanup(stream);
        // A stopped submit thread has nothing cached left to prune.
        let _ = self.submitter.prune();
    }

    fn retire_stream(&mut self, stream: StreamId, _wait: bool) -> bool {
        // Every stream records into the one queue: work still queued that uses the stream's
        // buffers holds their bindings (in-use slices) or wgpu's own reference to the buffer,
        // which wgpu keeps until that work has run. So no wait: a stream with no live handle is
        // idle as far as its pools go.
        // Dropping the state drops its pools' buffers; a guard error still kept for the stream
        // has no caller left to report it to.
        let retired = self.streams.try_retire(stream, |_| true);
        if retired {
            self.stream_errors.forget(stream);
        }
        retired
    }

    /// `host_memory_usage`:
    /// the bytes of the server's live readback buffers (`Staging`, `MAP_READ` memory the
    /// driver keeps host visible) — those of reads whose future has not finished (one per
    /// non-empty descriptor), of the indirect guard's status read by a sync or read, of the
    /// partly covered words a write merges, of timestamp profiles, and of collective rounds
    /// (dropped on their worker thread) — from their creation to their drop.
    ///
    /// The crate keeps no readback buffer beyond the transfer it serves (no pool), so
    /// `bytes_reserved` equals `bytes_in_use`, and both are 0 once every read, profile and
    /// collective round has finished. wgpu may free the memory of a dropped buffer only once
    /// the GPU is done with a copy into it; that lag is not ours to see.
    ///
    /// Not counted: the staging of `queue.write_buffer` (wgpu's own internal staging belt, which
    /// every write, the launch info and the collectives' outputs go through; this crate
    /// allocates no `MAP_WRITE` buffer), the caller's `Bytes` of a write (held until the submit
    /// thread copied them into `write_buffer`), the `Bytes` a read returns (the caller's), the
    /// device-local timestamp resolve buffers, launch info and indirect count buffers, and the
    /// device pools ([`memory_usage`](compute_core::ServerMemory::memory_usage)).
    fn host_memory_usage(&mut self) -> HostMemoryUsage {
        let bytes = self.staging_bytes.get();
        HostMemoryUsage {
            bytes_reserved: bytes,
            bytes_in_use: bytes,
        }
    }
}
