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

/// A launch with every argument resolved: run now, or kept in a graph and replayed.
#[derive(Debug)]
pub(crate) struct Dispatch {
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) buffers: Vec<BoundBuffer>,
    pub(crate) info: Vec<u32>,
    pub(crate) count: DispatchCount,
    /// Keeps the launch's memory reserved while a graph holds the launch.
    pub(crate) _bindings: Vec<Binding>,
}

impl Dispatch {
    /// Bytes the info binding of this launch spans: a power of two, so that launches of one
    /// kernel with slightly different metadata share bind groups.
    fn info_size(&self) -> u64 {
        ((self.info.len() * 4) as u64).next_power_of_two().max(16)
    }
}

/// One recorded device command.
#[derive(Debug, Clone)]
pub(crate) enum Command {
    Dispatch(Arc<Dispatch>),
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
}

/// Bytes of one indirect dispatch slot.
const INDIRECT_SLOT: u64 = 16;

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
    /// storage reports dropped blocks.
    pub(crate) fn new(device: &wgpu::Device, alignment: u64, freed: FreedBuffers) -> Self {
        Self {
            alignment,
            info: info_buffer(device, INFO_BUFFER_SIZE),
            shadow: Vec::new(),
            scratch: Vec::new(),
            offsets: Vec::new(),
            groups: HashMap::new(),
            freed,
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

    /// Write the info of every launch of `commands` into the info buffer (through
    /// `queue.write_buffer`, so before the submission that follows and after the ones before) and
    /// record where each launch's info starts in `self.offsets`.
    fn write_info(&mut self, device: &wgpu::Device, queue: &wgpu::Queue, commands: &[Command]) {
        self.offsets.clear();
        let mut total = 0u64;
        let mut last: Option<&Dispatch> = None;
        for command in commands {
            let Command::Dispatch(d) = command else {
                continue;
            };
            let reuse = last.is_some_and(|p| p.info == d.info && p.info_size() == d.info_size());
            if !reuse {
                let offset = total.next_multiple_of(self.alignment);
                total = offset + d.info_size();
                self.offsets.push(offset as u32);
            } else {
                let offset = self.offsets.last().copied().unwrap_or(0);
                self.offsets.push(offset);
            }
            last = Some(d);
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
        for command in commands {
            if let Command::Dispatch(d) = command {
                let start = self.offsets[k] as usize;
                let bytes: &[u8] = bytemuck::cast_slice(&d.info);
                self.scratch[start..start + bytes.len()].copy_from_slice(bytes);
                k += 1;
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

    /// The bind group of launch `d`, from the cache or created.
    fn group(&mut self, device: &wgpu::Device, d: &Dispatch) -> wgpu::BindGroup {
        let key = GroupKeyRef {
            pipeline: d.pipeline.id,
            info_size: d.info_size(),
            buffers: &d.buffers,
        };
        if let Some(group) = self.groups.get(&key) {
            return group.clone();
        }
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> = d
            .buffers
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
            binding: d.buffers.len() as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.info,
                offset: 0,
                size: wgpu::BufferSize::new(d.info_size()),
            }),
        });
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&d.pipeline.name),
            layout: &d.pipeline.layout,
            entries: &entries,
        });
        if self.groups.len() >= MAX_CACHED_GROUPS {
            self.groups.clear();
        }
        self.groups.insert(
            GroupKey {
                pipeline: d.pipeline.id,
                info_size: d.info_size(),
                buffers: d.buffers.clone().into_boxed_slice(),
            },
            group.clone(),
        );
        group
    }

    /// Encode `commands` into one command buffer; the launch info is written to the queue first,
    /// so the command buffer must be the next one submitted.
    pub(crate) fn encode(
        &mut self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        commands: &[Command],
    ) -> Result<wgpu::CommandBuffer, ServerError> {
        self.prune();
        self.write_info(device, queue, commands);
        let mut groups: Vec<wgpu::BindGroup> = Vec::with_capacity(self.offsets.len());
        let mut indirect_count = 0u64;
        let mut last: Option<&Dispatch> = None;
        for command in commands {
            if let Command::Dispatch(d) = command {
                // A launch binding what the one before it bound shares its group (no lookup).
                let same = last.is_some_and(|p| {
                    p.pipeline.id == d.pipeline.id
                        && p.info_size() == d.info_size()
                        && p.buffers == d.buffers
                });
                let group = match (same, groups.last()) {
                    (true, Some(group)) => group.clone(),
                    _ => self.group(device, d),
                };
                groups.push(group);
                last = Some(d);
                if matches!(d.count, DispatchCount::Dynamic { .. }) {
                    indirect_count += 1;
                }
            }
        }
        let indirect = (indirect_count > 0).then(|| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("compute-wgpu indirect counts"),
                size: indirect_count * INDIRECT_SLOT,
                usage: wgpu::BufferUsages::INDIRECT | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });

        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("compute-wgpu batch"),
        });
        let mut pass: Option<wgpu::ComputePass<'static>> = None;
        // What the open pass has bound: pipeline id, bind group index, info offset.
        let mut bound_pipeline = None;
        let mut bound_group = None;
        let mut k = 0;
        let mut slot = 0u64;
        for command in commands {
            match command {
                Command::Dispatch(d) => {
                    if let DispatchCount::Dynamic { buffer, offset } = &d.count
                        && let Some(indirect) = &indirect
                    {
                        drop(pass.take());
                        encoder.copy_buffer_to_buffer(
                            buffer,
                            *offset,
                            indirect,
                            slot * INDIRECT_SLOT,
                            Some(12),
                        );
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
                    let same_group = bound_group
                        .is_some_and(|(g, o): (usize, u32)| o == offset && groups[g] == groups[k]);
                    if !same_group {
                        p.set_bind_group(0, &groups[k], &[offset]);
                        bound_group = Some((k, offset));
                    }
                    match (&d.count, &indirect) {
                        (DispatchCount::Static([x, y, z]), _) => p.dispatch_workgroups(*x, *y, *z),
                        (DispatchCount::Dynamic { .. }, Some(indirect)) => {
                            p.dispatch_workgroups_indirect(indirect, slot * INDIRECT_SLOT);
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
            }
        }
        drop(pass);
        Ok(encoder.finish())
    }
}
