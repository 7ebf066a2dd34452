//! One worker thread per stream, running the stream's commands in order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};

use compute_core::ServerError;

/// A unit of work on a stream.
pub(crate) type Command = Box<dyn FnOnce() -> Result<(), ServerError> + Send>;

/// How far a stream's worker has got: commands up to `completed` (inclusive) have run.
#[derive(Default)]
pub(crate) struct Progress {
    completed: AtomicU64,
    lock: Mutex<()>,
    advanced: Condvar,
}

impl Progress {
    /// Block until command `seq` has run.
    pub(crate) fn wait_for(&self, seq: u64) {
        if self.completed.load(Ordering::Acquire) >= seq {
            return;
        }
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        while self.completed.load(Ordering::Acquire) < seq {
            guard = self.advanced.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn reached(&self, seq: u64) -> bool {
        self.completed.load(Ordering::Acquire) >= seq
    }

    fn advance(&self, seq: u64) {
        let guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.completed.store(seq, Ordering::Release);
        self.advanced.notify_all();
        drop(guard);
    }
}

/// Errors raised by a stream's commands, waiting to be reported by the next sync, flush or read.
pub(crate) type ErrorQueue = Arc<spin::Mutex<VecDeque<ServerError>>>;

struct Job {
    seq: u64,
    waits: Vec<(Arc<Progress>, u64)>,
    command: Command,
}

/// The worker thread of one stream.
pub struct Worker {
    sender: mpsc::Sender<Job>,
    progress: Arc<Progress>,
    errors: ErrorQueue,
    submitted: u64,
}

impl Worker {
    /// Start a worker thread named `name`.
    pub(crate) fn spawn(name: String) -> Result<Self, ServerError> {
        let (sender, receiver) = mpsc::channel::<Job>();
        let progress = Arc::new(Progress::default());
        let errors: ErrorQueue = Arc::default();
        let thread_progress = progress.clone();
        let thread_errors = errors.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || run(receiver, thread_progress, thread_errors))
            .map_err(|e| ServerError::Driver(format!("cannot start a stream worker: {e}")))?;
        Ok(Self {
            sender,
            progress,
            errors,
            submitted: 0,
        })
    }

    /// Queue `command` to run after the given points of other streams; returns its sequence number.
    pub(crate) fn submit(&mut self, waits: Vec<(Arc<Progress>, u64)>, command: Command) -> u64 {
        self.submitted += 1;
        let seq = self.submitted;
        let job = Job {
            seq,
            waits,
            command,
        };
        if let Err(mpsc::SendError(job)) = self.sender.send(job) {
            // The thread only ends when the sender is dropped; report rather than lose the job.
            self.errors.lock().push_back(ServerError::Driver(format!(
                "stream worker stopped; command {} was not run",
                job.seq
            )));
            self.progress.advance(seq);
        }
        seq
    }

    /// Run `command` at once on the calling thread when the stream is idle and every wait is
    /// already met (no thread hand-over: small launches and syncs cost no wake-up); queue it
    /// otherwise. Returns its sequence number.
    pub(crate) fn submit_or_run(
        &mut self,
        waits: Vec<(Arc<Progress>, u64)>,
        command: Command,
    ) -> u64 {
        let idle = self.progress.reached(self.submitted)
            && waits.iter().all(|(other, seq)| other.reached(*seq));
        if !idle {
            return self.submit(waits, command);
        }
        self.submitted += 1;
        let seq = self.submitted;
        run_command(command, &self.errors);
        self.progress.advance(seq);
        seq
    }

    /// The worker's progress, to wait on from other streams.
    pub(crate) fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    /// The queue of errors raised by this stream's commands.
    pub(crate) fn errors(&self) -> &ErrorQueue {
        &self.errors
    }

    /// Pop the oldest error raised so far, without waiting.
    pub(crate) fn take_error(&self) -> Option<ServerError> {
        compute_core::error::take_first(&mut self.errors.lock())
    }

    /// Whether every submitted command has run (without blocking).
    pub(crate) fn is_idle(&self) -> bool {
        self.progress.completed.load(Ordering::Acquire) >= self.submitted
    }

    /// Block until every submitted command has run.
    pub(crate) fn wait_idle(&self) {
        self.progress.wait_for(self.submitted);
    }
}

fn run(receiver: mpsc::Receiver<Job>, progress: Arc<Progress>, errors: ErrorQueue) {
    while let Ok(job) = receiver.recv() {
        for (other, seq) in &job.waits {
            other.wait_for(*seq);
        }
        run_command(job.command, &errors);
        progress.advance(job.seq);
    }
}

/// Run one command, queueing its error or panic.
fn run_command(command: Command, errors: &ErrorQueue) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(command));
    let error = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(panic) => Some(ServerError::Execution(format!(
            "a command panicked on the stream worker: {}",
            panic_message(&panic)
        ))),
    };
    if let Some(e) = error {
        errors.lock().push_back(e);
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}
