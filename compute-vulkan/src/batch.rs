//! Batched command recording: launches and copies of every stream go into the open command
//! buffer in issue order; a submission takes every command buffer recorded since the last one,
//! signals the timeline semaphore, and keeps the resources it uses alive until that value
//! completes.
//!
//! Consecutive commands are separated by a global memory barrier naming the stages involved, and
//! the first command after a submission has one on every stage: barriers order against
//! everything earlier in submission order, so work on the one queue runs in issue order.
//!
//! Commands are collected as [`Op`]s on the issuing thread; a submit thread records each batch
//! into command buffers and submits it with a timeline value reserved when the batch was closed,
//! so the caller can wait for that value at once (host waits may precede the signal's submission).
//!
//! Why one file above 800 lines: the recorder, its submit thread, the staging it hands out and
//! the recycler share one rule, that whatever a submission uses is kept until its timeline value
//! completes; kept together, every path that hands a resource to the GPU and every path that gives
//! it back are read side by side.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;

use ash::vk;
use compute_core::ServerError;

use crate::context::{Context, RawStaging};
use crate::ops::{Op, Ops, Rec};
use crate::server::ErrorQueue;
use compute_core::submit::{Spares, SubmitThread, SubmitWorker};

/// Submissions in flight before recycling asks the driver what completed (otherwise waits tell).
const RECYCLE_QUERY_AFTER: usize = 16;

/// Size of the chunks that launch info and small uploads are packed into.
pub(crate) const CHUNK_BYTES: u64 = 1 << 20;

/// A mapped staging buffer, returned to the device's pool when dropped.
///
/// Whoever holds one while the GPU uses it keeps it until that work has completed.
pub(crate) struct Staging {
    ctx: Arc<Context>,
    raw: Option<RawStaging>,
}

impl Staging {
    /// A staging buffer of at least `size` bytes.
    pub(crate) fn new(ctx: &Arc<Context>, size: u64) -> Result<Self, ServerError> {
        Ok(Self {
            ctx: ctx.clone(),
            raw: Some(ctx.take_staging(size)?),
        })
    }

    fn raw(&self) -> &RawStaging {
        self.raw
            .as_ref()
            .unwrap_or_else(|| unreachable!("only taken in drop"))
    }

    /// The buffer.
    pub(crate) fn buffer(&self) -> vk::Buffer {
        self.raw().buffer
    }

    /// Capacity in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.raw().size
    }

    /// Copy `data` in at `offset`.
    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) {
        let raw = self.raw();
        assert!(
            offset + data.len() as u64 <= raw.size,
            "staging write out of range"
        );
        // SAFETY: the range is inside the mapping (checked above); no GPU work reads it yet (its
        // holder only writes before recording the copy).
        unsafe {
            core::ptr::copy_nonoverlapping(data.as_ptr(), raw.ptr.add(offset as usize), data.len());
        }
    }

    /// The mapped bytes `[offset, offset + len)`.
    ///
    /// Only valid to call once the GPU work that wrote them has completed.
    pub(crate) fn read(&self, offset: u64, len: usize) -> &[u8] {
        let raw = self.raw();
        assert!(offset + len as u64 <= raw.size, "staging read out of range");
        // SAFETY: inside the mapping; the caller waited for the writes (coherent memory, made
        // visible to the host by the batch's final barrier).
        unsafe { core::slice::from_raw_parts(raw.ptr.add(offset as usize), len) }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            self.ctx.return_staging(raw);
        }
    }
}

/// A linear allocator over staging chunks, for launch info and small uploads.
#[derive(Default)]
pub(crate) struct Linear {
    current: Option<(Staging, u64)>,
    full: Vec<Staging>,
}

impl Linear {
    /// Room for `data` at an `align`ed offset: the buffer and offset it landed at.
    pub(crate) fn push(
        &mut self,
        ctx: &Arc<Context>,
        data: &[u8],
        align: u64,
    ) -> Result<(vk::Buffer, u64), ServerError> {
        let len = (data.len() as u64).max(4);
        if len > CHUNK_BYTES / 4 {
            let mut own = Staging::new(ctx, len)?;
            own.write(0, data);
            let buffer = own.buffer();
            self.full.push(own);
            return Ok((buffer, 0));
        }
        let fits = self
            .current
            .as_ref()
            .is_some_and(|(s, used)| used.next_multiple_of(align) + len <= s.size());
        if !fits {
            if let Some((old, _)) = self.current.take() {
                self.full.push(old);
            }
            self.current = Some((Staging::new(ctx, CHUNK_BYTES)?, 0));
        }
        let (chunk, used) = self
            .current
            .as_mut()
            .unwrap_or_else(|| unreachable!("a chunk was just made"));
        let at = used.next_multiple_of(align);
        chunk.write(at, data);
        *used = at + len;
        Ok((chunk.buffer(), at))
    }

    /// Every chunk used so far (the allocator starts over).
    pub(crate) fn take(&mut self) -> Vec<Staging> {
        let mut all = core::mem::take(&mut self.full);
        if let Some((c, _)) = self.current.take() {
            all.push(c);
        }
        all
    }
}

/// Stage sets of the barriers between commands: what earlier commands did (source) and what
/// the next one does (destination).
pub(crate) mod stage {
    /// A compute dispatch (shader reads and writes).
    pub(crate) const COMPUTE: u8 = 1;
    /// A transfer command (buffer copies and fills).
    pub(crate) const TRANSFER: u8 = 2;
    /// A dispatch that reads its cube count from a buffer (destination only).
    pub(crate) const INDIRECT: u8 = 4;
    /// Anything: what a barrier assumes about commands it cannot see (an earlier submission, a
    /// graph's command buffer) and what it orders before an unknown next command.
    pub(crate) const ALL: u8 = COMPUTE | TRANSFER | INDIRECT;
    /// The stages that write memory, of a set.
    pub(crate) const fn writers(set: u8) -> u8 {
        set & (COMPUTE | TRANSFER)
    }
}

/// Record a global memory barrier that makes the writes of everything before it (stages `src`)
/// visible to the work after it (stages `dst`).
///
/// Barriers chain: a command's stage is in the destination of the barrier before it and in the
/// source of the barrier after it, and a visibility operation covers every write made available
/// so far, so the barrier between two dispatches only names the compute stage.
pub(crate) fn barrier_between(ctx: &Context, cb: vk::CommandBuffer, src: u8, dst: u8) {
    let (mut src_stage, mut src_access) = (vk::PipelineStageFlags2::NONE, vk::AccessFlags2::NONE);
    if src & stage::COMPUTE != 0 {
        src_stage |= vk::PipelineStageFlags2::COMPUTE_SHADER;
        src_access |= vk::AccessFlags2::SHADER_WRITE;
    }
    if src & stage::TRANSFER != 0 {
        src_stage |= vk::PipelineStageFlags2::TRANSFER;
        src_access |= vk::AccessFlags2::TRANSFER_WRITE;
    }
    let (mut dst_stage, mut dst_access) = (vk::PipelineStageFlags2::NONE, vk::AccessFlags2::NONE);
    if dst & stage::COMPUTE != 0 {
        dst_stage |= vk::PipelineStageFlags2::COMPUTE_SHADER;
        dst_access |= vk::AccessFlags2::SHADER_READ | vk::AccessFlags2::SHADER_WRITE;
    }
    if dst & stage::TRANSFER != 0 {
        dst_stage |= vk::PipelineStageFlags2::TRANSFER;
        dst_access |= vk::AccessFlags2::TRANSFER_READ | vk::AccessFlags2::TRANSFER_WRITE;
    }
    if dst & stage::INDIRECT != 0 {
        dst_stage |= vk::PipelineStageFlags2::DRAW_INDIRECT;
        dst_access |= vk::AccessFlags2::INDIRECT_COMMAND_READ;
    }
    if src_stage.is_empty() || dst_stage.is_empty() {
        return;
    }
    let device = &ctx.device;
    if ctx.sync2 {
        let b = [vk::MemoryBarrier2::default()
            .src_stage_mask(src_stage)
            .src_access_mask(src_access)
            .dst_stage_mask(dst_stage)
            .dst_access_mask(dst_access)];
        let dependency = vk::DependencyInfo::default().memory_barriers(&b);
        // SAFETY: `cb` is in the recording state (the callers' contract); synchronization2 is
        // enabled on the device.
        unsafe { device.cmd_pipeline_barrier2(cb, &dependency) };
        return;
    }
    // The legacy flags have the same bit values as the first 32 bits of the 2 variants for every
    // stage and access used here.
    let b = [vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::from_raw(src_access.as_raw() as u32))
        .dst_access_mask(vk::AccessFlags::from_raw(dst_access.as_raw() as u32))];
    // SAFETY: `cb` is in the recording state (the callers' contract).
    unsafe {
        device.cmd_pipeline_barrier(
            cb,
            vk::PipelineStageFlags::from_raw(src_stage.as_raw() as u32),
            vk::PipelineStageFlags::from_raw(dst_stage.as_raw() as u32),
            vk::DependencyFlags::empty(),
            &b,
            &[],
            &[],
        );
    }
}

/// Record a global memory barrier between any earlier and any later compute/transfer work.
pub(crate) fn barrier(ctx: &Context, cb: vk::CommandBuffer) {
    barrier_between(ctx, cb, stage::ALL, stage::ALL);
}

/// A command pool with its command buffers (destroyed with it).
pub(crate) struct CommandPool {
    ctx: Arc<Context>,
    pool: vk::CommandPool,
}

impl CommandPool {
    pub(crate) fn new(ctx: &Arc<Context>, family: u32) -> Result<Self, ServerError> {
        let info = vk::CommandPoolCreateInfo::default()
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER)
            .queue_family_index(family);
        // SAFETY: a valid create info.
        let pool = unsafe { ctx.device.create_command_pool(&info, None) }
            .map_err(|e| ServerError::Driver(format!("vkCreateCommandPool failed: {e}")))?;
        Ok(Self {
            ctx: ctx.clone(),
            pool,
        })
    }

    /// The raw pool.
    pub(crate) fn raw(&self) -> vk::CommandPool {
        self.pool
    }

    /// A fresh primary command buffer, begun with `flags`.
    pub(crate) fn begin(
        &self,
        reuse: Option<vk::CommandBuffer>,
        flags: vk::CommandBufferUsageFlags,
    ) -> Result<vk::CommandBuffer, ServerError> {
        let device = &self.ctx.device;
        let cb = match reuse {
            Some(cb) => cb,
            None => {
                let info = vk::CommandBufferAllocateInfo::default()
                    .command_pool(self.pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(1);
                // SAFETY: the pool is externally synchronised by its single owner.
                unsafe { device.allocate_command_buffers(&info) }.map_err(|e| {
                    ServerError::Driver(format!("vkAllocateCommandBuffers failed: {e}"))
                })?[0]
            }
        };
        let begin = vk::CommandBufferBeginInfo::default().flags(flags);
        // SAFETY: `cb` is fresh or was reset after its last submission completed.
        unsafe { device.begin_command_buffer(cb, &begin) }
            .map_err(|e| ServerError::Driver(format!("vkBeginCommandBuffer failed: {e}")))?;
        Ok(cb)
    }
}

impl Drop for CommandPool {
    fn drop(&mut self) {
        // SAFETY: owners drop their pool only after its command buffers have completed.
        unsafe { self.ctx.device.destroy_command_pool(self.pool, None) };
    }
}

/// A command buffer with a pool of its own (reset with `vkResetCommandPool` before reuse).
#[derive(Clone, Copy)]
struct Cmd {
    pool: vk::CommandPool,
    cb: vk::CommandBuffer,
}

/// One submission in flight: what must live until its timeline value completes.
struct InFlight {
    value: u64,
    keep: Vec<Box<dyn Any + Send>>,
}

/// Drops what completed submissions kept alive (blocks, staging buffers, graphs), off the thread
/// that issues work.
struct Recycler {
    sender: Option<std::sync::mpsc::Sender<Vec<Box<dyn Any + Send>>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recycler {
    fn spawn() -> Result<Self, ServerError> {
        let (sender, receiver) = std::sync::mpsc::channel::<Vec<Box<dyn Any + Send>>>();
        let thread = std::thread::Builder::new()
            .name("compute-vulkan recycler".into())
            .spawn(move || {
                while let Ok(done) = receiver.recv() {
                    drop(done);
                }
            })
            .map_err(|e| ServerError::Driver(format!("cannot start the recycler thread: {e}")))?;
        Ok(Self {
            sender: Some(sender),
            thread: Some(thread),
        })
    }

    fn send(&self, keep: Vec<Box<dyn Any + Send>>) {
        if keep.is_empty() {
            return;
        }
        if let Some(sender) = &self.sender
            && let Err(std::sync::mpsc::SendError(keep)) = sender.send(keep)
        {
            // The thread is gone: release here.
            drop(keep);
        }
    }

    fn stop(&mut self) {
        self.sender.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Batches handed to the submit thread at most before the issuing thread waits for it.
const MAX_QUEUED_BATCHES: usize = 8;

/// Emptied command lists kept for reuse (their arenas keep their capacity).
const MAX_SPARE_OPS: usize = 4;

/// A batch for the submit thread: its commands and the timeline value reserved for it.
struct Job {
    ops: Ops,
    value: u64,
}

/// The submit thread: records each batch's commands into command buffers of its own pools and
/// submits them with the batch's reserved timeline value, in the order the batches came.
///
/// Recording is most of a launch's host cost in the driver (the NVIDIA driver spends about a
/// microsecond on a barrier and a dispatch); here it runs beside the thread that issues work.
struct Submitter {
    thread: SubmitThread<Worker>,
    spare: Arc<Spares<Ops>>,
    /// Whether waited-for batches may be submitted on the issuing thread when nothing is queued
    /// (two thread wake-ups less per sync or read; `COMPUTE_VULKAN_INLINE_SUBMIT=0` turns it
    /// off).
    inline: bool,
}

struct Worker {
    ctx: Arc<Context>,
    family: u32,
    errors: ErrorQueue,
    spare: Arc<Spares<Ops>>,
    /// Command buffers of submissions in flight, by timeline value.
    in_flight: VecDeque<(u64, Vec<Cmd>)>,
    /// Command buffers whose submission completed, reset when reused.
    completed: Vec<Cmd>,
}

impl Submitter {
    fn spawn(ctx: &Arc<Context>, family: u32, errors: ErrorQueue) -> Result<Self, ServerError> {
        let spare = Arc::new(Spares::new(MAX_SPARE_OPS));
        let worker = Worker {
            ctx: ctx.clone(),
            family,
            errors,
            spare: spare.clone(),
            in_flight: VecDeque::new(),
            completed: Vec::new(),
        };
        Ok(Self {
            thread: SubmitThread::spawn(
                "compute-vulkan submit".into(),
                MAX_QUEUED_BATCHES,
                worker,
            )?,
            spare,
            inline: compute_core::env::flag("COMPUTE_VULKAN_INLINE_SUBMIT", true),
        })
    }

    fn fresh_ops(&self) -> Ops {
        self.spare.take()
    }

    /// Hand `job` over (or, with `now` and nothing queued, record and submit it on this
    /// thread); `false` when the thread has stopped (the job is dropped).
    fn send(&self, job: Job, now: bool) -> bool {
        let job = if now && self.inline {
            self.thread.run_here_if_idle(job)
        } else {
            Some(job)
        };
        job.is_none_or(|job| self.thread.send(job).is_none())
    }

    /// Let the thread finish every batch handed over, then stop it.
    fn stop(&mut self) {
        self.thread.stop();
    }
}

impl SubmitWorker for Worker {
    type Job = Job;

    fn run(&mut self, mut job: Job) {
        let value = job.value;
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.record_and_submit(&job.ops, value)
        }));
        let error = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(ServerError::Driver(
                "the Vulkan submit thread panicked while recording a batch".into(),
            )),
        };
        if let Some(e) = error {
            // The error first, then the value: whoever waits for it finds the error after.
            self.errors.lock().push_back(e);
            self.ctx.abandon(value);
        }
        job.ops.clear();
        self.spare.give(job.ops);
    }

    fn finish(&mut self) {
        self.shutdown();
    }
}

impl Worker {
    /// Command buffers of completed submissions go back to the free list.
    fn reclaim(&mut self) {
        let mut done = self.ctx.known_completed();
        if self
            .in_flight
            .front()
            .is_some_and(|(v, _)| *v > done && self.in_flight.len() > RECYCLE_QUERY_AFTER)
        {
            // Nobody waited lately: ask the driver, so that the list stays short.
            done = self.ctx.completed().unwrap_or(done);
        }
        while self.in_flight.front().is_some_and(|(v, _)| *v <= done) {
            if let Some((_, cmds)) = self.in_flight.pop_front() {
                self.completed.extend(cmds);
            }
        }
    }

    /// A command buffer, begun for one submission.
    fn begin(&mut self) -> Result<Cmd, ServerError> {
        let device = &self.ctx.device;
        let mut reused = None;
        while let Some(cmd) = self.completed.pop() {
            // SAFETY: the submission using `cmd` completed; its pool is only used here.
            let reset =
                unsafe { device.reset_command_pool(cmd.pool, vk::CommandPoolResetFlags::empty()) };
            if reset.is_ok() {
                reused = Some(cmd);
                break;
            }
            // SAFETY: as above; a pool that cannot be reset is destroyed.
            unsafe { device.destroy_command_pool(cmd.pool, None) };
        }
        let cmd = match reused {
            Some(cmd) => cmd,
            None => {
                let info = vk::CommandPoolCreateInfo::default()
                    .flags(vk::CommandPoolCreateFlags::TRANSIENT)
                    .queue_family_index(self.family);
                // SAFETY: a valid create info.
                let pool = unsafe { device.create_command_pool(&info, None) }
                    .map_err(|e| ServerError::Driver(format!("vkCreateCommandPool failed: {e}")))?;
                let alloc = vk::CommandBufferAllocateInfo::default()
                    .command_pool(pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(1);
                // SAFETY: the pool is fresh and owned here.
                match unsafe { device.allocate_command_buffers(&alloc) } {
                    Ok(cbs) => Cmd { pool, cb: cbs[0] },
                    Err(e) => {
                        // SAFETY: unused.
                        unsafe { device.destroy_command_pool(pool, None) };
                        return Err(ServerError::Driver(format!(
                            "vkAllocateCommandBuffers failed: {e}"
                        )));
                    }
                }
            }
        };
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: the buffer is fresh or its pool was reset after its submission completed.
        if let Err(e) = unsafe { device.begin_command_buffer(cmd.cb, &begin) } {
            self.completed.push(cmd);
            return Err(ServerError::Driver(format!(
                "vkBeginCommandBuffer failed: {e}"
            )));
        }
        Ok(cmd)
    }

    fn record_and_submit(&mut self, ops: &Ops, value: u64) -> Result<(), ServerError> {
        self.reclaim();
        let mut owned: Vec<Cmd> = Vec::new();
        let mut segments: Vec<vk::CommandBuffer> = Vec::new();
        let mut current: Option<vk::CommandBuffer> = None;
        let recorded = (|| {
            for op in &ops.ops {
                let cb = match current {
                    Some(cb) => cb,
                    None => {
                        let cmd = self.begin()?;
                        owned.push(cmd);
                        current = Some(cmd.cb);
                        cmd.cb
                    }
                };
                // SAFETY: `cb` is recording; the batch's owner keeps every object the commands
                // name alive until `value` completed.
                unsafe { ops.record(&self.ctx, cb, op) };
            }
            if let Some(cb) = current.take() {
                // SAFETY: `cb` is recording.
                unsafe { self.ctx.device.end_command_buffer(cb) }
                    .map_err(|e| ServerError::Driver(format!("vkEndCommandBuffer failed: {e}")))?;
                segments.push(cb);
            }
            Ok::<(), ServerError>(())
        })();
        let submitted = recorded.and_then(|()| self.ctx.submit_reserved(&segments, value));
        match submitted {
            Ok(()) => {
                self.in_flight.push_back((value, owned));
                Ok(())
            }
            Err(e) => {
                // Nothing of the batch runs: its command buffers are free again.
                self.completed.extend(owned);
                Err(e)
            }
        }
    }

    fn shutdown(&mut self) {
        // SAFETY: waiting for the device before destroying what its work may still use.
        if let Err(e) = unsafe { self.ctx.device.device_wait_idle() } {
            compute_core::error::report_unreturned(
                "vulkan: vkDeviceWaitIdle at submit-thread stop",
                &e,
            );
        }
        let mut pools: Vec<Cmd> = self.completed.drain(..).collect();
        for (_, cmds) in self.in_flight.drain(..) {
            pools.extend(cmds);
        }
        for cmd in pools {
            // SAFETY: the device is idle; nothing else uses these pools.
            unsafe { self.ctx.device.destroy_command_pool(cmd.pool, None) };
        }
    }
}

/// A value [`Recorder::recycle`] drops on its own thread once its submission completed (see
/// [`Recorder::keep_until_done_here`]).
struct DropHere(#[allow(dead_code)] Box<dyn Any + Send>);

/// The server's open batch and its submissions in flight.
pub(crate) struct Recorder {
    ctx: Arc<Context>,
    recycler: Recycler,
    submitter: Submitter,
    /// The open batch's commands.
    pub(crate) ops: Ops,
    keep: Vec<Box<dyn Any + Send>>,
    in_flight: VecDeque<InFlight>,
    /// Launch info and small uploads of the open batch.
    pub(crate) linear: Linear,
    /// Stages of the commands recorded since the last barrier (every stage at the start of a
    /// batch: earlier submissions are not known here); the next command's barrier waits on them.
    pending: u8,
    /// Launches recorded in the open batch.
    pub(crate) dispatches: usize,
    /// What the open command buffer has bound, so that repeated launches skip rebinding.
    pub(crate) bound: Bound,
}

/// Compute state bound in the open command buffer.
#[derive(Default)]
pub(crate) struct Bound {
    /// The pipeline.
    pub(crate) pipeline: vk::Pipeline,
    /// Descriptor set 0 (null when none or pushed).
    pub(crate) set: vk::DescriptorSet,
    /// The push-constant block last pushed (empty when none).
    pub(crate) push: Vec<u8>,
}

impl Bound {
    /// Forget everything (a new command buffer, or binds made without tracking).
    pub(crate) fn forget(&mut self) {
        self.pipeline = vk::Pipeline::null();
        self.set = vk::DescriptorSet::null();
        self.push.clear();
    }
}

impl Recorder {
    /// A recorder submitting on `family`'s queue; failures of the submit thread go to `errors`.
    pub(crate) fn new(
        ctx: &Arc<Context>,
        family: u32,
        errors: ErrorQueue,
    ) -> Result<Self, ServerError> {
        Ok(Self {
            ctx: ctx.clone(),
            recycler: Recycler::spawn()?,
            submitter: Submitter::spawn(ctx, family, errors)?,
            ops: Ops::default(),
            keep: Vec::new(),
            in_flight: VecDeque::new(),
            linear: Linear::default(),
            pending: stage::ALL,
            dispatches: 0,
            bound: Bound::default(),
        })
    }

    /// Whether the open batch holds anything.
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The open batch, ready for one more command of the `next` stages (see [`stage`]), after
    /// a barrier on what was recorded since the last one.
    pub(crate) fn command(&mut self, next: u8) -> Rec<'_> {
        self.barrier_for(next);
        Rec(&mut self.ops)
    }

    /// Record the barrier a command of the `next` stages needs (see [`Recorder::command`]).
    pub(crate) fn barrier_for(&mut self, next: u8) {
        if stage::writers(self.pending) != 0 {
            self.ops.push(Op::Barrier {
                src: self.pending,
                dst: next,
            });
            self.pending = 0;
        }
        self.pending |= stage::writers(next);
    }

    /// Keep `value` alive until the open batch has completed.
    pub(crate) fn keep(&mut self, value: impl Any + Send) {
        self.keep.push(Box::new(value));
    }

    /// Append a graph's commands to the batch, after what is recorded (the graph starts with a
    /// barrier against it).
    pub(crate) fn append(&mut self, graph: &Ops) {
        self.ops.extend_from(graph);
        self.pending = stage::ALL;
        self.bound.forget();
    }

    /// Submit the batch if it holds anything: the timeline value it signals. The batch is
    /// recorded and submitted on the submit thread; the value may be waited for at once.
    pub(crate) fn submit(&mut self) -> Result<Option<u64>, ServerError> {
        self.submit_inner(false)
    }

    /// [`Recorder::submit`], for a caller about to wait for the batch: recorded and submitted on
    /// this thread when the submit thread has nothing queued.
    fn submit_now(&mut self) -> Result<Option<u64>, ServerError> {
        self.submit_inner(true)
    }

    fn submit_inner(&mut self, now: bool) -> Result<Option<u64>, ServerError> {
        if self.is_empty() {
            return Ok(None);
        }
        // The host reads results after the timeline wait: make the batch's writes visible.
        self.ops.push(Op::HostBarrier);
        let ops = core::mem::replace(&mut self.ops, self.submitter.fresh_ops());
        let mut keep = core::mem::take(&mut self.keep);
        keep.extend(
            self.linear
                .take()
                .into_iter()
                .map(|s| Box::new(s) as Box<dyn Any + Send>),
        );
        self.pending = stage::ALL;
        self.dispatches = 0;
        self.bound.forget();
        self.recycle();
        let value = self.ctx.reserve();
        match self.submitter.send(Job { ops, value }, now) {
            true => {
                self.in_flight.push_back(InFlight { value, keep });
                Ok(Some(value))
            }
            false => {
                self.ctx.abandon(value);
                self.recycler.send(keep);
                Err(ServerError::Driver(
                    "the Vulkan submit thread stopped".into(),
                ))
            }
        }
    }

    /// Submit the batch, or return the value of the latest submission when it is empty.
    pub(crate) fn submit_or_last(&mut self) -> Result<u64, ServerError> {
        match self.submit_now()? {
            Some(v) => Ok(v),
            None => Ok(self.ctx.last_submitted()),
        }
    }

    /// Hand what completed submissions kept alive to the recycler.
    pub(crate) fn recycle(&mut self) {
        let Some(front) = self.in_flight.front() else {
            return;
        };
        let mut done = self.ctx.known_completed();
        if front.value > done && self.in_flight.len() > RECYCLE_QUERY_AFTER {
            // Nobody waited lately: ask the driver, so that the list stays short.
            done = self.ctx.completed().unwrap_or(done);
        }
        if front.value > done {
            return;
        }
        while self.in_flight.front().is_some_and(|f| f.value <= done) {
            if let Some(f) = self.in_flight.pop_front() {
                // Staging buffers go back to the pool here and now (cheap, and the next
                // transfer wants them); the rest is released on the recycler thread.
                let mut rest = Vec::with_capacity(f.keep.len());
                for item in f.keep {
                    match item.downcast::<Staging>() {
                        Ok(staging) => drop(staging),
                        Err(other) => match other.downcast::<DropHere>() {
                            Ok(here) => drop(here),
                            Err(other) => rest.push(other),
                        },
                    }
                }
                self.recycler.send(rest);
            }
        }
    }

    /// Keep `value` alive until the latest submission (or the open batch, if not empty) has
    /// completed. When the open batch is empty and the latest submission has already completed
    /// (asked of the driver), `value` is dropped now, on this thread.
    pub(crate) fn keep_until_done(&mut self, value: impl Any + Send) {
        if !self.is_empty() {
            self.keep(value);
            return;
        }
        if self.in_flight.back().is_some_and(|last| {
            let done = self.ctx.known_completed();
            last.value > done && self.ctx.completed().unwrap_or(done) < last.value
        }) {
            if let Some(last) = self.in_flight.back_mut() {
                last.keep.push(Box::new(value));
            }
            return;
        }
        // Everything of this server submitted so far has completed (other submitters,
        // collectives, are waited for by the caller): release what completed, then `value`.
        self.recycle();
        drop(value);
    }

    /// Keep `value` alive until the latest submission (or the open batch) has completed, then
    /// drop it on the thread that recycles (the server's), not on the recycler thread: a graph,
    /// whose buffers must be back in their pools when a sync after the release returns and the
    /// server next looks at its memory.
    pub(crate) fn keep_until_done_here(&mut self, value: impl Any + Send) {
        self.keep_until_done(DropHere(Box::new(value)));
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Err(e) = self.submit() {
            compute_core::error::report_unreturned("vulkan: submitting at recorder drop", &e);
        }
        // The submit thread submits what it was handed, waits for the device and frees its
        // command buffers.
        self.submitter.stop();
        // SAFETY: waiting for the device before releasing what its work may still use.
        if let Err(e) = unsafe { self.ctx.device.device_wait_idle() } {
            compute_core::error::report_unreturned("vulkan: vkDeviceWaitIdle at recorder drop", &e);
        }
        for f in self.in_flight.drain(..) {
            drop(f.keep);
        }
        self.keep.clear();
        let _ = self.linear.take();
        self.recycler.stop();
    }
}
