//! Graphs: a capture records the stream's launches (pipelines, bound ranges and launch info, as
//! they would be submitted, with the bindings they use); a replay appends them to the batch again
//! in order, on the capture's stream.

use std::sync::Arc;

use compute_core::backend::ServerKit;
use compute_core::graph::GraphId;
use compute_core::{ServerError, ServerGraph, StreamId};

use crate::batch::{Dispatch, DispatchCount};
use crate::server::WgpuServer;

/// A captured graph: the launches it replays.
pub(crate) type WgpuGraph = Vec<Arc<Dispatch>>;

impl ServerGraph for WgpuServer {
    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, ServerError> {
        self.kit_end_capture(stream)
    }

    /// `graph_replay`: append the graph's launches to the batch, as launches issued now.
    fn graph_replay(&mut self, graph: GraphId, stream: StreamId) -> Result<(), ServerError> {
        let launches = self.kit_replay(graph, stream)?.clone();
        for launch in &launches {
            if matches!(launch.count, DispatchCount::Dynamic { .. }) {
                self.guard_streams.mark(stream);
            }
            self.batch.push_dispatch(launch);
            self.submit_if_full()?;
        }
        Ok(())
    }
}
