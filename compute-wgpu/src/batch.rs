//! Recorded device commands and their encoding: launches, copies and timestamps are collected in
//! issue order and encoded into one command buffer per submission.

use std::sync::Arc;

use compute_core::{Binding, ServerError};

/// A compiled pipeline and what launching it needs.
#[derive(Debug)]
pub(crate) struct Pipeline {
    pub(crate) name: String,
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
    pub(crate) info: crate::compiler::InfoLayout,
    pub(crate) item_sizes: Vec<u64>,
}

/// A buffer range bound to one binding of a launch.
#[derive(Debug, Clone)]
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

/// Encode `commands` into one command buffer; `info_alignment` is the storage offset alignment.
pub(crate) fn encode(
    device: &wgpu::Device,
    commands: &[Command],
    info_alignment: u64,
) -> Result<wgpu::CommandBuffer, ServerError> {
    // One info buffer and one indirect buffer for the whole batch.
    let mut info_offsets = Vec::new();
    let mut info_size = 0u64;
    let mut indirect_count = 0u64;
    for command in commands {
        if let Command::Dispatch(d) = command {
            let offset = info_size.next_multiple_of(info_alignment);
            info_offsets.push(offset);
            info_size = offset + (d.info.len().max(1) * 4) as u64;
            if matches!(d.count, DispatchCount::Dynamic { .. }) {
                indirect_count += 1;
            }
        }
    }
    let mut info_buffer = None;
    if !info_offsets.is_empty() {
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("compute-wgpu launch info"),
            size: info_size.next_multiple_of(4),
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: true,
        });
        {
            let mut view = buffer
                .slice(..)
                .get_mapped_range_mut()
                .map_err(|e| ServerError::Driver(format!("mapping the launch info buffer: {e}")))?;
            let mut k = 0;
            for command in commands {
                if let Command::Dispatch(d) = command {
                    let start = info_offsets[k] as usize;
                    let bytes: &[u8] = bytemuck::cast_slice(&d.info);
                    view.slice(start..start + bytes.len())
                        .copy_from_slice(bytes);
                    k += 1;
                }
            }
        }
        buffer.unmap();
        info_buffer = Some(buffer);
    }
    let indirect = (indirect_count > 0).then(|| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("compute-wgpu indirect counts"),
            size: indirect_count * INDIRECT_SLOT,
            usage: wgpu::BufferUsages::INDIRECT | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    });

    let mut bind_groups = Vec::with_capacity(info_offsets.len());
    let mut k = 0;
    for command in commands {
        if let Command::Dispatch(d) = command {
            let info = info_buffer
                .as_ref()
                .unwrap_or_else(|| unreachable!("a batch with a launch has an info buffer"));
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
                    buffer: info,
                    offset: info_offsets[k],
                    size: wgpu::BufferSize::new((d.info.len().max(1) * 4) as u64),
                }),
            });
            bind_groups.push(device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&d.pipeline.name),
                layout: &d.pipeline.layout,
                entries: &entries,
            }));
            k += 1;
        }
    }

    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("compute-wgpu batch"),
    });
    let mut pass: Option<wgpu::ComputePass<'static>> = None;
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
                let p = pass.get_or_insert_with(|| {
                    encoder
                        .begin_compute_pass(&wgpu::ComputePassDescriptor::default())
                        .forget_lifetime()
                });
                p.set_pipeline(&d.pipeline.pipeline);
                p.set_bind_group(0, &bind_groups[k], &[]);
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
