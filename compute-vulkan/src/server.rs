//! The Vulkan server: logical streams over the device's compute queue, pools over
//! `vkAllocateMemory` blocks, a pipeline cache, batched submissions with push descriptors,
//! graphs as recorded commands appended to the batch at each replay, timestamp profiles and
//! host-staged collectives.
//!
//! This file holds the struct, its construction, the stream and memory bookkeeping (compute-core's
//! [`Streams`] behind a small resolve cache), the batch submission helpers and the [`ServerKit`].
//! Each role trait is implemented in the file of its role: `storage.rs` (`ServerMemory`),
//! `transfer.rs` (`ServerTransfer`: writes, reads), `launch.rs` (the `ComputeServer` core calls:
//! launches, `get_resource`, flush, sync), `guard.rs` (the indirect dispatch guard), `graph.rs` (`ServerGraph`: capture,
//! replay), `profile.rs` (`ServerProfile`: timestamps), `collective.rs` (`ServerCollective`:
//! all-reduce) and `compiler/pipeline.rs` (the pipeline lookup).
//!
//! Ordering: every stream records into the server's one batch, in issue order, and batches are
//! submitted to the one queue in order with a barrier between consecutive commands, so work runs
//! in the order it was issued, on a stream and across streams. Each submission signals the
//! device's timeline semaphore; reads and syncs wait on it with `vkWaitSemaphores`.

use std::collections::VecDeque;
use std::sync::Arc;

use ash::vk;
use compute_core::backend::{CreateRules, Graphs, KernelCache, ServerKit, StreamEntry, Streams};
use compute_core::collective::GroupScope;
use compute_core::future::DynFut;
use compute_core::handle::HandleOwner;
use compute_core::memory::{MemoryDeviceProperties, SliceId};
use compute_core::profile::ProfileTable;
use compute_core::{
    Binding, DeviceProperties, ElemType, Features, HardwareProperties, ServerError, StreamId,
    TimingMethod,
};

use crate::batch::Recorder;
use crate::collective::Collectives;
use crate::compiler::SpirvCaps;
use crate::compiler::pipeline::{Pipeline, PipelineCache};
use crate::context::Context;
use crate::descriptors::{DescriptorCache, Range};
use crate::device::VulkanDevice;
use crate::graph::{Capture, VulkanGraph};
use crate::guard::IndirectGuard;
use crate::profile::QueryPool;
use crate::storage::{Block, Retired, VulkanResource, VulkanStorage};

/// Errors raised outside a call (by the collective worker), waiting for the next flush, sync or
/// read.
pub(crate) type ErrorQueue = Arc<spin::Mutex<VecDeque<ServerError>>>;

/// Launches per batch on a GPU before it is submitted on its own (keeps the device busy while
/// the host records more). While the host keeps filling batches without waiting, the limit
/// doubles up to [`MAX_BATCH_GROWN`] (fewer submissions); a wait brings it back.
const MAX_BATCH_GPU: usize = 64;
/// The most a GPU batch grows to.
const MAX_BATCH_GROWN: usize = 2048;
/// The same on a CPU device (lavapipe), where a submission competes with the host for cores.
const MAX_BATCH_CPU: usize = 2048;

/// Backend information of a Vulkan server.
#[derive(Debug, Clone)]
pub struct VulkanInfo {
    /// The device.
    pub device: VulkanDevice,
    /// The physical device's name.
    pub name: String,
    /// Physical device type (discrete, integrated, CPU, ...).
    pub device_type: String,
    /// Vulkan API version of the device, `major.minor.patch`.
    pub api_version: String,
    /// Driver version as the driver encodes it.
    pub driver_version: u32,
    /// What kernels are compiled for (the features enabled on the device).
    pub caps: SpirvCaps,
    /// Whether launches use push descriptors (VK_KHR_push_descriptor).
    pub push_descriptors: bool,
    /// Whether storage memory is host visible (unified memory: integrated and CPU devices).
    pub unified_memory: bool,
    /// Nanoseconds per timestamp tick (0 without timestamps).
    pub timestamp_period_ns: f32,
}

/// Memory of a block to free once the work submitted before its release has completed.
struct FreeBlock {
    ctx: Arc<Context>,
    block: Block,
}

impl Drop for FreeBlock {
    fn drop(&mut self) {
        // SAFETY: kept until the submissions that could use the block completed.
        unsafe { self.ctx.free_buffer(self.block.buffer, self.block.memory) };
    }
}

/// A stream: its pools and its capture (all streams share the server's one batch and queue).
pub(crate) type StreamState = StreamEntry<VulkanStorage, (), Capture>;

/// Slices whose resources the launch path remembers.
const RESOLVED: usize = 4;

/// What a binding resolves from: slice ids are never reused, and a live slice (a binding holds
/// its handle) keeps its place in its block, so a remembered resolution stays valid while the
/// slice lives; it is forgotten anyway whenever pools or blocks change (see
/// [`VulkanServer::forget_resolved`]).
#[derive(Clone, Copy, PartialEq, Eq)]
struct ResolveKey {
    stream: StreamId,
    slice: SliceId,
    start: u64,
    end: u64,
}

/// The server of one Vulkan device.
pub struct VulkanServer {
    pub(crate) ctx: Arc<Context>,
    pub(crate) info: VulkanInfo,
    pub(crate) owner: HandleOwner,
    /// The device's properties (those the kit's streams keep too), read by the launch checks,
    /// the guard and the pipeline compiler.
    pub(crate) properties: DeviceProperties,
    /// `minStorageBufferOffsetAlignment`.
    pub(crate) bind_align: u64,
    pub(crate) slice_align: u64,
    pub(crate) max_block: u64,
    pub(crate) family: u32,
    pub(crate) streams: Streams<VulkanStorage, (), Capture>,
    pub(crate) retired: Retired,
    pub(crate) recorder: Recorder,
    /// The pipelines made, per kernel and bounds-check mode.
    pub(crate) pipelines: KernelCache<Pipeline>,
    pub(crate) cache: PipelineCache,
    pub(crate) max_batch: usize,
    pub(crate) batch_limit: usize,
    /// False when `COMPUTE_VULKAN_MAX_BATCH` fixes the limit.
    pub(crate) batch_grows: bool,
    pub(crate) graphs: Graphs<VulkanGraph>,
    pub(crate) profiles: ProfileTable<QueryPool>,
    pub(crate) errors: ErrorQueue,
    /// The indirect guard's over-limit errors, kept for the streams whose launches they cover.
    pub(crate) stream_errors: compute_core::backend::StreamErrors,
    pub(crate) collectives: Collectives,
    pub(crate) words: Vec<u32>,
    pub(crate) info_words: Vec<u32>,
    pub(crate) descriptors: Vec<vk::DescriptorBufferInfo>,
    pub(crate) ranges: Vec<Range>,
    pub(crate) descriptors_cache: DescriptorCache,
    /// Streams with a capture running (the launch path skips stream lookups when none).
    pub(crate) captures: usize,
    /// Bindings resolved lately (repeated launches skip the pool and block lookups).
    resolved: [(Option<ResolveKey>, VulkanResource); RESOLVED],
    next_resolved: usize,
    /// The indirect dispatch guard, made at the first launch with a dynamic cube count.
    pub(crate) guard: Option<IndirectGuard>,
}

/// Placeholder of unused [`ResolveKey`] slots.
const NO_RESOURCE: VulkanResource = VulkanResource {
    buffer: vk::Buffer::null(),
    offset: 0,
    size: 0,
    block_size: 0,
};

pub(crate) fn ready<T: Send + 'static>(value: T) -> DynFut<T> {
    Box::pin(core::future::ready(value))
}

/// The element types kernels may use with these capabilities.
pub fn elem_types(caps: &SpirvCaps) -> Vec<ElemType> {
    let mut types = vec![ElemType::I32, ElemType::U32, ElemType::F32];
    if caps.int8 && caps.storage8 {
        types.extend([ElemType::Bool, ElemType::I8, ElemType::U8]);
    }
    if caps.int16 && caps.storage16 {
        types.extend([ElemType::I16, ElemType::U16, ElemType::BF16]);
    }
    if caps.float16 && caps.storage16 {
        types.push(ElemType::F16);
    }
    if caps.int64 {
        types.extend([ElemType::I64, ElemType::U64]);
    }
    if caps.float64 {
        types.push(ElemType::F64);
    }
    types.sort();
    types
}

fn device_type_name(t: vk::PhysicalDeviceType) -> &'static str {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => "discrete GPU",
        vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated GPU",
        vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual GPU",
        vk::PhysicalDeviceType::CPU => "CPU",
        _ => "other",
    }
}

fn max_batch(ctx: &Context) -> usize {
    if let Some(n) = compute_core::env::positive::<usize>("COMPUTE_VULKAN_MAX_BATCH") {
        return n;
    }
    if ctx.properties.device_type == vk::PhysicalDeviceType::CPU {
        MAX_BATCH_CPU
    } else {
        MAX_BATCH_GPU
    }
}

impl VulkanServer {
    /// Create the logical device of `device` on `physical` and start its server.
    pub(crate) fn new(
        device: VulkanDevice,
        instance: &'static crate::device::Instance,
        physical: vk::PhysicalDevice,
    ) -> Result<Self, ServerError> {
        let ctx = Arc::new(Context::new(instance, physical)?);
        let family = ctx.family;
        let limits = *ctx.limits();
        let bind_align = limits.min_storage_buffer_offset_alignment.max(4);
        let slice_align = bind_align.max(16);
        // Rounded down to the slice alignment: the pools pad a request to it, and every size up
        // to the reported maximum must allocate.
        let max_block = u64::from(limits.max_storage_buffer_range)
            .min(ctx.max_buffer_size)
            .min(ctx.max_memory_allocation_size)
            / slice_align
            * slice_align;
        let timestamps = ctx.timestamp_valid_bits > 0 && limits.timestamp_period > 0.0;
        let props = ctx.properties;
        let info = VulkanInfo {
            device,
            name: ctx.name(),
            device_type: device_type_name(props.device_type).into(),
            api_version: format!(
                "{}.{}.{}",
                vk::api_version_major(props.api_version),
                vk::api_version_minor(props.api_version),
                vk::api_version_patch(props.api_version)
            ),
            driver_version: props.driver_version,
            caps: ctx.caps,
            push_descriptors: ctx.push_descriptor.is_some(),
            unified_memory: ctx.storage_host_visible,
            timestamp_period_ns: if timestamps {
                limits.timestamp_period
            } else {
                0.0
            },
        };
        let properties = DeviceProperties {
            name: format!(
                "vulkan:{} {} ({})",
                device.index,
                info.name,
                device_type_name(props.device_type)
            ),
            backend: "vulkan".into(),
            memory: MemoryDeviceProperties {
                max_page_size: max_block,
                alignment: slice_align,
            },
            memory_total: (ctx.memory_total > 0).then_some(ctx.memory_total),
            hardware: HardwareProperties {
                plane_size_min: ctx.subgroup_size.0,
                plane_size_max: ctx.subgroup_size.1,
                max_units_per_cube: limits.max_compute_work_group_invocations,
                max_cube_dim: limits.max_compute_work_group_size,
                max_cube_count: limits.max_compute_work_group_count,
                max_shared_memory_bytes: u64::from(limits.max_compute_shared_memory_size),
                num_compute_units: 1,
                max_load_bytes: 16,
                max_private_bytes_per_unit:
                    compute_core::properties::DEFAULT_MAX_PRIVATE_BYTES_PER_UNIT,
            },
            features: Features {
                elem_types: elem_types(&ctx.caps),
                plane_ops: ctx.caps.subgroups,
                atomics: true,
                graphs: true,
                device_timestamps: timestamps,
                collectives: true,
            },
            timing: TimingMethod::with_timestamps(timestamps),
            pitch_alignment: None,
        };
        let owner = HandleOwner::fresh(compute_core::Device::to_id(&device));
        let errors = ErrorQueue::default();
        let recorder = Recorder::new(&ctx, family, errors.clone())?;
        let cache = PipelineCache::open(&ctx)?;
        let max_batch = max_batch(&ctx);
        Ok(Self {
            info,
            owner,
            streams: Streams::new(owner, properties.clone()),
            properties,
            bind_align,
            slice_align,
            max_block,
            family,
            retired: Retired::default(),
            recorder,
            pipelines: KernelCache::default(),
            cache,
            max_batch,
            batch_limit: max_batch,
            batch_grows: compute_core::env::positive::<usize>("COMPUTE_VULKAN_MAX_BATCH").is_none(),
            graphs: Graphs::default(),
            profiles: ProfileTable::default(),
            errors,
            stream_errors: Default::default(),
            collectives: Collectives::new(GroupScope {
                me: owner.device,
                count: crate::device::device_count,
                backend: "vulkan",
            }),
            words: Vec::new(),
            info_words: Vec::new(),
            descriptors: Vec::new(),
            ranges: Vec::new(),
            descriptors_cache: DescriptorCache::new(&ctx),
            captures: 0,
            resolved: [(None, NO_RESOURCE); RESOLVED],
            next_resolved: 0,
            guard: None,
            ctx,
        })
    }

    /// The `ash::Device` behind this server, for interop.
    pub fn raw_device(&self) -> &ash::Device {
        &self.ctx.device
    }

    /// [`Streams::resolve`] behind the cache of lately resolved bindings.
    pub(crate) fn resolve(&mut self, binding: &Binding) -> Result<VulkanResource, ServerError> {
        binding.check_owner(self.owner)?;
        let handle = binding.handle();
        let key = ResolveKey {
            stream: handle.stream(),
            slice: handle.memory().id(),
            start: handle.slice_offset_start(),
            end: handle.slice_offset_end(),
        };
        let resource = match self.resolved.iter().find(|(k, _)| *k == Some(key)) {
            Some(&(_, resource)) => resource,
            None => {
                let resource = self.streams.resolve(binding)?;
                self.resolved[self.next_resolved] = (Some(key), resource);
                self.next_resolved = (self.next_resolved + 1) % RESOLVED;
                resource
            }
        };
        self.collectives.wait_for(key.slice);
        Ok(resource)
    }

    /// Forget remembered resolutions (pools or blocks may have changed).
    pub(crate) fn forget_resolved(&mut self) {
        self.resolved = [(None, NO_RESOURCE); RESOLVED];
    }

    pub(crate) fn capturing(&self, stream: StreamId) -> bool {
        self.streams.is_capturing(stream)
    }

    /// The first error waiting for `stream`: its own guard errors first, then the server's.
    pub(crate) fn take_error(&self, stream: StreamId) -> Result<(), ServerError> {
        self.stream_errors.take(stream)?;
        compute_core::error::take_result(&mut self.errors.lock())
    }

    /// Hand blocks the pools released to the batch (freed once the work before them is done).
    pub(crate) fn drain_retired(&mut self) {
        let blocks = core::mem::take(&mut *self.retired.lock());
        if !blocks.is_empty() {
            self.forget_resolved();
            // Cached sets may point at these blocks (and their handles may be reused).
            let pools = self.descriptors_cache.clear();
            self.recorder.keep_until_done(pools);
        }
        for block in blocks {
            let free = FreeBlock {
                ctx: self.ctx.clone(),
                block,
            };
            self.recorder.keep_until_done(free);
        }
    }

    pub(crate) fn submit(&mut self) -> Result<Option<u64>, ServerError> {
        self.drain_retired();
        self.recorder.submit()
    }

    pub(crate) fn submit_or_last(&mut self) -> Result<u64, ServerError> {
        self.drain_retired();
        self.recorder.submit_or_last()
    }

    pub(crate) fn after_command(&mut self) -> Result<(), ServerError> {
        if self.recorder.dispatches >= self.batch_limit {
            self.submit()?;
            if self.batch_grows {
                self.batch_limit = (self.batch_limit * 2).min(self.max_batch.max(MAX_BATCH_GROWN));
            }
        }
        Ok(())
    }

    /// A wait is coming: the host is not racing ahead, batches start small again.
    pub(crate) fn reset_batch_limit(&mut self) {
        self.batch_limit = self.max_batch;
    }
}

/// The kit behind the role traits' defaults: the Vulkan streams, graphs and create layout.
impl ServerKit for VulkanServer {
    type KitStorage = VulkanStorage;
    type KitQueue = ();
    type KitCapture = Capture;
    type KitGraph = VulkanGraph;

    fn kit_streams(&self) -> &Streams<VulkanStorage, (), Capture> {
        &self.streams
    }

    fn kit_parts(
        &mut self,
    ) -> (
        &mut Streams<VulkanStorage, (), Capture>,
        &mut Graphs<VulkanGraph>,
    ) {
        (&mut self.streams, &mut self.graphs)
    }

    fn stream(&mut self, id: StreamId) -> Result<&mut StreamState, ServerError> {
        let (ctx, retired) = (&self.ctx, &self.retired);
        let (slice_align, max_block) = (self.slice_align, self.max_block);
        self.streams.get_or_create(id, || {
            let storage = VulkanStorage::new(ctx.clone(), slice_align, max_block, retired.clone());
            Ok((storage, ()))
        })
    }

    /// The layout of a `create`: slices start at the slice alignment, rows are packed, and an
    /// allocation larger than one block can be (the least of maxStorageBufferRange,
    /// maxBufferSize and maxMemoryAllocationSize, rounded down to the slice alignment) is
    /// [`ServerError::BufferTooLarge`].
    fn create_rules(&self) -> CreateRules {
        CreateRules {
            alignment: self.slice_align,
            pitch_alignment: None,
        }
    }
}

impl Drop for VulkanServer {
    fn drop(&mut self) {
        if let Err(e) = self.submit() {
            compute_core::error::report_unreturned("vulkan: submitting at server drop", &e);
        }
        // SAFETY: waiting for the device before releasing what its work may still use.
        if let Err(e) = unsafe { self.ctx.device.device_wait_idle() } {
            compute_core::error::report_unreturned("vulkan: vkDeviceWaitIdle at server drop", &e);
        }
        self.collectives.shutdown();
        self.graphs.drain().for_each(drop);
        self.profiles.clear();
        self.streams.drain().for_each(drop);
        self.recorder.recycle();
        for block in core::mem::take(&mut *self.retired.lock()) {
            // SAFETY: the device is idle.
            unsafe { self.ctx.free_buffer(block.buffer, block.memory) };
        }
        self.pipelines.clear();
    }
}
