//! The device-wide gate behind `ComputeClient::exclusive`.

use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

thread_local! {
    static THREAD_TOKEN: u64 = {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

fn thread_token() -> u64 {
    THREAD_TOKEN.with(|t| *t)
}

/// Lets one thread run a task with no other thread's work on the device interleaved.
///
/// The fast path for everyone else is a single atomic load.
#[derive(Default)]
pub(crate) struct ExclusiveGate {
    owner: AtomicU64,
    depth: AtomicU64,
    lock: Mutex<()>,
    released: Condvar,
}

impl ExclusiveGate {
    /// Whether another thread holds the gate.
    pub(crate) fn held_by_other(&self) -> bool {
        let owner = self.owner.load(Ordering::Acquire);
        owner != 0 && owner != thread_token()
    }

    /// Block while another thread holds the gate.
    pub(crate) fn wait_until_open(&self) {
        if !self.held_by_other() {
            return;
        }
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        while self.held_by_other() {
            guard = self.released.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Take the gate (re-entrant on the same thread).
    pub(crate) fn enter(&self) {
        let me = thread_token();
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match self
                .owner
                .compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(owner) if owner == me => break,
                Err(_) => guard = self.released.wait(guard).unwrap_or_else(|p| p.into_inner()),
            }
        }
        self.depth.fetch_add(1, Ordering::Relaxed);
        drop(guard);
    }

    /// Release one level of the gate.
    pub(crate) fn exit(&self) {
        let guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.depth.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.owner.store(0, Ordering::Release);
            self.released.notify_all();
        }
        drop(guard);
    }
}
