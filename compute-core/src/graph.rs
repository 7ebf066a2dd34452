//! Captured graphs: work recorded once and replayed many times.
//!
//! Stream ordering: a graph replays on the stream it was captured on, so `write`s issued from that
//! stream between replays land before the next replay reads them.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::client::ComputeClient;
use crate::error::ServerError;
use crate::runtime::Runtime;
use crate::server::ServerGraph;
use crate::stream::StreamId;

/// Identifies a graph held by a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphId(pub u64);

impl GraphId {
    /// A process-unique graph id.
    pub fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        GraphId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A captured graph; dropping it releases it on its server.
///
/// The graph keeps alive every buffer it recorded (the handles can be dropped right after the
/// capture; replays still use those buffers) and the client it was captured with (so a
/// [forked](crate::ComputeClient::fork_stream) stream is not retired while the graph lives).
/// Dropping it frees those buffers once its replays have run: after a sync, the stream's
/// `memory_usage` no longer counts them. See the client's
/// [Graph capture](crate::ComputeClient#graph-capture) notes.
pub struct Graph<R: Runtime> {
    client: ComputeClient<R>,
    id: GraphId,
    stream: StreamId,
}

impl<R: Runtime> Graph<R> {
    pub(crate) fn new(client: ComputeClient<R>, id: GraphId, stream: StreamId) -> Self {
        Self { client, id, stream }
    }

    /// Enqueue one replay on the capture stream. Non-blocking.
    pub fn replay(&self) -> Result<(), ServerError> {
        self.client
            .with_server(|server| server.graph_replay(self.id, self.stream))
    }

    /// The graph's id.
    pub fn id(&self) -> GraphId {
        self.id
    }

    /// The stream the graph replays on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }
}

impl<R: Runtime> Drop for Graph<R> {
    fn drop(&mut self) {
        let id = self.id;
        self.client.with_server(|server| server.graph_release(id));
    }
}

impl<R: Runtime> core::fmt::Debug for Graph<R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Graph")
            .field("id", &self.id)
            .field("stream", &self.stream)
            .finish()
    }
}
