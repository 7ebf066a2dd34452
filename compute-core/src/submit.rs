//! A submit thread: runs the jobs a server hands over, in the order they came, on state the
//! server's thread can also use when nothing is queued.
//!
//! The GPU backends record launches on the caller's thread and leave the expensive part of a
//! submission (the driver's or wgpu's recording, the submission itself) to this thread, so a
//! launch costs the caller little more than appending to a list. Jobs go through one bounded
//! channel (a slow device makes the server wait instead of queueing without end). A job the
//! server is about to wait for can run on the server's thread instead
//! ([`SubmitThread::run_here_if_idle`]) when nothing is queued or running: only the server hands
//! jobs over, so the order stays.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;

use crate::error::ServerError;

/// The state a submit thread runs jobs on.
pub trait SubmitWorker: Send + 'static {
    /// What the server hands over.
    type Job: Send + 'static;
    /// Run one job. Panics are the worker's to catch: the thread goes on with the next job.
    fn run(&mut self, job: Self::Job);
    /// Called once on the thread after the last job, when the server stops it.
    fn finish(&mut self) {}
}

/// The server's side of a submit thread.
pub struct SubmitThread<W: SubmitWorker> {
    sender: Option<mpsc::SyncSender<W::Job>>,
    worker: Arc<Mutex<W>>,
    /// Jobs handed over and not finished yet.
    queued: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

/// The worker, also after a panic that escaped a job (the worker's own state is its concern).
fn lock<W>(worker: &Mutex<W>) -> MutexGuard<'_, W> {
    worker.lock().unwrap_or_else(|p| p.into_inner())
}

impl<W: SubmitWorker> SubmitThread<W> {
    /// Start the thread `name` over `worker`; at most `bound` jobs wait for it.
    pub fn spawn(name: String, bound: usize, worker: W) -> Result<Self, ServerError> {
        let (sender, receiver) = mpsc::sync_channel::<W::Job>(bound);
        let worker = Arc::new(Mutex::new(worker));
        let queued = Arc::new(AtomicUsize::new(0));
        let (thread_worker, thread_queued) = (worker.clone(), queued.clone());
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                while let Ok(job) = receiver.recv() {
                    lock(&thread_worker).run(job);
                    thread_queued.fetch_sub(1, Ordering::AcqRel);
                }
                lock(&thread_worker).finish();
            })
            .map_err(|e| ServerError::Driver(format!("cannot start the thread {name}: {e}")))?;
        Ok(Self {
            sender: Some(sender),
            worker,
            queued,
            thread: Some(thread),
        })
    }

    /// Hand `job` over (waiting while `bound` jobs are queued). The job comes back when the
    /// thread has stopped.
    pub fn send(&self, job: W::Job) -> Option<W::Job> {
        let Some(sender) = &self.sender else {
            return Some(job);
        };
        self.queued.fetch_add(1, Ordering::AcqRel);
        match sender.send(job) {
            Ok(()) => None,
            Err(mpsc::SendError(job)) => {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                Some(job)
            }
        }
    }

    /// Run `job` on this thread if nothing is queued or running; else hand it back.
    pub fn run_here_if_idle(&self, job: W::Job) -> Option<W::Job> {
        if self.sender.is_none() || self.queued.load(Ordering::Acquire) != 0 {
            return Some(job);
        }
        lock(&self.worker).run(job);
        None
    }

    /// Let the thread finish every job handed over, run [`SubmitWorker::finish`], and join it.
    pub fn stop(&mut self) {
        self.sender.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<W: SubmitWorker> Drop for SubmitThread<W> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Emptied containers (batches, command lists) kept for reuse, so their allocations survive
/// from one batch to the next; at most a few.
pub struct Spares<T> {
    free: spin::Mutex<Vec<T>>,
    max: usize,
}

impl<T: Default> Spares<T> {
    /// A pool keeping at most `max` containers.
    pub fn new(max: usize) -> Self {
        Self {
            free: spin::Mutex::new(Vec::new()),
            max,
        }
    }

    /// A kept container, or a new one.
    pub fn take(&self) -> T {
        self.free.lock().pop().unwrap_or_default()
    }

    /// Keep `value` (emptied by the caller) unless `max` are kept.
    pub fn give(&self, value: T) {
        let mut free = self.free.lock();
        if free.len() < self.max {
            free.push(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Log {
        seen: Arc<spin::Mutex<Vec<(u32, bool)>>>,
        finished: Arc<AtomicUsize>,
        here: std::thread::ThreadId,
        /// Job 99 waits until this is set.
        gate: Arc<std::sync::atomic::AtomicBool>,
    }

    impl SubmitWorker for Log {
        type Job = u32;
        fn run(&mut self, job: u32) {
            while job == 99 && !self.gate.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            let on_caller = std::thread::current().id() == self.here;
            self.seen.lock().push((job, on_caller));
        }
        fn finish(&mut self) {
            self.finished.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn jobs_run_in_order_and_inline_only_when_idle() {
        let seen = Arc::new(spin::Mutex::new(Vec::new()));
        let finished = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut thread = SubmitThread::spawn(
            "test-submit".into(),
            2,
            Log {
                seen: seen.clone(),
                finished: finished.clone(),
                here: std::thread::current().id(),
                gate: gate.clone(),
            },
        )
        .expect("spawn");
        assert!(thread.send(99).is_none());
        for job in 1..=2 {
            assert!(thread.send(job).is_none());
        }
        // Jobs are queued or running: not run here.
        assert_eq!(thread.run_here_if_idle(5), Some(5));
        gate.store(true, Ordering::Release);
        for job in 3..=4 {
            assert!(thread.send(job).is_none());
        }
        while thread.queued.load(Ordering::Acquire) != 0 {
            std::thread::yield_now();
        }
        assert_eq!(thread.run_here_if_idle(6), None);
        thread.stop();
        assert_eq!(finished.load(Ordering::SeqCst), 1);
        let seen = seen.lock().clone();
        assert_eq!(
            seen,
            vec![
                (99, false),
                (1, false),
                (2, false),
                (3, false),
                (4, false),
                (6, true)
            ]
        );
        // A stopped thread hands jobs back.
        assert_eq!(thread.send(7), Some(7));
        assert_eq!(thread.run_here_if_idle(8), Some(8));
    }

    #[test]
    fn spares_keep_at_most_max() {
        let spares = Spares::<Vec<u8>>::new(2);
        for _ in 0..3 {
            spares.give(Vec::with_capacity(16));
        }
        assert_eq!(spares.free.lock().len(), 2);
        assert!(spares.take().capacity() >= 16);
        assert!(spares.take().capacity() >= 16);
        assert_eq!(spares.take().capacity(), 0);
    }
}
