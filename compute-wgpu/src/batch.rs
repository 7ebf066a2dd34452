//! Recorded device commands and their encoding: launches, copies and timestamps are collected in
//! issue order and encoded into one command buffer per submission.
//!
//! Encoding keeps state between batches (an [`Encoder`]): launch info lives in one persistent
//! buffer bound with a dynamic offset, rewritten only where it changed since the last batch, and
//! bind groups are cached per (pipeline, bound buffer ranges, info size), so that a launch repeated
//! with the same arguments creates no wgpu object at all.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use compute_core::{Binding, ServerError};
use hashbrown::{Equivalent, HashMap};

/// A compiled pipeline and what launching it needs.
#[derive(Debug)]
pub(crate) struct Pipeline {
    /// Unique per server: the bind group cache key.
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
    pub(crate) info: crate::compiler::InfoLayout,
    pub(crate) item_sizes: Vec<u64>,
}

/// A buffer range bound to one binding of a launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct BoundBuffer {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

/// How many cubes a recorded launch runs.
#[derive(Debug, Clone)]
pub(crate) enum DispatchCount {
    /// Known on the host.
    Static([u32; 3]),
    /// Three `u32` read from `buffer` at `offset` when the launch runs.
    Dynamic { buffer: wgpu::Buffer, offset: u64 },
}

/// A launch kept by a graph and replayed: every argument resolved, owning its info words.
#[derive(Debug)]
pub struct Dispatch {
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) buffers: Vec<BoundBuffer>,
    pub(crate) info: Vec<u32>,
    pub(crate) count: DispatchCount,
    /// Keeps the launch's memory reserved while a graph holds the launch.
    pub(crate) _bindings: Vec<Binding>,
}

/// Bytes the info binding of a launch with `words` info words spans: a power of two, so that
/// launches of one kernel with slightly different metadata share bind groups.
fn info_size(words: usize) -> u64 {
    ((words * 4) as u64).next_power_of_two().max(16)
}

/// A launch recorded in a [`Batch`]: its info words and bound buffers are ranges of the batch's
/// arenas, so recording a launch allocates nothing once the arenas have grown.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub(crate) pipeline: Arc<Pipeline>,
    /// Start and length of the launch's info in [`Batch::words`].
    pub(crate) words: (u32, u32),
    /// Start and length of the launch's buffers in [`Batch::buffers`].
    pub(crate) buffers: (u32, u32),
    pub(crate) count: DispatchCount,
}

/// One recorded device command.
#[derive(Debug, Clone)]
pub(crate) enum Command {
    Dispatch(Launch),
    Copy {
        src: wgpu::Buffer,
        src_offset: u64,
        dst: wgpu::Buffer,
        dst_offset: u64,
        size: u64,
    },
    Timestamp {
        set: wgpu::QuerySet,
        index: u32,
    },
    Resolve {
        set: wgpu::QuerySet,
        count: u32,
        dst: wgpu::Buffer,
    },
    /// Zero `size` bytes of `buffer` from `offset` on.
    Clear {
        buffer: wgpu::Buffer,
        offset: u64,
        size: u64,
    },
}

/// The commands recorded since the last submission, with the arenas their launches point into.
/// Cleared (not freed) after each submission.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) commands: Vec<Command>,
    /// Info words of every launch of the batch, back to back.
    pub(crate) words: Vec<u32>,
    /// Bound buffers of every launch of the batch, back to back.
    pub(crate) buffers: Vec<BoundBuffer>,
    /// Launches recorded.
    pub(crate) dispatches: usize,
    /// Launches recorded whose cube count is read from a buffer.
    pub(crate) indirect: usize,
}

fn range(r: (u32, u32)) -> core::ops::Range<usize> {
    r.0 as usize..(r.0 + r.1) as usize
}

impl Batch {
    /// Whether nothing was recorded.
    pub(crate) fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Forget every command, keeping the allocations.
    pub(crate) fn clear(&mut self) {
        self.commands.clear();
        self.words.clear();
        self.buffers.clear();
        self.dispatches = 0;
        self.indirect = 0;
    }

    /// Record a launch whose info words and buffers were appended to the arenas from `words`
    /// and `buffers` on.
    pub(crate) fn push_launch(
        &mut self,
        pipeline: Arc<Pipeline>,
        words: usize,
        buffers: usize,
        count: DispatchCount,
    ) {
        if matches!(count, DispatchCount::Dynamic { .. }) {
            self.indirect += 1;
        }
        self.dispatches += 1;
        self.commands.push(Command::Dispatch(Launch {
            pipeline,
            words: (words as u32, (self.words.len() - words) as u32),
            buffers: (buffers as u32, (self.buffers.len() - buffers) as u32),
            count,
        }));
    }

    /// Record a launch a graph holds.
    pub(crate) fn push_dispatch(&mut self, d: &Dispatch) {
        let (words, buffers) = (self.words.len(), self.buffers.len());
        self.words.extend_from_slice(&d.info);
        self.buffers.extend_from_slice(&d.buffers);
        self.push_launch(d.pipeline.clone(), words, buffers, d.count.clone());
    }

    /// The info words of `launch`.
    pub(crate) fn info(&self, launch: &Launch) -> &[u32] {
        &self.words[range(launch.words)]
    }

    /// The bound buffers of `launch`.
    pub(crate) fn bound(&self, launch: &Launch) -> &[BoundBuffer] {
        &self.buffers[range(launch.buffers)]
    }
}

/// Bytes of one indirect dispatch slot before rounding up to the storage offset alignment: the
/// count as read (3 x u32 and a pad word), then the count dispatched (3 x u32 and a pad word).
const INDIRECT_SLOT: u64 = 32;

/// Byte offset of the dispatched count in an indirect slot.
const INDIRECT_ARGS: u64 = 16;

/// Bytes of the guard's status buffer: a flag, then the first over-limit count seen.
pub(crate) const GUARD_STATUS_BYTES: u64 = 16;

/// The WGSL of the indirect guard: copies the count read from the caller's buffer to the
/// dispatched count, or zero (an empty dispatch) when an axis is over the device's limit and none
/// is zero, and then records the count in the status buffer (the first one since it was cleared).
/// wgpu's own indirect validation (`InstanceFlags::VALIDATION_INDIRECT_CALL`) also turns such
/// counts into empty dispatches, but reports nothing: the runtime must queue an error.
fn guard_source(max: [u32; 3]) -> String {
    format!(
        "@group(0) @binding(0) var<storage, read_write> slot: array<u32, 8>;
@group(0) @binding(1) var<storage, read_write> status: array<u32, 4>;
@compute @workgroup_size(1)
fn main() {{
    let x = slot[0];
    let y = slot[1];
    let z = slot[2];
    let empty = x == 0u || y == 0u || z == 0u;
    if (!empty && (x > {}u || y > {}u || z > {}u)) {{
        slot[4] = 0u;
        slot[5] = 0u;
        slot[6] = 0u;
        if (status[0] == 0u) {{
            status[0] = 1u;
            status[1] = x;
            status[2] = y;
            status[3] = z;
        }}
    }} else {{
        slot[4] = x;
        slot[5] = y;
        slot[6] = z;
    }}
}}
",
        max[0], max[1], max[2]
    )
}

/// The pipeline that guards indirect dispatches (see [`guard_source`]), and its status buffer.
struct Guard {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    status: wgpu::Buffer,
}

impl Guard {
    fn new(device: &wgpu::Device, max: [u32; 3], status: wgpu::Buffer) -> Self {
        let storage = |binding, dynamic, size| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: dynamic,
                min_binding_size: wgpu::BufferSize::new(size),
            },
            count: None,
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("compute-wgpu indirect guard"),
            entries: &[
                storage(0, true, INDIRECT_SLOT),
                storage(1, false, GUARD_STATUS_BYTES),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("compute-wgpu indirect guard"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("compute-wgpu indirect guard"),
            source: wgpu::ShaderSource::Wgsl(guard_source(max).into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("compute-wgpu indirect guard"),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions::default(),
            cache: None,
        });
        Self {
            pipeline,
            layout,
            status,
        }
    }
}

/// Initial size of the launch info buffer; it grows (by powers of two) when a batch needs more.
const INFO_BUFFER_SIZE: u64 = 64 << 10;

/// Bind groups kept before the cache is emptied (it is also pruned of freed blocks).
const MAX_CACHED_GROUPS: usize = 4096;

/// Storage blocks dropped by the pools, whose cached bind groups must go too.
pub(crate) type FreedBuffers = Arc<spin::Mutex<Vec<wgpu::Buffer>>>;

/// Key of a cached bind group.
struct GroupKey {
    pipeline: u64,
    info_size: u64,
    buffers: Box<[BoundBuffer]>,
}

impl Hash for GroupKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        GroupKeyRef {
            pipeline: self.pipeline,
            info_size: self.info_size,
            buffers: &self.buffers,
        }
        .hash(state);
    }
}

impl PartialEq for GroupKey {
    fn eq(&self, other: &Self) -> bool {
        self.pipeline == other.pipeline
            && self.info_size == other.info_size
            && self.buffers == other.buffers
    }
}

impl Eq for GroupKey {}

/// A [`GroupKey`] borrowed from a launch (looked up without allocating).
#[derive(Hash)]
struct GroupKeyRef<'a> {
    pipeline: u64,
    info_size: u64,
    buffers: &'a [BoundBuffer],
}

impl Equivalent<GroupKey> for GroupKeyRef<'_> {
    fn equivalent(&self, key: &GroupKey) -> bool {
        self.pipeline == key.pipeline
            && self.info_size == key.info_size
            && *self.buffers == *key.buffers
    }
}

/// State kept between batches: the launch info buffer and the bind group cache.
pub(crate) struct Encoder {
    alignment: u64,
    info: wgpu::Buffer,
    /// What the info buffer holds (as far as it was written).
    shadow: Vec<u8>,
    scratch: Vec<u8>,
    offsets: Vec<u32>,
    groups: HashMap<GroupKey, wgpu::BindGroup>,
    freed: FreedBuffers,
    guard: Guard,
}

fn info_buffer(device: &wgpu::Device, size: u64) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("compute-wgpu launch info"),
        size,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

impl Encoder {
    /// An encoder for `device`; `alignment` is the storage offset alignment, `freed` where the
    /// storage reports dropped blocks, `max_count` the device's cube count limits and `status`
    /// the buffer (of [`GUARD_STATUS_BYTES`], zeroed) where indirect dispatches over them are
    /// recorded.
    pub(crate) fn new(
        device: &wgpu::Device,
        alignment: u64,
        freed: FreedBuffers,
        max_count: [u32; 3],
        status: wgpu::Buffer,
    ) -> Self {
        Self {
            alignment,
            info: info_buffer(device, INFO_BUFFER_SIZE),
            shadow: Vec::new(),
            scratch: Vec::new(),
            offsets: Vec::new(),
            groups: HashMap::new(),
            freed,
            guard: Guard::new(device, max_count, status),
        }
    }

    /// Forget what the info buffer holds: the next batch writes all of its info.
    pub(crate) fn forget_info(&mut self) {
        self.shadow.clear();
    }

    /// Drop the cached bind groups that bind a freed block, so the block's memory goes back.
    pub(crate) fn prune(&mut self) {
        let freed = core::mem::take(&mut *self.freed.lock());
        if freed.is_empty() {
            return;
        }
        self.groups
            .retain(|key, _| !key.buffers.iter().any(|b| freed.contains(&b.buffer)));
    }

    /// Write the info of every launch of `batch` into the info buffer (through
    /// `queue.write_buffer`, so before the submission that follows and after the ones before) and
    /// record where each launch's info starts in `self.offsets`.
    fn write_info(&mut self, device: &wgpu::Device, queue: &wgpu::Queue, batch: &Batch) {
        self.offsets.clear();
        let mut total = 0u64;
        let mut last: Option<&[u32]> = None;
        for command in &batch.commands {
            let Command::Dispatch(d) = command else {
                continue;
            };
            let info = batch.info(d);
            // A launch with the info of the launch before it shares its slot (and its size).
            if last == Some(info) {
                let offset = self.offsets.last().copied().unwrap_or(0);
                self.offsets.push(offset);
            } else {
                let offset = total.next_multiple_of(self.alignment);
                total = offset + info_size(info.len());
                self.offsets.push(offset as u32);
            }
            last = Some(info);
        }
        if total > self.info.size() {
            let size = total.next_power_of_two().max(2 * self.info.size());
            self.info = info_buffer(device, size);
            self.shadow.clear();
            self.groups.clear();
        }
        let n = total as usize;
        self.scratch.clear();
        self.scratch.resize(n, 0);
        let mut k = 0;
        let mut written = None;
        for command in &batch.commands {
            if let Command::Dispatch(d) = command {
                let start = self.offsets[k];
                k += 1;
                if written == Some(start) {
                    continue;
                }
                written = Some(start);
                let bytes: &[u8] = bytemuck::cast_slice(batch.info(d));
                let start = start as usize;
                self.scratch[start..start + bytes.len()].copy_from_slice(bytes);
            }
        }
        // Only the bytes that differ from what the buffer holds are written.
        let common = self.shadow.len().min(n);
        let (old, new) = (&self.shadow[..common], &self.scratch[..common]);
        let lo = old
            .iter()
            .zip(new)
            .position(|(a, b)| a != b)
            .unwrap_or(common);
        let hi = if n > common {
            n
        } else {
            old.iter()
                .zip(new)
                .rposition(|(a, b)| a != b)
                .map_or(lo, |i| i + 1)
        };
        let lo = lo / 4 * 4;
        let hi = hi.next_multiple_of(4).min(n);
        if lo < hi {
            queue.write_buffer(&self.info, lo as u64, &self.scratch[lo..hi]);
            if self.shadow.len() < hi {
                self.shadow.resize(hi, 0);
            }
            self.shadow[lo..hi].copy_from_slice(&self.scratch[lo..hi]);
        }
    }

    /// The bind group of a launch of `pipeline` binding `buffers` and `info_size` bytes of info,
    /// from the cache or created.
    fn group(
        &mut self,
        device: &wgpu::Device,
        pipeline: &Pipeline,
        buffers: &[BoundBuffer],
        info_size: u64,
    ) -> wgpu::BindGroup {
        let key = GroupKeyRef {
            pipeline: pipeline.id,
            info_size,
            buffers,
        };
        if let Some(group) = self.groups.get(&key) {
            return group.clone();
        }
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &b.buffer,
                    offset: b.offset,
                    size: wgpu::BufferSize::new(b.size),
                }),
            })
            .collect();
        entries.push(wgpu::BindGroupEntry {
            binding: buffers.len() as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.info,
                offset: 0,
                size: wgpu::BufferSize::new(info_size),
            }),
        });
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&pipeline.name),
            layout: &pipeline.layout,
            entries: &entries,
        });
        if self.groups.len() >= MAX_CACHED_GROUPS {
            self.groups.clear();
        }
        self.groups.insert(
            GroupKey {
                pipeline: pipeline.id,
                info_size,
                buffers: buffers.into(),
            },
            group.clone(),
        );
        group
    }

    /// Encode `batch` into one command buffer; the launch info is written to the queue first,
    /// so the command buffer must be the next one submitted.
    pub(crate) fn encode(
        &mut self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        batch: &Batch,
    ) -> Result<wgpu::CommandBuffer, ServerError> {
        self.prune();
        self.write_info(device, queue, batch);
        // Every indirect launch gets a slot: its count is copied in, checked against the
        // device's limits by the guard pipeline, and dispatched from the slot.
        let slot_size = INDIRECT_SLOT.next_multiple_of(self.alignment);
        let indirect = (batch.indirect > 0).then(|| {
            let buffer = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("compute-wgpu indirect counts"),
                size: batch.indirect as u64 * slot_size,
                usage: wgpu::BufferUsages::INDIRECT
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            });
            let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("compute-wgpu indirect guard"),
                layout: &self.guard.layout,
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &buffer,
                            offset: 0,
                            size: wgpu::BufferSize::new(INDIRECT_SLOT),
                        }),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: self.guard.status.as_entire_binding(),
                    },
                ],
            });
            (buffer, group)
        });

        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("compute-wgpu batch"),
        });
        let mut pass: Option<wgpu::ComputePass<'static>> = None;
        // What the open pass has bound: pipeline id, and bind group with its info offset.
        let mut bound_pipeline = None;
        // The group of the launch before (pipeline id, buffers, info size) and its number: a
        // launch binding what it bound shares its group without a cache lookup, and without
        // setting it again when its info offset is also the same.
        let mut last: Option<(u64, &[BoundBuffer], u64, wgpu::BindGroup)> = None;
        let mut group_number = 0u64;
        let mut bound_group: Option<(u64, u32)> = None;
        let mut k = 0;
        let mut slot = 0u64;
        for command in &batch.commands {
            match command {
                Command::Dispatch(d) => {
                    let buffers = batch.bound(d);
                    let size = info_size(d.words.1 as usize);
                    let same = last.as_ref().is_some_and(|(id, b, s, _)| {
                        *id == d.pipeline.id && *s == size && *b == buffers
                    });
                    if !same {
                        let group = self.group(device, &d.pipeline, buffers, size);
                        last = Some((d.pipeline.id, buffers, size, group));
                        group_number += 1;
                    }
                    if let DispatchCount::Dynamic { buffer, offset } = &d.count
                        && let Some((indirect, guard_group)) = &indirect
                    {
                        drop(pass.take());
                        encoder.copy_buffer_to_buffer(
                            buffer,
                            *offset,
                            indirect,
                            slot * slot_size,
                            Some(12),
                        );
                        let mut guard =
                            encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                        guard.set_pipeline(&self.guard.pipeline);
                        guard.set_bind_group(0, guard_group, &[(slot * slot_size) as u32]);
                        guard.dispatch_workgroups(1, 1, 1);
                    }
                    let p = match &mut pass {
                        Some(p) => p,
                        None => {
                            bound_pipeline = None;
                            bound_group = None;
                            pass.insert(
                                encoder
                                    .begin_compute_pass(&wgpu::ComputePassDescriptor::default())
                                    .forget_lifetime(),
                            )
                        }
                    };
                    if bound_pipeline != Some(d.pipeline.id) {
                        p.set_pipeline(&d.pipeline.pipeline);
                        bound_pipeline = Some(d.pipeline.id);
                    }
                    let offset = self.offsets[k];
                    if bound_group != Some((group_number, offset))
                        && let Some((_, _, _, group)) = &last
                    {
                        p.set_bind_group(0, group, &[offset]);
                        bound_group = Some((group_number, offset));
                    }
                    match (&d.count, &indirect) {
                        (DispatchCount::Static([x, y, z]), _) => p.dispatch_workgroups(*x, *y, *z),
                        (DispatchCount::Dynamic { .. }, Some((indirect, _))) => {
                            p.dispatch_workgroups_indirect(
                                indirect,
                                slot * slot_size + INDIRECT_ARGS,
                            );
                            slot += 1;
                        }
                        (DispatchCount::Dynamic { .. }, None) => {
                            unreachable!("a batch with an indirect launch has an indirect buffer")
                        }
                    }
                    k += 1;
                }
                Command::Copy {
                    src,
                    src_offset,
                    dst,
                    dst_offset,
                    size,
                } => {
                    drop(pass.take());
                    encoder.copy_buffer_to_buffer(src, *src_offset, dst, *dst_offset, Some(*size));
                }
                Command::Timestamp { set, index } => {
                    drop(pass.take());
                    encoder.write_timestamp(set, *index);
                }
                Command::Resolve { set, count, dst } => {
                    drop(pass.take());
                    encoder.resolve_query_set(set, 0..*count, dst, 0);
                }
                Command::Clear {
                    buffer,
                    offset,
                    size,
                } => {
                    drop(pass.take());
                    encoder.clear_buffer(buffer, *offset, Some(*size));
                }
            }
        }
        drop(pass);
        Ok(encoder.finish())
    }
}
