//! Recorded commands: a batch's commands are collected as a list of [`Op`]s on the issuing thread
//! and recorded into a command buffer on the submit thread ([`Ops::record`]); a graph capture
//! collects its own list, appended to the batch at each replay. [`Rec`] is the one recording
//! interface over both, so launches, copies and timestamps are written once.

use ash::vk;

use crate::batch::barrier_between;
use crate::context::Context;

/// One recorded command. Variable-length data lives in the arenas of its [`Ops`].
#[derive(Clone, Copy)]
pub(crate) enum Op {
    /// A global memory barrier between the stage sets (see `batch::stage`).
    Barrier {
        src: u8,
        dst: u8,
    },
    BindPipeline(vk::Pipeline),
    BindSet {
        layout: vk::PipelineLayout,
        set: vk::DescriptorSet,
    },
    /// Push constants: `bytes[start..start + len]`.
    Push {
        layout: vk::PipelineLayout,
        start: u32,
        len: u32,
    },
    /// Pushed descriptors: `infos[start..start + len]`, bindings in `bindings` alike.
    PushDescriptors {
        layout: vk::PipelineLayout,
        start: u32,
        len: u32,
    },
    Dispatch([u32; 3]),
    DispatchIndirect {
        buffer: vk::Buffer,
        offset: u64,
    },
    /// `regions[start..start + len]`.
    Copy {
        src: vk::Buffer,
        dst: vk::Buffer,
        start: u32,
        len: u32,
    },
    ResetQueries {
        pool: vk::QueryPool,
        first: u32,
        count: u32,
    },
    Timestamp {
        pool: vk::QueryPool,
        query: u32,
    },
    /// Device writes become visible to host reads after the submission.
    HostBarrier,
}

/// A list of recorded commands and the arenas their data lives in (cleared, not freed, between
/// batches).
#[derive(Default)]
pub(crate) struct Ops {
    pub(crate) ops: Vec<Op>,
    bytes: Vec<u8>,
    infos: Vec<vk::DescriptorBufferInfo>,
    bindings: Vec<u32>,
    regions: Vec<vk::BufferCopy>,
}

// SAFETY: the Vulkan handles inside are plain identifiers, valid on any thread; the objects they
// name are kept alive by the batch's owner until its submission completed.
unsafe impl Send for Ops {}

fn span(start: usize, end: usize) -> (u32, u32) {
    (start as u32, (end - start) as u32)
}

impl Ops {
    /// Whether nothing is recorded.
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Forget every command, keeping the allocations.
    pub(crate) fn clear(&mut self) {
        self.ops.clear();
        self.bytes.clear();
        self.infos.clear();
        self.bindings.clear();
        self.regions.clear();
    }

    pub(crate) fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    /// Append every command of `other` (a graph's), with its data.
    pub(crate) fn extend_from(&mut self, other: &Ops) {
        let (bytes, infos, regions) = (
            self.bytes.len() as u32,
            self.infos.len() as u32,
            self.regions.len() as u32,
        );
        self.bytes.extend_from_slice(&other.bytes);
        self.infos.extend_from_slice(&other.infos);
        self.bindings.extend_from_slice(&other.bindings);
        self.regions.extend_from_slice(&other.regions);
        self.ops.extend(other.ops.iter().map(|&op| match op {
            Op::Push { layout, start, len } => Op::Push {
                layout,
                start: start + bytes,
                len,
            },
            Op::PushDescriptors { layout, start, len } => Op::PushDescriptors {
                layout,
                start: start + infos,
                len,
            },
            Op::Copy {
                src,
                dst,
                start,
                len,
            } => Op::Copy {
                src,
                dst,
                start: start + regions,
                len,
            },
            other => other,
        }));
    }

    fn push_bytes(&mut self, layout: vk::PipelineLayout, data: &[u8]) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(data);
        let (start, len) = span(at, self.bytes.len());
        self.ops.push(Op::Push { layout, start, len });
    }

    fn push_descriptors(
        &mut self,
        layout: vk::PipelineLayout,
        bindings: &[u32],
        infos: &[vk::DescriptorBufferInfo],
    ) {
        let at = self.infos.len();
        self.bindings.extend_from_slice(bindings);
        self.infos.extend_from_slice(infos);
        let (start, len) = span(at, self.infos.len());
        self.ops.push(Op::PushDescriptors { layout, start, len });
    }

    fn copy(&mut self, src: vk::Buffer, dst: vk::Buffer, regions: &[vk::BufferCopy]) {
        let at = self.regions.len();
        self.regions.extend_from_slice(regions);
        let (start, len) = span(at, self.regions.len());
        self.ops.push(Op::Copy {
            src,
            dst,
            start,
            len,
        });
    }

    /// Record `op` into `cb`.
    ///
    /// # Safety
    /// `cb` is recording; every object `op` names is alive until the command buffer completed;
    pub(crate) unsafe fn record(&self, ctx: &Context, cb: vk::CommandBuffer, op: &Op) {
        let device = &ctx.device;
        let range = |start: u32, len: u32| start as usize..(start + len) as usize;
        // SAFETY: the caller's contract.
        unsafe {
            match *op {
                Op::Barrier { src, dst } => barrier_between(ctx, cb, src, dst),
                Op::BindPipeline(p) => {
                    device.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, p)
                }
                Op::BindSet { layout, set } => device.cmd_bind_descriptor_sets(
                    cb,
                    vk::PipelineBindPoint::COMPUTE,
                    layout,
                    0,
                    &[set],
                    &[],
                ),
                Op::Push { layout, start, len } => device.cmd_push_constants(
                    cb,
                    layout,
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    &self.bytes[range(start, len)],
                ),
                Op::PushDescriptors { layout, start, len } => {
                    let r = range(start, len);
                    push_descriptor_set(ctx, cb, layout, &self.bindings[r.clone()], &self.infos[r]);
                }
                Op::Dispatch([x, y, z]) => device.cmd_dispatch(cb, x, y, z),
                Op::DispatchIndirect { buffer, offset } => {
                    device.cmd_dispatch_indirect(cb, buffer, offset)
                }
                Op::Copy {
                    src,
                    dst,
                    start,
                    len,
                } => device.cmd_copy_buffer(cb, src, dst, &self.regions[range(start, len)]),
                Op::ResetQueries { pool, first, count } => {
                    device.cmd_reset_query_pool(cb, pool, first, count)
                }
                Op::Timestamp { pool, query } => device.cmd_write_timestamp(
                    cb,
                    vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                    pool,
                    query,
                ),
                Op::HostBarrier => host_barrier(device, cb),
            }
        }
    }
}

/// `vkCmdPushDescriptorSetKHR` of storage buffers at the given bindings of set 0.
///
/// # Safety
/// `cb` is recording; the device has the push descriptor extension (pipelines that push
/// descriptors are only built then); the buffers are alive until the command buffer completed.
unsafe fn push_descriptor_set(
    ctx: &Context,
    cb: vk::CommandBuffer,
    layout: vk::PipelineLayout,
    bindings: &[u32],
    infos: &[vk::DescriptorBufferInfo],
) {
    let Some(push_descriptor) = ctx.push_descriptor.as_ref() else {
        unreachable!("push descriptor pipelines are only built where the extension exists")
    };
    // Launches with few buffers (nearly all) build their writes on the stack.
    const STACK_WRITES: usize = 16;
    let mut stack = [vk::WriteDescriptorSet::default(); STACK_WRITES];
    let mut heap = Vec::new();
    let n = bindings.len().min(infos.len());
    let out: &mut [vk::WriteDescriptorSet] = if n <= STACK_WRITES {
        &mut stack[..n]
    } else {
        heap.resize(n, vk::WriteDescriptorSet::default());
        &mut heap
    };
    for (w, (binding, info)) in out.iter_mut().zip(bindings.iter().zip(infos)) {
        *w = vk::WriteDescriptorSet::default()
            .dst_binding(*binding)
            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
            .buffer_info(core::slice::from_ref(info));
    }
    // SAFETY: the caller's contract.
    unsafe {
        push_descriptor.cmd_push_descriptor_set(cb, vk::PipelineBindPoint::COMPUTE, layout, 0, out)
    };
}

/// Record a barrier that makes device writes visible to host reads after the submission.
fn host_barrier(device: &ash::Device, cb: vk::CommandBuffer) {
    let b = [vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
        .dst_access_mask(vk::AccessFlags::HOST_READ)];
    // SAFETY: `cb` is recording.
    unsafe {
        device.cmd_pipeline_barrier(
            cb,
            vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
            vk::PipelineStageFlags::HOST,
            vk::DependencyFlags::empty(),
            &b,
            &[],
            &[],
        );
    }
}

/// Where commands go: the open batch's list or a graph capture's (recorded into a command buffer
/// on the submit thread, a graph's at each replay).
pub(crate) struct Rec<'a>(pub(crate) &'a mut Ops);

impl Rec<'_> {
    fn op(&mut self, op: Op) {
        self.0.push(op);
    }

    pub(crate) fn bind_pipeline(&mut self, pipeline: vk::Pipeline) {
        self.op(Op::BindPipeline(pipeline));
    }

    pub(crate) fn bind_set(&mut self, layout: vk::PipelineLayout, set: vk::DescriptorSet) {
        self.op(Op::BindSet { layout, set });
    }

    pub(crate) fn push_constants(&mut self, layout: vk::PipelineLayout, data: &[u8]) {
        self.0.push_bytes(layout, data);
    }

    pub(crate) fn push_descriptors(
        &mut self,
        layout: vk::PipelineLayout,
        bindings: &[u32],
        infos: &[vk::DescriptorBufferInfo],
    ) {
        self.0.push_descriptors(layout, bindings, infos);
    }

    pub(crate) fn dispatch(&mut self, count: [u32; 3]) {
        self.op(Op::Dispatch(count));
    }

    pub(crate) fn dispatch_indirect(&mut self, buffer: vk::Buffer, offset: u64) {
        self.op(Op::DispatchIndirect { buffer, offset });
    }

    pub(crate) fn copy(&mut self, src: vk::Buffer, dst: vk::Buffer, regions: &[vk::BufferCopy]) {
        self.0.copy(src, dst, regions);
    }

    pub(crate) fn reset_queries(&mut self, pool: vk::QueryPool, first: u32, count: u32) {
        self.op(Op::ResetQueries { pool, first, count });
    }

    pub(crate) fn timestamp(&mut self, pool: vk::QueryPool, query: u32) {
        self.op(Op::Timestamp { pool, query });
    }
}
