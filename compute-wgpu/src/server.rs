//! The wgpu server: logical streams over the device's one queue, pools over wgpu buffers, a
//! pipeline cache, batched submissions, graphs, timestamp profiles and host-staged collectives.
//!
//! Ordering: every stream records into the server's one batch, in issue order, and batches are
//! submitted to the one queue in order, so work keeps the order it was issued in, on a stream and
//! across streams. `queue.write_buffer` lands before the command buffers of the *next* submission,
//! so a write first submits the batch recorded before it.

use std::collections::VecDeque;
use std::sync::Arc;

use compute_core::backend::{CreateRules, Graphs, StreamEntry, Streams};
use compute_core::error::LaunchError;
use compute_core::future::{DynFut, oneshot};
use compute_core::graph::GraphId;
use compute_core::handle::{BufferArgument, HandleOwner};
use compute_core::kernel::KernelId;
use compute_core::layout::{contiguous_strides, for_each_row};
use compute_core::memory::{
    MemoryAllocationMode, MemoryDeviceProperties, MemoryPoolsConfig, MemoryUsage, PoolConfigError,
    SliceId,
};
use compute_core::profile::{ProfileTable, ProfileToken, device_profile, host_profile};
use compute_core::{
    Binding, Bytes, ComputeServer, CopyDescriptor, CubeCount, DeviceId, DeviceProperties, ElemType,
    ExecutionMode, Features, Handle, HardwareProperties, KernelArguments, MemoryLayout,
    MemoryLayoutDescriptor, ProfileDuration, ProfileError, ReduceOperation, ServerError, StreamId,
    TimingMethod,
};
use hashbrown::HashMap;

use crate::batch::{
    Batch, BoundBuffer, Command, Dispatch, DispatchCount, Encoder, FreedBuffers,
    GUARD_STATUS_BYTES, Pipeline,
};
use crate::collective::{Collectives, Round};
use crate::compiler::{self, HEADER_WORDS, ShaderCapabilities};
use crate::device::{WgpuDevice, device_count};
use crate::kernel::WgpuKernel;
use crate::poller::Poller;
use crate::storage::{WgpuResource, WgpuStorage};
use crate::submitter::{Submitter, WritePart};

/// Errors raised outside a call (validation errors wgpu reports late, failed polls), waiting for
/// the next flush, sync or read.
pub(crate) type ErrorQueue = Arc<spin::Mutex<VecDeque<ServerError>>>;

/// Launches recorded before the batch is submitted on its own, on a GPU, the first time after
/// the device was waited for: an early submission gets the device busy while the host records
/// more.
const FIRST_BATCH_DISPATCHES: usize = 64;

/// The most launches a batch grows to: while the host keeps filling batches the device has work
/// queued, and larger batches cost the host less per launch (one encoder, one submission).
const MAX_BATCH_DISPATCHES: usize = 4096;

/// How many launches a batch holds before it is submitted on its own.
///
/// On a GPU the limit starts at [`FIRST_BATCH_DISPATCHES`] and doubles with every batch
/// submitted because it was full, up to [`MAX_BATCH_DISPATCHES`]; waiting for the device resets
/// it. On a software adapter (lavapipe, WARP), where a submission waits on the host for the one
/// before it to finish, it is always [`MAX_BATCH_DISPATCHES`]: submitting mid-stream would tie
/// the host to the device. `COMPUTE_WGPU_MAX_BATCH` fixes it.
#[derive(Debug, Clone, Copy)]
struct BatchLimit {
    first: usize,
    max: usize,
    current: usize,
}

impl BatchLimit {
    fn new(adapter: &wgpu::AdapterInfo) -> Self {
        let fixed = compute_core::env::positive::<usize>("COMPUTE_WGPU_MAX_BATCH");
        let (first, max) = match fixed {
            Some(n) => (n, n),
            None if adapter.device_type == wgpu::DeviceType::Cpu => {
                (MAX_BATCH_DISPATCHES, MAX_BATCH_DISPATCHES)
            }
            None => (FIRST_BATCH_DISPATCHES, MAX_BATCH_DISPATCHES),
        };
        Self {
            first,
            max,
            current: first,
        }
    }

    fn grow(&mut self) {
        self.current = (2 * self.current).min(self.max);
    }

    fn reset(&mut self) {
        self.current = self.first;
    }
}

/// What a binding resolves to: a slice (ids are never reused) and the sub-range the handle views.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ResolveKey {
    stream: StreamId,
    slice: SliceId,
    start: u64,
    end: u64,
}

/// Resources of the last few bindings resolved, so that launches repeating their arguments skip
/// the pool lookups. Sound because a slice keeps its storage for its whole life, slice ids are
/// never reused, and a binding presented to the server keeps its slice alive. Cleared at every
/// submission, so a cached block is not held past the batch that uses it.
#[derive(Default)]
struct ResolveCache {
    entries: [Option<(ResolveKey, WgpuResource)>; 4],
    next: usize,
}

impl ResolveCache {
    fn get(&self, key: &ResolveKey) -> Option<WgpuResource> {
        self.entries
            .iter()
            .flatten()
            .find(|(k, _)| k == key)
            .map(|(_, r)| r.clone())
    }

    fn insert(&mut self, key: ResolveKey, resource: WgpuResource) {
        self.entries[self.next] = Some((key, resource));
        self.next = (self.next + 1) % self.entries.len();
    }

    fn clear(&mut self) {
        if self.entries.iter().any(Option::is_some) {
            self.entries = Default::default();
        }
    }
}

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
type StreamState = StreamEntry<WgpuStorage, (), Vec<Arc<Dispatch>>>;

/// A captured graph: the launches it replays.
type WgpuGraph = Vec<Arc<Dispatch>>;

/// A part of a read: nothing to copy, or a staging buffer the bytes land in.
enum ReadPart {
    Empty,
    Staged {
        staging: wgpu::Buffer,
        mapped: compute_core::future::Receiver<Result<(), wgpu::BufferAsyncError>>,
        delta: usize,
        span: usize,
        descriptor: CopyDescriptor,
    },
}

/// The server of one logical wgpu device.
pub struct WgpuServer {
    info: WgpuInfo,
    owner: HandleOwner,
    properties: DeviceProperties,
    device: wgpu::Device,
    queue: wgpu::Queue,
    caps: ShaderCapabilities,
    timestamps: bool,
    alignment: u64,
    streams: Streams<WgpuStorage, (), Vec<Arc<Dispatch>>>,
    pipelines: HashMap<(KernelId, bool), Arc<Pipeline>>,
    batch: Batch,
    batch_limit: BatchLimit,
    resolved: ResolveCache,
    /// The pipeline of the last launch, found without hashing when the next one is the same.
    last_pipeline: Option<(KernelId, bool, Arc<Pipeline>)>,
    freed: FreedBuffers,
    next_pipeline: u64,
    graphs: Graphs<WgpuGraph>,
    profiles: ProfileTable<wgpu::QuerySet>,
    errors: ErrorQueue,
    /// Where the indirect guard records a dynamic cube count over the device's limits (see
    /// `batch::guard_source`): read and cleared by the next sync or read after an indirect
    /// launch.
    guard_status: wgpu::Buffer,
    /// Whether an indirect launch was recorded since the guard status was last read.
    guard_unread: bool,
    collectives: Collectives,
    /// Dropped before the poll thread: it holds one of its waiters.
    submitter: Submitter,
    poller: Poller,
}

fn ready<T: Send + 'static>(value: T) -> DynFut<T> {
    Box::pin(core::future::ready(value))
}

fn is_contiguous(shape: &[usize], strides: &[usize]) -> bool {
    strides == contiguous_strides(shape).0.as_slice()
}

/// Bytes from the first to one past the last element of a strided tensor.
fn strided_span(shape: &[usize], strides: &[usize], elem_size: usize) -> usize {
    if shape.contains(&0) {
        return 0;
    }
    let last: usize = shape.iter().zip(strides).map(|(n, s)| (n - 1) * s).sum();
    (last + 1) * elem_size
}

/// The bytes of a write that fall into 4-byte words it covers only partly, by word offset in the
/// buffer: `(first byte in the word, start in the host data, length)` for each piece.
pub(crate) type EdgeWords = std::collections::BTreeMap<u64, Vec<(usize, usize, usize)>>;

/// Plan the write of `len` bytes (from byte `from` of the host data) at `offset` bytes into
/// `target`, changing exactly those bytes: the whole 4-byte words it covers go into `parts`
/// (`queue.write_buffer` needs a 4-byte aligned offset and length), the words it covers only
/// partly (an unaligned head or tail) into `edges`, to be merged with the buffer's contents.
pub(crate) fn plan_write(
    target: &WgpuResource,
    offset: u64,
    from: usize,
    len: usize,
    parts: &mut Vec<WritePart>,
    edges: &mut EdgeWords,
) {
    if len == 0 {
        return;
    }
    let start = target.offset + offset;
    let end = start + len as u64;
    let (lo, hi) = (start.next_multiple_of(4), end / 4 * 4);
    if lo < hi {
        let n = (hi - lo) as usize;
        parts.push(WritePart {
            at: lo,
            from: from + (lo - start) as usize,
            len: n,
            padded: n,
        });
    }
    let mut edge = |word: u64| {
        let (a, b) = (start.max(word), end.min(word + 4));
        edges.entry(word).or_default().push((
            (a - word) as usize,
            from + (a - start) as usize,
            (b - a) as usize,
        ));
    };
    let head = start / 4 * 4;
    let unaligned_start = !start.is_multiple_of(4);
    if unaligned_start {
        edge(head);
    }
    let tail = end / 4 * 4;
    // An unaligned tail in the head's word was covered with the head.
    let tail_in_head = unaligned_start && tail == head;
    if !end.is_multiple_of(4) && !tail_in_head {
        edge(tail);
    }
}

fn saturate(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
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
        static NEXT_SERVER: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
        let owner = HandleOwner {
            device: compute_core::Device::to_id(&index),
            server: NEXT_SERVER.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
        };
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
            streams: Streams::new(owner, properties.memory.clone()),
            properties,
            device,
            queue,
            caps,
            timestamps,
            alignment,
            pipelines: HashMap::new(),
            batch: Batch::default(),
            batch_limit,
            resolved: ResolveCache::default(),
            last_pipeline: None,
            freed,
            next_pipeline: 1,
            graphs: Graphs::default(),
            profiles: ProfileTable::default(),
            errors,
            guard_status,
            guard_unread: false,
            collectives: Collectives::default(),
            submitter,
            poller,
        })
    }

    /// When an indirect launch was recorded since the last look: record a copy of the guard's
    /// status into a readback buffer and clear it, to be read once the batch completed (see
    /// [`guard_error`]).
    fn stage_guard_status(&mut self) -> Option<wgpu::Buffer> {
        if !self.guard_unread {
            return None;
        }
        self.guard_unread = false;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("compute-wgpu guard status readback"),
            size: GUARD_STATUS_BYTES,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.push(Command::Copy {
            src: self.guard_status.clone(),
            src_offset: 0,
            dst: staging.clone(),
            dst_offset: 0,
            size: GUARD_STATUS_BYTES,
        });
        self.push(Command::Clear {
            buffer: self.guard_status.clone(),
            offset: 0,
            size: GUARD_STATUS_BYTES,
        });
        Some(staging)
    }

    /// The wgpu device behind this server.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The wgpu queue behind this server.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// The wgpu layout of a `create`: starts at the slice alignment, rows packed, one buffer of
    /// at most `max_page_size` (the least of `max_buffer_size` and
    /// `max_storage_buffer_binding_size`, rounded down to the alignment).
    fn create_rules(&self) -> CreateRules {
        CreateRules {
            alignment: self.alignment,
            pitch_alignment: None,
            max_size: self.properties.memory.max_page_size,
        }
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

    fn resolve(&mut self, binding: &Binding) -> Result<WgpuResource, ServerError> {
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

    fn ensure_not_capturing(&self, stream: StreamId, what: &str) -> Result<(), ServerError> {
        self.streams.ensure_not_capturing(stream, what)
    }

    fn take_error(&self) -> Result<(), ServerError> {
        match compute_core::error::take_first(&mut self.errors.lock()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Hand the batch, if it holds anything, to the submit thread (which encodes and submits it)
    /// and start a new one. No error scope (it would cost every submission a round trip):
    /// validation errors reach the device's uncaptured-error handler, and submission errors the
    /// error queue, reported at the next flush, sync or read.
    fn submit(&mut self) -> Result<(), ServerError> {
        // The cached resources hold their blocks: let go of them at every submission.
        self.resolved.clear();
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = core::mem::replace(&mut self.batch, self.submitter.fresh_batch());
        self.submitter.submit(batch)
    }

    /// Hand the batch over and wait until it is submitted: its submission index (with `always`,
    /// an empty submission's when nothing was recorded, which also flushes pending writes).
    fn submit_indexed(
        &mut self,
        always: bool,
    ) -> Result<Option<wgpu::SubmissionIndex>, ServerError> {
        self.resolved.clear();
        let batch = if self.batch.is_empty() {
            Batch::default()
        } else {
            core::mem::replace(&mut self.batch, self.submitter.fresh_batch())
        };
        self.submitter.submit_indexed(batch, always)
    }

    /// The device is about to be waited for: the next batch starts small again, so that the
    /// device gets work early (see [`BatchLimit`]).
    fn idle(&mut self) {
        self.batch_limit.reset();
    }

    /// Submit the batch (or an empty submission, which also flushes pending `write_buffer`s)
    /// and return its index. The caller waits for the submission: the batch limit starts over.
    fn submit_always(&mut self) -> Result<wgpu::SubmissionIndex, ServerError> {
        self.idle();
        self.submit_indexed(true)?.ok_or_else(|| {
            ServerError::Driver("the wgpu submit thread returned no submission".into())
        })
    }

    /// Record a command other than a launch.
    fn push(&mut self, command: Command) {
        self.batch.commands.push(command);
    }

    /// Submit the batch if it holds as many launches as the current limit allows.
    fn submit_if_full(&mut self) -> Result<(), ServerError> {
        if self.batch.dispatches >= self.batch_limit.current {
            self.submit()?;
            self.batch_limit.grow();
        }
        Ok(())
    }

    fn pipeline(
        &mut self,
        kernel: &WgpuKernel,
        checked: bool,
    ) -> Result<Arc<Pipeline>, ServerError> {
        if let Some((id, c, found)) = &self.last_pipeline
            && *id == kernel.id
            && *c == checked
        {
            return Ok(found.clone());
        }
        if let Some(found) = self.pipelines.get(&(kernel.id, checked)) {
            self.last_pipeline = Some((kernel.id, checked, found.clone()));
            return Ok(found.clone());
        }
        let def = &kernel.definition;
        def.validate(&self.properties.hardware)?;
        let compiled = compiler::compile(def, self.caps, checked)?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(def.name()),
                source: wgpu::ShaderSource::Wgsl(compiled.source.as_str().into()),
            });
        let count = def.buffers().len() as u32;
        let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..=count)
            .map(|binding| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage {
                        read_only: binding == count,
                    },
                    // The launch info sits in one buffer shared by every launch.
                    has_dynamic_offset: binding == count,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let layout = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(def.name()),
                entries: &entries,
            });
        let pipeline_layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(def.name()),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(def.name()),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            });
        if let Some(error) = compute_core::block_on(scope.pop()) {
            return Err(ServerError::Compilation(format!(
                "kernel `{}` on wgpu: {error}\n--- generated WGSL ---\n{}",
                def.name(),
                compiled.source
            )));
        }
        let id = self.next_pipeline;
        self.next_pipeline += 1;
        let pipeline = Arc::new(Pipeline {
            id,
            name: def.name().to_string(),
            pipeline,
            layout,
            info: compiled.info,
            item_sizes: compiled.buffer_item_sizes,
        });
        self.pipelines
            .insert((kernel.id, checked), pipeline.clone());
        Ok(pipeline)
    }

    /// The range a launch binds for a buffer argument, and its header words.
    fn bind(
        &self,
        resource: WgpuResource,
        item: u64,
        name: &str,
    ) -> Result<(BoundBuffer, u32, u32), ServerError> {
        // Both are powers of two (WebGPU's offset alignment, items of 1-8 byte elements times
        // 1-16 components): masks and shifts, no division on the launch path.
        let align = u64::from(self.info.limits.min_storage_buffer_offset_alignment).max(4);
        let bind_offset = resource.offset & !(align - 1);
        let delta = resource.offset - bind_offset;
        let per_item = |bytes: u64| {
            if item.is_power_of_two() {
                bytes >> item.trailing_zeros()
            } else {
                bytes / item
            }
        };
        if per_item(delta) * item != delta {
            return Err(LaunchError::MisalignedBuffer {
                kernel: name.into(),
                name: "argument".into(),
                offset: resource.offset,
                alignment: item,
            }
            .into());
        }
        let block = resource.buffer.size();
        let mut size = (delta + resource.size).max(item).next_multiple_of(4);
        if bind_offset + size > block {
            size = (block - bind_offset) / 4 * 4;
        }
        let max = self.info.limits.max_storage_buffer_binding_size;
        if size > max {
            return Err(LaunchError::BindingTooLarge {
                kernel: name.into(),
                bytes: size,
                maximum: max,
                limit: "max_storage_buffer_binding_size",
            }
            .into());
        }
        Ok((
            BoundBuffer {
                buffer: resource.buffer,
                offset: bind_offset,
                size,
            },
            saturate(per_item(delta)),
            saturate(per_item(resource.size)),
        ))
    }

    /// Append the info words and bound buffers of a launch of `pipeline` to the batch's arenas;
    /// the bindings go to `keep`, if given.
    fn build_launch(
        &mut self,
        def: &compute_core::kernel::KernelDefinition,
        pipeline: &Pipeline,
        arguments: KernelArguments,
        mut keep: Option<&mut Vec<Binding>>,
    ) -> Result<(), ServerError> {
        let layout = &pipeline.info;
        let start = self.batch.words.len();
        self.batch
            .words
            .resize(start + layout.fixed_words as usize, 0u32);
        for (value, &offset) in arguments.scalars.iter().zip(&layout.scalar_offsets) {
            let words = value.word_bits();
            let at = start + offset as usize;
            self.batch.words[at] = words[0];
            if value.elem_type().size() == 8 {
                self.batch.words[at + 1] = words[1];
            }
        }
        for (
            k,
            BufferArgument {
                binding,
                shape,
                strides,
            },
        ) in arguments.buffers.into_iter().enumerate()
        {
            let resource = self.resolve(&binding)?;
            let (bound, base, len) = self.bind(resource, pipeline.item_sizes[k], def.name())?;
            let header = start + (layout.header_offset + HEADER_WORDS * k as u32) as usize;
            let words = &mut self.batch.words;
            let meta = (words.len() - start) as u32;
            words[header] = base;
            words[header + 1] = len;
            words[header + 2] = shape.rank() as u32;
            words[header + 3] = meta;
            words.extend(shape.iter().map(|&d| saturate(d as u64)));
            words.extend(strides.iter().map(|&s| saturate(s as u64)));
            self.batch.buffers.push(bound);
            if let Some(keep) = keep.as_deref_mut() {
                keep.push(binding);
            }
        }
        Ok(())
    }

    fn check_group(&self, devices: &[DeviceId]) -> Result<Vec<DeviceId>, ServerError> {
        compute_core::collective::check_group(devices, self.owner.device, device_count(), "wgpu")
    }

    /// Record a copy of `len` bytes of `source` into a fresh staging buffer: the buffer and the
    /// offset of the first byte in it.
    /// The 4-byte words `edges` of `buffer` as they are after every command and write issued so
    /// far, with the pieces of `data` the edges name written over them. The server issues
    /// nothing in between, so writing the merged words back changes exactly the written bytes.
    fn merge_edges(
        &mut self,
        buffer: &wgpu::Buffer,
        edges: &EdgeWords,
        data: &[u8],
    ) -> Result<Vec<(u64, [u8; 4])>, ServerError> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("compute-wgpu partial words"),
            size: 4 * edges.len() as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        for (k, &word) in edges.keys().enumerate() {
            self.push(Command::Copy {
                src: buffer.clone(),
                src_offset: word,
                dst: staging.clone(),
                dst_offset: 4 * k as u64,
                size: 4,
            });
        }
        let index = self.submit_always()?;
        let mapped = map_read(&staging);
        wait_for(&self.device, index)?;
        compute_core::block_on(mapped)
            .ok_or_else(gone)?
            .map_err(|e| ServerError::Driver(format!("mapping a readback buffer: {e}")))?;
        let words = {
            let view = staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| ServerError::Driver(format!("reading a readback buffer: {e}")))?;
            edges
                .iter()
                .enumerate()
                .map(|(k, (&at, pieces))| {
                    let mut word = [0u8; 4];
                    word.copy_from_slice(&view[4 * k..4 * k + 4]);
                    for &(first, src, n) in pieces {
                        word[first..first + n].copy_from_slice(&data[src..src + n]);
                    }
                    (at, word)
                })
                .collect()
        };
        staging.unmap();
        Ok(words)
    }

    fn stage_read(
        &mut self,
        source: &WgpuResource,
        len: u64,
    ) -> Result<(wgpu::Buffer, u64), ServerError> {
        let start = source.offset / 4 * 4;
        let delta = source.offset - start;
        let size = (delta + len)
            .next_multiple_of(4)
            .min(source.buffer.size() - start);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("compute-wgpu readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.push(Command::Copy {
            src: source.buffer.clone(),
            src_offset: start,
            dst: staging.clone(),
            dst_offset: 0,
            size,
        });
        Ok((staging, delta))
    }
}

fn map_read(
    staging: &wgpu::Buffer,
) -> compute_core::future::Receiver<Result<(), wgpu::BufferAsyncError>> {
    let (tx, rx) = oneshot();
    staging
        .slice(..)
        .map_async(wgpu::MapMode::Read, move |result| tx.send(result));
    rx
}

/// Block (in the driver, not spinning) until submission `index` has completed.
fn wait_for(device: &wgpu::Device, index: wgpu::SubmissionIndex) -> Result<(), ServerError> {
    device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: None,
        })
        .map(|_| ())
        .map_err(|e| ServerError::Driver(format!("waiting for the wgpu device: {e}")))
}

/// The error of the over-limit count the guard recorded in `staging` (a copy of its status,
/// mapped by `mapped`), if it recorded one.
async fn guard_error(
    staging: wgpu::Buffer,
    mapped: compute_core::future::Receiver<Result<(), wgpu::BufferAsyncError>>,
    maximum: [u32; 3],
) -> Result<Option<ServerError>, ServerError> {
    mapped
        .await
        .ok_or_else(gone)?
        .map_err(|e| ServerError::Driver(format!("mapping the indirect guard status: {e}")))?;
    let status: [u32; 4] = {
        let view = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| ServerError::Driver(format!("reading the indirect guard status: {e}")))?;
        bytemuck::pod_read_unaligned(&view[..16])
    };
    staging.unmap();
    Ok((status[0] != 0).then(|| {
        compute_core::error::LaunchError::CubeCountTooLarge {
            count: [status[1], status[2], status[3]],
            maximum,
        }
        .into()
    }))
}

fn gone() -> ServerError {
    ServerError::Driver("the wgpu poll thread stopped before answering".into())
}

fn properties(
    index: WgpuDevice,
    adapter: &wgpu::AdapterInfo,
    limits: &wgpu::Limits,
    caps: ShaderCapabilities,
    timestamps: bool,
    alignment: u64,
) -> DeviceProperties {
    // Rounded down to the slice alignment: every size up to it allocates (the pools pad a
    // request to the alignment, and a padded request must still fit one buffer).
    let max_page = limits
        .max_buffer_size
        .min(limits.max_storage_buffer_binding_size)
        / alignment
        * alignment;
    DeviceProperties {
        name: format!(
            "wgpu:{} {} ({:?})",
            index.index, adapter.name, adapter.backend
        ),
        backend: "wgpu".into(),
        memory: MemoryDeviceProperties {
            max_page_size: max_page,
            alignment,
        },
        memory_total: None,
        hardware: HardwareProperties {
            plane_size_min: adapter.subgroup_min_size,
            plane_size_max: adapter.subgroup_max_size,
            max_units_per_cube: limits.max_compute_invocations_per_workgroup,
            max_cube_dim: [
                limits.max_compute_workgroup_size_x,
                limits.max_compute_workgroup_size_y,
                limits.max_compute_workgroup_size_z,
            ],
            max_cube_count: [limits.max_compute_workgroups_per_dimension; 3],
            max_shared_memory_bytes: u64::from(limits.max_compute_workgroup_storage_size),
            num_compute_units: 1,
            max_load_bytes: 16,
            max_private_bytes_per_unit:
                compute_core::properties::DEFAULT_MAX_PRIVATE_BYTES_PER_UNIT,
        },
        features: Features {
            elem_types: caps.elem_types(),
            plane_ops: caps.subgroups,
            atomics: true,
            graphs: true,
            device_timestamps: timestamps,
            collectives: true,
        },
        timing: if timestamps {
            TimingMethod::Device
        } else {
            TimingMethod::Host
        },
        pitch_alignment: None,
    }
}

impl ComputeServer for WgpuServer {
    type Kernel = WgpuKernel;
    type Storage = WgpuStorage;
    type Info = WgpuInfo;

    fn info(&self) -> WgpuInfo {
        self.info.clone()
    }

    fn properties(&self) -> DeviceProperties {
        self.properties.clone()
    }

    fn owner(&self) -> HandleOwner {
        self.owner
    }

    fn create(
        &mut self,
        descriptors: &[MemoryLayoutDescriptor],
        stream: StreamId,
    ) -> Result<Vec<MemoryLayout>, ServerError> {
        let (owner, rules) = (self.owner, self.create_rules());
        self.stream(stream)?
            .create(owner, stream, descriptors, &rules)
    }

    fn create_buffer(&mut self, size: u64, stream: StreamId) -> Result<Handle, ServerError> {
        let (owner, rules) = (self.owner, self.create_rules());
        self.stream(stream)?
            .create_buffer(owner, stream, size, &rules)
    }

    fn write(
        &mut self,
        writes: Vec<(CopyDescriptor, Bytes)>,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "write")?;
        for (descriptor, bytes) in writes {
            descriptor.validate_write(bytes.len())?;
            let target = self.resolve(&descriptor.binding)?;
            if bytes.is_empty() {
                continue;
            }
            let mut parts = Vec::new();
            let mut edges = EdgeWords::new();
            if is_contiguous(&descriptor.shape, &descriptor.strides) {
                plan_write(&target, 0, 0, bytes.len(), &mut parts, &mut edges);
            } else {
                let mut rows = Vec::new();
                for_each_row(
                    &descriptor.shape,
                    &descriptor.strides,
                    descriptor.elem_size,
                    |s, c, n| {
                        rows.push((s, c, n));
                    },
                );
                for (strided, compact, len) in rows {
                    plan_write(
                        &target,
                        strided as u64,
                        compact,
                        len,
                        &mut parts,
                        &mut edges,
                    );
                }
            }
            // Words the write covers only partly are merged with what the buffer holds after
            // the work issued before (a round trip, for unaligned heads and tails only).
            let words = if edges.is_empty() {
                Vec::new()
            } else {
                self.merge_edges(&target.buffer, &edges, bytes.try_as_slice()?)?
            };
            // `write_buffer` lands before the next submission: the batch recorded so far goes
            // first, then the write, both on the submit thread (which also frees the bytes).
            self.submit()?;
            self.submitter
                .write(target.buffer.clone(), parts, words, bytes)?;
        }
        Ok(())
    }

    fn read(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        let prepared = (|| {
            self.ensure_not_capturing(stream, "read")?;
            self.take_error()?;
            let mut sources = Vec::with_capacity(descriptors.len());
            for descriptor in &descriptors {
                descriptor.validate()?;
                sources.push(self.resolve(&descriptor.binding)?);
            }
            let mut staged = Vec::with_capacity(descriptors.len());
            for (descriptor, source) in descriptors.iter().zip(&sources) {
                let span =
                    strided_span(&descriptor.shape, &descriptor.strides, descriptor.elem_size);
                if span == 0 {
                    staged.push(None);
                } else {
                    let (buffer, delta) = self.stage_read(source, span as u64)?;
                    staged.push(Some((buffer, delta as usize, span)));
                }
            }
            let guard = self.stage_guard_status();
            self.idle();
            let index = self.submit_indexed(false)?;
            let guard = guard.map(|staging| {
                let mapped = map_read(&staging);
                (staging, mapped)
            });
            Ok::<_, ServerError>((staged, index, guard))
        })();
        let (staged, index, guard) = match prepared {
            Ok(p) => p,
            Err(e) => return ready(Err(e)),
        };
        let maximum = self.properties.hardware.max_cube_count;
        let parts: Vec<ReadPart> = staged
            .into_iter()
            .zip(descriptors)
            .map(|(staged, descriptor)| match staged {
                None => ReadPart::Empty,
                Some((staging, delta, span)) => ReadPart::Staged {
                    mapped: map_read(&staging),
                    staging,
                    delta,
                    span,
                    descriptor,
                },
            })
            .collect();
        let device = self.device.clone();
        Box::pin(async move {
            // The maps complete during this wait (their callbacks run on the polling thread).
            if let Some(index) = index {
                wait_for(&device, index)?;
            }
            if let Some((staging, mapped)) = guard
                && let Some(e) = guard_error(staging, mapped, maximum).await?
            {
                return Err(e);
            }
            let mut out = Vec::with_capacity(parts.len());
            for part in parts {
                match part {
                    ReadPart::Empty => out.push(Bytes::from_vec(Vec::new())),
                    ReadPart::Staged {
                        staging,
                        mapped,
                        delta,
                        span,
                        descriptor,
                    } => {
                        mapped.await.ok_or_else(gone)?.map_err(|e| {
                            ServerError::Driver(format!("mapping a readback buffer: {e}"))
                        })?;
                        let bytes = {
                            let view = staging.slice(..).get_mapped_range().map_err(|e| {
                                ServerError::Driver(format!("reading a readback buffer: {e}"))
                            })?;
                            let raw = &view[delta..delta + span];
                            if is_contiguous(&descriptor.shape, &descriptor.strides) {
                                // Mapped readback memory of a discrete GPU reads slowly on one
                                // thread (1.4 GB/s on the H200's Vulkan driver).
                                Bytes::from_slice_parallel(raw)
                            } else {
                                let mut buf = compute_core::bytes::AlignedBuf::zeroed(
                                    descriptor.compact_size(),
                                );
                                let dst = buf.as_mut_slice();
                                for_each_row(
                                    &descriptor.shape,
                                    &descriptor.strides,
                                    descriptor.elem_size,
                                    |s, c, n| {
                                        dst[c..c + n].copy_from_slice(&raw[s..s + n]);
                                    },
                                );
                                Bytes::from_aligned(buf)
                            }
                        };
                        staging.unmap();
                        out.push(bytes);
                    }
                }
            }
            Ok(out)
        })
    }

    fn get_resource(
        &mut self,
        binding: Binding,
        _stream: StreamId,
    ) -> Result<WgpuResource, ServerError> {
        let resource = self.resolve(&binding)?;
        let index = self.submit_always()?;
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map_err(|e| ServerError::Driver(format!("waiting for the wgpu device: {e}")))?;
        Ok(resource)
    }

    unsafe fn launch(
        &mut self,
        kernel: WgpuKernel,
        count: CubeCount,
        arguments: KernelArguments,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        let def = &*kernel.definition;
        // The kernel's own limits (cube dimensions, shared and private memory) are checked once,
        // with the rest of the IR, when its pipeline is made.
        def.check_arguments(&arguments)?;
        count.check(&self.properties.hardware)?;
        // Only a graph keeps the bindings (its launches outlive the caller's handles). A batch
        // does not need them: a slice freed and reused after this launch is written by work
        // issued later, which the one queue runs after this launch.
        let capturing = self.stream(stream)?.capture.is_some();
        let mut bindings: Vec<Binding> = Vec::new();
        let (count, empty) = match count {
            CubeCount::Static(x, y, z) => {
                (DispatchCount::Static([x, y, z]), x == 0 || y == 0 || z == 0)
            }
            CubeCount::Dynamic(binding) => {
                let resource = self.resolve(&binding)?;
                bindings.push(binding);
                // Recorded now or by a graph's replay: the guard's status is read from the next
                // sync or read on (a replay sets this again).
                self.guard_unread |= !capturing;
                (
                    DispatchCount::Dynamic {
                        buffer: resource.buffer,
                        offset: resource.offset,
                    },
                    false,
                )
            }
        };
        let checked = mode == ExecutionMode::Checked;
        let pipeline = self.pipeline(&kernel, checked)?;
        // The info words and bound buffers go straight into the batch's arenas (taken back on
        // an error, moved into a graph's launch when capturing).
        let words = self.batch.words.len();
        let bound = self.batch.buffers.len();
        let built = self.build_launch(
            def,
            &pipeline,
            arguments,
            capturing.then_some(&mut bindings),
        );
        if let Err(e) = built {
            self.batch.words.truncate(words);
            self.batch.buffers.truncate(bound);
            return Err(e);
        }
        if capturing {
            let dispatch = Arc::new(Dispatch {
                pipeline,
                buffers: self.batch.buffers.drain(bound..).collect(),
                info: self.batch.words.drain(words..).collect(),
                count,
                _bindings: bindings,
            });
            if let Some(capture) = &mut self.stream(stream)?.capture
                && !empty
            {
                capture.push(dispatch);
            }
            return Ok(());
        }
        if empty {
            self.batch.words.truncate(words);
            self.batch.buffers.truncate(bound);
            return Ok(());
        }
        self.batch.push_launch(pipeline, words, bound, count);
        self.submit_if_full()
    }

    fn flush(&mut self, _stream: StreamId) -> Result<(), ServerError> {
        self.submit()?;
        self.take_error()
    }

    fn sync(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
        if let Err(e) = self.ensure_not_capturing(stream, "sync") {
            return ready(Err(e));
        }
        let guard = self.stage_guard_status();
        let index = match self.submit_always() {
            Ok(index) => index,
            Err(e) => return ready(Err(e)),
        };
        if let Err(e) = self.submitter.prune() {
            return ready(Err(e));
        }
        let guard = guard.map(|staging| {
            let mapped = map_read(&staging);
            (staging, mapped)
        });
        let maximum = self.properties.hardware.max_cube_count;
        let device = self.device.clone();
        let errors = self.errors.clone();
        Box::pin(async move {
            // Waited for here, on the caller's thread, not through the poll thread: one thread
            // hop less per sync. The wait blocks in the driver; it does not spin.
            wait_for(&device, index)?;
            if let Some((staging, mapped)) = guard
                && let Some(e) = guard_error(staging, mapped, maximum).await?
            {
                errors.lock().push_back(e);
            }
            match compute_core::error::take_first(&mut errors.lock()) {
                Some(e) => Err(e),
                None => Ok(()),
            }
        })
    }

    fn stream_ids(&self) -> Vec<StreamId> {
        self.streams.ids()
    }

    fn memory_usage(&mut self, stream: StreamId) -> Result<MemoryUsage, ServerError> {
        Ok(self.stream(stream)?.memory.memory_usage())
    }

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
        // Dropping the state drops its pools' buffers.
        self.streams.try_retire(stream, |_| true)
    }

    fn allocation_mode(
        &mut self,
        mode: MemoryAllocationMode,
        stream: StreamId,
    ) -> MemoryAllocationMode {
        self.stream(stream)
            .map_or(MemoryAllocationMode::Auto, |state| state.memory.mode(mode))
    }

    fn configure_memory_pools(
        &mut self,
        config: &MemoryPoolsConfig,
        stream: StreamId,
    ) -> Result<bool, PoolConfigError> {
        self.streams.configure_memory_pools(config, stream)
    }

    fn graph_prepare(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.stream(stream)?.prepare_graph(stream)
    }

    fn begin_capture(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.stream(stream)?.begin_capture(stream, Vec::new())
    }

    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, ServerError> {
        let launches = self.stream(stream)?.end_capture(stream)?;
        Ok(self.graphs.insert(stream, launches))
    }

    fn graph_replay(&mut self, graph: GraphId, stream: StreamId) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "graph replay")?;
        let launches = self.graphs.for_replay(graph, stream)?.clone();
        for launch in &launches {
            self.guard_unread |= matches!(launch.count, DispatchCount::Dynamic { .. });
            self.batch.push_dispatch(launch);
            self.submit_if_full()?;
        }
        Ok(())
    }

    fn graph_release(&mut self, graph: GraphId) {
        self.graphs.remove(graph);
    }

    fn profile_start(&mut self, stream: StreamId) -> Result<ProfileToken, ProfileError> {
        self.ensure_not_capturing(stream, "profile")?;
        let queries = if self.timestamps {
            let set = self.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("compute-wgpu profile"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            });
            self.push(Command::Timestamp {
                set: set.clone(),
                index: 0,
            });
            Some(set)
        } else {
            None
        };
        Ok(self.profiles.start(queries))
    }

    fn profile_end(
        &mut self,
        token: ProfileToken,
        stream: StreamId,
    ) -> DynFut<Result<ProfileDuration, ProfileError>> {
        let (start, queries) = match self.profiles.end(token) {
            Ok(p) => p,
            Err(e) => return ready(Err(e)),
        };
        let Some(set) = queries else {
            return host_profile(start, self.sync(stream));
        };
        let recorded = (|| {
            self.push(Command::Timestamp {
                set: set.clone(),
                index: 1,
            });
            let size = 2 * u64::from(wgpu::QUERY_SIZE);
            let resolve = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("compute-wgpu timestamps"),
                size,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            self.push(Command::Resolve {
                set,
                count: 2,
                dst: resolve.clone(),
            });
            let source = WgpuResource {
                buffer: resolve,
                offset: 0,
                size,
            };
            let (staging, _) = self.stage_read(&source, size)?;
            let index = self.submit_always()?;
            Ok::<_, ServerError>((staging, index))
        })();
        let (staging, index) = match recorded {
            Ok(r) => r,
            Err(e) => return ready(Err(e.into())),
        };
        let mapped = map_read(&staging);
        self.poller.wait(index, None);
        let period = f64::from(self.queue.get_timestamp_period());
        let errors = self.errors.clone();
        Box::pin(async move {
            mapped
                .await
                .ok_or_else(gone)?
                .map_err(|e| ServerError::Driver(format!("mapping the timestamps: {e}")))?;
            let ticks = {
                let view = staging
                    .slice(..)
                    .get_mapped_range()
                    .map_err(|e| ServerError::Driver(format!("reading the timestamps: {e}")))?;
                let stamps: [u64; 2] = bytemuck::pod_read_unaligned(&view[..16]);
                stamps[1].saturating_sub(stamps[0])
            };
            staging.unmap();
            if let Some(e) = compute_core::error::take_first(&mut errors.lock()) {
                return Err(e.into());
            }
            Ok(device_profile(ticks, period))
        })
    }

    fn ensure_init_collective(
        &mut self,
        devices: &[DeviceId],
        _stream: StreamId,
    ) -> Result<(), ServerError> {
        let group = self.check_group(devices)?;
        self.collectives.init(group);
        Ok(())
    }

    fn all_reduce(
        &mut self,
        src: Binding,
        dst: Binding,
        dtype: ElemType,
        devices: Vec<DeviceId>,
        op: ReduceOperation,
        _stream: StreamId,
    ) -> Result<(), ServerError> {
        let group = self.check_group(&devices)?;
        self.collectives
            .check_all_reduce(&group, src.size(), dst.size(), dtype)?;
        let source = self.resolve(&src)?;
        let target = self.resolve(&dst)?;
        let (staging, delta) = if source.size == 0 {
            let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("compute-wgpu empty collective"),
                size: 4,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            (staging, 0)
        } else {
            self.stage_read(&source, source.size)?
        };
        // The words the output covers only partly, read back with the contribution.
        let (start, end) = (target.offset, target.offset + target.size);
        let mut edge_words = Vec::new();
        if target.size > 0 && !start.is_multiple_of(4) {
            edge_words.push(start / 4 * 4);
        }
        if target.size > 0 && !end.is_multiple_of(4) && edge_words.last() != Some(&(end / 4 * 4)) {
            edge_words.push(end / 4 * 4);
        }
        let mut edge_reads = Vec::with_capacity(edge_words.len());
        for &at in &edge_words {
            let word = WgpuResource {
                buffer: target.buffer.clone(),
                offset: at,
                size: 4,
            };
            edge_reads.push((at, self.stage_read(&word, 4)?.0));
        }
        let index = self.submit_always()?;
        let mapped = map_read(&staging);
        let edges = edge_reads
            .into_iter()
            .map(|(at, staging)| crate::collective::EdgeWord {
                at,
                mapped: map_read(&staging),
                staging,
            })
            .collect();
        self.poller.wait(index, None);
        let seq = self.collectives.next_round(&group, self.owner.device);
        let round = Round {
            mapped,
            staging,
            delta,
            len: source.size,
            group,
            seq,
            me: self.owner.device,
            dtype,
            op,
            dst: target,
            dst_slice: dst.handle().memory().id(),
            edges,
        };
        crate::collective::submit(&mut self.collectives, &self.queue, round)
    }

    fn sync_collective(&mut self, _stream: StreamId) -> DynFut<Result<(), ServerError>> {
        let rx = self.collectives.marker();
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|| Err(ServerError::Driver("the collective worker stopped".into())))
        })
    }
}
