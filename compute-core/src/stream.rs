//! Streams: ordered queues of work on a device.

use core::cell::Cell;
use core::sync::atomic::{AtomicU64, Ordering};

/// Identifies a stream. Work on one stream runs in the order it was issued.
///
/// By default each OS thread has its own stream ([`StreamId::current`]); a client can be pinned to
/// another one with [`ComputeClient::set_stream`](crate::ComputeClient::set_stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId {
    /// The raw id; unique in the process.
    pub value: u64,
}

static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_STREAM: Cell<Option<StreamId>> = const { Cell::new(None) };
}

impl StreamId {
    /// The calling thread's default stream, created on first use.
    pub fn current() -> StreamId {
        THREAD_STREAM.with(|cell| match cell.get() {
            Some(id) => id,
            None => {
                let id = StreamId::fresh();
                cell.set(Some(id));
                id
            }
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
