//! Graphs: a capture records a stream's launches as [`Ops`] (with only the barriers the graph's
//! own dependencies need); a replay appends them to the open batch.

use std::any::Any;

use ash::vk;
use compute_core::backend::ServerKit;
use compute_core::graph::GraphId;
use compute_core::{ServerError, ServerGraph, StreamId};

use crate::batch::{Linear, Staging, stage};
use crate::ops::{Op, Ops};
use crate::server::VulkanServer;

/// A capture in progress on a stream: the commands, recorded as [`Ops`] that each replay appends
/// to the open batch (recorded into the batch's own command buffer on the submit thread, as plain
/// launches are: no simultaneous-use command buffer, which drivers may copy or patch at every
/// submission), and the buffer ranges used since the capture's last barrier.
#[derive(Default)]
pub struct Capture {
    pub(crate) ops: Ops,
    pub(crate) linear: Linear,
    pub(crate) since_barrier: Vec<(vk::Buffer, u64, u64)>,
    pub(crate) keep: Vec<Box<dyn Any + Send>>,
}

impl Capture {
    /// Record the barrier a dispatch using `ranges` (buffer, offset, bytes) needs: one before the
    /// graph's first command (against the work before the replay), and one before a dispatch
    /// that uses a range overlapping one used since the last barrier (every use is taken as a
    /// write). The capture knows every command of the graph, so independent dispatches run
    /// without barriers between them, which plain launches cannot know.
    pub(crate) fn barrier_for(
        &mut self,
        ranges: impl Iterator<Item = (vk::Buffer, u64, u64)> + Clone,
    ) {
        let overlaps = |&(b, o, n): &(vk::Buffer, u64, u64)| {
            ranges.clone().any(|(b2, o2, n2)| {
                b == b2 && o < o2.saturating_add(n2) && o2 < o.saturating_add(n)
            })
        };
        if self.ops.is_empty() || self.since_barrier.iter().any(overlaps) {
            self.ops.push(Op::Barrier {
                src: stage::ALL,
                dst: stage::ALL,
            });
            self.since_barrier.clear();
        }
        self.since_barrier.extend(ranges);
    }
}

/// A captured graph: its commands, appended to the open batch on each replay, and what they use.
pub struct VulkanGraph {
    ops: Ops,
    _keep: Vec<Box<dyn Any + Send>>,
    _chunks: Vec<Staging>,
}

/// A capture ended: the graph keeps its commands, what they use and the staging chunks they read.
impl From<Capture> for VulkanGraph {
    fn from(mut capture: Capture) -> Self {
        VulkanGraph {
            ops: core::mem::take(&mut capture.ops),
            _keep: core::mem::take(&mut capture.keep),
            _chunks: capture.linear.take(),
        }
    }
}

impl ServerGraph for VulkanServer {
    /// [`ServerGraph::begin_capture`](compute_core::ServerGraph::begin_capture).
    fn begin_capture(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.stream(stream)?
            .begin_capture(stream, Capture::default())?;
        self.captures += 1;
        Ok(())
    }

    /// [`ServerGraph::end_capture`](compute_core::ServerGraph::end_capture).
    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, ServerError> {
        let graph = self.kit_end_capture(stream)?;
        self.captures -= 1;
        Ok(graph)
    }

    /// [`ServerGraph::graph_replay`](compute_core::ServerGraph::graph_replay).
    fn graph_replay(&mut self, graph: GraphId, stream: StreamId) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "graph replay")?;
        // A graph may hold guarded indirect launches: read the guard's status at the next sync.
        if let Some(guard) = &mut self.guard {
            guard.streams.mark(stream);
        }
        let graph = self.graphs.for_replay(graph, stream)?;
        // The graph's first command is a barrier against earlier work.
        self.recorder.append(&graph.ops);
        self.recorder.dispatches += 1;
        self.after_command()
    }

    /// [`ServerGraph::graph_release`](compute_core::ServerGraph::graph_release).
    fn graph_release(&mut self, graph: GraphId) {
        if let Some(g) = self.graphs.remove(graph) {
            // Its buffers return to their pools as soon as its last replay has run: now when it
            // has, else when the server next recycles after that (a sync, then any call that
            // looks at memory).
            self.recorder.keep_until_done_here(g);
        }
    }
}
