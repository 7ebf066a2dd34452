//! Each stream's memory, capture state and backend queue.

use hashbrown::HashMap;

use crate::error::ServerError;
use crate::handle::{Binding, Handle, HandleOwner};
use crate::layout::{MemoryLayout, MemoryLayoutDescriptor, pack_tensors};
use crate::memory::{
    MemoryAllocationMode, MemoryManagement, MemoryPoolsConfig, MemoryUsage, PoolConfigError,
};
use crate::properties::DeviceProperties;
use crate::storage::ComputeStorage;
use crate::stream::StreamId;

/// One stream of a server: its memory pools, the capture running on it, and what the backend
/// keeps per stream (`Q`: a driver stream, a worker thread, or nothing).
pub struct StreamEntry<S: ComputeStorage, Q, C> {
    /// The stream's pools; every handle created on the stream lives in them.
    pub memory: MemoryManagement<S>,
    /// What the running capture recorded so far, `None` when none runs.
    pub capture: Option<C>,
    /// The backend's own per-stream state.
    pub queue: Q,
}

/// How a backend lays out the memory of a `create` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateRules {
    /// Where each tensor of one `create` starts: a multiple of this.
    pub alignment: u64,
    /// The row pitch alignment of 2-D and higher tensors (`None`: rows are packed).
    pub pitch_alignment: Option<usize>,
}

impl<S: ComputeStorage, Q, C> StreamEntry<S, Q, C> {
    /// `create` on this stream (`id`) of server `owner`: the tensors packed into one
    /// allocation after `rules`, persistent while a capture runs.
    ///
    /// # Errors
    /// A layout error, or the pools' allocation error ([`ServerError::BufferTooLarge`] above the
    /// device's `max_page_size`).
    pub fn create(
        &mut self,
        owner: HandleOwner,
        id: StreamId,
        descriptors: &[MemoryLayoutDescriptor],
        rules: &CreateRules,
    ) -> Result<Vec<MemoryLayout>, ServerError> {
        let packed = pack_tensors(descriptors, rules.alignment, rules.pitch_alignment)?;
        let base = self.create_buffer(owner, id, packed.total())?;
        Ok(packed.layouts(&base, descriptors))
    }

    /// `create_buffer` on this stream (`id`) of server `owner`: `size` bytes, no layout.
    ///
    /// # Errors
    /// The pools' allocation error ([`ServerError::BufferTooLarge`] above the device's
    /// `max_page_size`).
    pub fn create_buffer(
        &mut self,
        owner: HandleOwner,
        id: StreamId,
        size: u64,
    ) -> Result<Handle, ServerError> {
        let slice = self.memory.reserve_for(size, self.capture.is_some())?;
        Ok(Handle::new(slice, owner, id))
    }

    /// `graph_prepare` on this stream (`id`): refused while a capture runs, then persistent
    /// memory.
    ///
    /// # Errors
    /// [`CaptureError::Running`](crate::CaptureError::Running).
    pub fn prepare_graph(&mut self, id: StreamId) -> Result<(), ServerError> {
        if self.capture.is_some() {
            return Err(ServerError::capture_running("graph_prepare", id));
        }
        self.memory.mode(MemoryAllocationMode::Persistent);
        Ok(())
    }

    /// Start recording `capture` on this stream (`id`).
    ///
    /// # Errors
    /// [`CaptureError::Running`](crate::CaptureError::Running) when one runs already.
    pub fn begin_capture(&mut self, id: StreamId, capture: C) -> Result<(), ServerError> {
        if self.capture.is_some() {
            return Err(ServerError::capture_running("start_capture", id));
        }
        self.capture = Some(capture);
        Ok(())
    }

    /// End the capture of this stream (`id`): what it recorded, and automatic memory
    /// again.
    ///
    /// # Errors
    /// [`CaptureError::NotStarted`](crate::CaptureError::NotStarted) when none runs.
    pub fn end_capture(&mut self, id: StreamId) -> Result<C, ServerError> {
        let capture = self
            .capture
            .take()
            .ok_or_else(|| ServerError::capture_not_started(id))?;
        self.memory.mode(MemoryAllocationMode::Auto);
        Ok(capture)
    }
}

/// The streams of one server.
///
/// Writes the rules every backend shares once: a stream is created on first use with the pools
/// of the current [`MemoryPoolsConfig`]; a binding resolves only on its own server, to memory its
/// stream still holds; no `graph_prepare`, capture, replay or profile while a capture runs on
/// the stream; memory is persistent from `graph_prepare` (or the capture's start) until the
/// capture ends.
pub struct Streams<S: ComputeStorage, Q, C> {
    entries: HashMap<StreamId, StreamEntry<S, Q, C>>,
    owner: HandleOwner,
    properties: DeviceProperties,
    pool_config: MemoryPoolsConfig,
}

impl<S: ComputeStorage, Q, C> Streams<S, Q, C> {
    /// No streams yet, for the server `owner` of a device described by `properties` (its memory
    /// limits size the pools).
    pub fn new(owner: HandleOwner, properties: DeviceProperties) -> Self {
        Self {
            entries: HashMap::new(),
            owner,
            properties,
            pool_config: MemoryPoolsConfig::default(),
        }
    }

    /// The server the handles of these streams belong to.
    pub fn owner(&self) -> HandleOwner {
        self.owner
    }

    /// The properties of the server's device.
    pub fn properties(&self) -> &DeviceProperties {
        &self.properties
    }

    /// The stream `id`, created with `create`'s storage and queue when it does not exist yet.
    ///
    /// # Errors
    /// The error of `create`, or [`ServerError::PoolConfig`] when the pools cannot be built.
    pub fn get_or_create(
        &mut self,
        id: StreamId,
        create: impl FnOnce() -> Result<(S, Q), ServerError>,
    ) -> Result<&mut StreamEntry<S, Q, C>, ServerError> {
        if !self.entries.contains_key(&id) {
            let (storage, queue) = create()?;
            let memory =
                MemoryManagement::new(storage, &self.pool_config, self.properties.memory.clone())
                    .map_err(ServerError::from)?;
            self.entries.insert(
                id,
                StreamEntry {
                    memory,
                    capture: None,
                    queue,
                },
            );
        }
        Ok(self
            .entries
            .get_mut(&id)
            .unwrap_or_else(|| unreachable!("inserted just above")))
    }

    /// The stream `id`, if it exists.
    pub fn get(&self, id: StreamId) -> Option<&StreamEntry<S, Q, C>> {
        self.entries.get(&id)
    }

    /// The stream `id`, if it exists.
    pub fn get_mut(&mut self, id: StreamId) -> Option<&mut StreamEntry<S, Q, C>> {
        self.entries.get_mut(&id)
    }

    /// Every stream's id.
    pub fn ids(&self) -> Vec<StreamId> {
        self.entries.keys().copied().collect()
    }

    /// Every stream.
    pub fn iter(&self) -> impl Iterator<Item = (StreamId, &StreamEntry<S, Q, C>)> {
        self.entries.iter().map(|(id, e)| (*id, e))
    }

    /// Every stream.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (StreamId, &mut StreamEntry<S, Q, C>)> {
        self.entries.iter_mut().map(|(id, e)| (*id, e))
    }

    /// How many streams exist.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no stream exists.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Take every stream out (a server's teardown).
    pub fn drain(&mut self) -> impl Iterator<Item = (StreamId, StreamEntry<S, Q, C>)> + '_ {
        self.entries.drain()
    }

    /// Whether a capture runs on `id`.
    pub fn is_capturing(&self, id: StreamId) -> bool {
        self.entries.get(&id).is_some_and(|e| e.capture.is_some())
    }

    /// Whether a capture runs on any stream.
    pub fn any_capturing(&self) -> bool {
        self.entries.values().any(|e| e.capture.is_some())
    }

    /// The capture rule: `what` may not run while a capture runs on `id`.
    ///
    /// # Errors
    /// [`CaptureError::Running`](crate::CaptureError::Running) naming `what` and the stream.
    pub fn ensure_not_capturing(&self, id: StreamId, what: &str) -> Result<(), ServerError> {
        if self.is_capturing(id) {
            return Err(ServerError::capture_running(what, id));
        }
        Ok(())
    }

    /// The resource behind `binding`: its slice's range in its stream's pools.
    ///
    /// # Errors
    /// The owner check's error for a handle of another server or device
    /// ([`Binding::check_owner`]),
    /// [`ServerError::NoMemory`] when its memory does not exist (a failed allocation's handle).
    pub fn resolve(&mut self, binding: &Binding) -> Result<S::Resource, ServerError> {
        binding.check_owner(self.owner)?;
        let handle = binding.handle();
        self.entries
            .get_mut(&handle.stream())
            .and_then(|e| {
                e.memory.get_resource(
                    handle.memory().id(),
                    handle.slice_offset_start(),
                    handle.slice_offset_end(),
                )
            })
            .ok_or(ServerError::NoMemory)
    }

    /// The memory figures of `id` (zero for a stream not created yet).
    pub fn memory_usage(&self, id: StreamId) -> MemoryUsage {
        self.entries
            .get(&id)
            .map(|e| e.memory.memory_usage())
            .unwrap_or_default()
    }

    /// Release the free memory of `id`'s pools.
    pub fn cleanup(&mut self, id: StreamId) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.memory.cleanup(true);
        }
    }

    /// Check `config` against the device, keep it for streams created from now on, and rebuild
    /// `id`'s pools with it (`Ok(true)` when the layout is in effect now: the pools were rebuilt,
    /// or the stream does not exist yet).
    ///
    /// # Errors
    /// The [`PoolConfigError`] of an invalid layout; nothing changes then.
    pub fn configure_memory_pools(
        &mut self,
        config: &MemoryPoolsConfig,
        id: StreamId,
    ) -> Result<bool, PoolConfigError> {
        config.resolve(&self.properties.memory)?;
        self.pool_config = config.clone();
        match self.entries.get_mut(&id) {
            Some(e) => e.memory.reconfigure(config),
            // Created from now on with this layout: in effect at once.
            None => Ok(true),
        }
    }

    /// The pools layout streams are created with.
    pub fn pool_config(&self) -> &MemoryPoolsConfig {
        &self.pool_config
    }

    /// Retire `id` when it may go: not capturing, `idle` (the backend's own check, which may
    /// wait for the stream's work) says its work is done, and no handle of it is alive. Dropping
    /// the entry frees its pools and its queue. `true` when the stream is gone (or never was).
    pub fn try_retire(
        &mut self,
        id: StreamId,
        idle: impl FnOnce(&mut StreamEntry<S, Q, C>) -> bool,
    ) -> bool {
        let Some(entry) = self.entries.get_mut(&id) else {
            return true;
        };
        if entry.capture.is_some() || !idle(entry) || entry.memory.memory_usage().number_allocs > 0
        {
            return false;
        }
        self.entries.remove(&id);
        true
    }
}
