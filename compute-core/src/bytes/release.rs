//! Freeing large host buffers off the caller's path.
//!
//! Freeing a large heap buffer returns its pages to the system, and that costs as much as the copy
//! it came for: 50 ms for 1 GiB (21 GB/s) on this project's build host, against 20 ms for the
//! pinned DMA of the same bytes on an H100. A write that consumed owned bytes hands them to
//! [`release`] once it no longer reads them; a large buffer that nothing else shares is then
//! freed on one background thread, so the caller (and every other client waiting for the server
//! lock the write holds) goes on at once.
//!
//! Freeing contends with copying (returning pages interrupts every thread of the process to
//! flush its TLB, the copy team's included), so the release thread waits while large host copies
//! run ([`host_copy`]) and until none has run for [`RELEASE_QUIET`], up to [`RELEASE_MAX_DEFER`]
//! per buffer: a burst of uploads is copied at full speed and its buffers are freed once it is
//! done. (Freeing each buffer as soon as its own copy ended overlapped the next upload of the
//! burst: 64 MiB uploads then ran at 0.79x the pinned DMA rate on the H100 host.)
//!
//! Bounded: at most [`RELEASE_MAX_BYTES`] wait to be freed at any time; beyond that, and for
//! buffers below [`RELEASE_MIN_BYTES`], shared with a clone, or when the thread cannot be
//! started, the bytes are freed where they are, as a plain drop would.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::thread::Thread;
use std::time::{Duration, Instant};

use super::{Bytes, Repr};

/// Smallest buffer freed on the release thread; smaller ones free quickly where they are.
pub const RELEASE_MIN_BYTES: usize = 4 << 20;
/// Bytes waiting on the release thread at most; past this a release frees where it is called.
pub const RELEASE_MAX_BYTES: usize = 4 << 30;
/// Buffers waiting on the release thread at most.
const RELEASE_QUEUE: usize = 64;

/// Longest a buffer waits on the release thread for the host copies in progress to end.
pub const RELEASE_MAX_DEFER: Duration = Duration::from_millis(20);
/// How long no large host copy must have run before the release thread frees.
pub const RELEASE_QUIET: Duration = Duration::from_millis(1);

/// Bytes handed to the release thread and not freed yet.
static PENDING: AtomicUsize = AtomicUsize::new(0);
/// Large host copies in progress ([`host_copy`]).
static COPYING: AtomicUsize = AtomicUsize::new(0);
/// The release thread, once started (woken when the last copy in progress ends).
static THREAD: OnceLock<Thread> = OnceLock::new();
/// When the last large host copy ended, in nanoseconds since [`epoch`].
static LAST_COPY_END: AtomicU64 = AtomicU64::new(0);

/// The clock origin of [`LAST_COPY_END`].
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since [`epoch`].
fn now_nanos() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A large host copy in progress: while one lives, the release thread waits (see the
/// [module docs](self)). Hold it for the span of a copy of at least [`RELEASE_MIN_BYTES`].
#[must_use = "the copy counts as in progress only while the guard lives"]
pub struct HostCopy(());

/// Mark a large host copy as in progress until the returned guard drops.
pub fn host_copy() -> HostCopy {
    COPYING.fetch_add(1, Ordering::AcqRel);
    HostCopy(())
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        LAST_COPY_END.store(now_nanos(), Ordering::Release);
        if COPYING.fetch_sub(1, Ordering::AcqRel) == 1
            && let Some(thread) = THREAD.get()
        {
            thread.unpark();
        }
    }
}

/// Wait while a large host copy runs and until none ran for [`RELEASE_QUIET`], until `deadline`.
fn wait_for_quiet(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        if COPYING.load(Ordering::Acquire) > 0 {
            std::thread::park_timeout(deadline - now);
            continue;
        }
        let since =
            Duration::from_nanos(now_nanos().saturating_sub(LAST_COPY_END.load(Ordering::Acquire)));
        if since >= RELEASE_QUIET {
            return;
        }
        std::thread::park_timeout((RELEASE_QUIET - since).min(deadline - now));
    }
}

fn sender() -> Option<&'static SyncSender<(Bytes, Instant)>> {
    static SENDER: OnceLock<Option<SyncSender<(Bytes, Instant)>>> = OnceLock::new();
    SENDER
        .get_or_init(|| {
            let (tx, rx) = sync_channel::<(Bytes, Instant)>(RELEASE_QUEUE);
            std::thread::Builder::new()
                .name("compute-release".into())
                .spawn(move || {
                    let _ = THREAD.set(std::thread::current());
                    for (bytes, queued) in rx {
                        wait_for_quiet(queued + RELEASE_MAX_DEFER);
                        let len = bytes.len();
                        // A `HostBuffer` is user code: a panic in its drop must not end the
                        // thread (later releases would then free where they are called, which
                        // is correct but slow) nor leave the pending count high.
                        let dropped =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(bytes)));
                        if dropped.is_err() {
                            eprintln!(
                                "compute: a host buffer's drop panicked on the release thread"
                            );
                        }
                        PENDING.fetch_sub(len, Ordering::AcqRel);
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

/// Whether dropping `bytes` would free a large buffer now: its last reference, an owned or host
/// buffer (a `bytes::Bytes` or a deferred read drops on the caller, as it may share its storage
/// in ways this cannot see), of at least [`RELEASE_MIN_BYTES`].
fn frees_large_buffer(bytes: &Bytes) -> bool {
    match &bytes.repr {
        Repr::Owned(buf) => buf.len >= RELEASE_MIN_BYTES && std::sync::Arc::strong_count(buf) == 1,
        Repr::Host(buf) => {
            buf.as_bytes().len() >= RELEASE_MIN_BYTES && std::sync::Arc::strong_count(buf) == 1
        }
        Repr::Shared(_) | Repr::Deferred(_) => false,
    }
}

/// Drop `bytes`, freeing a large unshared buffer on the background release thread (see the
/// [module docs](self)). Call it where a copy consumed owned bytes and reads them no more.
pub fn release(bytes: Bytes) {
    if !frees_large_buffer(&bytes) {
        return;
    }
    let len = bytes.len();
    if PENDING.fetch_add(len, Ordering::AcqRel) + len > RELEASE_MAX_BYTES {
        PENDING.fetch_sub(len, Ordering::AcqRel);
        return;
    }
    let Some(tx) = sender() else {
        PENDING.fetch_sub(len, Ordering::AcqRel);
        return;
    };
    if let Err(TrySendError::Full((bytes, _)) | TrySendError::Disconnected((bytes, _))) =
        tx.try_send((bytes, Instant::now()))
    {
        PENDING.fetch_sub(len, Ordering::AcqRel);
        drop(bytes);
    }
}

/// Bytes handed to [`release`] that the release thread has not freed yet.
pub fn releasing_bytes() -> usize {
    PENDING.load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::HostBuffer;
    use std::sync::mpsc::{Sender, channel};
    use std::thread::ThreadId;

    /// A host buffer that reports the thread it is dropped on.
    struct Reporting(Vec<u8>, Sender<ThreadId>);

    impl HostBuffer for Reporting {
        fn as_bytes(&self) -> &[u8] {
            &self.0
        }
        fn as_bytes_mut(&mut self) -> &mut [u8] {
            &mut self.0
        }
    }

    impl Drop for Reporting {
        fn drop(&mut self) {
            let _ = self.1.send(std::thread::current().id());
        }
    }

    /// The thread a buffer of `len` bytes is freed on after a release (with `keep_clone`, a
    /// clone outlives the release and is dropped here after it).
    fn dropped_on(len: usize, keep_clone: bool) -> ThreadId {
        let (tx, rx) = channel();
        let bytes = Bytes::from_host_buffer(Box::new(Reporting(vec![3u8; len], tx)));
        let clone = keep_clone.then(|| bytes.clone());
        release(bytes);
        if let Some(clone) = clone {
            assert!(
                rx.try_recv().is_err(),
                "a shared buffer is not freed by a release"
            );
            assert_eq!(clone.try_as_slice().unwrap()[len - 1], 3);
        }
        rx.recv().unwrap()
    }

    #[test]
    fn large_owned_buffers_are_freed_on_the_release_thread() {
        let here = std::thread::current().id();
        let thread = dropped_on(RELEASE_MIN_BYTES, false);
        assert_ne!(
            thread, here,
            "a large buffer is freed off the caller's thread"
        );
        // The pending count returns to zero once the thread freed it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while releasing_bytes() != 0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(releasing_bytes(), 0);
    }

    #[test]
    fn a_release_waits_for_the_copy_in_progress() {
        let (tx, rx) = channel();
        let copy = host_copy();
        let bytes = Bytes::from_host_buffer(Box::new(Reporting(vec![1u8; RELEASE_MIN_BYTES], tx)));
        release(bytes);
        // Not freed while the copy runs (well within the 20 ms cap).
        std::thread::sleep(Duration::from_millis(5));
        assert!(rx.try_recv().is_err(), "freed during a copy in progress");
        drop(copy);
        let thread = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_ne!(thread, std::thread::current().id());
    }

    #[test]
    fn small_and_shared_buffers_are_freed_where_they_are() {
        let here = std::thread::current().id();
        let thread = dropped_on(RELEASE_MIN_BYTES - 1, false);
        assert_eq!(thread, here, "a small buffer is freed by the caller");
        // A clone keeps the buffer: the release only drops a reference, and the last drop (the
        // clone's, here) frees it.
        let thread = dropped_on(RELEASE_MIN_BYTES, true);
        assert_eq!(thread, here);
    }
}
