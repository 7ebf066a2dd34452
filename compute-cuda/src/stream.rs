//! Per-stream state: compute-core's [`StreamEntry`] (the stream's memory and the capture running
//! on it) around a [`StreamQueue`]: the CUDA stream, its order counter, and what in-flight work
//! keeps alive until an event says the device is done with it.

use std::collections::VecDeque;

use compute_core::backend::{ServerKit, StreamEntry};
use compute_core::future::DynFut;
use compute_core::handle::StreamPoint;
use compute_core::{Binding, Bytes, ServerError, StreamId};
use cudarc::driver::{result, sys};

use crate::driver::{Check, Context, Raw};
use crate::pinned::PinnedBuffer;
use crate::server::{CudaServer, ready};
use crate::storage::CudaStorage;

/// Something the device may still read or write: dropped once the event after its use completed.
/// The payloads are never read; they are held for their `Drop`.
#[allow(dead_code)]
pub(crate) enum KeepAlive {
    /// Memory of another stream's pool used on this stream.
    Binding(Binding),
    /// Pinned bytes a copy reads from.
    Bytes(Bytes),
    /// A staging buffer a copy reads from.
    Pinned(PinnedBuffer),
    /// A released graph whose last replays may still run.
    Graph(GraphExec),
}

/// An instantiated CUDA graph, destroyed on drop.
pub(crate) struct GraphExec(pub(crate) Raw<sys::CUgraphExec>);

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: instantiated by the server; dropped only after its replays completed.
        crate::driver::released("cuGraphExecDestroy", unsafe {
            result::graph::exec_destroy(self.0.0)
        });
    }
}

/// The server's handle on its [`WaitEvents`]: events it records and retires itself (stream
/// markers, the events that keep in-flight memory alive, staging ring slots).
pub(crate) struct EventPool {
    shared: std::sync::Arc<WaitEvents>,
}

impl EventPool {
    pub(crate) fn new(shared: std::sync::Arc<WaitEvents>) -> Self {
        Self { shared }
    }

    /// The shared pool (for events handed to futures).
    pub(crate) fn shared(&self) -> &std::sync::Arc<WaitEvents> {
        &self.shared
    }

    pub(crate) fn take(&mut self) -> Result<Raw<sys::CUevent>, ServerError> {
        self.shared.take_raw()
    }

    pub(crate) fn give(&mut self, event: Raw<sys::CUevent>) {
        self.shared.give_raw(event);
    }
}

/// Reusable events without timing (cheap to record and wait on; creating and destroying one
/// costs about as much as a small copy), shared by the server and the futures of its reads and
/// syncs, which return theirs when dropped. At most [`MAX_FREE_EVENTS`] free ones are kept.
pub(crate) struct WaitEvents {
    context: std::sync::Arc<Context>,
    free: spin::Mutex<Vec<Raw<sys::CUevent>>>,
}

/// Free events kept at most.
const MAX_FREE_EVENTS: usize = 256;

/// An event of a [`WaitEvents`] pool, back in it when dropped.
pub(crate) struct WaitEvent {
    event: Raw<sys::CUevent>,
    pool: std::sync::Arc<WaitEvents>,
}

impl WaitEvents {
    pub(crate) fn new(context: std::sync::Arc<Context>) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            context,
            free: spin::Mutex::new(Vec::new()),
        })
    }

    /// An event (not recorded yet) that returns to the pool when dropped.
    pub(crate) fn take(self: &std::sync::Arc<Self>) -> Result<WaitEvent, ServerError> {
        Ok(WaitEvent {
            event: self.take_raw()?,
            pool: self.clone(),
        })
    }

    fn take_raw(&self) -> Result<Raw<sys::CUevent>, ServerError> {
        let reused = self.free.lock().pop();
        match reused {
            Some(event) => Ok(event),
            None => result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map(Raw)
                .check("cuEventCreate"),
        }
    }

    fn give_raw(&self, event: Raw<sys::CUevent>) {
        let mut free = self.free.lock();
        if free.len() < MAX_FREE_EVENTS {
            free.push(event);
            return;
        }
        drop(free);
        if self.context.bind().is_ok() {
            // SAFETY: owned by the caller alone; destroying a pending event is allowed (the
            // destruction completes once it has).
            crate::driver::released("cuEventDestroy", unsafe { result::event::destroy(event.0) });
        }
    }
}

impl WaitEvent {
    /// The raw event.
    pub(crate) fn raw(&self) -> sys::CUevent {
        self.event.0
    }
}

impl Drop for WaitEvent {
    fn drop(&mut self) {
        self.pool.give_raw(self.event);
    }
}

impl Drop for WaitEvents {
    fn drop(&mut self) {
        if self.context.bind().is_err() {
            return;
        }
        for event in self.free.get_mut().drain(..) {
            // SAFETY: pooled events are referenced by nothing else.
            crate::driver::released("cuEventDestroy", unsafe { result::event::destroy(event.0) });
        }
    }
}

/// One stream of the server: its pools, its capture (while one runs: what the graph being
/// recorded uses) and its [`StreamQueue`].
pub(crate) type StreamState = StreamEntry<CudaStorage, StreamQueue, Vec<Binding>>;

/// The CUDA side of one stream of the server.
pub struct StreamQueue {
    pub(crate) raw: Raw<sys::CUstream>,
    /// Commands submitted so far (the `seq` of access logs).
    pub(crate) seq: u64,
    /// The latest event recorded for other streams to wait on, and the `seq` it covers.
    pub(crate) marker: Option<(u64, Raw<sys::CUevent>)>,
    /// Work in flight and what it keeps alive, oldest first.
    pub(crate) pending: VecDeque<(Raw<sys::CUevent>, Vec<KeepAlive>)>,
    /// Kept-alive items of recent commands not yet covered by an event: one event is recorded per
    /// [`HOLD_BATCH`] items or [`HOLD_BATCH_BYTES`] bytes (or at the next idle wait), so a loop
    /// of small pinned writes does not pay an event record each.
    open: Vec<KeepAlive>,
    open_bytes: usize,
    /// Calls of [`retire`](Self::retire) since it last queried an event.
    since_retire: u32,
}

/// [`StreamQueue::retire`] queries the oldest event once per this many calls: a `cuEventQuery`
/// costs a sizeable part of a small copy's or a launch's host time, and most calls would find
/// nothing new.
const RETIRE_EVERY: u32 = 16;
/// [`StreamQueue::retire`] queries on every call once this many events are pending.
const RETIRE_BACKLOG: usize = 4;

/// Items kept alive per recorded event, at most.
const HOLD_BATCH: usize = 32;
/// Bytes kept alive without an event, at most.
const HOLD_BATCH_BYTES: usize = 64 << 20;

impl KeepAlive {
    /// Host or device bytes the item keeps alive (for the batching bound).
    fn bytes(&self) -> usize {
        match self {
            KeepAlive::Binding(b) => usize::try_from(b.size()).unwrap_or(usize::MAX),
            KeepAlive::Bytes(b) => b.len(),
            KeepAlive::Pinned(p) => compute_core::HostBuffer::as_bytes(p).len(),
            KeepAlive::Graph(_) => 0,
        }
    }
}

impl StreamQueue {
    pub(crate) fn new() -> Result<Self, ServerError> {
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
            .check("cuStreamCreate")?;
        Ok(Self {
            raw: Raw(raw),
            seq: 0,
            marker: None,
            pending: VecDeque::new(),
            open: Vec::new(),
            open_bytes: 0,
            since_retire: 0,
        })
    }

    /// Drop what completed work kept alive (checked on every [`RETIRE_EVERY`]-th call, or on
    /// every call while [`RETIRE_BACKLOG`] events are pending).
    pub(crate) fn retire(&mut self, events: &mut EventPool) {
        if self.pending.is_empty() {
            return;
        }
        self.since_retire += 1;
        if self.since_retire < RETIRE_EVERY && self.pending.len() < RETIRE_BACKLOG {
            return;
        }
        self.since_retire = 0;
        self.retire_completed(events);
    }

    /// Drop what completed work kept alive, now (a query per completed event, stopping at the
    /// first that is still pending).
    pub(crate) fn retire_completed(&mut self, events: &mut EventPool) {
        while let Some((event, _)) = self.pending.front() {
            // SAFETY: the event was recorded on this stream and is still owned by the queue.
            match unsafe { result::event::query(event.0) } {
                Ok(()) => {
                    if let Some((event, keep)) = self.pending.pop_front() {
                        drop(keep);
                        events.give(event);
                    }
                }
                Err(_) => break,
            }
        }
    }

    /// Record an event after the work submitted so far, keeping `keep` alive until it completes
    /// (`capturing`: a capture runs on the stream).
    pub(crate) fn hold(
        &mut self,
        events: &mut EventPool,
        keep: impl IntoIterator<Item = KeepAlive>,
        capturing: bool,
    ) -> Result<(), ServerError> {
        let before = self.open.len();
        for item in keep {
            self.open_bytes = self.open_bytes.saturating_add(item.bytes());
            self.open.push(item);
        }
        if self.open.len() == before {
            return Ok(());
        }
        // An event recorded while capturing would become a graph node: seal after the capture.
        if !capturing && (self.open.len() >= HOLD_BATCH || self.open_bytes >= HOLD_BATCH_BYTES) {
            self.seal(events)?;
        }
        Ok(())
    }

    /// Record one event covering every open item.
    pub(crate) fn seal(&mut self, events: &mut EventPool) -> Result<(), ServerError> {
        if self.open.is_empty() {
            return Ok(());
        }
        let event = events.take()?;
        // SAFETY: the event and the stream are alive.
        if let Err(e) = unsafe { result::event::record(event.0, self.raw.0) }.check("cuEventRecord")
        {
            events.give(event);
            return Err(e);
        }
        self.open_bytes = 0;
        self.pending
            .push_back((event, core::mem::take(&mut self.open)));
        Ok(())
    }

    /// Block until the stream is idle, then drop everything it kept alive.
    pub(crate) fn wait_idle(&mut self, events: &mut EventPool) -> Result<(), ServerError> {
        // SAFETY: the stream is alive.
        let outcome =
            unsafe { result::stream::synchronize(self.raw.0) }.check("cuStreamSynchronize");
        for (event, keep) in self.pending.drain(..) {
            drop(keep);
            events.give(event);
        }
        if outcome.is_ok() {
            self.open.clear();
            self.open_bytes = 0;
        }
        outcome
    }
}

impl Drop for StreamQueue {
    fn drop(&mut self) {
        // SAFETY: the stream is alive; nothing is enqueued on it after this.
        crate::driver::released("cuStreamSynchronize", unsafe {
            result::stream::synchronize(self.raw.0)
        });
        self.open.clear();
        for (event, keep) in self.pending.drain(..) {
            drop(keep);
            // SAFETY: completed (the stream is idle) and owned by the queue.
            crate::driver::released("cuEventDestroy", unsafe { result::event::destroy(event.0) });
        }
        if let Some((_, event)) = self.marker.take() {
            // SAFETY: as above.
            crate::driver::released("cuEventDestroy", unsafe { result::event::destroy(event.0) });
        }
        // SAFETY: idle, and destroyed once.
        crate::driver::released("cuStreamDestroy", unsafe {
            result::stream::destroy(self.raw.0)
        });
    }
}

/// Stream order: the events other streams wait on, what a command keeps alive, the wait events
/// of syncs and reads, and a stream's retirement.
impl CudaServer {
    /// An event on `other` that covers its command `seq`, recording one only when none does.
    pub(crate) fn marker(
        &mut self,
        other: StreamId,
        seq: u64,
    ) -> Result<Option<Raw<sys::CUevent>>, ServerError> {
        // A communication stream's all-reduce may wait for the other devices of its round: the
        // marker must follow its NCCL kernel, so the round is issued first.
        if !self.comm_streams.is_empty()
            && let Some(group) = self.comm_group(other)
        {
            self.await_round(&group)?;
        }
        let Some(state) = self.streams.get_mut(other) else {
            return Ok(None);
        };
        if state.capture.is_some() {
            return Ok(None);
        }
        let state = &mut state.queue;
        if let Some((covered, event)) = state.marker
            && covered >= seq
        {
            return Ok(Some(event));
        }
        let event = self.events.take()?;
        // SAFETY: event and stream are alive.
        unsafe { result::event::record(event.0, state.raw.0) }.check("cuEventRecord")?;
        if let Some((_, old)) = state.marker.replace((state.seq, event)) {
            self.events.give(old);
        }
        Ok(Some(event))
    }

    /// Make `stream` wait for the last uses of `bindings` on other streams.
    pub(crate) fn order_after<'b>(
        &mut self,
        stream: StreamId,
        bindings: impl IntoIterator<Item = &'b Binding>,
    ) -> Result<(), ServerError> {
        for binding in bindings {
            let Some(point) = binding.handle().access().last() else {
                continue;
            };
            if point.stream == stream {
                continue;
            }
            if let Some(event) = self.marker(point.stream, point.seq)? {
                let state = self.stream(stream)?;
                if state.capture.is_some() {
                    continue;
                }
                // SAFETY: both the stream and the event are alive.
                unsafe {
                    result::stream::wait_event(
                        state.queue.raw.0,
                        event.0,
                        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    )
                }
                .check("cuStreamWaitEvent")?;
            }
        }
        Ok(())
    }

    /// Record the command just submitted on `stream` as the last use of `bindings`, and keep the
    /// ones of other streams' pools (plus `extra`) alive until it completed.
    pub(crate) fn mark<'b>(
        &mut self,
        stream: StreamId,
        bindings: impl IntoIterator<Item = &'b Binding>,
        extra: Option<KeepAlive>,
    ) -> Result<(), ServerError> {
        let state = self
            .streams
            .get_mut(stream)
            .unwrap_or_else(|| unreachable!("the stream submitted the command"));
        state.queue.seq += 1;
        let point = StreamPoint {
            stream,
            seq: state.queue.seq,
        };
        let mut others = Vec::new();
        for binding in bindings {
            binding.handle().access().replace(point);
            match &mut state.capture {
                // A graph keeps every binding it recorded, of this stream's pools too: its
                // replays read and write the recorded addresses long after the caller may have
                // dropped the handles, and a freed slice would be handed to a new buffer.
                Some(holds) => holds.push(binding.clone()),
                None if binding.handle().stream() != stream => {
                    others.push(KeepAlive::Binding(binding.clone()));
                }
                None => {}
            }
        }
        if others.is_empty() && extra.is_none() {
            // Nothing to keep alive: no event to record.
            return Ok(());
        }
        let capturing = state.capture.is_some();
        state
            .queue
            .hold(&mut self.events, extra.into_iter().chain(others), capturing)
    }

    /// A future completing when `event` (recorded just before) completed; the event goes back to
    /// its pool then.
    pub(crate) fn event_future(
        &self,
        event: WaitEvent,
    ) -> impl core::future::Future<Output = Result<(), ServerError>> + Send + 'static {
        let context = self.context.clone();
        async move {
            context.bind()?;
            // SAFETY: the event was recorded and is owned by this future.
            unsafe { result::event::synchronize(event.raw()) }.check("waiting for the stream")
        }
    }

    /// Record a wait event on `stream` (for a future to wait on).
    pub(crate) fn record_fresh(&mut self, stream: StreamId) -> Result<WaitEvent, ServerError> {
        let raw = self.stream(stream)?.queue.raw;
        let event = self.events.shared().take()?;
        // SAFETY: event and stream are alive.
        unsafe { result::event::record(event.raw(), raw.0) }.check("cuEventRecord")?;
        Ok(event)
    }

    /// `flush`: the errors of earlier calls, and the stream's status (not queried while it
    /// captures).
    pub(crate) fn flush_stream(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.settle()?;
        crate::driver::take_release_error()?;
        let state = self.stream(stream)?;
        if state.capture.is_some() {
            return Ok(());
        }
        // SAFETY: the stream is alive; only reports its status.
        match unsafe { sys::cuStreamQuery(state.queue.raw.0) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_NOT_READY => Ok(()),
            other => Err(crate::driver::driver_error(
                "stream",
                cudarc::driver::DriverError(other),
            )),
        }
    }

    /// `sync`: a future completing once the work queued on `stream` so far completed.
    pub(crate) fn sync_stream(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
        if let Err(e) = self
            .settle()
            .and_then(|()| crate::driver::take_release_error())
            .and_then(|()| self.ensure_not_capturing(stream, "sync"))
        {
            return ready(Err(e));
        }
        // Items kept alive until the work so far completes (a released graph's buffers) get
        // their event now, so that they are free once this sync has returned.
        if let Err(e) = self.context.bind() {
            return ready(Err(e));
        }
        if let Some(state) = self.streams.get_mut(stream)
            && state.capture.is_none()
            && let Err(e) = state.queue.seal(&mut self.events)
        {
            return ready(Err(e));
        }
        match self.record_fresh(stream) {
            Ok(event) => Box::pin(self.event_future(event)),
            Err(e) => ready(Err(e)),
        }
    }
}
