//! Graphs by stream capture: a capture records the stream's commands into a CUDA graph, which is
//! instantiated once and replayed with `cuGraphLaunch` on the capture's stream; the graph keeps
//! every binding it recorded alive until it is released and its last replay completed.

use compute_core::backend::ServerKit;
use compute_core::graph::GraphId;
use compute_core::{Binding, ServerError, ServerGraph, StreamId};
use cudarc::driver::{result, sys};

use crate::driver::{Check, Raw};
use crate::server::CudaServer;
use crate::stream::{GraphExec, KeepAlive};

/// A captured graph: the executable graph, the stream it was captured on, and the bindings it
/// recorded. [`Graphs`](compute_core::backend::Graphs) keeps the stream too, but its `remove`
/// hands back the graph alone, and a release orders on that stream.
pub struct CudaGraph {
    exec: GraphExec,
    stream: StreamId,
    holds: Vec<Binding>,
}

impl CudaServer {
    /// Launch the executable graph `exec` on `stream`, ordered after the last uses of `holds`
    /// (the bindings it recorded) on other streams, and mark them used by it.
    pub(crate) fn replay_holding(
        &mut self,
        exec: Raw<sys::CUgraphExec>,
        stream: StreamId,
        holds: &[Binding],
    ) -> Result<(), ServerError> {
        let refs: Vec<&Binding> = holds.iter().collect();
        self.order_after(stream, refs.iter().copied())?;
        let raw = self.stream(stream)?.queue.raw;
        // SAFETY: the executable graph and the stream are alive; the graph's memory is kept
        // alive by `holds`.
        unsafe { result::graph::launch(exec.0, raw.0) }.check("cuGraphLaunch")?;
        self.mark(stream, refs.iter().copied(), None)
    }
}

impl ServerGraph for CudaServer {
    fn graph_prepare(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.settle()?;
        self.kit_prepare_graph(stream)
    }

    /// `begin_capture`: what the stream keeps alive and its staging slots get their events, then
    /// `cuStreamBeginCapture` (relaxed mode).
    fn begin_capture(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.settle()?;
        self.ensure_not_capturing(stream, "start_capture")?;
        self.stream(stream)?;
        let events = &mut self.events;
        let state = self
            .streams
            .get_mut(stream)
            .unwrap_or_else(|| unreachable!("created by `stream` just above"));
        // What earlier commands keep alive gets its event before the capture starts, and so do
        // the staging slots this stream's last writes copied from.
        state.queue.seal(events)?;
        self.staging.close_on(state.queue.raw, events)?;
        self.small_staging.close_on(state.queue.raw, events)?;
        // SAFETY: the stream is alive and not capturing.
        unsafe {
            result::stream::begin_capture(
                state.queue.raw.0,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }
        .check("cuStreamBeginCapture")?;
        // Not capturing (checked above): this only records that one runs now.
        state.begin_capture(stream, Vec::new())
    }

    /// `end_capture`: `cuStreamEndCapture` and `cuGraphInstantiate`; the graph keeps the bindings
    /// the capture recorded.
    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, ServerError> {
        // A failed staged write is reported by the next call, not by ending the capture (which
        // would leave the capture running).
        self.settle_quietly();
        let state = self.stream(stream)?;
        let holds = state.end_capture(stream)?;
        // SAFETY: the stream is capturing (begun in `begin_capture`).
        let graph = unsafe { result::stream::end_capture(state.queue.raw.0) }.map_err(|e| {
            ServerError::from(compute_core::CaptureError::Driver {
                call: "cuStreamEndCapture".into(),
                message: crate::driver::describe(e),
            })
        })?;
        // SAFETY: `graph` was just captured.
        let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
        // SAFETY: the executable graph does not need the template.
        crate::driver::released("cuGraphDestroy", unsafe { result::graph::destroy(graph) });
        let exec = exec.map_err(|e| {
            ServerError::from(compute_core::CaptureError::Driver {
                call: "cuGraphInstantiate".into(),
                message: crate::driver::describe(e),
            })
        })?;
        Ok(self.graphs.insert(
            stream,
            CudaGraph {
                exec: GraphExec(Raw(exec)),
                stream,
                holds,
            },
        ))
    }

    /// `graph_replay`: on the capture's stream only, ordered after the last uses of its bindings.
    fn graph_replay(&mut self, graph: GraphId, stream: StreamId) -> Result<(), ServerError> {
        self.settle()?;
        self.ensure_not_capturing(stream, "graph replay")?;
        // The holds are taken out for the replay (not cloned: one per recorded binding) and put
        // back below.
        let g = self.graphs.for_replay(graph, stream)?;
        let (exec, holds) = (g.exec.0, core::mem::take(&mut g.holds));
        let result = self.replay_holding(exec, stream, &holds);
        if let Ok(g) = self.graphs.for_replay(graph, stream) {
            g.holds = holds;
        }
        result
    }

    /// `graph_release`: the executable graph and its bindings are kept alive until the work queued
    /// on its stream so far completed.
    fn graph_release(&mut self, graph: GraphId) {
        self.settle_quietly();
        let Some(g) = self.graphs.remove(graph) else {
            return;
        };
        let events = &mut self.events;
        if self.context.bind().is_err() {
            return;
        }
        match self.streams.get_mut(g.stream) {
            Some(state) if state.capture.is_none() => {
                let mut keep = vec![KeepAlive::Graph(g.exec)];
                keep.extend(g.holds.into_iter().map(KeepAlive::Binding));
                if let Err(e) = state.queue.hold(events, keep, false) {
                    crate::driver::record_release_error(e);
                    if let Err(e) = state.queue.wait_idle(events) {
                        crate::driver::record_release_error(e);
                    }
                }
            }
            Some(state) => {
                // Capturing again: the graph cannot be ordered now, so wait for it.
                // SAFETY: the stream is alive.
                crate::driver::released("cuStreamSynchronize", unsafe {
                    result::stream::synchronize(state.queue.raw.0)
                });
            }
            None => {}
        }
    }
}
