//! wgpu storage: one `wgpu::Buffer` per block, and the server's cache of resolved bindings.

use compute_core::memory::SliceId;
use compute_core::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use compute_core::{ServerError, StreamId};
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
        let end = handle
            .utilization
            .offset
            .checked_add(handle.utilization.size)?;
        if end > buffer.size() {
            return None;
        }
        Some(WgpuResource {
            buffer: buffer.clone(),
            offset: handle.utilization.offset,
            size: handle.utilization.size,
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
