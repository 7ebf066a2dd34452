//! Streams: ordered queues of work on a device.

use core::cell::Cell;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Identifies a stream. Work on one stream runs in the order it was issued.
///
/// By default each OS thread has its own stream ([`StreamId::current`]), retired when the thread
/// exits; [`ComputeClient::fork_stream`](crate::ComputeClient::fork_stream) gives a client a new
/// stream of its own, retired when its last client drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId {
    /// The raw id; unique in the process.
    pub value: u64,
}

static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);

/// The calling thread's default stream; announced as retired when the thread exits.
struct ThreadStream(Cell<Option<StreamId>>);

impl Drop for ThreadStream {
    fn drop(&mut self) {
        if let Some(id) = self.0.get() {
            announce_retired(id);
        }
    }
}

thread_local! {
    static THREAD_STREAM: ThreadStream = const { ThreadStream(Cell::new(None)) };
}

impl StreamId {
    /// The calling thread's default stream, created on first use. When the thread exits, every
    /// device retires the stream (frees its pools and queue) once its memory is no longer in use
    /// and its work is done; see [`ComputeClient`](crate::ComputeClient)'s stream notes.
    pub fn current() -> StreamId {
        let id = THREAD_STREAM.try_with(|cell| match cell.0.get() {
            Some(id) => id,
            None => {
                let id = StreamId::fresh();
                cell.0.set(Some(id));
                id
            }
        });
        // During the thread's exit, after its default stream was retired: a stream for this one
        // call, retired at once after it.
        id.unwrap_or_else(|_| {
            let id = StreamId::fresh();
            announce_retired(id);
            id
        })
    }

    /// A stream id never returned before in this process.
    pub fn fresh() -> StreamId {
        StreamId {
            value: NEXT_STREAM.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl core::fmt::Display for StreamId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "stream#{}", self.value)
    }
}

/// Streams announced as retired, for one client's device: filled by thread exits and by the last
/// client of a forked stream, drained by that device's client before its next server call.
#[derive(Default)]
pub(crate) struct RetireSink {
    pending: spin::Mutex<Vec<StreamId>>,
    signalled: AtomicBool,
}

impl RetireSink {
    /// Announce `id` to this sink.
    pub(crate) fn push(&self, id: StreamId) {
        self.pending.lock().push(id);
        self.signalled.store(true, Ordering::Release);
    }

    /// Whether something was announced since the last [`take`](Self::take).
    pub(crate) fn signalled(&self) -> bool {
        self.signalled.load(Ordering::Acquire)
    }

    /// The announced streams.
    pub(crate) fn take(&self) -> Vec<StreamId> {
        self.signalled.store(false, Ordering::Release);
        core::mem::take(&mut *self.pending.lock())
    }
}

/// Every live client's sink (one per loaded device).
static SINKS: spin::Mutex<Vec<Weak<RetireSink>>> = spin::Mutex::new(Vec::new());

/// A new sink that receives every stream retired from now on.
pub(crate) fn register_sink() -> Arc<RetireSink> {
    let sink = Arc::new(RetireSink::default());
    let mut sinks = SINKS.lock();
    sinks.retain(|w| w.strong_count() > 0);
    sinks.push(Arc::downgrade(&sink));
    sink
}

/// Tell every device that `id` will not be used again.
fn announce_retired(id: StreamId) {
    let sinks: Vec<Arc<RetireSink>> = SINKS.lock().iter().filter_map(Weak::upgrade).collect();
    for sink in sinks {
        sink.push(id);
    }
}
