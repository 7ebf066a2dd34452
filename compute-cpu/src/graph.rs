//! Graphs: a capture records the stream's launches (resolved, as they would run); a replay
//! submits them again in order on the capture's stream.

use compute_core::backend::ServerKit;
use compute_core::graph::GraphId;
use compute_core::{Binding, ServerError, ServerGraph, StreamId};

use std::sync::Arc;

use crate::launch::RecordedLaunch;
use crate::server::CpuServer;

/// A captured graph: the launches it replays.
pub(crate) type CpuGraph = Vec<Arc<RecordedLaunch>>;

impl ServerGraph for CpuServer {
    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, ServerError> {
        self.kit_end_capture(stream)
    }

    fn graph_replay(&mut self, graph: GraphId, stream: StreamId) -> Result<(), ServerError> {
        let launches = self.kit_replay(graph, stream)?.clone();
        for launch in launches {
            let bindings: Vec<Binding> = launch.bindings().cloned().collect();
            let refs: Vec<&Binding> = bindings.iter().collect();
            self.submit(stream, &refs, Box::new(move || launch.run()))?;
        }
        Ok(())
    }
}
