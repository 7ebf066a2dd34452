//! [`ServerKit`]: the one door through which the role traits' default methods reach a
//! backend's [`Streams`] and [`Graphs`].

use crate::backend::{CreateRules, Graphs, StreamEntry, Streams};
use crate::error::ServerError;
use crate::graph::GraphId;
use crate::handle::Handle;
use crate::layout::{MemoryLayout, MemoryLayoutDescriptor};
use crate::storage::ComputeStorage;
use crate::stream::StreamId;

/// The [`Streams`] of a [`ServerKit`] implementor.
pub type KitStreams<K> =
    Streams<<K as ServerKit>::KitStorage, <K as ServerKit>::KitQueue, <K as ServerKit>::KitCapture>;

/// One stream entry of a [`ServerKit`] implementor.
pub type KitStreamEntry<K> = StreamEntry<
    <K as ServerKit>::KitStorage,
    <K as ServerKit>::KitQueue,
    <K as ServerKit>::KitCapture,
>;

/// How a server built from the backend kit hands its kit to the role traits of
/// [`server`](crate::server).
///
/// A backend implements it once (four accessors); the role traits'
/// default methods ([`ServerMemory::stream_ids`](crate::server::ServerMemory::stream_ids),
/// [`ServerGraph::graph_release`](crate::server::ServerGraph::graph_release), ...) are written
/// against it, so a backend whose body is the kit's rule writes no body at all. The provided
/// `kit_*` methods are those rules, for a backend that does its own step first and then the
/// kit's.
pub trait ServerKit {
    /// The storage behind the streams' pools.
    type KitStorage: ComputeStorage;
    /// What the backend keeps per stream (a driver stream, a worker thread, or nothing).
    type KitQueue;
    /// What a running capture records; a capture starts from the default (empty).
    type KitCapture: Default;
    /// A captured graph, as the registry keeps it.
    type KitGraph;

    /// The server's streams.
    fn kit_streams(&self) -> &KitStreams<Self>;

    /// The server's streams and graph registry, borrowed together.
    fn kit_parts(&mut self) -> (&mut KitStreams<Self>, &mut Graphs<Self::KitGraph>);

    /// Stream `id`, created on first use with the backend's storage and queue (and whatever the
    /// backend does on the way, such as binding a driver context).
    ///
    /// # Errors
    /// The backend's error creating the stream.
    fn stream(&mut self, id: StreamId) -> Result<&mut KitStreamEntry<Self>, ServerError>;

    /// How the backend lays out the memory of a `create` call.
    fn create_rules(&self) -> CreateRules;

    /// The kit's `create`: the tensors packed after [`create_rules`](Self::create_rules) into
    /// one allocation of `stream`'s pools.
    ///
    /// # Errors
    /// See [`StreamEntry::create`].
    fn kit_create(
        &mut self,
        descriptors: &[MemoryLayoutDescriptor],
        stream: StreamId,
    ) -> Result<Vec<MemoryLayout>, ServerError> {
        let (owner, rules) = (self.kit_streams().owner(), self.create_rules());
        self.stream(stream)?
            .create(owner, stream, descriptors, &rules)
    }

    /// The kit's `create_buffer`: `size` bytes of `stream`'s pools, no layout.
    ///
    /// # Errors
    /// See [`StreamEntry::create_buffer`].
    fn kit_create_buffer(&mut self, size: u64, stream: StreamId) -> Result<Handle, ServerError> {
        let owner = self.kit_streams().owner();
        self.stream(stream)?.create_buffer(owner, stream, size)
    }

    /// The capture rule of the kit's streams: `what` may not run while a capture runs on
    /// `stream`.
    ///
    /// # Errors
    /// See [`Streams::ensure_not_capturing`].
    fn ensure_not_capturing(&self, stream: StreamId, what: &str) -> Result<(), ServerError> {
        self.kit_streams().ensure_not_capturing(stream, what)
    }

    /// The kit's `end_capture`: the capture of `stream` ended (automatic memory again) and kept
    /// as a graph of the registry, for a backend whose graph is made from what its capture
    /// recorded.
    ///
    /// # Errors
    /// See [`StreamEntry::end_capture`].
    fn kit_end_capture(&mut self, stream: StreamId) -> Result<GraphId, ServerError>
    where
        Self::KitCapture: Into<Self::KitGraph>,
    {
        let capture = self.stream(stream)?.end_capture(stream)?;
        Ok(self.kit_parts().1.insert(stream, capture.into()))
    }

    /// The kit's checks of `graph_replay`: refused while a capture runs on `stream`, and only on
    /// the stream `graph` was captured on; the graph to replay.
    ///
    /// # Errors
    /// [`CaptureError::Running`](crate::CaptureError::Running), or see [`Graphs::for_replay`].
    fn kit_replay(
        &mut self,
        graph: GraphId,
        stream: StreamId,
    ) -> Result<&mut Self::KitGraph, ServerError> {
        self.ensure_not_capturing(stream, "graph replay")?;
        self.kit_parts().1.for_replay(graph, stream)
    }

    /// The kit's `graph_prepare`: refused while a capture runs on `stream`, then persistent
    /// memory.
    ///
    /// # Errors
    /// See [`StreamEntry::prepare_graph`].
    fn kit_prepare_graph(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.stream(stream)?.prepare_graph(stream)
    }
}
