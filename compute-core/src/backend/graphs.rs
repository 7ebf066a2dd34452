//! The registry of a server's captured graphs.

use hashbrown::HashMap;

use crate::error::{GraphError, ServerError};
use crate::graph::GraphId;
use crate::stream::StreamId;

/// The graphs a server holds, each with the stream it was captured on.
pub struct Graphs<G> {
    graphs: HashMap<GraphId, (StreamId, G)>,
}

impl<G> Default for Graphs<G> {
    fn default() -> Self {
        Self {
            graphs: HashMap::new(),
        }
    }
}

impl<G> Graphs<G> {
    /// Keep `graph`, captured on `stream`, under a fresh id.
    pub fn insert(&mut self, stream: StreamId, graph: G) -> GraphId {
        let id = GraphId::fresh();
        self.graphs.insert(id, (stream, graph));
        id
    }

    /// The graph `id`, for a replay on `stream`.
    ///
    /// # Errors
    /// [`GraphError::NotHeld`] for an id this server does not hold (released, or another
    /// server's), [`GraphError::WrongStream`] when `stream` is not the capture's stream.
    pub fn for_replay(&mut self, id: GraphId, stream: StreamId) -> Result<&mut G, ServerError> {
        match self.graphs.get_mut(&id) {
            Some((captured_on, graph)) if *captured_on == stream => Ok(graph),
            Some((captured_on, _)) => Err(GraphError::WrongStream {
                graph: id,
                captured_on: *captured_on,
                stream,
            }
            .into()),
            None => Err(GraphError::NotHeld { graph: id }.into()),
        }
    }

    /// Take the graph `id` out of the registry (`None` when it is not held).
    pub fn remove(&mut self, id: GraphId) -> Option<G> {
        self.graphs.remove(&id).map(|(_, graph)| graph)
    }

    /// How many graphs are held.
    pub fn len(&self) -> usize {
        self.graphs.len()
    }

    /// Whether no graph is held.
    pub fn is_empty(&self) -> bool {
        self.graphs.is_empty()
    }

    /// Every graph held, with its stream.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (StreamId, &mut G)> {
        self.graphs.values_mut().map(|(s, g)| (*s, g))
    }

    /// Take every graph out of the registry.
    pub fn drain(&mut self) -> impl Iterator<Item = G> + '_ {
        self.graphs.drain().map(|(_, (_, graph))| graph)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_only_on_the_capture_stream() {
        let mut graphs = Graphs::default();
        let (a, b) = (StreamId::fresh(), StreamId::fresh());
        let id = graphs.insert(a, 7u32);
        assert_eq!(*graphs.for_replay(id, a).unwrap(), 7);
        assert_eq!(
            graphs.for_replay(id, b).unwrap_err(),
            ServerError::Graph(GraphError::WrongStream {
                graph: id,
                captured_on: a,
                stream: b
            })
        );
        assert_eq!(graphs.remove(id), Some(7));
        assert_eq!(
            graphs.for_replay(id, a).unwrap_err(),
            ServerError::Graph(GraphError::NotHeld { graph: id })
        );
        assert!(graphs.is_empty());
    }
}
