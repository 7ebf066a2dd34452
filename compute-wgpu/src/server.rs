//! The wgpu server: logical streams over the device's one queue, pools over wgpu buffers, a
//! pipeline cache, batched submissions, graphs, timestamp profiles and host-staged collectives.
//!
//! Ordering: every stream records into the server's one batch, in issue order, and batches are
//! submitted to the one queue in order, so work keeps the order it was issued in, on a stream and
//! across streams. `queue.write_buffer` lands before the command buffers of the *next* submission,
//! so a write first submits the batch recorded before it.
//!
//! This file holds the server's struct, its construction, the per-stream helpers (stream,
//! resolve, capture check) and the [`ServerKit`]. Each role trait is implemented in the file of
//! its role: [`storage`](crate::storage) (`ServerMemory`), [`transfer`](crate::transfer)
//! (`ServerTransfer`), [`launch`](crate::launch) (the `ComputeServer` core calls: pipelines,
//! bindings, launch checks, the indirect guard, `get_resource`, flush and sync), [`graph`](crate::graph)
//! (`ServerGraph`), [`profile`](crate::profile) (`ServerProfile`: timestamps),
//! [`collective`](crate::collective) (`ServerCollective`: all-reduce) and
//! [`submitter`](crate::submitter) (the batch limit, submissions and sync). The stream, memory and
//! capture rules are compute-core's [backend kit](compute_core::backend).

use std::collections::VecDeque;
use std::sync::Arc;

use compute_core::backend::{CreateRules, Graphs, KernelCache, ServerKit, StreamEntry, Streams};
use compute_core::collective::GroupScope;
use compute_core::future::DynFut;
use compute_core::handle::HandleOwner;
use compute_core::profile::ProfileTable;
use compute_core::{Binding, ServerError, StreamId};

use crate::batch::{Batch, Dispatch, Encoder, FreedBuffers, GUARD_STATUS_BYTES, Pipeline};
use crate::collective::Collectives;
use crate::compiler::ShaderCapabilities;
use crate::device::{WgpuDevice, properties};
use crate::graph::WgpuGraph;
use crate::poller::Poller;
use crate::storage::{ResolveCache, ResolveKey, WgpuResource, WgpuStorage};
use crate::submitter::{BatchLimit, Submitter};
use crate::transfer::StagingBytes;

/// Errors raised outside a call (validation errors wgpu reports late, failed polls), waiting for
/// the next flush, sync or read.
pub(crate) type ErrorQueue = Arc<spin::Mutex<VecDeque<ServerError>>>;

/// Backend information of a wgpu server.
#[derive(Debug, Clone)]
pub struct WgpuInfo {
    /// The logical device.
    pub device: WgpuDevice,
    /// The adapter it runs on.
    pub adapter: wgpu::AdapterInfo,
    /// The limits the device was requested with (the adapter's own).
    pub limits: wgpu::Limits,
    /// The features the device was requested with (the adapter's, less experimental ones).
    pub features: wgpu::Features,
}

/// A stream: its pools and its capture (the launches recorded so far). Every stream records
/// into the server's one batch and queue: nothing of its own besides.
pub(crate) type StreamState = StreamEntry<WgpuStorage, (), Vec<Arc<Dispatch>>>;

/// The server of one logical wgpu device.
pub struct WgpuServer {
    pub(crate) info: WgpuInfo,
    pub(crate) owner: HandleOwner,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) caps: ShaderCapabilities,
    pub(crate) timestamps: bool,
    pub(crate) alignment: u64,
    pub(crate) streams: Streams<WgpuStorage, (), Vec<Arc<Dispatch>>>,
    /// The pipelines made, per kernel and bounds-check mode.
    pub(crate) pipelines: KernelCache<Pipeline>,
    pub(crate) batch: Batch,
    pub(crate) batch_limit: BatchLimit,
    pub(crate) resolved: ResolveCache,
    pub(crate) freed: FreedBuffers,
    pub(crate) next_pipeline: u64,
    pub(crate) graphs: Graphs<WgpuGraph>,
    pub(crate) profiles: ProfileTable<wgpu::QuerySet>,
    pub(crate) errors: ErrorQueue,
    /// Where the indirect guard records a dynamic cube count over the device's limits (see
    /// `batch::guard_source`): read and cleared by the next sync or read after an indirect
    /// launch.
    pub(crate) guard_status: wgpu::Buffer,
    /// The streams that recorded an indirect launch since the guard status was last read.
    pub(crate) guard_streams: compute_core::backend::MarkedStreams,
    /// Over-limit errors the guard recorded, kept for the streams whose launches they cover.
    pub(crate) stream_errors: compute_core::backend::StreamErrors,
    pub(crate) collectives: Collectives,
    /// Bytes of the live readback buffers (see [`WgpuServer::host_memory`]).
    pub(crate) staging_bytes: StagingBytes,
    /// Dropped before the poll thread: it holds one of its waiters.
    pub(crate) submitter: Submitter,
    pub(crate) poller: Poller,
}

pub(crate) fn ready<T: Send + 'static>(value: T) -> DynFut<T> {
    Box::pin(core::future::ready(value))
}

impl WgpuServer {
    /// Request a device on `adapter` with its real limits and features, and start its server.
    pub fn new(index: WgpuDevice, adapter: &wgpu::Adapter) -> Result<Self, ServerError> {
        let features = adapter.features() - wgpu::Features::all_experimental_mask();
        let limits = adapter.limits();
        let request = adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("compute-wgpu"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        });
        let (device, queue) = compute_core::block_on(request)
            .map_err(|e| ServerError::Unavailable(format!("wgpu request_device failed: {e}")))?;
        let errors: ErrorQueue = Arc::default();
        let handler_errors = errors.clone();
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            handler_errors
                .lock()
                .push_back(ServerError::Driver(format!("wgpu: {error}")));
        }));
        let adapter_info = adapter.get_info();
        let batch_limit = BatchLimit::new(&adapter_info);
        let caps = ShaderCapabilities::from_features(features);
        let timestamps = features.contains(
            wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS,
        );
        let alignment = u64::from(limits.min_storage_buffer_offset_alignment).max(32);
        let properties = properties(index, &adapter_info, &limits, caps, timestamps, alignment);
        let owner = HandleOwner::fresh(compute_core::Device::to_id(&index));
        let freed = FreedBuffers::default();
        let guard_status = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("compute-wgpu indirect guard status"),
            size: GUARD_STATUS_BYTES,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let encoder = Encoder::new(
            &device,
            u64::from(limits.min_storage_buffer_offset_alignment).max(4),
            freed.clone(),
            properties.hardware.max_cube_count,
            guard_status.clone(),
        );
        let poller = Poller::spawn(
            device.clone(),
            errors.clone(),
            format!("wgpu{}-poll", index.index),
        )?;
        let submitter = Submitter::spawn(
            device.clone(),
            queue.clone(),
            encoder,
            errors.clone(),
            poller.waiter(),
            format!("wgpu{}-submit", index.index),
        )?;
        Ok(Self {
            info: WgpuInfo {
                device: index,
                adapter: adapter_info,
                limits,
                features,
            },
            owner,
            streams: Streams::new(owner, properties),
            device,
            queue,
            caps,
            timestamps,
            alignment,
            pipelines: KernelCache::default(),
            batch: Batch::default(),
            batch_limit,
            resolved: ResolveCache::default(),
            freed,
            next_pipeline: 1,
            graphs: Graphs::default(),
            profiles: ProfileTable::default(),
            errors,
            guard_status,
            guard_streams: Default::default(),
            stream_errors: Default::default(),
            collectives: Collectives::new(GroupScope {
                me: owner.device,
                count: crate::device::device_count,
                backend: "wgpu",
            }),
            staging_bytes: StagingBytes::default(),
            submitter,
            poller,
        })
    }

    /// The wgpu device behind this server.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The wgpu queue behind this server.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    pub(crate) fn resolve(&mut self, binding: &Binding) -> Result<WgpuResource, ServerError> {
        let handle = binding.handle();
        let key = ResolveKey {
            stream: handle.stream(),
            slice: handle.memory().id(),
            start: handle.slice_offset_start(),
            end: handle.slice_offset_end(),
        };
        if let Some(resource) = self.resolved.get(&key) {
            // A cached key is a binding of this server, but this one may not be: the owner
            // check runs before every hit too.
            binding.check_owner(self.owner)?;
            self.collectives.wait_for(key.slice);
            return Ok(resource);
        }
        let resource = self.streams.resolve(binding)?;
        self.resolved.insert(key, resource.clone());
        self.collectives.wait_for(key.slice);
        Ok(resource)
    }

    /// The first error waiting for `stream`: its own guard errors first, then the server's.
    pub(crate) fn take_error(&self, stream: StreamId) -> Result<(), ServerError> {
        self.stream_errors.take(stream)?;
        compute_core::error::take_result(&mut self.errors.lock())
    }
}

/// The kit behind the role traits' defaults: wgpu's streams, graphs and create layout.
impl ServerKit for WgpuServer {
    type KitStorage = WgpuStorage;
    type KitQueue = ();
    type KitCapture = Vec<Arc<Dispatch>>;
    type KitGraph = WgpuGraph;

    fn kit_streams(&self) -> &Streams<WgpuStorage, (), Vec<Arc<Dispatch>>> {
        &self.streams
    }

    fn kit_parts(
        &mut self,
    ) -> (
        &mut Streams<WgpuStorage, (), Vec<Arc<Dispatch>>>,
        &mut Graphs<WgpuGraph>,
    ) {
        (&mut self.streams, &mut self.graphs)
    }

    fn stream(&mut self, id: StreamId) -> Result<&mut StreamState, ServerError> {
        let (device, alignment) = (&self.device, self.alignment);
        let (max_buffer_size, freed) = (self.info.limits.max_buffer_size, &self.freed);
        self.streams.get_or_create(id, || {
            let storage = WgpuStorage::new(device.clone(), alignment, max_buffer_size)
                .with_freed(freed.clone());
            Ok((storage, ()))
        })
    }

    /// wgpu's layout of a `create`: starts at the storage offset alignment, packed rows.
    fn create_rules(&self) -> CreateRules {
        CreateRules {
            alignment: self.alignment,
            pitch_alignment: None,
        }
    }
}
