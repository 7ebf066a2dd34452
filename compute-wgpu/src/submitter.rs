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

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, mpsc};

use compute_core::submit::{Spares, SubmitThread, SubmitWorker};
use compute_core::{Bytes, ServerError};

use crate::batch::{Batch, Encoder};
use crate::poller::Waiter;
use crate::server::ErrorQueue;

/// Jobs handed over at most before the server's thread waits for the submit thread: a bound on
/// the recorded work (and host bytes of writes) in flight.
const MAX_QUEUED_JOBS: usize = 16;

/// Host buffers of at least this many bytes handed to a write are freed on the poll thread.
const RELEASE_OFF_THREAD_BYTES: usize = 1 << 20;

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
                for part in parts {
                    part.apply(&self.queue, &buffer, &data[part.from..part.from + part.len]);
                }
                for (at, word) in words {
                    self.queue.write_buffer(&buffer, at, &word);
                }
                // `write_buffer` has copied the bytes out: a large buffer is freed on the poll
                // thread, not before the jobs queued behind this one.
                if let Some(waiter) = &self.waiter
                    && bytes.len() >= RELEASE_OFF_THREAD_BYTES
                {
                    waiter.release(bytes);
                }
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
