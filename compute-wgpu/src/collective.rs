//! Collectives between wgpu devices through host staging: each device's contribution is read
//! back, reduced on the host by compute-core's [`HostRendezvous`], and written to its output.
//!
//! A collective worker thread per server and group runs the group's rounds in issue order, off
//! the server lock (a round waits for the other devices of its group). Groups get their own
//! workers so that rounds of two groups sharing devices, issued in different orders on different
//! devices (two threads), cannot wait on each other. Until a round has written its output, later
//! work on the server that touches that output waits for it (which orders rounds of different
//! groups that share memory).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

use compute_core::collective::HostRendezvous;
use compute_core::future::{Receiver, Sender};
use compute_core::memory::SliceId;
use compute_core::{DeviceId, ElemType, ReduceOperation, ServerError};
use hashbrown::HashMap;

use crate::storage::WgpuResource;

/// One device's part of an all-reduce, handed to the worker.
pub(crate) struct Round {
    /// Completes when `staging` holds the contribution.
    pub(crate) mapped: Receiver<Result<(), wgpu::BufferAsyncError>>,
    pub(crate) staging: wgpu::Buffer,
    pub(crate) delta: u64,
    pub(crate) len: u64,
    pub(crate) group: Vec<DeviceId>,
    pub(crate) seq: u64,
    pub(crate) me: DeviceId,
    pub(crate) dtype: ElemType,
    pub(crate) op: ReduceOperation,
    pub(crate) dst: WgpuResource,
    pub(crate) dst_slice: SliceId,
}

enum Job {
    Round(Box<Round>),
    Marker(Arc<Marker>),
}

/// A `sync_collective` waiting for every worker of a server to reach it.
struct Marker {
    /// Workers that have not reached the marker yet.
    remaining: AtomicUsize,
    done: Mutex<Option<Sender<Result<(), ServerError>>>>,
}

impl Marker {
    /// One worker reached the marker (or will never): the last one answers with the first error
    /// the rounds raised.
    fn reach(&self, errors: &Mutex<VecDeque<ServerError>>) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let first = errors.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
            if let Some(tx) = self.done.lock().unwrap_or_else(|p| p.into_inner()).take() {
                tx.send(first.map_or(Ok(()), Err));
            }
        }
    }
}

/// Output slices of rounds not yet written, with how many rounds write each.
#[derive(Default)]
struct Pending {
    slices: Mutex<HashMap<SliceId, u32>>,
    /// Rounds queued and not yet released: lets `wait_for` skip the lock when none is.
    count: AtomicUsize,
    done: Condvar,
}

/// The collective state of one server.
#[derive(Default)]
pub(crate) struct Collectives {
    groups: BTreeSet<Vec<DeviceId>>,
    rounds: HashMap<Vec<DeviceId>, u64>,
    pending: Arc<Pending>,
    workers: HashMap<Vec<DeviceId>, mpsc::Sender<Job>>,
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
        // Rounds are counted on the server's thread (in `submit`) before any later call can
        // reach here, so a zero count means no round is pending for any slice.
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
        queue: &wgpu::Queue,
        group: &[DeviceId],
    ) -> Result<&mpsc::Sender<Job>, ServerError> {
        if !self.workers.contains_key(group) {
            let (sender, receiver) = mpsc::channel();
            let queue = queue.clone();
            let pending = self.pending.clone();
            let errors = self.errors.clone();
            std::thread::Builder::new()
                .name("compute-wgpu collectives".into())
                .spawn(move || run(receiver, queue, pending, errors))
                .map_err(|e| {
                    ServerError::Driver(format!("cannot start the collective worker: {e}"))
                })?;
            self.workers.insert(group.to_vec(), sender);
        }
        Ok(self
            .workers
            .get(group)
            .unwrap_or_else(|| unreachable!("started just above")))
    }

    /// Queue a round on the worker.
    pub(crate) fn submit(&mut self, queue: &wgpu::Queue, round: Round) -> Result<(), ServerError> {
        let slice = round.dst_slice;
        *self
            .pending
            .slices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(slice)
            .or_insert(0) += 1;
        self.pending.count.fetch_add(1, Ordering::AcqRel);
        let group = round.group.clone();
        let sent = self.worker(queue, &group).and_then(|worker| {
            worker
                .send(Job::Round(Box::new(round)))
                .map_err(|_| ServerError::Driver("the collective worker stopped".into()))
        });
        if let Err(e) = sent {
            release(&self.pending, slice);
            return Err(e);
        }
        Ok(())
    }

    /// A receiver that completes once every round queued so far (on every group's worker) has
    /// finished, with the first error they raised.
    pub(crate) fn marker(&mut self) -> Receiver<Result<(), ServerError>> {
        let (tx, rx) = compute_core::future::oneshot();
        let marker = Arc::new(Marker {
            // One count per worker, and one for this call (so none answers before all are sent).
            remaining: AtomicUsize::new(self.workers.len() + 1),
            done: Mutex::new(Some(tx)),
        });
        for worker in self.workers.values() {
            if let Err(mpsc::SendError(Job::Marker(m))) = worker.send(Job::Marker(marker.clone())) {
                self.errors
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_back(ServerError::Driver("a collective worker stopped".into()));
                m.reach(&self.errors);
            }
        }
        marker.reach(&self.errors);
        rx
    }
}

fn release(pending: &Pending, slice: SliceId) {
    let mut slices = pending.slices.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = slices.get_mut(&slice) {
        *n -= 1;
        if *n == 0 {
            slices.remove(&slice);
        }
        pending.count.fetch_sub(1, Ordering::AcqRel);
    }
    pending.done.notify_all();
}

fn run(
    receiver: mpsc::Receiver<Job>,
    queue: wgpu::Queue,
    pending: Arc<Pending>,
    errors: Arc<Mutex<VecDeque<ServerError>>>,
) {
    while let Ok(job) = receiver.recv() {
        match job {
            Job::Round(round) => {
                let slice = round.dst_slice;
                if let Err(e) = run_round(*round, &queue) {
                    errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_back(e);
                }
                release(&pending, slice);
            }
            Job::Marker(marker) => marker.reach(&errors),
        }
    }
}

fn run_round(round: Round, queue: &wgpu::Queue) -> Result<(), ServerError> {
    let mapped = compute_core::block_on(round.mapped)
        .ok_or_else(|| ServerError::Driver("the read of a collective input was dropped".into()))?;
    mapped.map_err(|e| ServerError::Driver(format!("reading a collective input: {e}")))?;
    let data = {
        let view = round
            .staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| ServerError::Driver(format!("reading a collective input: {e}")))?;
        view[round.delta as usize..(round.delta + round.len) as usize].to_vec()
    };
    round.staging.unmap();
    let out = HostRendezvous::global().all_reduce(
        &round.group,
        round.seq,
        round.me,
        data,
        round.dtype,
        round.op,
    )?;
    crate::server::write_padded(queue, &round.dst, 0, &out)?;
    queue.submit([]);
    Ok(())
}
