//! Batched command recording: launches and copies of every stream go into the open command
//! buffer in issue order; a submission takes every command buffer recorded since the last one,
//! signals the timeline semaphore, and keeps the resources it uses alive until that value
//! completes.
//!
//! Consecutive commands are separated by a global memory barrier (compute and transfer, plus
//! indirect reads), and the first command after a submission has one too: barriers order against
//! everything earlier in submission order, so work on the one queue runs in issue order.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;

use ash::vk;
use compute_core::ServerError;

use crate::context::{Context, RawStaging};

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

/// A command buffer with a pool of its own, so that it can be reset (`vkResetCommandPool`) on
/// another thread than the one recording the others.
#[derive(Clone, Copy)]
struct Cmd {
    pool: vk::CommandPool,
    cb: vk::CommandBuffer,
}

/// What a completed submission hands to the recycler thread.
struct Completed {
    commands: Vec<Cmd>,
    keep: Vec<Box<dyn Any + Send>>,
}

/// One submission in flight: what must live until its timeline value completes.
struct InFlight {
    value: u64,
    done: Completed,
}

/// Drops what completed submissions kept alive (blocks, staging buffers, graphs), off the thread
/// that issues work. Command buffers are reset by the issuing thread itself, right before reuse:
/// drivers that allocate per recorded command (lavapipe) then reuse that memory from the same
/// thread's allocator caches.
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

/// The server's open batch and its submissions in flight.
pub(crate) struct Recorder {
    ctx: Arc<Context>,
    family: u32,
    recycler: Recycler,
    /// Command buffers whose submission completed, reset when reused.
    completed: Vec<Cmd>,
    current: Option<Cmd>,
    segments: Vec<vk::CommandBuffer>,
    owned: Vec<Cmd>,
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
    pub(crate) fn new(ctx: &Arc<Context>, family: u32) -> Result<Self, ServerError> {
        Ok(Self {
            ctx: ctx.clone(),
            family,
            recycler: Recycler::spawn()?,
            completed: Vec::new(),
            current: None,
            segments: Vec::new(),
            owned: Vec::new(),
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
        self.current.is_none() && self.segments.is_empty()
    }

    fn open(&mut self) -> Result<vk::CommandBuffer, ServerError> {
        if let Some(cmd) = self.current {
            return Ok(cmd.cb);
        }
        let mut reused = None;
        while let Some(cmd) = self.completed.pop() {
            // SAFETY: the submission using `cmd` completed; its pool is only used here.
            let reset = unsafe {
                self.ctx
                    .device
                    .reset_command_pool(cmd.pool, vk::CommandPoolResetFlags::empty())
            };
            if reset.is_ok() {
                reused = Some(cmd);
                break;
            }
            // SAFETY: as above; a pool that cannot be reset is destroyed.
            unsafe { self.ctx.device.destroy_command_pool(cmd.pool, None) };
        }
        let cmd = match reused {
            Some(cmd) => cmd,
            None => {
                let device = &self.ctx.device;
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
        unsafe { self.ctx.device.begin_command_buffer(cmd.cb, &begin) }
            .map_err(|e| ServerError::Driver(format!("vkBeginCommandBuffer failed: {e}")))?;
        self.owned.push(cmd);
        self.current = Some(cmd);
        self.bound.forget();
        Ok(cmd.cb)
    }

    /// The open command buffer, ready for one more command of the `next` stages (see [`stage`]),
    /// after a barrier on what was recorded since the last one.
    pub(crate) fn command(&mut self, next: u8) -> Result<vk::CommandBuffer, ServerError> {
        let cb = self.open()?;
        if stage::writers(self.pending) != 0 {
            barrier_between(&self.ctx, cb, self.pending, next);
            self.pending = 0;
        }
        self.pending |= stage::writers(next);
        Ok(cb)
    }

    /// Drop `value` on the recycler thread (large host buffers: their release takes a while).
    pub(crate) fn release_soon(&self, value: impl Any + Send) {
        self.recycler.send(vec![Box::new(value)]);
    }

    /// Keep `value` alive until the open batch has completed.
    pub(crate) fn keep(&mut self, value: impl Any + Send) {
        self.keep.push(Box::new(value));
    }

    fn close_current(&mut self) -> Result<(), ServerError> {
        if let Some(cmd) = self.current.take() {
            // SAFETY: `cmd.cb` is recording.
            unsafe { self.ctx.device.end_command_buffer(cmd.cb) }
                .map_err(|e| ServerError::Driver(format!("vkEndCommandBuffer failed: {e}")))?;
            self.segments.push(cmd.cb);
        }
        Ok(())
    }

    /// Append a pre-recorded command buffer (a graph) to the batch, after what is recorded.
    pub(crate) fn append(&mut self, cb: vk::CommandBuffer) -> Result<(), ServerError> {
        self.close_current()?;
        self.segments.push(cb);
        self.pending = stage::ALL;
        Ok(())
    }

    /// Submit the batch if it holds anything: the timeline value it signals.
    pub(crate) fn submit(&mut self) -> Result<Option<u64>, ServerError> {
        if self.is_empty() {
            return Ok(None);
        }
        // The host reads results after the timeline wait: make the batch's writes visible.
        let cb = self.open()?;
        host_barrier(&self.ctx.device, cb);
        self.close_current()?;
        let segments = core::mem::take(&mut self.segments);
        let mut keep = core::mem::take(&mut self.keep);
        keep.extend(
            self.linear
                .take()
                .into_iter()
                .map(|s| Box::new(s) as Box<dyn Any + Send>),
        );
        let commands = core::mem::take(&mut self.owned);
        self.pending = stage::ALL;
        self.dispatches = 0;
        let done = Completed { commands, keep };
        // Before submitting: right after, the driver may be busy starting this batch (lavapipe
        // holds its queue lock then, and the counter query would wait for it).
        self.recycle();
        match self.ctx.submit(&segments) {
            Ok(value) => {
                self.in_flight.push_back(InFlight { value, done });
                Ok(Some(value))
            }
            Err(e) => {
                // Nothing of the batch runs: release it at once.
                self.completed.extend(done.commands);
                self.recycler.send(done.keep);
                Err(e)
            }
        }
    }

    /// Submit the batch, or return the value of the latest submission when it is empty.
    pub(crate) fn submit_or_last(&mut self) -> Result<u64, ServerError> {
        match self.submit()? {
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
                self.completed.extend(f.done.commands);
                // Staging buffers go back to the pool here and now (cheap, and the next
                // transfer wants them); the rest is released on the recycler thread.
                let mut rest = Vec::with_capacity(f.done.keep.len());
                for item in f.done.keep {
                    match item.downcast::<Staging>() {
                        Ok(staging) => drop(staging),
                        Err(other) => rest.push(other),
                    }
                }
                self.recycler.send(rest);
            }
        }
    }

    /// Keep `value` alive until the latest submission (or the open batch, if not empty) has
    /// completed.
    pub(crate) fn keep_until_done(&mut self, value: impl Any + Send) {
        if !self.is_empty() {
            self.keep(value);
        } else if let Some(last) = self.in_flight.back_mut() {
            last.done.keep.push(Box::new(value));
        } else {
            // Nothing of this server is in flight; other submitters (collectives) are waited
            // for by the caller.
            drop(value);
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.submit();
        // SAFETY: waiting for the device before releasing what its work may still use.
        let _ = unsafe { self.ctx.device.device_wait_idle() };
        let mut pools: Vec<Cmd> = self.owned.drain(..).collect();
        for f in self.in_flight.drain(..) {
            pools.extend(f.done.commands);
            drop(f.done.keep);
        }
        self.keep.clear();
        let _ = self.linear.take();
        self.recycler.stop();
        pools.append(&mut self.completed);
        for cmd in pools {
            // SAFETY: the device is idle and the recycler has stopped.
            unsafe { self.ctx.device.destroy_command_pool(cmd.pool, None) };
        }
    }
}
