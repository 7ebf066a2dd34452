//! The poll thread of a device: drives wgpu's completion callbacks (buffer maps) by waiting on
//! submissions, so that no caller spins.

use std::sync::mpsc;
use std::thread::JoinHandle;

use compute_core::ServerError;
use compute_core::future::Sender;

use crate::server::ErrorQueue;

enum Job {
    /// Wait for a submission; its map callbacks run during the wait.
    Wait(
        wgpu::SubmissionIndex,
        Option<Sender<Result<(), ServerError>>>,
    ),
}

/// A thread that blocks in `device.poll` for the submissions it is given.
pub(crate) struct Poller {
    sender: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// A handle that queues waits on the poll thread (for threads other than the server's).
#[derive(Clone)]
pub(crate) struct Waiter(mpsc::Sender<Job>);

impl Waiter {
    /// Poll until `index` has completed (its failures go to the poll thread's error queue).
    pub(crate) fn wait(&self, index: wgpu::SubmissionIndex) {
        let _ = self.0.send(Job::Wait(index, None));
    }
}

impl Poller {
    /// A [`Waiter`] of this poll thread (none once it stopped).
    pub(crate) fn waiter(&self) -> Option<Waiter> {
        self.sender.clone().map(Waiter)
    }

    /// Start the poll thread of `device`; poll failures go to `errors`.
    pub(crate) fn spawn(
        device: wgpu::Device,
        errors: ErrorQueue,
        name: String,
    ) -> Result<Self, ServerError> {
        let (sender, receiver) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(device, receiver, errors))
            .map_err(|e| ServerError::Driver(format!("cannot start the wgpu poll thread: {e}")))?;
        Ok(Self {
            sender: Some(sender),
            thread: Some(thread),
        })
    }

    /// Poll until `index` has completed; then send the outcome to `done`, if given.
    pub(crate) fn wait(
        &self,
        index: wgpu::SubmissionIndex,
        done: Option<Sender<Result<(), ServerError>>>,
    ) {
        let job = Job::Wait(index, done);
        if let Some(sender) = &self.sender
            && let Err(mpsc::SendError(Job::Wait(_, Some(done)))) = sender.send(job)
        {
            done.send(Err(ServerError::Driver(
                "the wgpu poll thread stopped".into(),
            )));
        }
    }
}

fn run(device: wgpu::Device, receiver: mpsc::Receiver<Job>, errors: ErrorQueue) {
    while let Ok(job) = receiver.recv() {
        let Job::Wait(index, done) = job;
        let outcome = device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| ServerError::Driver(format!("waiting for the wgpu device: {e}")));
        match done {
            Some(done) => done.send(outcome),
            None => {
                if let Err(e) = outcome {
                    errors.lock().push_back(e);
                }
            }
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The error of a wait the poll thread stopped before answering.
pub(crate) fn gone() -> ServerError {
    ServerError::Driver("the wgpu poll thread stopped before answering".into())
}
