//! Collectives between Vulkan devices through host staging: each device's contribution is copied
//! to a staging buffer, reduced on the host by compute-core's [`HostRendezvous`], and copied to
//! its output by a submission of the collective worker.
//!
//! One worker thread per server runs the rounds in issue order, off the server lock (a round waits
//! for the other devices of its group). Until a round's output copy has completed, later work on
//! the server that touches that output waits for it (in `resolve`).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

use ash::vk;
use compute_core::collective::HostRendezvous;
use compute_core::future::{Receiver, Sender};
use compute_core::memory::SliceId;
use compute_core::{Binding, DeviceId, ElemType, ReduceOperation, ServerError};
use hashbrown::HashMap;

use crate::batch::{CommandPool, Staging, barrier};
use crate::context::Context;
use crate::server::ErrorQueue;
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

enum Job {
    Round(Box<Round>),
    Marker(Sender<Result<(), ServerError>>),
}

/// Output slices of rounds not yet written, with how many rounds write each.
#[derive(Default)]
struct Pending {
    slices: Mutex<HashMap<SliceId, u32>>,
    done: Condvar,
    /// Rounds not yet written: lets the launch path skip the lock when there are none.
    count: AtomicUsize,
}

/// The collective state of one server.
#[derive(Default)]
pub(crate) struct Collectives {
    groups: BTreeSet<Vec<DeviceId>>,
    rounds: HashMap<Vec<DeviceId>, u64>,
    pending: Arc<Pending>,
    worker: Option<(mpsc::Sender<Job>, std::thread::JoinHandle<()>)>,
    errors: Arc<Mutex<VecDeque<ServerError>>>,
}

impl Collectives {
    /// Remember an initialised group.
    pub(crate) fn init(&mut self, group: Vec<DeviceId>) {
        self.groups.insert(group);
    }

    /// Whether `group` was initialised.
    pub(crate) fn is_init(&self, group: &[DeviceId]) -> bool {
        self.groups.contains(group)
    }

    /// The next round number of `group`.
    pub(crate) fn next_round(&mut self, group: &[DeviceId]) -> u64 {
        let round = self.rounds.entry(group.to_vec()).or_insert(0);
        *round += 1;
        *round
    }

    /// Block until no pending round writes `slice`.
    pub(crate) fn wait_for(&self, slice: SliceId) {
        if self.pending.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut slices = self
            .pending
            .slices
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        while slices.get(&slice).is_some_and(|&n| n > 0) {
            slices = self
                .pending
                .done
                .wait(slices)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    fn worker(
        &mut self,
        ctx: &Arc<Context>,
        family: u32,
    ) -> Result<&mpsc::Sender<Job>, ServerError> {
        if self.worker.is_none() {
            let (sender, receiver) = mpsc::channel();
            let ctx = ctx.clone();
            let pending = self.pending.clone();
            let errors = self.errors.clone();
            let handle = std::thread::Builder::new()
                .name("compute-vulkan collectives".into())
                .spawn(move || run(receiver, ctx, family, pending, errors))
                .map_err(|e| {
                    ServerError::Driver(format!("cannot start the collective worker: {e}"))
                })?;
            self.worker = Some((sender, handle));
        }
        Ok(&self
            .worker
            .as_ref()
            .unwrap_or_else(|| unreachable!("started just above"))
            .0)
    }

    /// Queue a round on the worker.
    pub(crate) fn submit(
        &mut self,
        ctx: &Arc<Context>,
        family: u32,
        round: Round,
    ) -> Result<(), ServerError> {
        let slice = round.dst_binding.handle().memory().id();
        self.pending.count.fetch_add(1, Ordering::AcqRel);
        *self
            .pending
            .slices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(slice)
            .or_insert(0) += 1;
        let sent = self.worker(ctx, family).and_then(|w| {
            w.send(Job::Round(Box::new(round)))
                .map_err(|_| ServerError::Driver("the collective worker stopped".into()))
        });
        if let Err(e) = sent {
            release(&self.pending, slice);
            return Err(e);
        }
        Ok(())
    }

    /// A receiver that completes once every round queued so far has finished, with the first
    /// error they raised.
    pub(crate) fn marker(
        &mut self,
        ctx: &Arc<Context>,
        family: u32,
        errors: &ErrorQueue,
    ) -> Receiver<Result<(), ServerError>> {
        let (tx, rx) = compute_core::future::oneshot();
        match self.worker(ctx, family) {
            Ok(worker) => {
                if let Err(mpsc::SendError(Job::Marker(tx))) = worker.send(Job::Marker(tx)) {
                    tx.send(Err(ServerError::Driver(
                        "the collective worker stopped".into(),
                    )));
                }
            }
            Err(e) => {
                errors.lock().push_back(e.clone());
                tx.send(Err(e));
            }
        }
        rx
    }

    /// Stop the worker after the rounds queued so far.
    pub(crate) fn shutdown(&mut self) {
        if let Some((sender, handle)) = self.worker.take() {
            drop(sender);
            let _ = handle.join();
        }
    }
}

fn release(pending: &Pending, slice: SliceId) {
    let mut slices = pending.slices.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = slices.get_mut(&slice) {
        pending.count.fetch_sub(1, Ordering::AcqRel);
        *n -= 1;
        if *n == 0 {
            slices.remove(&slice);
        }
    }
    pending.done.notify_all();
}

fn run(
    receiver: mpsc::Receiver<Job>,
    ctx: Arc<Context>,
    family: u32,
    pending: Arc<Pending>,
    errors: Arc<Mutex<VecDeque<ServerError>>>,
) {
    let mut pool: Option<CommandPool> = None;
    while let Ok(job) = receiver.recv() {
        match job {
            Job::Round(round) => {
                let slice = round.dst_binding.handle().memory().id();
                if let Err(e) = run_round(*round, &ctx, family, &mut pool) {
                    errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_back(e);
                }
                release(&pending, slice);
            }
            Job::Marker(tx) => {
                let first = errors.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
                tx.send(first.map_or(Ok(()), Err));
            }
        }
    }
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
