//! The Vulkan server: logical streams over the device's compute queue, pools over
//! `vkAllocateMemory` blocks, a pipeline cache, batched submissions with push descriptors,
//! graphs as pre-recorded command buffers, timestamp profiles and host-staged collectives.
//!
//! Ordering: every stream records into the server's one batch, in issue order, and batches are
//! submitted to the one queue in order with a barrier between consecutive commands, so work runs
//! in the order it was issued, on a stream and across streams. Each submission signals the
//! device's timeline semaphore; reads and syncs wait on it with `vkWaitSemaphores`.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;

use ash::vk;
use compute_core::backend::{CreateRules, Graphs, StreamEntry, Streams};
use compute_core::error::LaunchError;
use compute_core::future::DynFut;
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

use crate::batch::{Linear, Recorder, Staging, stage};
use crate::collective::{Collectives, Round};
use crate::context::Context;
use crate::descriptors::{DescriptorCache, Range};
use crate::device::{VulkanDevice, device_count};
use crate::guard::{GUARD_BYTES, IndirectGuard, cleared_status, guard_kernel};
use crate::kernel::VulkanKernel;
use crate::ops::Rec;
use crate::ops::{Op, Ops};
use crate::pipeline::{Pipeline, PipelineCache};
use crate::spirv::{self, SpirvCaps};
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

/// Written host buffers at least this large are freed on the recycler thread.
const RELEASE_OFF_THREAD_BYTES: usize = 4 << 20;

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

/// A capture in progress on a stream: the commands, recorded as [`Ops`] that each replay appends
/// to the open batch (recorded into the batch's own command buffer on the submit thread, as plain
/// launches are: no simultaneous-use command buffer, which drivers may copy or patch at every
/// submission), and the buffer ranges used since the capture's last barrier.
struct Capture {
    ops: Ops,
    linear: Linear,
    since_barrier: Vec<(vk::Buffer, u64, u64)>,
    keep: Vec<Box<dyn Any + Send>>,
}

impl Capture {
    /// Record the barrier a dispatch using `ranges` (buffer, offset, bytes) needs: one before the
    /// graph's first command (against the work before the replay), and one before a dispatch
    /// that uses a range overlapping one used since the last barrier (every use is taken as a
    /// write). The capture knows every command of the graph, so independent dispatches run
    /// without barriers between them, which plain launches cannot know.
    fn barrier_for(&mut self, ranges: impl Iterator<Item = (vk::Buffer, u64, u64)> + Clone) {
        let overlaps = |&(b, o, n): &(vk::Buffer, u64, u64)| {
            ranges.clone().any(|(b2, o2, n2)| {
                b == b2 && o < o2.saturating_add(n2) && o2 < o.saturating_add(n)
            })
        };
        if self.ops.is_empty() || self.since_barrier.iter().any(overlaps) {
            self.ops.push(Op::Barrier {
                src: stage::ALL,
                dst: stage::ALL,
            });
            self.since_barrier.clear();
        }
        self.since_barrier.extend(ranges);
    }
}

/// A captured graph: its commands, appended to the open batch on each replay, and what they use.
struct VulkanGraph {
    ops: Ops,
    _keep: Vec<Box<dyn Any + Send>>,
    _chunks: Vec<Staging>,
}

/// A stream: its pools and its capture (all streams share the server's one batch and queue).
type StreamState = StreamEntry<VulkanStorage, (), Capture>;

struct QueryPool {
    ctx: Arc<Context>,
    pool: vk::QueryPool,
}

impl Drop for QueryPool {
    fn drop(&mut self) {
        // SAFETY: dropped after the submission writing it completed (or never submitted).
        unsafe { self.ctx.device.destroy_query_pool(self.pool, None) };
    }
}

/// Staging buffers a read copies into, waited for before they return to the pool.
struct PendingRead {
    ctx: Arc<Context>,
    value: u64,
    parts: Vec<Option<(Staging, CopyDescriptor)>>,
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        // A read dropped before completion must not hand its staging back while the GPU writes
        // it.
        if let Err(e) = self.ctx.wait(self.value) {
            compute_core::error::report_unreturned("vulkan: waiting for a dropped read", &e);
        }
    }
}

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
    ctx: Arc<Context>,
    info: VulkanInfo,
    owner: HandleOwner,
    properties: DeviceProperties,
    /// `minStorageBufferOffsetAlignment`.
    bind_align: u64,
    slice_align: u64,
    max_block: u64,
    family: u32,
    streams: Streams<VulkanStorage, (), Capture>,
    retired: Retired,
    recorder: Recorder,
    pipelines: HashMap<(KernelId, bool), Arc<Pipeline>>,
    /// The pipeline of the latest launch (repeated launches skip the map lookup).
    last_pipeline: Option<(KernelId, bool, Arc<Pipeline>)>,
    cache: PipelineCache,
    max_batch: usize,
    batch_limit: usize,
    /// False when `COMPUTE_VULKAN_MAX_BATCH` fixes the limit.
    batch_grows: bool,
    graphs: Graphs<VulkanGraph>,
    profiles: ProfileTable<QueryPool>,
    errors: ErrorQueue,
    collectives: Collectives,
    words: Vec<u32>,
    info_words: Vec<u32>,
    descriptors: Vec<vk::DescriptorBufferInfo>,
    ranges: Vec<Range>,
    descriptors_cache: DescriptorCache,
    /// Streams with a capture running (the launch path skips stream lookups when none).
    captures: usize,
    /// Bindings resolved lately (repeated launches skip the pool and block lookups).
    resolved: [(Option<ResolveKey>, VulkanResource); RESOLVED],
    next_resolved: usize,
    /// The indirect dispatch guard, made at the first launch with a dynamic cube count.
    guard: Option<IndirectGuard>,
}

/// Placeholder of unused [`ResolveKey`] slots.
const NO_RESOURCE: VulkanResource = VulkanResource {
    buffer: vk::Buffer::null(),
    offset: 0,
    size: 0,
    block_size: 0,
};

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

fn saturate(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

fn words_as_bytes(words: &[u32]) -> &[u8] {
    bytemuck::cast_slice(words)
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
            timing: if timestamps {
                TimingMethod::Device
            } else {
                TimingMethod::Host
            },
            pitch_alignment: None,
        };
        static NEXT_SERVER: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
        let owner = HandleOwner {
            device: compute_core::Device::to_id(&device),
            server: NEXT_SERVER.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
        };
        let errors = ErrorQueue::default();
        let recorder = Recorder::new(&ctx, family, errors.clone())?;
        let cache = PipelineCache::open(&ctx)?;
        let max_batch = max_batch(&ctx);
        Ok(Self {
            info,
            owner,
            streams: Streams::new(owner, properties.memory.clone()),
            properties,
            bind_align,
            slice_align,
            max_block,
            family,
            retired: Retired::default(),
            recorder,
            pipelines: HashMap::new(),
            last_pipeline: None,
            cache,
            max_batch,
            batch_limit: max_batch,
            batch_grows: compute_core::env::positive::<usize>("COMPUTE_VULKAN_MAX_BATCH").is_none(),
            graphs: Graphs::default(),
            profiles: ProfileTable::default(),
            errors,
            collectives: Collectives::default(),
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

    /// Run the indirect guard (see [`crate::guard`]) over the dynamic count `binding` on
    /// `stream`: the binding of the guarded count, to dispatch from.
    fn guard_count(&mut self, binding: Binding, stream: StreamId) -> Result<Binding, ServerError> {
        if self.guard.is_none() {
            self.ensure_not_capturing(
                stream,
                "the first launch with a dynamic cube count (it makes the count guard's buffers)",
            )?;
            let owner = self.owner;
            let memory = &mut self.stream(stream)?.memory;
            let args = Handle::new(memory.reserve(GUARD_BYTES)?, owner, stream);
            let status = Handle::new(memory.reserve(GUARD_BYTES)?, owner, stream);
            self.write(
                vec![(status.clone().copy_descriptor_bytes(), cleared_status())],
                stream,
            )?;
            self.guard = Some(IndirectGuard {
                kernel: guard_kernel().into(),
                args,
                status,
                unread: false,
            });
        }
        let Some(guard) = self.guard.as_mut() else {
            unreachable!("made just above")
        };
        guard.unread = true;
        let (kernel, args) = (guard.kernel.clone(), guard.args.clone());
        let max = self.properties.hardware.max_cube_count;
        let arguments = KernelArguments::new()
            .buffer(binding)
            .buffer(args.clone().binding())
            .buffer(guard.status.clone().binding())
            .scalar(max[0])
            .scalar(max[1])
            .scalar(max[2]);
        // SAFETY: a bounds-checked launch of the guard, whose buffers hold the 3 and 4 words it
        // reads and writes.
        unsafe {
            self.launch(
                kernel,
                CubeCount::Static(1, 1, 1),
                arguments,
                ExecutionMode::Checked,
                stream,
            )?;
        }
        Ok(args.binding())
    }

    /// When an indirect launch was recorded since the status was last read: a read of the
    /// guard's status, and a write clearing it after the read.
    fn read_guard_status(
        &mut self,
        stream: StreamId,
    ) -> Option<DynFut<Result<Vec<Bytes>, ServerError>>> {
        let guard = self.guard.as_mut()?;
        if !guard.unread {
            return None;
        }
        guard.unread = false;
        let status = guard.status.clone();
        let read = self.read(vec![status.clone().copy_descriptor_bytes()], stream);
        if let Err(e) = self.write(
            vec![(status.copy_descriptor_bytes(), cleared_status())],
            stream,
        ) {
            self.errors.lock().push_back(e);
        }
        Some(read)
    }

    /// The layout of a `create`: slices start at the slice alignment, rows are packed, and an
    /// allocation larger than one block can be (the least of maxStorageBufferRange,
    /// maxBufferSize and maxMemoryAllocationSize, rounded down to the slice alignment) is
    /// [`ServerError::BufferTooLarge`].
    fn create_rules(&self) -> CreateRules {
        CreateRules {
            alignment: self.slice_align,
            pitch_alignment: None,
            max_size: self.max_block,
        }
    }

    /// The `ash::Device` behind this server, for interop.
    pub fn raw_device(&self) -> &ash::Device {
        &self.ctx.device
    }

    fn stream(&mut self, id: StreamId) -> Result<&mut StreamState, ServerError> {
        let (ctx, retired) = (&self.ctx, &self.retired);
        let (slice_align, max_block) = (self.slice_align, self.max_block);
        self.streams.get_or_create(id, || {
            let storage = VulkanStorage::new(ctx.clone(), slice_align, max_block, retired.clone());
            Ok((storage, ()))
        })
    }

    /// [`Streams::resolve`] behind the cache of lately resolved bindings.
    fn resolve(&mut self, binding: &Binding) -> Result<VulkanResource, ServerError> {
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
    fn forget_resolved(&mut self) {
        self.resolved = [(None, NO_RESOURCE); RESOLVED];
    }

    fn capturing(&self, stream: StreamId) -> bool {
        self.streams.is_capturing(stream)
    }

    /// One write: `data` (the descriptor's compact bytes) copied into the linear staging and a
    /// copy from there recorded. `data` is read only during the call.
    fn write_staged(
        &mut self,
        descriptor: &CopyDescriptor,
        data: &[u8],
    ) -> Result<(), ServerError> {
        descriptor.validate_write(data.len())?;
        let target = self.resolve(&descriptor.binding)?;
        if data.is_empty() {
            return Ok(());
        }
        let (src, src_offset) = self.recorder.linear.push(&self.ctx, data, 16)?;
        let regions: Vec<vk::BufferCopy> = if is_contiguous(&descriptor.shape, &descriptor.strides)
        {
            vec![vk::BufferCopy {
                src_offset,
                dst_offset: target.offset,
                size: data.len() as u64,
            }]
        } else {
            let mut rows = Vec::new();
            for_each_row(
                &descriptor.shape,
                &descriptor.strides,
                descriptor.elem_size,
                |s, c, n| {
                    rows.push(vk::BufferCopy {
                        src_offset: src_offset + c as u64,
                        dst_offset: target.offset + s as u64,
                        size: n as u64,
                    });
                },
            );
            rows
        };
        // The regions lie inside the staging chunk and the block.
        self.recorder
            .command(stage::TRANSFER)
            .copy(src, target.buffer, &regions);
        self.recorder.dispatches += 1;
        self.after_command()
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

    /// Hand blocks the pools released to the batch (freed once the work before them is done).
    fn drain_retired(&mut self) {
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

    fn submit(&mut self) -> Result<Option<u64>, ServerError> {
        self.drain_retired();
        self.recorder.submit()
    }

    fn submit_or_last(&mut self) -> Result<u64, ServerError> {
        self.drain_retired();
        self.recorder.submit_or_last()
    }

    fn after_command(&mut self) -> Result<(), ServerError> {
        if self.recorder.dispatches >= self.batch_limit {
            self.submit()?;
            if self.batch_grows {
                self.batch_limit = (self.batch_limit * 2).min(self.max_batch.max(MAX_BATCH_GROWN));
            }
        }
        Ok(())
    }

    /// A wait is coming: the host is not racing ahead, batches start small again.
    fn reset_batch_limit(&mut self) {
        self.batch_limit = self.max_batch;
    }

    fn pipeline(
        &mut self,
        kernel: &VulkanKernel,
        checked: bool,
    ) -> Result<Arc<Pipeline>, ServerError> {
        if let Some((id, was_checked, found)) = &self.last_pipeline
            && *id == kernel.id
            && *was_checked == checked
        {
            return Ok(found.clone());
        }
        if let Some(found) = self.pipelines.get(&(kernel.id, checked)) {
            self.last_pipeline = Some((kernel.id, checked, found.clone()));
            return Ok(found.clone());
        }
        let def = &kernel.definition;
        def.validate(&self.properties.hardware)?;
        let compiled = spirv::compile(def, &self.ctx.caps, checked)?;
        // Launch info changes every launch: pushed. Everything else binds cached sets.
        let push = compiled.uses_info;
        if push && self.ctx.push_descriptor.is_none() {
            return Err(ServerError::Unsupported(format!(
                "vulkan: kernel `{}` reads launch metadata, which needs VK_KHR_push_descriptor (this device lacks it)",
                def.name()
            )));
        }
        if compiled.push_constant_bytes > self.ctx.limits().max_push_constants_size {
            return Err(ServerError::Compilation(format!(
                "kernel `{}` needs {} bytes of push constants, the device has {}",
                def.name(),
                compiled.push_constant_bytes,
                self.ctx.limits().max_push_constants_size
            )));
        }
        let pipeline = Arc::new(Pipeline::new(
            &self.ctx,
            self.cache.cache,
            def.name(),
            compiled,
            push,
        )?);
        self.cache.created();
        self.pipelines
            .insert((kernel.id, checked), pipeline.clone());
        self.last_pipeline = Some((kernel.id, checked, pipeline.clone()));
        Ok(pipeline)
    }

    /// The descriptor range a launch binds for a buffer argument, its offset in items and its
    /// length in items.
    fn bind(
        &self,
        resource: VulkanResource,
        item: u64,
        name: &str,
    ) -> Result<(vk::DescriptorBufferInfo, u32, u32), ServerError> {
        let item = item.max(1);
        // minStorageBufferOffsetAlignment is a power of two (spec); item sizes nearly always are:
        // masks and shifts instead of divisions on the launch path.
        let bind_offset = if self.bind_align.is_power_of_two() {
            resource.offset & !(self.bind_align - 1)
        } else {
            resource.offset / self.bind_align * self.bind_align
        };
        let delta = resource.offset - bind_offset;
        let in_items = |bytes: u64| {
            if item.is_power_of_two() {
                bytes >> item.trailing_zeros()
            } else {
                bytes / item
            }
        };
        let misaligned = if item.is_power_of_two() {
            delta & (item - 1) != 0
        } else {
            !delta.is_multiple_of(item)
        };
        if misaligned {
            return Err(LaunchError::MisalignedBuffer {
                kernel: name.into(),
                name: "argument".into(),
                offset: resource.offset,
                alignment: item,
            }
            .into());
        }
        let mut range = (delta + resource.size).max(item).next_multiple_of(4);
        if bind_offset + range > resource.block_size {
            range = resource.block_size - bind_offset;
        }
        let max = u64::from(self.ctx.limits().max_storage_buffer_range);
        if range > max {
            return Err(LaunchError::BindingTooLarge {
                kernel: name.into(),
                bytes: range,
                maximum: max,
                limit: "maxStorageBufferRange",
            }
            .into());
        }
        Ok((
            vk::DescriptorBufferInfo::default()
                .buffer(resource.buffer)
                .offset(bind_offset)
                .range(range),
            saturate(in_items(delta)),
            saturate(in_items(resource.size)),
        ))
    }

    fn check_group(&self, devices: &[DeviceId]) -> Result<Vec<DeviceId>, ServerError> {
        compute_core::collective::check_group(devices, self.owner.device, device_count(), "vulkan")
    }

    /// Record copies of `regions` from `src` into a fresh staging buffer of `size` bytes.
    fn stage_read(
        &mut self,
        src: vk::Buffer,
        regions: &[vk::BufferCopy],
        size: u64,
    ) -> Result<Staging, ServerError> {
        let staging = Staging::new(&self.ctx, size)?;
        // The regions lie inside both buffers; the staging buffer lives until the copy completed.
        self.recorder
            .command(stage::TRANSFER)
            .copy(src, staging.buffer(), regions);
        Ok(staging)
    }

    fn profile_queries(&mut self) -> Result<QueryPool, ServerError> {
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(2);
        // SAFETY: a valid create info.
        let pool = unsafe { self.ctx.device.create_query_pool(&info, None) }
            .map_err(|e| ServerError::Driver(format!("vkCreateQueryPool failed: {e}")))?;
        Ok(QueryPool {
            ctx: self.ctx.clone(),
            pool,
        })
    }

    fn timestamp(&mut self, pool: vk::QueryPool, index: u32) -> Result<(), ServerError> {
        // The pool has 2 queries and is kept until the profile is read.
        let mut rec = self.recorder.command(stage::ALL);
        if index == 0 {
            rec.reset_queries(pool, 0, 2);
        }
        rec.timestamp(pool, index);
        Ok(())
    }

    /// Record (or capture) one dispatch.
    #[allow(clippy::too_many_arguments)]
    fn record_dispatch(
        &mut self,
        stream: StreamId,
        pipeline: &Arc<Pipeline>,
        descriptors: &[vk::DescriptorBufferInfo],
        push: &[u32],
        info: Option<&[u32]>,
        count: DispatchCount,
        keep: Vec<Binding>,
    ) -> Result<(), ServerError> {
        let ctx = &self.ctx;
        if self.descriptors_cache.is_full() {
            let pools = self.descriptors_cache.clear();
            self.recorder.keep_until_done(pools);
        }
        let capture = if self.captures > 0 {
            self.streams
                .get_mut(stream)
                .and_then(|state| state.capture.as_mut())
        } else {
            None
        };
        let (mut rec, linear, graph_keep) = match capture {
            Some(capture) => {
                let count_range = match count {
                    DispatchCount::Dynamic { buffer, offset } => Some((buffer, offset, 12)),
                    DispatchCount::Static(_) => None,
                };
                capture.barrier_for(
                    descriptors
                        .iter()
                        .map(|d| (d.buffer, d.offset, d.range))
                        .chain(count_range),
                );
                capture.keep.push(Box::new(pipeline.clone()));
                capture.keep.push(Box::new(keep));
                (
                    Rec(&mut capture.ops),
                    &mut capture.linear,
                    Some(&mut capture.keep),
                )
            }
            None => {
                self.recorder.barrier_for(count.stages());
                self.recorder.dispatches += 1;
                (Rec(&mut self.recorder.ops), &mut self.recorder.linear, None)
            }
        };
        let push_bytes = pipeline.push_constant_bytes as usize;
        let mut push_stack = [0u8; 256];
        let mut push_heap = Vec::new();
        let push_block = push_block(push, push_bytes, &mut push_stack, &mut push_heap);
        if !pipeline.push_descriptors {
            let mut ranges = core::mem::take(&mut self.ranges);
            ranges.clear();
            ranges.extend(descriptors.iter().map(|d| (d.buffer, d.offset, d.range)));
            let found =
                self.descriptors_cache
                    .get(pipeline.id, pipeline.set_layout_handle, &ranges);
            self.ranges = ranges;
            let (set, pool) = found?;
            let tracked = graph_keep.is_none();
            if let Some(keep) = graph_keep {
                // A graph outlives cache clears: it keeps the pool of its sets.
                keep.push(Box::new(pool.clone()));
            }
            // Graph captures record into their own list, replayed after any command: no state
            // tracking there.
            // The pipeline, the set (its pool is kept until the work completes) and every bound
            // buffer are alive until the commands completed; skipped binds are already bound in
            // the command buffer (same pipeline, hence same layout).
            let bound = &mut self.recorder.bound;
            let same_pipeline = tracked && bound.pipeline == pipeline.pipeline;
            let same_set = same_pipeline && bound.set == set;
            let same_push = same_pipeline && bound.push.as_slice() == push_block;
            if !same_pipeline {
                rec.bind_pipeline(pipeline.pipeline);
            }
            if !descriptors.is_empty() && !same_set {
                rec.bind_set(pipeline.layout, set);
            }
            if !push_block.is_empty() && !same_push {
                rec.push_constants(pipeline.layout, push_block);
            }
            record_count(&mut rec, count);
            if tracked {
                bound.pipeline = pipeline.pipeline;
                bound.set = set;
                if !same_push {
                    bound.push.clear();
                    bound.push.extend_from_slice(push_block);
                }
            }
            return Ok(());
        }
        if graph_keep.is_none() {
            self.recorder.bound.forget();
        }
        let info_descriptor = match info {
            Some(words) => {
                let (buffer, offset) = linear.push(ctx, words_as_bytes(words), self.bind_align)?;
                Some(
                    vk::DescriptorBufferInfo::default()
                        .buffer(buffer)
                        .offset(offset)
                        .range((words.len() as u64 * 4).max(4)),
                )
            }
            None => None,
        };
        // Launches with few buffers (nearly all) build their writes on the stack.
        const STACK_WRITES: usize = 16;
        let total = descriptors.len() + usize::from(info_descriptor.is_some());
        let mut bindings = [0u32; STACK_WRITES];
        let mut infos = [vk::DescriptorBufferInfo::default(); STACK_WRITES];
        let (mut heap_bindings, mut heap_infos) = (Vec::new(), Vec::new());
        let (bindings, infos): (&mut [u32], &mut [vk::DescriptorBufferInfo]) =
            if total <= STACK_WRITES {
                (&mut bindings[..total], &mut infos[..total])
            } else {
                heap_bindings.resize(total, 0);
                heap_infos.resize(total, vk::DescriptorBufferInfo::default());
                (&mut heap_bindings, &mut heap_infos)
            };
        for (k, d) in descriptors.iter().enumerate() {
            bindings[k] = k as u32;
            infos[k] = *d;
        }
        if let Some(d) = info_descriptor {
            bindings[descriptors.len()] = pipeline.info_binding;
            infos[descriptors.len()] = d;
        }
        // The pipeline, its layout and every bound buffer are alive until the commands completed
        // (pipelines are cached, blocks are freed late).
        rec.bind_pipeline(pipeline.pipeline);
        if !bindings.is_empty() {
            rec.push_descriptors(pipeline.layout, bindings, infos);
        }
        if !push_block.is_empty() {
            rec.push_constants(pipeline.layout, push_block);
        }
        record_count(&mut rec, count);
        Ok(())
    }
}

/// The push-constant block: the argument words padded to the pipeline's block size, on the
/// stack when it fits.
fn push_block<'a>(
    push: &'a [u32],
    bytes: usize,
    stack: &'a mut [u8; 256],
    heap: &'a mut Vec<u8>,
) -> &'a [u8] {
    if bytes == 0 {
        return &[];
    }
    let src = words_as_bytes(push);
    let dst: &mut [u8] = if bytes <= stack.len() {
        &mut stack[..bytes]
    } else {
        heap.resize(bytes, 0);
        heap
    };
    let n = src.len().min(bytes);
    dst[..n].copy_from_slice(&src[..n]);
    dst
}

/// The over-limit count the indirect guard recorded in its status (read back as `bytes`), as the
/// error to report, if it recorded one.
fn guard_error(bytes: &[Bytes], maximum: [u32; 3]) -> Option<ServerError> {
    let raw = bytes.first()?.to_vec();
    let word =
        |i: usize| u32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]]);
    (raw.len() >= GUARD_BYTES as usize && word(0) != 0).then(|| {
        compute_core::error::LaunchError::CubeCountTooLarge {
            count: [word(1), word(2), word(3)],
            maximum,
        }
        .into()
    })
}

/// Record the dispatch itself (after the pipeline and its descriptors).
fn record_count(rec: &mut Rec<'_>, count: DispatchCount) {
    match count {
        DispatchCount::Static(xyz) => rec.dispatch(xyz),
        DispatchCount::Dynamic { buffer, offset } => rec.dispatch_indirect(buffer, offset),
    }
}

#[derive(Clone, Copy)]
enum DispatchCount {
    Static([u32; 3]),
    Dynamic { buffer: vk::Buffer, offset: u64 },
}

impl DispatchCount {
    /// The stages the dispatch runs in (a dynamic count is read by the indirect stage first).
    fn stages(self) -> u8 {
        match self {
            DispatchCount::Static(_) => stage::COMPUTE,
            DispatchCount::Dynamic { .. } => stage::COMPUTE | stage::INDIRECT,
        }
    }
}

impl ComputeServer for VulkanServer {
    type Kernel = VulkanKernel;
    type Storage = VulkanStorage;
    type Info = VulkanInfo;

    fn info(&self) -> VulkanInfo {
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
        // Completed work hands its staging buffers back before this write asks for one.
        self.recorder.recycle();
        for (descriptor, bytes) in writes {
            self.write_staged(&descriptor, bytes.try_as_slice()?)?;
            if bytes.len() >= RELEASE_OFF_THREAD_BYTES {
                // The data is in staging now; freeing a large host buffer (unmapping its pages)
                // is not the caller's wait.
                self.recorder.release_soon(bytes);
            }
        }
        Ok(())
    }

    fn write_from_slice(
        &mut self,
        descriptor: CopyDescriptor,
        data: &[u8],
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "write")?;
        self.recorder.recycle();
        // Copied into staging during the call: no intermediate host copy.
        self.write_staged(&descriptor, data)
    }

    fn read(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        // Read before the data (the status read takes a queued error first); cleared after.
        let guard = match self.ensure_not_capturing(stream, "read") {
            Ok(()) => self.read_guard_status(stream),
            Err(_) => None,
        };
        let maximum = self.properties.hardware.max_cube_count;
        let prepared = (|| {
            self.ensure_not_capturing(stream, "read")?;
            self.take_error()?;
            let mut sources = Vec::with_capacity(descriptors.len());
            for descriptor in &descriptors {
                descriptor.validate()?;
                sources.push(self.resolve(&descriptor.binding)?);
            }
            self.recorder.recycle();
            let mut parts = Vec::with_capacity(descriptors.len());
            for (descriptor, source) in descriptors.into_iter().zip(sources) {
                let span =
                    strided_span(&descriptor.shape, &descriptor.strides, descriptor.elem_size)
                        as u64;
                if span == 0 {
                    parts.push(None);
                    continue;
                }
                let region = vk::BufferCopy {
                    src_offset: source.offset,
                    dst_offset: 0,
                    size: span,
                };
                let staging = self.stage_read(source.buffer, &[region], span)?;
                parts.push(Some((staging, descriptor)));
            }
            let value = self.submit_or_last()?;
            self.reset_batch_limit();
            self.cache.maybe_save();
            Ok::<_, ServerError>(PendingRead {
                ctx: self.ctx.clone(),
                value,
                parts,
            })
        })();
        let pending = match prepared {
            Ok(p) => p,
            Err(e) => return ready(Err(e)),
        };
        Box::pin(async move {
            if let Some(read) = guard
                && let Some(e) = guard_error(&read.await?, maximum)
            {
                return Err(e);
            }
            pending.ctx.wait(pending.value)?;
            let mut out = Vec::with_capacity(pending.parts.len());
            for part in &pending.parts {
                let Some((staging, descriptor)) = part else {
                    out.push(Bytes::from_vec(Vec::new()));
                    continue;
                };
                let span =
                    strided_span(&descriptor.shape, &descriptor.strides, descriptor.elem_size);
                let raw = staging.read(0, span);
                if is_contiguous(&descriptor.shape, &descriptor.strides) {
                    // Fresh host pages fault slowly on one thread (1.3 GB/s for 1 GiB on the H200 host).
                    out.push(Bytes::from_slice_parallel(raw));
                } else {
                    let mut buf =
                        compute_core::bytes::AlignedBuf::zeroed(descriptor.compact_size());
                    let dst = buf.as_mut_slice();
                    for_each_row(
                        &descriptor.shape,
                        &descriptor.strides,
                        descriptor.elem_size,
                        |s, c, n| {
                            dst[c..c + n].copy_from_slice(&raw[s..s + n]);
                        },
                    );
                    out.push(Bytes::from_aligned(buf));
                }
            }
            Ok(out)
        })
    }

    fn get_resource(
        &mut self,
        binding: Binding,
        _stream: StreamId,
    ) -> Result<VulkanResource, ServerError> {
        let resource = self.resolve(&binding)?;
        let value = self.submit_or_last()?;
        self.ctx.wait(value)?;
        Ok(resource)
    }

    unsafe fn launch(
        &mut self,
        kernel: VulkanKernel,
        count: CubeCount,
        arguments: KernelArguments,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        let def = &*kernel.definition;
        // Owners are checked by `resolve`, binding by binding. The kernel's own limits (cube
        // dimensions, shared and private memory) are checked once, with the rest of the IR, when
        // its pipeline is made.
        def.check_arguments(&arguments)?;
        count.check(&self.properties.hardware)?;
        // A dynamic count is dispatched through the guard: over the limits, nothing runs and
        // the next sync reports it.
        let count = match count {
            CubeCount::Dynamic(binding) => CubeCount::Dynamic(self.guard_count(binding, stream)?),
            other => other,
        };
        let mut keep: Vec<Binding> = Vec::new();
        let capturing = self.captures > 0 && self.capturing(stream);
        let (count, empty) = match count {
            CubeCount::Static(x, y, z) => {
                (DispatchCount::Static([x, y, z]), x == 0 || y == 0 || z == 0)
            }
            CubeCount::Dynamic(binding) => {
                let resource = self.resolve(&binding)?;
                if capturing {
                    keep.push(binding);
                }
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
        let args = &pipeline.args;
        let mut words = core::mem::take(&mut self.words);
        words.clear();
        words.resize(args.words as usize, 0);
        for (value, &at) in arguments.scalars.iter().zip(&args.scalar_words) {
            let w = value.word_bits();
            words[at as usize] = w[0];
            if value.elem_type().size() == 8 {
                words[at as usize + 1] = w[1];
            }
        }
        let mut descriptors = core::mem::take(&mut self.descriptors);
        descriptors.clear();
        let mut info = core::mem::take(&mut self.info_words);
        info.clear();
        if pipeline.uses_info {
            let header = args.info_header_word as usize;
            info.resize(header + 2 * arguments.buffers.len(), 0);
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
            let (descriptor, base, len) =
                self.bind(resource, pipeline.item_sizes[k], &pipeline.name)?;
            let at = args.buffer_words[k] as usize;
            words[at] = base;
            words[at + 1] = len;
            if pipeline.uses_info {
                let header = args.info_header_word as usize + 2 * k;
                info[header] = shape.rank() as u32;
                info[header + 1] = info.len() as u32;
                info.extend(shape.iter().map(|&d| saturate(d as u64)));
                info.extend(strides.iter().map(|&s| saturate(s as u64)));
            }
            descriptors.push(descriptor);
            if capturing {
                keep.push(binding);
            }
        }
        if pipeline.uses_info && !args.in_push_constants {
            info[..words.len()].copy_from_slice(&words);
        }
        let result = if empty {
            Ok(())
        } else {
            let push: &[u32] = if args.in_push_constants { &words } else { &[] };
            let info_ref = pipeline.uses_info.then_some(info.as_slice());
            self.record_dispatch(stream, &pipeline, &descriptors, push, info_ref, count, keep)
        };
        self.words = words;
        self.info_words = info;
        self.descriptors = descriptors;
        result?;
        if !capturing {
            self.after_command()?;
        }
        Ok(())
    }

    fn flush(&mut self, _stream: StreamId) -> Result<(), ServerError> {
        self.submit()?;
        self.cache.maybe_save();
        self.take_error()
    }

    fn sync(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
        if let Err(e) = self.ensure_not_capturing(stream, "sync") {
            return ready(Err(e));
        }
        let guard = self.read_guard_status(stream);
        let value = match self.submit_or_last() {
            Ok(v) => v,
            Err(e) => return ready(Err(e)),
        };
        self.reset_batch_limit();
        self.cache.maybe_save();
        let ctx = self.ctx.clone();
        let errors = self.errors.clone();
        let maximum = self.properties.hardware.max_cube_count;
        Box::pin(async move {
            ctx.wait(value)?;
            if let Some(read) = guard {
                match read.await {
                    Ok(bytes) => {
                        if let Some(e) = guard_error(&bytes, maximum) {
                            errors.lock().push_back(e);
                        }
                    }
                    // An error queued before, taken by the read: first again.
                    Err(e) => errors.lock().push_front(e),
                }
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
        // Release what completed submissions kept (released graphs' buffers among them).
        self.recorder.recycle();
        Ok(self.stream(stream)?.memory.memory_usage())
    }

    fn memory_cleanup(&mut self, stream: StreamId) {
        self.forget_resolved();
        self.streams.cleanup(stream);
        self.drain_retired();
        self.recorder.recycle();
        if self.recorder.is_empty()
            && self
                .ctx
                .completed()
                .is_ok_and(|c| c >= self.ctx.last_submitted())
        {
            self.ctx.trim_staging();
        }
    }

    fn retire_stream(&mut self, stream: StreamId, _wait: bool) -> bool {
        if self.streams.get(stream).is_none() {
            return true;
        }
        // Submissions that use the stream's buffers keep their bindings (in-use slices) until
        // they complete; a released graph's bindings go at the recycle.
        self.recorder.recycle();
        // Dropping the state hands its blocks to the deferred release (freed once the
        // submissions so far have completed), drained here.
        if !self.streams.try_retire(stream, |_| true) {
            return false;
        }
        self.forget_resolved();
        self.drain_retired();
        true
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
        self.forget_resolved();
        let rebuilt = self.streams.configure_memory_pools(config, stream);
        self.drain_retired();
        rebuilt
    }

    fn graph_prepare(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.stream(stream)?.prepare_graph(stream)
    }

    fn begin_capture(&mut self, stream: StreamId) -> Result<(), ServerError> {
        let capture = Capture {
            ops: Ops::default(),
            linear: Linear::default(),
            since_barrier: Vec::new(),
            keep: Vec::new(),
        };
        self.stream(stream)?.begin_capture(stream, capture)?;
        self.captures += 1;
        Ok(())
    }

    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, ServerError> {
        let mut capture = self.stream(stream)?.end_capture(stream)?;
        self.captures -= 1;
        let graph = VulkanGraph {
            ops: core::mem::take(&mut capture.ops),
            _keep: core::mem::take(&mut capture.keep),
            _chunks: capture.linear.take(),
        };
        Ok(self.graphs.insert(stream, graph))
    }

    fn graph_replay(&mut self, graph: GraphId, stream: StreamId) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "graph replay")?;
        // A graph may hold guarded indirect launches: read the guard's status at the next sync.
        if let Some(guard) = &mut self.guard {
            guard.unread = true;
        }
        let graph = self.graphs.for_replay(graph, stream)?;
        // The graph's first command is a barrier against earlier work.
        self.recorder.append(&graph.ops);
        self.recorder.dispatches += 1;
        self.after_command()
    }

    fn graph_release(&mut self, graph: GraphId) {
        if let Some(g) = self.graphs.remove(graph) {
            // Its buffers return to their pools as soon as its last replay has run: now when it
            // has, else when the server next recycles after that (a sync, then any call that
            // looks at memory).
            self.recorder.keep_until_done_here(g);
        }
    }

    fn profile_start(&mut self, stream: StreamId) -> Result<ProfileToken, ProfileError> {
        self.ensure_not_capturing(stream, "profile")?;
        let queries = if self.properties.features.device_timestamps {
            let pool = self.profile_queries()?;
            self.timestamp(pool.pool, 0)?;
            Some(pool)
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
        let Some(queries) = queries else {
            return host_profile(start, self.sync(stream));
        };
        let recorded = (|| {
            self.timestamp(queries.pool, 1)?;
            self.submit_or_last()
        })();
        let value = match recorded {
            Ok(v) => v,
            Err(e) => {
                // The pool may be referenced by the open batch.
                self.recorder.keep_until_done(queries);
                return ready(Err(e.into()));
            }
        };
        let ctx = self.ctx.clone();
        let errors = self.errors.clone();
        let period = f64::from(self.info.timestamp_period_ns);
        let bits = ctx.timestamp_valid_bits;
        Box::pin(async move {
            ctx.wait(value)?;
            let mut stamps = [0u64; 2];
            // SAFETY: both queries were written by the completed submission.
            unsafe {
                ctx.device.get_query_pool_results(
                    queries.pool,
                    0,
                    &mut stamps,
                    vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
                )
            }
            .map_err(|e| ServerError::Driver(format!("vkGetQueryPoolResults failed: {e}")))?;
            drop(queries);
            if let Some(e) = compute_core::error::take_first(&mut errors.lock()) {
                return Err(e.into());
            }
            let mask = if bits >= 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            let ticks = (stamps[1] & mask).wrapping_sub(stamps[0] & mask) & mask;
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
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "all_reduce")?;
        let group = self.check_group(&devices)?;
        self.collectives
            .check_all_reduce(&group, src.size(), dst.size(), dtype)?;
        let source = self.resolve(&src)?;
        let target = self.resolve(&dst)?;
        let staging = if source.size == 0 {
            None
        } else {
            let region = vk::BufferCopy {
                src_offset: source.offset,
                dst_offset: 0,
                size: source.size,
            };
            Some(self.stage_read(source.buffer, &[region], source.size)?)
        };
        let value = self.submit_or_last()?;
        let seq = self.collectives.next_round(&group, self.owner.device);
        let round = Round {
            ctx: self.ctx.clone(),
            value,
            staging,
            len: source.size,
            group,
            seq,
            me: self.owner.device,
            dtype,
            op,
            dst: target,
            dst_binding: dst,
        };
        crate::collective::submit(&mut self.collectives, &self.ctx, self.family, round)
    }

    fn sync_collective(&mut self, _stream: StreamId) -> DynFut<Result<(), ServerError>> {
        let rx = crate::collective::marker(&mut self.collectives);
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|| Err(ServerError::Driver("the collective worker stopped".into())))
        })
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
        self.last_pipeline = None;
        self.pipelines.clear();
    }
}
