//! Errors kept for the stream they belong to when another stream's call found them.
//!
//! A backend whose device queue is shared by every stream (wgpu, Vulkan) learns of some errors
//! only when a later submission completes, such as the indirect guard's over-limit count. The
//! stream that syncs or reads first is not necessarily the one whose launch failed: such an error
//! is kept here for the streams it covers, and each of them reports it once, from its next
//! flush, sync or read.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::error::ServerError;
use crate::stream::StreamId;

/// Errors waiting for their own streams (cheap to clone: one shared table).
#[derive(Debug, Clone, Default)]
pub struct StreamErrors(Arc<spin::Mutex<HashMap<StreamId, VecDeque<ServerError>>>>);

impl StreamErrors {
    /// Keep `error` for each of `streams`.
    pub fn push(&self, streams: &[StreamId], error: &ServerError) {
        let mut table = self.0.lock();
        for &stream in streams {
            table.entry(stream).or_default().push_back(error.clone());
        }
    }

    /// The first error kept for `stream`, as a result (one error per call; the rest stay for
    /// the next).
    pub fn take(&self, stream: StreamId) -> Result<(), ServerError> {
        let mut table = self.0.lock();
        let Some(queue) = table.get_mut(&stream) else {
            return Ok(());
        };
        let first = queue.pop_front();
        if queue.is_empty() {
            table.remove(&stream);
        }
        first.map_or(Ok(()), Err)
    }

    /// Drop what is kept for `stream` (a retired stream reports nothing again).
    pub fn forget(&self, stream: StreamId) {
        self.0.lock().remove(&stream);
    }
}

/// The streams that recorded work of one kind since the last look (for the indirect guard:
/// the streams whose launches the next status read covers, and so the owners of an error it
/// finds).
#[derive(Debug, Clone, Default)]
pub struct MarkedStreams(Vec<StreamId>);

impl MarkedStreams {
    /// `stream` recorded such work (once per stream until the next [`take`](Self::take)).
    pub fn mark(&mut self, stream: StreamId) {
        if !self.0.contains(&stream) {
            self.0.push(stream);
        }
    }

    /// Whether no stream recorded such work since the last look.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The marked streams, leaving none marked.
    pub fn take(&mut self) -> Vec<StreamId> {
        core::mem::take(&mut self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stream_reports_its_error_once_and_in_order() {
        let (a, b, c) = (StreamId::fresh(), StreamId::fresh(), StreamId::fresh());
        let errors = StreamErrors::default();
        errors.push(&[a, b], &ServerError::NoMemory);
        errors.push(&[a], &ServerError::Unsupported("second".into()));
        assert_eq!(errors.take(c), Ok(()));
        assert_eq!(errors.take(a), Err(ServerError::NoMemory));
        assert_eq!(
            errors.take(a),
            Err(ServerError::Unsupported("second".into()))
        );
        assert_eq!(errors.take(a), Ok(()));
        errors.forget(b);
        assert_eq!(errors.take(b), Ok(()));
    }
}
