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

/// Record a global memory barrier between earlier and later compute/transfer work.
pub(crate) fn barrier(device: &ash::Device, cb: vk::CommandBuffer) {
    let b = [vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
        .dst_access_mask(
            vk::AccessFlags::SHADER_READ
                | vk::AccessFlags::SHADER_WRITE
                | vk::AccessFlags::TRANSFER_READ
                | vk::AccessFlags::TRANSFER_WRITE
                | vk::AccessFlags::INDIRECT_COMMAND_READ,
        )];
    // SAFETY: `cb` is in the recording state (the callers' contract).
    unsafe {
        device.cmd_pipeline_barrier(
            cb,
            vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
            vk::PipelineStageFlags::COMPUTE_SHADER
                | vk::PipelineStageFlags::TRANSFER
                | vk::PipelineStageFlags::DRAW_INDIRECT,
            vk::DependencyFlags::empty(),
            &b,
            &[],
            &[],
        );
    }
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

/// One submission in flight: what must live until its timeline value completes.
struct InFlight {
    value: u64,
    commands: Vec<vk::CommandBuffer>,
    keep: Vec<Box<dyn Any + Send>>,
}

/// The server's open batch and its submissions in flight.
pub(crate) struct Recorder {
    ctx: Arc<Context>,
    pool: CommandPool,
    free: Vec<vk::CommandBuffer>,
    current: Option<vk::CommandBuffer>,
    segments: Vec<vk::CommandBuffer>,
    owned: Vec<vk::CommandBuffer>,
    keep: Vec<Box<dyn Any + Send>>,
    in_flight: VecDeque<InFlight>,
    /// Launch info and small uploads of the open batch.
    pub(crate) linear: Linear,
    /// Whether the next command needs a barrier before it.
    pub(crate) needs_barrier: bool,
    /// Launches recorded in the open batch.
    pub(crate) dispatches: usize,
}

impl Recorder {
    pub(crate) fn new(ctx: &Arc<Context>, family: u32) -> Result<Self, ServerError> {
        Ok(Self {
            ctx: ctx.clone(),
            pool: CommandPool::new(ctx, family)?,
            free: Vec::new(),
            current: None,
            segments: Vec::new(),
            owned: Vec::new(),
            keep: Vec::new(),
            in_flight: VecDeque::new(),
            linear: Linear::default(),
            needs_barrier: true,
            dispatches: 0,
        })
    }

    /// Whether the open batch holds anything.
    pub(crate) fn is_empty(&self) -> bool {
        self.current.is_none() && self.segments.is_empty()
    }

    /// The open command buffer, ready for one more command (barrier recorded when needed).
    pub(crate) fn command(&mut self) -> Result<vk::CommandBuffer, ServerError> {
        let cb = match self.current {
            Some(cb) => cb,
            None => {
                let cb = self.pool.begin(
                    self.free.pop(),
                    vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT,
                )?;
                self.owned.push(cb);
                self.current = Some(cb);
                cb
            }
        };
        if self.needs_barrier {
            barrier(&self.ctx.device, cb);
        }
        self.needs_barrier = true;
        Ok(cb)
    }

    /// Keep `value` alive until the open batch has completed.
    pub(crate) fn keep(&mut self, value: impl Any + Send) {
        self.keep.push(Box::new(value));
    }

    fn close_current(&mut self) -> Result<(), ServerError> {
        if let Some(cb) = self.current.take() {
            // SAFETY: `cb` is recording.
            unsafe { self.ctx.device.end_command_buffer(cb) }
                .map_err(|e| ServerError::Driver(format!("vkEndCommandBuffer failed: {e}")))?;
            self.segments.push(cb);
        }
        Ok(())
    }

    /// Append a pre-recorded command buffer (a graph) to the batch, after what is recorded.
    pub(crate) fn append(&mut self, cb: vk::CommandBuffer) -> Result<(), ServerError> {
        self.close_current()?;
        self.segments.push(cb);
        self.needs_barrier = true;
        Ok(())
    }

    /// Submit the batch if it holds anything: the timeline value it signals.
    pub(crate) fn submit(&mut self) -> Result<Option<u64>, ServerError> {
        if self.is_empty() {
            return Ok(None);
        }
        // The host reads results after the timeline wait: make the batch's writes visible.
        let cb = match self.current {
            Some(cb) => cb,
            None => {
                let cb = self.pool.begin(
                    self.free.pop(),
                    vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT,
                )?;
                self.owned.push(cb);
                self.current = Some(cb);
                cb
            }
        };
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
        self.needs_barrier = true;
        self.dispatches = 0;
        match self.ctx.submit(&segments) {
            Ok(value) => {
                self.in_flight.push_back(InFlight {
                    value,
                    commands,
                    keep,
                });
                self.recycle();
                Ok(Some(value))
            }
            Err(e) => {
                // Nothing of the batch runs: its command buffers can be reused at once.
                self.reuse(commands);
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

    fn reuse(&mut self, commands: Vec<vk::CommandBuffer>) {
        for cb in commands {
            // SAFETY: `cb` is not pending (its submission completed or never happened).
            if unsafe {
                self.ctx
                    .device
                    .reset_command_buffer(cb, vk::CommandBufferResetFlags::empty())
            }
            .is_ok()
            {
                self.free.push(cb);
            }
        }
    }

    /// Release what completed submissions kept alive.
    pub(crate) fn recycle(&mut self) {
        let Ok(done) = self.ctx.completed() else {
            return;
        };
        while self.in_flight.front().is_some_and(|f| f.value <= done) {
            if let Some(f) = self.in_flight.pop_front() {
                self.reuse(f.commands);
                drop(f.keep);
            }
        }
    }

    /// Keep `value` alive until the latest submission (or the open batch, if not empty) has
    /// completed.
    pub(crate) fn keep_until_done(&mut self, value: impl Any + Send) {
        if !self.is_empty() {
            self.keep(value);
        } else if let Some(last) = self.in_flight.back_mut() {
            last.keep.push(Box::new(value));
        } else {
            // Nothing in flight on this server; other submitters (collectives) are waited for
            // by the caller.
            drop(value);
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.submit();
        // SAFETY: waiting for the device before releasing what its work may still use.
        let _ = unsafe { self.ctx.device.device_wait_idle() };
        self.in_flight.clear();
        self.keep.clear();
        let _ = self.linear.take();
    }
}
