//! The submit thread of a device: encodes recorded batches into command buffers and submits them,
//! and performs `queue.write_buffer`s, in the order the server hands them over.
//!
//! wgpu does the expensive part of recording at `CommandEncoder::finish` (validation, usage
//! tracking and the barriers of every dispatch) and frees finished command buffers in the next
//! submission: about two thirds of a launch's host time. Moving both here leaves the caller's
//! thread with recording a launch into the batch's arenas; the device is fed as before, one
//! command buffer per batch. Everything that touches the queue's order goes through this thread
//! (one FIFO channel), so a write lands after the launches issued before it, as it would if the
//! caller submitted the batch and wrote the buffer itself. A reader asks for the submission index
//! and gets it once its batch is submitted ([`Submitter::submit_indexed`]); map requests are made
//! after that, on the caller's side.
//!
//! The server's side of it is here too: the [`BatchLimit`] (when a batch is handed over on its
//! own), the server's submit helpers, waiting for a submission, and `sync`.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, mpsc};

use compute_core::backend::ServerKit;
use compute_core::future::{DynFut, oneshot};
use compute_core::submit::{Spares, SubmitThread, SubmitWorker};
use compute_core::{Bytes, ServerError, StreamId};

use crate::batch::{Batch, Command, Encoder};
use crate::launch::GuardRead;
use crate::poller::{Waiter, gone};
use crate::server::{ErrorQueue, WgpuServer, ready};

/// Jobs handed over at most before the server's thread waits for the submit thread: a bound on
/// the recorded work (and host bytes of writes) in flight.
const MAX_QUEUED_JOBS: usize = 16;

/// Emptied batches kept for reuse (their arenas keep their capacity).
const MAX_SPARE_BATCHES: usize = 4;

/// One `queue.write_buffer` of part of a host buffer.
#[derive(Debug, Clone)]
pub(crate) struct WritePart {
    /// Byte offset in the target buffer (a multiple of 4).
    pub(crate) at: u64,
    /// Start of the part in the host bytes.
    pub(crate) from: usize,
    /// Bytes of the part.
    pub(crate) len: usize,
    /// Bytes the write covers: `len` rounded up to a multiple of 4 (padded with zeros; the
    /// caller checked the padding lies inside the buffer).
    pub(crate) padded: usize,
}

impl WritePart {
    /// `queue.write_buffer` of `data` (the part's bytes), padded as planned.
    pub(crate) fn apply(&self, queue: &wgpu::Queue, buffer: &wgpu::Buffer, data: &[u8]) {
        if self.padded == self.len {
            queue.write_buffer(buffer, self.at, data);
        } else {
            let mut tail = data.to_vec();
            tail.resize(self.padded, 0);
            queue.write_buffer(buffer, self.at, &tail);
        }
    }
}

type IndexReply = mpsc::SyncSender<Result<Option<wgpu::SubmissionIndex>, ServerError>>;

enum Job {
    /// Encode and submit a batch (an empty submission for an empty batch when `always`); the
    /// submission index goes to `reply`, if given.
    Submit {
        batch: Batch,
        always: bool,
        reply: Option<IndexReply>,
    },
    /// Write parts of `bytes`, then whole 4-byte `words` (at their offsets), into `buffer`.
    Write {
        buffer: wgpu::Buffer,
        parts: Vec<WritePart>,
        words: Vec<(u64, [u8; 4])>,
        bytes: Bytes,
    },
    /// Drop cached bind groups of freed blocks.
    Prune,
}

/// The server's side of the submit thread.
pub(crate) struct Submitter {
    thread: SubmitThread<Worker>,
    spare: Arc<Spares<Batch>>,
    /// Whether waited-for submissions run on the server's thread when nothing is queued
    /// (`COMPUTE_WGPU_INLINE_SUBMIT=1`). Off by default: on the H200's NVIDIA Vulkan driver it
    /// raised launch+sync latency from 73-81 to 169-215 us (raw wgpu: 52-63), while on
    /// lavapipe it made no clear difference.
    inline: bool,
}

struct Worker {
    device: wgpu::Device,
    queue: wgpu::Queue,
    encoder: Encoder,
    errors: ErrorQueue,
    waiter: Option<Waiter>,
    spare: Arc<Spares<Batch>>,
}

fn stopped() -> ServerError {
    ServerError::Driver("the wgpu submit thread stopped".into())
}

impl Submitter {
    /// Start the submit thread; its failures go to `errors`, and every submitted batch is handed
    /// to `waiter` (the poll thread), which frees it off both threads once it completed.
    pub(crate) fn spawn(
        device: wgpu::Device,
        queue: wgpu::Queue,
        encoder: Encoder,
        errors: ErrorQueue,
        waiter: Option<Waiter>,
        name: String,
    ) -> Result<Self, ServerError> {
        let spare = Arc::new(Spares::new(MAX_SPARE_BATCHES));
        let worker = Worker {
            device,
            queue,
            encoder,
            errors,
            waiter,
            spare: spare.clone(),
        };
        Ok(Self {
            thread: SubmitThread::spawn(name, MAX_QUEUED_JOBS, worker)?,
            spare,
            inline: compute_core::env::flag("COMPUTE_WGPU_INLINE_SUBMIT", false),
        })
    }

    /// An empty batch to record into (a reused one when there is one).
    pub(crate) fn fresh_batch(&self) -> Batch {
        self.spare.take()
    }

    fn send(&self, job: Job) -> Result<(), ServerError> {
        match self.thread.send(job) {
            None => Ok(()),
            Some(_) => Err(stopped()),
        }
    }

    /// Hand `batch` over for encoding and submission; returns at once (unless the thread is
    /// [`MAX_QUEUED_JOBS`] jobs behind). Errors of the submission reach the error queue.
    pub(crate) fn submit(&self, batch: Batch) -> Result<(), ServerError> {
        self.send(Job::Submit {
            batch,
            always: false,
            reply: None,
        })
    }

    /// Hand `batch` over and wait until it is submitted: its submission index (an empty
    /// submission's for an empty batch when `always`, else `None` for an empty batch).
    pub(crate) fn submit_indexed(
        &self,
        batch: Batch,
        always: bool,
    ) -> Result<Option<wgpu::SubmissionIndex>, ServerError> {
        let (reply, answer) = mpsc::sync_channel(1);
        let job = Job::Submit {
            batch,
            always,
            reply: Some(reply),
        };
        // With `inline`, submitted here when the thread is idle: the caller waits anyway.
        let job = if self.inline {
            self.thread.run_here_if_idle(job)
        } else {
            Some(job)
        };
        if let Some(job) = job {
            self.send(job)?;
        }
        answer.recv().map_err(|_| stopped())?
    }

    /// Write `parts` of `bytes`, and the 4-byte `words` at their offsets, into `buffer` after
    /// everything handed over before.
    pub(crate) fn write(
        &self,
        buffer: wgpu::Buffer,
        parts: Vec<WritePart>,
        words: Vec<(u64, [u8; 4])>,
        bytes: Bytes,
    ) -> Result<(), ServerError> {
        self.send(Job::Write {
            buffer,
            parts,
            words,
            bytes,
        })
    }

    /// Drop the bind groups cached for blocks the pools freed (after the queued batches).
    pub(crate) fn prune(&self) -> Result<(), ServerError> {
        self.send(Job::Prune)
    }
}

impl SubmitWorker for Worker {
    type Job = Job;

    /// Run one job; a panic inside wgpu becomes an error on the queue (and the job's answer),
    /// and the thread goes on.
    fn run(&mut self, job: Job) {
        let reply = match &job {
            Job::Submit { reply, .. } => reply.clone(),
            _ => None,
        };
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| self.handle(job)));
        let error = match outcome {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                self.encoder.forget_info();
                ServerError::Driver(format!("wgpu submit thread: {what}"))
            }
        };
        match reply {
            Some(reply) => {
                let _ = reply.send(Err(error));
            }
            None => self.errors.lock().push_back(error),
        }
    }
}

impl Worker {
    fn handle(&mut self, job: Job) -> Result<(), ServerError> {
        match job {
            Job::Submit {
                mut batch,
                always,
                reply,
            } => {
                let index = self.submit(&batch, always);
                batch.clear();
                self.spare.give(batch);
                match reply {
                    Some(reply) => {
                        let _ = reply.send(index);
                        Ok(())
                    }
                    None => index.map(|_| ()),
                }
            }
            Job::Write {
                buffer,
                parts,
                words,
                bytes,
            } => {
                let data = bytes.try_as_slice()?;
                let copy = (data.len() >= compute_core::bytes::RELEASE_MIN_BYTES)
                    .then(compute_core::bytes::host_copy);
                for part in parts {
                    part.apply(&self.queue, &buffer, &data[part.from..part.from + part.len]);
                }
                for (at, word) in words {
                    self.queue.write_buffer(&buffer, at, &word);
                }
                drop(copy);
                // `write_buffer` has copied the bytes out: a large buffer is freed on the release
                // thread, not before the jobs queued behind this one.
                compute_core::bytes::release(bytes);
                Ok(())
            }
            Job::Prune => {
                self.encoder.prune();
                Ok(())
            }
        }
    }

    fn submit(
        &mut self,
        batch: &Batch,
        always: bool,
    ) -> Result<Option<wgpu::SubmissionIndex>, ServerError> {
        if batch.is_empty() {
            return Ok(always.then(|| self.queue.submit([])));
        }
        let encoded = self.encoder.encode(&self.device, &self.queue, batch);
        let index = encoded.map(|buffer| self.queue.submit([buffer]));
        if index.is_err() || !self.errors.lock().is_empty() {
            // A rejected submission may have dropped the info written for it.
            self.encoder.forget_info();
        }
        if let (Ok(index), Some(waiter)) = (&index, &self.waiter) {
            // The poll thread waits for the batch and then retires it (wgpu frees a finished
            // command buffer in the first poll or submit that sees it done: resetting one of
            // thousands of dispatches is a good part of a submission's cost).
            waiter.wait(index.clone());
        }
        index.map(Some)
    }
}

/// Launches recorded before the batch is submitted on its own, on a GPU, the first time after
/// the device was waited for: an early submission gets the device busy while the host records
/// more.
pub(crate) const FIRST_BATCH_DISPATCHES: usize = 64;

/// The most launches a batch grows to: while the host keeps filling batches the device has work
/// queued, and larger batches cost the host less per launch (one encoder, one submission).
pub(crate) const MAX_BATCH_DISPATCHES: usize = 4096;

/// How many launches a batch holds before it is submitted on its own.
///
/// On a GPU the limit starts at [`FIRST_BATCH_DISPATCHES`] and doubles with every batch
/// submitted because it was full, up to [`MAX_BATCH_DISPATCHES`]; waiting for the device resets
/// it. On a software adapter (lavapipe, WARP), where a submission waits on the host for the one
/// before it to finish, it is always [`MAX_BATCH_DISPATCHES`]: submitting mid-stream would tie
/// the host to the device. `COMPUTE_WGPU_MAX_BATCH` fixes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchLimit {
    first: usize,
    max: usize,
    current: usize,
}

impl BatchLimit {
    pub(crate) fn new(adapter: &wgpu::AdapterInfo) -> Self {
        let fixed = compute_core::env::positive::<usize>("COMPUTE_WGPU_MAX_BATCH");
        let (first, max) = match fixed {
            Some(n) => (n, n),
            None if adapter.device_type == wgpu::DeviceType::Cpu => {
                (MAX_BATCH_DISPATCHES, MAX_BATCH_DISPATCHES)
            }
            None => (FIRST_BATCH_DISPATCHES, MAX_BATCH_DISPATCHES),
        };
        Self {
            first,
            max,
            current: first,
        }
    }

    pub(crate) fn grow(&mut self) {
        self.current = (2 * self.current).min(self.max);
    }

    pub(crate) fn reset(&mut self) {
        self.current = self.first;
    }
}

impl WgpuServer {
    /// A future of submission `index`'s completion, waited for on the poll thread.
    ///
    /// Every wait of the device goes through that one thread: with a second thread inside
    /// `device.poll` at the same time, launch+sync had a 99th percentile of 10 ms on an H100
    /// (the bench's tail ablation shows it on raw wgpu: a poll thread waiting beside the caller
    /// takes raw wgpu's p99 from about 0.3 ms to 10 ms; a submit thread alone does not).
    pub(crate) fn completion(
        &self,
        index: wgpu::SubmissionIndex,
    ) -> DynFut<Result<(), ServerError>> {
        let (done, completed) = oneshot();
        self.poller.wait(index, Some(done));
        Box::pin(async move { completed.await.unwrap_or_else(|| Err(gone())) })
    }

    /// Block until submission `index` has completed (waited for on the poll thread, see
    /// [`completion`](Self::completion)).
    pub(crate) fn wait_for(&self, index: wgpu::SubmissionIndex) -> Result<(), ServerError> {
        compute_core::block_on(self.completion(index))
    }

    /// Hand the batch, if it holds anything, to the submit thread (which encodes and submits it)
    /// and start a new one. No error scope (it would cost every submission a round trip):
    /// validation errors reach the device's uncaptured-error handler, and submission errors the
    /// error queue, reported at the next flush, sync or read.
    pub(crate) fn submit(&mut self) -> Result<(), ServerError> {
        // The cached resources hold their blocks: let go of them at every submission.
        self.resolved.clear();
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = core::mem::replace(&mut self.batch, self.submitter.fresh_batch());
        self.submitter.submit(batch)
    }

    /// Hand the batch over and wait until it is submitted: its submission index (with `always`,
    /// an empty submission's when nothing was recorded, which also flushes pending writes).
    pub(crate) fn submit_indexed(
        &mut self,
        always: bool,
    ) -> Result<Option<wgpu::SubmissionIndex>, ServerError> {
        self.resolved.clear();
        let batch = if self.batch.is_empty() {
            Batch::default()
        } else {
            core::mem::replace(&mut self.batch, self.submitter.fresh_batch())
        };
        self.submitter.submit_indexed(batch, always)
    }

    /// The device is about to be waited for: the next batch starts small again, so that the
    /// device gets work early (see [`BatchLimit`]).
    pub(crate) fn idle(&mut self) {
        self.batch_limit.reset();
    }

    /// Submit the batch (or an empty submission, which also flushes pending `write_buffer`s)
    /// and return its index. The caller waits for the submission: the batch limit starts over.
    pub(crate) fn submit_always(&mut self) -> Result<wgpu::SubmissionIndex, ServerError> {
        self.idle();
        self.submit_indexed(true)?.ok_or_else(|| {
            ServerError::Driver("the wgpu submit thread returned no submission".into())
        })
    }

    /// Record a command other than a launch.
    pub(crate) fn push(&mut self, command: Command) {
        self.batch.commands.push(command);
    }

    /// Submit the batch if it holds as many launches as the current limit allows.
    pub(crate) fn submit_if_full(&mut self) -> Result<(), ServerError> {
        if self.batch.dispatches >= self.batch_limit.current {
            self.submit()?;
            self.batch_limit.grow();
        }
        Ok(())
    }

    /// `sync`: submit everything recorded, then wait on the poll thread for it (and the
    /// indirect guard's status) and report the first queued error.
    pub(crate) fn sync_stream(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
        if let Err(e) = self.ensure_not_capturing(stream, "sync") {
            return ready(Err(e));
        }
        let guard = self.stage_guard_status();
        let index = match self.submit_always() {
            Ok(index) => index,
            Err(e) => return ready(Err(e)),
        };
        if let Err(e) = self.submitter.prune() {
            return ready(Err(e));
        }
        let guard = guard.map(GuardRead::map);
        let maximum = self.streams.properties().hardware.max_cube_count;
        let (errors, stream_errors) = (self.errors.clone(), self.stream_errors.clone());
        let completed = self.completion(index);
        Box::pin(async move {
            completed.await?;
            if let Some(guard) = guard {
                guard.deliver(maximum, &stream_errors).await?;
            }
            stream_errors.take(stream)?;
            compute_core::error::take_result(&mut errors.lock())
        })
    }
}
