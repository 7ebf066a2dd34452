//! Collectives between Vulkan devices through host staging: each device's contribution is copied
//! to a staging buffer, reduced on the host by compute-core's [`HostRendezvous`], and copied to
//! its output by a submission of the collective worker. The bookkeeping (groups, round numbers,
//! pending outputs, the worker, errors) is compute-core's [`HostCollectives`].
//!
//! One worker thread per group runs that group's rounds in issue order, off the server lock (a
//! round waits for the other devices of its group). One worker per server would deadlock two
//! groups issued in different orders on two devices: each worker would wait, in its first round,
//! for a device whose worker waits for the other group. Until a round's output copy has completed, later work on
//! the server that touches that output waits for it (in `resolve`).

use std::sync::Arc;

use ash::vk;
use compute_core::backend::ServerKit;
use compute_core::collective::{AllReduce, HostCollectives, HostRendezvous};
use compute_core::future::DynFut;
use compute_core::{
    Binding, DeviceId, ElemType, ReduceOperation, ServerCollective, ServerError, StreamId,
};

use crate::batch::{CommandPool, Staging, barrier};
use crate::context::Context;
use crate::server::VulkanServer;
use crate::storage::VulkanResource;

/// One device's part of an all-reduce, handed to the worker.
pub(crate) struct Round {
    pub(crate) ctx: Arc<Context>,
    /// The submission that fills `staging`.
    pub(crate) value: u64,
    pub(crate) staging: Option<Staging>,
    pub(crate) len: u64,
    pub(crate) group: Vec<DeviceId>,
    pub(crate) seq: u64,
    pub(crate) me: DeviceId,
    pub(crate) dtype: ElemType,
    pub(crate) op: ReduceOperation,
    pub(crate) dst: VulkanResource,
    /// Keeps the output's memory alive until the round has written it.
    pub(crate) dst_binding: Binding,
}

/// The collective state of one server: compute-core's bookkeeping, with a worker per group.
pub(crate) type Collectives = HostCollectives<Vec<DeviceId>, Round>;

/// The name of the worker thread.
const WORKER: &str = "compute-vulkan collectives";

/// What the worker runs each round with: `run_round` with a command pool of its own.
fn round_runner(
    ctx: &Arc<Context>,
    family: u32,
) -> impl FnOnce() -> Box<dyn FnMut(Round) -> Result<(), ServerError> + Send> {
    let ctx = ctx.clone();
    move || {
        let mut pool: Option<CommandPool> = None;
        Box::new(move |round| run_round(round, &ctx, family, &mut pool))
    }
}

/// Queue a round on the worker.
pub(crate) fn submit(
    collectives: &mut Collectives,
    ctx: &Arc<Context>,
    family: u32,
    round: Round,
) -> Result<(), ServerError> {
    let slice = round.dst_binding.handle().memory().id();
    let group = round.group.clone();
    collectives.submit(&group, slice, round, WORKER, round_runner(ctx, family))
}

fn run_round(
    round: Round,
    ctx: &Arc<Context>,
    family: u32,
    pool: &mut Option<CommandPool>,
) -> Result<(), ServerError> {
    round.ctx.wait(round.value)?;
    let data = match &round.staging {
        Some(s) => s.read(0, round.len as usize).to_vec(),
        None => Vec::new(),
    };
    drop(round.staging);
    let out = HostRendezvous::global().all_reduce(
        &round.group,
        round.seq,
        round.me,
        data,
        round.dtype,
        round.op,
    )?;
    if out.is_empty() {
        return Ok(());
    }
    let mut upload = Staging::new(ctx, out.len() as u64)?;
    upload.write(0, &out);
    if pool.is_none() {
        *pool = Some(CommandPool::new(ctx, family)?);
    }
    let Some(pool) = pool.as_ref() else {
        unreachable!("created just above")
    };
    let cb = pool.begin(None, vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT)?;
    barrier(ctx, cb);
    let region = [vk::BufferCopy {
        src_offset: 0,
        dst_offset: round.dst.offset,
        size: out.len() as u64,
    }];
    // SAFETY: `cb` is recording; the regions lie inside both buffers; the output stays alive
    // (`dst_binding`) until the copy has completed, which is waited for below.
    unsafe {
        ctx.device
            .cmd_copy_buffer(cb, upload.buffer(), round.dst.buffer, &region);
        barrier(ctx, cb);
        ctx.device
            .end_command_buffer(cb)
            .map_err(|e| ServerError::Driver(format!("vkEndCommandBuffer failed: {e}")))?;
    }
    let value = ctx.submit(&[cb]);
    let waited = value.and_then(|v| ctx.wait(v));
    // SAFETY: the copy has completed (or was never submitted).
    unsafe { ctx.device.free_command_buffers(pool_handle(pool), &[cb]) };
    drop(upload);
    drop(round.dst_binding);
    waited
}

fn pool_handle(pool: &CommandPool) -> vk::CommandPool {
    pool.raw()
}

impl ServerCollective for VulkanServer {
    /// [`ServerCollective::ensure_init_collective`](compute_core::ServerCollective::ensure_init_collective).
    fn ensure_init_collective(
        &mut self,
        devices: &[DeviceId],
        _stream: StreamId,
    ) -> Result<(), ServerError> {
        self.collectives.init(devices)
    }

    /// [`ServerCollective::all_reduce`](compute_core::ServerCollective::all_reduce).
    fn all_reduce(&mut self, reduce: AllReduce, stream: StreamId) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "all_reduce")?;
        let group = self.collectives.check_all_reduce(&reduce)?;
        let source = self.resolve(&reduce.src)?;
        let target = self.resolve(&reduce.dst)?;
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
            dtype: reduce.dtype,
            op: reduce.op,
            dst: target,
            dst_binding: reduce.dst,
        };
        crate::collective::submit(&mut self.collectives, &self.ctx, self.family, round)
    }

    /// [`ServerCollective::sync_collective`](compute_core::ServerCollective::sync_collective).
    fn sync_collective(&mut self, _stream: StreamId) -> DynFut<Result<(), ServerError>> {
        self.collectives.sync()
    }
}
