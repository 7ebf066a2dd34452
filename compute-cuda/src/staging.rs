//! The pinned staging of pageable writes: the [`StagingPlan`] (piece sizes and the stores of the
//! host copy), the [`StagingRing`] of pinned slots the pieces are copied into, and the
//! [`Issue`]s by which a copy team thread starts a piece's DMA while the server goes on; also the
//! server's `staging` call, which moves caller bytes into pinned buffers ahead of a write.

use std::sync::Arc;

use compute_core::copy::Stores;
use compute_core::{Bytes, BytesKind, ServerError};
use cudarc::driver::{result, sys};

use crate::driver::{Check, Context, Raw};
use crate::pinned::{PinnedBuffer, PinnedPool};
use crate::server::CudaServer;
use crate::stream::EventPool;

/// How pageable writes are done. Up to `direct` bytes (none by default) they go straight from
/// pageable memory (the driver stages them before the call returns: on the H200 host 12 GB/s at
/// 1 MiB, a quarter of the pinned DMA). The others are staged by us: pieces of about
/// `len / divisor` bytes (clamped to `min..=max`) are copied by the copy team into a ring of
/// `ring` pinned buffers, each piece's DMA overlapping the next piece's host copy. The ring stays
/// small enough to live in the host's last-level cache, so the DMA reads the staged bytes from
/// cache and the host copy mostly reads DRAM. Smaller pieces shorten the start (the first piece's
/// host copy) and the end (the last piece's DMA), which nothing overlaps; larger ones cost fewer
/// calls per byte.
///
/// The host copy must leave the staged lines where the DMA reads them without a snoop of the
/// core that wrote them (see [`Stores`]): writes above [`SMALL_PIECE`] and up to `streaming`
/// bytes are copied with non-temporal stores, larger ones up to `demote` bytes with plain stores
/// and `cldemote`, all in parts of `part` bytes or more so that every core of the team holds
/// a few lines only; the largest writes are copied with plain stores (their source is read from
/// memory, the host copy is what bounds them, and `cldemote` only adds to it). Measured on the
/// H200 host against the pinned DMA: 1 MiB writes ran at 0.37-0.43 with plain stores in 256 KiB
/// parts, 0.78-0.98 (median 0.89 over 11 runs) demoted in 32 KiB parts; 1 GiB writes 0.95-0.97
/// with plain stores, 0.89-0.97 demoted. Copying a share (25-60%) of a demoted write with
/// non-temporal stores did not help (1 MiB 0.77-0.93, 64 MiB 0.86-0.91).
///
/// A slot takes pieces up to `fill` bytes (or one larger piece) before it is closed, so the bytes
/// the ring cycles through, and the cache they must stay in, are about `ring * max(fill, piece)`:
/// 4 MiB for 1 MiB writes instead of the 32 MiB of slots packed full. On an H200 host whose
/// last-level cache was shared with busy neighbours, a model loop of 1 MiB demoted copies + DMA
/// ran at 0.97-0.98 of the pinned DMA (best of 9) through 4 slots of 1 MiB, against 0.78-0.90
/// through 4 packed slots of 8 MiB; on a quiet host both ran at 0.95-0.99. For the same reason
/// a 64 MiB write goes in 4 MiB pieces (16 MiB cycled): on a quiet host that ran at 0.94-0.95 of
/// the pinned DMA, as 8 MiB pieces did.
/// `COMPUTE_CUDA_STAGING="divisor,min_kib,max_kib,ring[,direct_kib[,streaming_kib[,demote_kib[,part_kib[,fill_kib]]]]]"`
/// overrides the defaults (for tuning on a given host).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StagingPlan {
    divisor: usize,
    min: usize,
    max: usize,
    ring: usize,
    pub(crate) direct: usize,
    streaming: usize,
    demote: usize,
    part: usize,
    fill: usize,
}

impl StagingPlan {
    const DEFAULT: StagingPlan = StagingPlan {
        divisor: 16,
        min: 1 << 20,
        max: 8 << 20,
        ring: 4,
        direct: 0,
        streaming: 512 << 10,
        demote: 64 << 20,
        part: 32 << 10,
        fill: 1 << 20,
    };

    /// The plan of this process: the defaults, or `COMPUTE_CUDA_STAGING` when it parses (a value
    /// that does not is reported on stderr once and ignored).
    pub(crate) fn get() -> Self {
        static PLAN: std::sync::OnceLock<StagingPlan> = std::sync::OnceLock::new();
        *PLAN.get_or_init(|| {
            let Some(text) = compute_core::env::text("COMPUTE_CUDA_STAGING") else {
                return Self::DEFAULT;
            };
            Self::parse(&text).unwrap_or_else(|| {
                eprintln!(
                    "compute-cuda: ignoring COMPUTE_CUDA_STAGING={text:?} (expected \
                     divisor,min_kib,max_kib,ring[,direct_kib[,streaming_kib[,demote_kib[,part_kib[,fill_kib]]]]] \
                     with positive divisor, min, ring, part and fill, and max >= min)"
                );
                Self::DEFAULT
            })
        })
    }

    /// `divisor,min_kib,max_kib,ring[,direct_kib[,streaming_kib[,demote_kib[,part_kib[,fill_kib]]]]]`;
    /// fields left out keep their defaults.
    fn parse(text: &str) -> Option<StagingPlan> {
        let fields = text
            .split(',')
            .map(|p| p.trim().parse::<usize>().ok())
            .collect::<Option<Vec<usize>>>()?;
        let default = Self::DEFAULT;
        match fields[..] {
            [divisor, min_kib, max_kib, ring, ref rest @ ..]
                if rest.len() <= 5
                    && divisor > 0
                    && min_kib > 0
                    && max_kib >= min_kib
                    && ring > 0
                    && rest.get(3).is_none_or(|&kib| kib > 0)
                    && rest.get(4).is_none_or(|&kib| kib > 0) =>
            {
                Some(StagingPlan {
                    divisor,
                    min: min_kib << 10,
                    max: max_kib << 10,
                    ring,
                    direct: rest.first().map_or(default.direct, |kib| kib << 10),
                    streaming: rest.get(1).map_or(default.streaming, |kib| kib << 10),
                    demote: rest.get(2).map_or(default.demote, |kib| kib << 10),
                    part: rest.get(3).map_or(default.part, |kib| kib << 10),
                    fill: rest.get(4).map_or(default.fill, |kib| kib << 10),
                })
            }
            _ => None,
        }
    }

    /// The stores and the part size the host copy of a staged write of `len` bytes uses.
    fn stores(&self, len: usize) -> (Stores, usize) {
        if len > SMALL_PIECE && len <= self.streaming {
            (Stores::Streaming, self.part)
        } else if len > SMALL_PIECE && len <= self.demote {
            (Stores::Demoted, self.part)
        } else {
            (Stores::Cached, CACHED_PART)
        }
    }

    /// Size of the pinned pieces a pageable write of `len` bytes is staged through.
    fn chunk(&self, len: usize) -> usize {
        (len / self.divisor)
            .clamp(self.min, self.max)
            .next_multiple_of(4096)
    }
}

/// Pinned buffers that pageable writes are staged through, kept from one write to the next: a
/// few slots of the plan's largest piece. Pieces are packed into the open slot one after the
/// other (a 4 KiB write takes 4 KiB of it, not a slot) up to the plan's `fill`; when the next
/// piece does not fit, or a write comes from another stream, the slot is closed with one event
/// recorded after its last copy, and the next slot is opened once its own closing event
/// completed. Reusing the same few buffers keeps them in the host's last-level cache (taking
/// fresh ones from the pinned pool for every write rotated through hundreds of MiB and made the
/// staging DRAM-bound: 39 GB/s at 64 MiB on the H200 host against 53 for the pinned DMA), and
/// packing costs one event per slot instead of one per write.
#[derive(Default)]
pub(crate) struct StagingRing {
    /// Each slot's buffer and how it was last closed.
    slots: Vec<(PinnedBuffer, Option<Closed>)>,
    /// The slot opened after the open one.
    next: usize,
    /// The open slot: its index, the bytes of it in use, and the stream every copy from it so far
    /// was enqueued on (the only stream its closing event has to cover).
    open: Option<OpenSlot>,
}

/// The event recorded after a slot's last copy, and the [`Issue`] that records it when a copy
/// team worker does (see [`CudaServer::write_staged`]): until that issue is done the event may
/// not be recorded yet, and waiting on it would return at once.
struct Closed {
    event: Raw<sys::CUevent>,
    issue: Option<Arc<Issue>>,
    /// The stream the slot's copies ran on.
    stream: Raw<sys::CUstream>,
}

impl Closed {
    /// Whether every copy out of the slot completed, asked without blocking (a stream that
    /// `capturing` names is not queried: the slot counts as busy).
    fn completed(&self, capturing: &impl Fn(Raw<sys::CUstream>) -> bool) -> bool {
        if let Some(issue) = &self.issue {
            if !issue.is_done() {
                return false;
            }
            if !issue.recorded.load(core::sync::atomic::Ordering::Acquire) {
                // Never recorded (the issue failed): only the stream says.
                return !capturing(self.stream) && stream_idle(self.stream);
            }
        }
        // SAFETY: the event is the ring's and was recorded after the slot's last copy.
        unsafe { result::event::query(self.event.0) }.is_ok()
    }

    /// Block until every copy out of the slot completed; the event goes back to `events`.
    fn wait(self, events: &mut EventPool) -> Result<(), ServerError> {
        if let Some(issue) = &self.issue {
            issue.wait();
            if !issue.recorded.load(core::sync::atomic::Ordering::Acquire) {
                // The issue failed before it recorded the event: nothing says when the slot's
                // earlier copies are done but the stream.
                events.give(self.event);
                // SAFETY: the stream lives as long as the server.
                return unsafe { result::stream::synchronize(self.stream.0) }
                    .check("waiting for a staging copy");
            }
        }
        // SAFETY: the event was recorded after the last copy that read the slot.
        let done =
            unsafe { result::event::synchronize(self.event.0) }.check("waiting for a staging copy");
        events.give(self.event);
        done
    }
}

/// The driver calls that start one staged piece's DMA (and, when the piece fills its slot,
/// record the slot's closing event), made by the copy team thread that copied the piece's last
/// part while the server goes on. Issues run in the order they were made: each first waits for
/// the one before it. The server waits for the last one before its next call on a stream
/// ([`CudaServer::settle`]).
#[derive(Default)]
pub(crate) struct Issue {
    done: core::sync::atomic::AtomicBool,
    /// Whether the slot's closing event, if the issue carries one, was recorded.
    recorded: core::sync::atomic::AtomicBool,
}

impl Issue {
    /// Whether the issue's driver calls were made (or failed).
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(core::sync::atomic::Ordering::Acquire)
    }

    fn wait(&self) {
        let mut spins = 0u32;
        while !self.done.load(core::sync::atomic::Ordering::Acquire) {
            spins += 1;
            if spins < 1 << 12 {
                core::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// The first error of an [`Issue`], kept for the server's next call.
pub(crate) type IssueError = Arc<spin::Mutex<Option<ServerError>>>;

#[derive(Clone, Copy)]
struct OpenSlot {
    slot: usize,
    used: usize,
    stream: Raw<sys::CUstream>,
}

/// Writes up to this size are staged through the small ring of [`SMALL_SLOTS`] slots of
/// [`SMALL_SLOT`] bytes (1 MiB in all). On the H200 host a 4 KiB memcpy into lines of the large
/// ring that are not in cache took 0.88 us, as long as the rest of the write.
pub(crate) const SMALL_PIECE: usize = 64 << 10;
const SMALL_SLOT: usize = 128 << 10;
const SMALL_SLOTS: usize = 8;

/// Smallest part of a [`Stores::Cached`] staging copy.
const CACHED_PART: usize = 256 << 10;

/// Offsets of pieces packed into a staging slot are rounded up to this.
const STAGING_ALIGN: usize = 256;

impl StagingRing {
    /// Allocate `count` slots of `len` bytes on first use.
    fn fill(
        &mut self,
        pinned: &Arc<PinnedPool>,
        count: usize,
        len: usize,
    ) -> Result<(), ServerError> {
        while self.slots.len() < count {
            self.slots
                .push((pinned.take_held(len.next_multiple_of(4096))?, None));
        }
        Ok(())
    }

    /// Record the event that closes the open slot, if one is open.
    fn close(&mut self, events: &mut EventPool) -> Result<(), ServerError> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        let event = events.take()?;
        // SAFETY: event and stream are alive (streams live as long as the server).
        let recorded = unsafe { result::event::record(event.0, open.stream.0) };
        if let Err(e) = recorded.check("closing a staging slot") {
            events.give(event);
            // Nothing says when the slot's copies are done: wait for them here.
            // SAFETY: the stream is alive.
            crate::driver::released("cuStreamSynchronize", unsafe {
                result::stream::synchronize(open.stream.0)
            });
            return Err(e);
        }
        let closed = Closed {
            event,
            issue: None,
            stream: open.stream,
        };
        self.set_closed(open.slot, closed, events);
        Ok(())
    }

    /// Record how `slot` was closed, returning the record it replaces (long waited for: a slot
    /// is only reused after its record was waited on) to `events`.
    fn set_closed(&mut self, slot: usize, closed: Closed, events: &mut EventPool) {
        if let Some(old) = self.slots[slot].1.replace(closed) {
            if let Some(issue) = &old.issue {
                issue.wait();
            }
            events.give(old.event);
        }
    }

    /// Whether placing `len` bytes for a copy on `stream` closes the open slot on the caller's
    /// thread (see [`Self::place`]).
    fn closes(&self, len: usize, fill: usize, stream: Raw<sys::CUstream>) -> bool {
        self.open.as_ref().is_some_and(|open| {
            open.stream.0 != stream.0 || open.used + len > self.limit(open, len, fill)
        })
    }

    /// Whether the open slot has no room left for another `len` bytes, so the copy just placed
    /// should close it.
    fn full_after(&self, len: usize, fill: usize) -> bool {
        self.open
            .as_ref()
            .is_some_and(|open| open.used + len > self.limit(open, len, fill))
    }

    /// How many bytes the open slot takes when pieces of `len` bytes are placed: up to `fill`,
    /// or one larger piece, and never more than the slot holds.
    fn limit(&self, open: &OpenSlot, len: usize, fill: usize) -> usize {
        self.slots[open.slot].0.len().min(fill.max(len))
    }

    /// Close the open slot if its copies were enqueued on `stream`. A capture on `stream` calls
    /// this before it begins: the closing event would otherwise be recorded later, by a write
    /// from another stream, into the capture (where it becomes a graph node that nothing can
    /// wait on, and the next wait for the slot fails).
    pub(crate) fn close_on(
        &mut self,
        stream: Raw<sys::CUstream>,
        events: &mut EventPool,
    ) -> Result<(), ServerError> {
        match &self.open {
            Some(open) if open.stream.0 == stream.0 => self.close(events),
            _ => Ok(()),
        }
    }

    /// Room for `len` bytes (at most one slot) staged for a copy on `stream`: the slot and the
    /// offset in it. Pieces are packed into the open slot up to `fill` bytes (or one piece, if
    /// larger). Closes the open slot when the piece does not fit or the stream differs, and
    /// waits for the next slot's last copies before handing it out.
    fn place(
        &mut self,
        len: usize,
        fill: usize,
        stream: Raw<sys::CUstream>,
        events: &mut EventPool,
    ) -> Result<(usize, usize), ServerError> {
        if let Some(open) = &mut self.open {
            let limit = self.slots[open.slot].0.len().min(fill.max(len));
            if open.stream.0 == stream.0 && open.used + len <= limit {
                let offset = open.used;
                open.used = (offset + len).next_multiple_of(STAGING_ALIGN);
                return Ok((open.slot, offset));
            }
        }
        self.close(events)?;
        let slot = self.next % self.slots.len();
        self.next = slot + 1;
        if let Some(closed) = self.slots[slot].1.take() {
            closed.wait(events)?;
        }
        self.open = Some(OpenSlot {
            slot,
            used: len.next_multiple_of(STAGING_ALIGN),
            stream,
        });
        Ok((slot, 0))
    }

    /// Pinned bytes (whole size classes) of the slots no copy may still read from, asked without
    /// blocking: closed slots whose closing event completed, and the open slot once every piece
    /// copied into it has its DMA enqueued (`issued`: no copy team job is still at it) and its
    /// stream is idle. A stream that `capturing` names is never queried (a query of a capturing
    /// stream invalidates its capture); a slot that would need it counts as busy.
    pub(crate) fn idle_bytes(
        &self,
        issued: bool,
        capturing: &impl Fn(Raw<sys::CUstream>) -> bool,
    ) -> u64 {
        self.slots
            .iter()
            .enumerate()
            .filter(|(i, (_, closed))| match &self.open {
                Some(open) if open.slot == *i => {
                    issued && !capturing(open.stream) && stream_idle(open.stream)
                }
                _ => closed.as_ref().is_none_or(|c| c.completed(capturing)),
            })
            .map(|(_, (buffer, _))| buffer.reserved() as u64)
            .sum()
    }

    /// Pinned bytes (whole size classes) of every slot.
    pub(crate) fn reserved_bytes(&self) -> u64 {
        self.slots
            .iter()
            .map(|(buffer, _)| buffer.reserved() as u64)
            .sum()
    }

    /// Wait for every slot's last copy and free the slots.
    pub(crate) fn release(&mut self, events: &mut EventPool) {
        if let Some(open) = self.open.take() {
            // SAFETY: the stream is alive; its copies from the open slot are done after this.
            crate::driver::released("cuStreamSynchronize", unsafe {
                result::stream::synchronize(open.stream.0)
            });
        }
        for (buffer, closed) in self.slots.drain(..) {
            if let Some(closed) = closed
                && let Err(e) = closed.wait(events)
            {
                crate::driver::record_release_error(e);
            }
            drop(buffer);
        }
        self.next = 0;
    }
}

/// Whether every command enqueued on `stream` so far completed (`cuStreamQuery`; an error counts
/// as not idle). Never for a capturing stream.
fn stream_idle(stream: Raw<sys::CUstream>) -> bool {
    // SAFETY: the server's streams live as long as it; only reports the status.
    let status = unsafe { sys::cuStreamQuery(stream.0) };
    status == sys::CUresult::CUDA_SUCCESS
}

/// `dst.copy_from_slice(src)` on compute-core's copy team, then `then` (see
/// [`compute_core::copy::copy_parallel_then`]): one thread's memcpy is far below the PCIe /
/// NVLink-C2C bandwidth a pinned copy reaches. Cached copies go in parts of at least `part`
/// bytes and about two per thread (threads that start late still find work); the others in parts
/// of `part` bytes, so that each core holds few of the lines the DMA reads next.
fn copy_parallel_then(
    dst: &mut [u8],
    src: &[u8],
    stores: Stores,
    part: usize,
    then: compute_core::copy::AfterCopy,
) {
    let part = if stores == Stores::Cached {
        let threads = compute_core::copy::copy_threads();
        src.len().div_ceil(threads * 2).max(part)
    } else {
        part
    };
    compute_core::copy::copy_parallel_then(dst, src, part.next_multiple_of(64), stores, then);
}

/// Whether staged pieces' driver calls are handed to the copy team (see [`Issue`]); on by default,
/// `COMPUTE_CUDA_HAND_OVER=0` makes them on the writing thread after the copy (for A/B
/// measurements).
fn hand_over_issues() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| compute_core::env::flag("COMPUTE_CUDA_HAND_OVER", true))
}

/// What a copy team thread does once a staged piece is copied: start its DMA and, when the piece
/// filled its slot, record the slot's closing event (see [`Issue`]).
struct IssueJob {
    context: Arc<Context>,
    stream: Raw<sys::CUstream>,
    dst: sys::CUdeviceptr,
    staged: Raw<*const u8>,
    len: usize,
    closing: Option<Raw<sys::CUevent>>,
    /// The issue made before this one, which must be done first (stream order).
    after: Option<Arc<Issue>>,
    issue: Arc<Issue>,
    errors: IssueError,
    /// Whether [`Self::run`] got to make the calls (the job is dropped unrun only if the copy
    /// team lost it, which would be a bug, or the run panicked).
    ran: bool,
}

impl IssueJob {
    /// Make the calls; the issue is done when `self` drops, at the end.
    fn run(mut self) {
        if let Some(after) = &self.after {
            after.wait();
        }
        let outcome = self.start();
        self.ran = true;
        if let Err(e) = outcome {
            self.errors.lock().get_or_insert(e);
        }
    }

    fn start(&self) -> Result<(), ServerError> {
        self.context.bind()?;
        // SAFETY: `staged` points to `len` pinned bytes of a staging slot, copied before this
        // runs and not written again before the slot's closing event (recorded below, or by a
        // later issue or the server after this one) completed; the server keeps the slot alive
        // until then. The target holds `len` bytes (validated by the writer).
        let staged = unsafe { core::slice::from_raw_parts(self.staged.0, self.len) };
        // SAFETY: as above; the stream lives as long as the server, which waits for this issue
        // before it destroys anything.
        let copied = unsafe { result::memcpy_htod_async(self.dst, staged, self.stream.0) }
            .check("staging a pageable write");
        if let Some(event) = self.closing {
            // SAFETY: the event was taken from the server's pool for this slot; the stream is
            // alive.
            let recorded = unsafe { result::event::record(event.0, self.stream.0) };
            recorded.check("closing a staging slot")?;
            self.issue
                .recorded
                .store(true, core::sync::atomic::Ordering::Release);
        }
        copied
    }
}

impl Drop for IssueJob {
    fn drop(&mut self) {
        if !self.ran {
            self.errors.lock().get_or_insert(ServerError::Driver(
                "the DMA of a staged write was not started (its copy team job was lost)".into(),
            ));
        }
        // Whatever happened, nothing may wait for this issue forever.
        self.issue
            .done
            .store(true, core::sync::atomic::Ordering::Release);
    }
}

impl CudaServer {
    /// A pageable write, staged piece by piece through the server's [`StagingRing`]: the host
    /// copy of one piece overlaps the DMA of the ones before it (of this write and of the writes
    /// before it), and a slot is reused once the event closing it completed.
    ///
    /// Pieces above [`SMALL_PIECE`] are copied by the copy team, and the thread that copies a
    /// piece's last part makes the driver calls that start its DMA (see [`Issue`]): the caller
    /// returns as soon as the bytes are staged, and those calls (about 2-3 us on the H200 host,
    /// a tenth of a 1 MiB piece's DMA) overlap its next steps instead of adding to them. On the
    /// H200 host (same process, alternating) a 1 MiB write returned after 22.8-23.4 us with the
    /// hand-over against 25.4-26.4 without, and back-to-back 1 MiB writes ran at 0.96-0.97 of the
    /// pinned DMA against 0.83-0.94; on a host with busy neighbours both stayed copy-bound
    /// (0.58-0.83).
    pub(crate) fn write_staged(
        &mut self,
        stream: Raw<sys::CUstream>,
        dst: sys::CUdeviceptr,
        src: &[u8],
    ) -> Result<(), ServerError> {
        let plan = StagingPlan::get();
        if src.len() <= SMALL_PIECE {
            // Copied on this thread: handing the DMA call over would cost as much as making it.
            self.settle()?;
            let ring = &mut self.small_staging;
            ring.fill(&self.pinned, SMALL_SLOTS, SMALL_SLOT)?;
            let (slot, at) = ring.place(src.len(), SMALL_SLOT, stream, &mut self.events)?;
            let buffer = &mut ring.slots[slot].0;
            let staged = &mut compute_core::HostBuffer::as_bytes_mut(buffer)[at..at + src.len()];
            staged.copy_from_slice(src);
            // SAFETY: `staged` is pinned and is not written again before the event closing its
            // slot completed; the target holds `src.len()` bytes (validated by the caller).
            let copied = unsafe { result::memcpy_htod_async(dst, staged, stream.0) };
            if let Err(e) = copied.check("staging a pageable write") {
                // An earlier copy from the slot may still run; closing it records that.
                if let Err(second) = ring.close(&mut self.events) {
                    crate::driver::record_release_error(second);
                }
                return Err(e);
            }
            return Ok(());
        }
        self.staging.fill(&self.pinned, plan.ring, plan.max)?;
        let chunk = plan.chunk(src.len());
        let (stores, part) = plan.stores(src.len());
        for (i, piece) in src.chunks(chunk).enumerate() {
            if self.staging.closes(piece.len(), plan.fill, stream) {
                // The closing event must follow the DMAs of the slot's pieces.
                self.settle()?;
            }
            let (slot, at) =
                self.staging
                    .place(piece.len(), plan.fill, stream, &mut self.events)?;
            let closing = if self.staging.full_after(piece.len(), plan.fill) {
                Some(self.events.take()?)
            } else {
                None
            };
            let issue = Arc::new(Issue::default());
            let after = self
                .issuing
                .replace((issue.clone(), stream))
                .map(|(before, _)| before);
            let buffer = &self.staging.slots[slot].0;
            assert!(
                at + piece.len() <= buffer.len(),
                "a staged piece fits its slot"
            );
            // SAFETY: `place` handed out `at..at + len` of the slot to this piece alone: no
            // earlier piece (whose DMA a job may be starting from a shared view of it) overlaps
            // it, and the slot lives until the server waited for the event closing it.
            let staged =
                unsafe { core::slice::from_raw_parts_mut(buffer.as_ptr().add(at), piece.len()) };
            let job = IssueJob {
                context: self.context.clone(),
                stream,
                dst: dst + (i * chunk) as u64,
                staged: Raw(staged.as_ptr()),
                len: piece.len(),
                closing,
                after,
                issue: issue.clone(),
                errors: self.issue_errors.clone(),
                ran: false,
            };
            if hand_over_issues() {
                copy_parallel_then(staged, piece, stores, part, Box::new(move || job.run()));
            } else {
                copy_parallel_then(staged, piece, stores, part, Box::new(|| {}));
                job.run();
            }
            if let Some(event) = closing {
                self.staging.open = None;
                self.staging.set_closed(
                    slot,
                    Closed {
                        event,
                        issue: Some(issue),
                        stream,
                    },
                    &mut self.events,
                );
            }
        }
        Ok(())
    }

    /// Wait until the driver calls handed to the copy team were made (so that the next call on
    /// a stream comes after them), and return the first error among them not reported yet. An
    /// error of a staged write's DMA call is reported this way, by the server's next call that
    /// settles (whatever its stream).
    pub(crate) fn settle(&mut self) -> Result<(), ServerError> {
        self.settle_quietly();
        match self.issue_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// [`Self::settle`] for calls that cannot report an error: it stays for the next one.
    pub(crate) fn settle_quietly(&mut self) {
        if let Some((issue, _)) = self.issuing.take() {
            // Every issue waits for the one before it: once the last is done, all are.
            issue.wait();
            if let Some(e) = self.issue_errors.lock().take() {
                self.issue_error.get_or_insert(e);
            }
        }
    }

    /// `staging`: move `bytes` into pinned buffers (or, with `file_only`, read file-backed ones
    /// into memory); bytes that find no pinned memory stay pageable.
    pub(crate) fn stage_bytes(
        &mut self,
        bytes: &mut [&mut Bytes],
        file_only: bool,
    ) -> Result<(), ServerError> {
        for b in bytes.iter_mut() {
            if file_only {
                if b.kind() == BytesKind::File {
                    b.materialize()?;
                }
                continue;
            }
            if b.kind() == BytesKind::Pinned {
                continue;
            }
            let pool = self.pinned.clone();
            let mut failure = None;
            // The caller's bytes: `take` counts them as handed out, not as the server's.
            let moved = b.move_into(|len| match pool.take(len) {
                Ok(buffer) => Some(Box::new(buffer) as Box<dyn compute_core::HostBuffer>),
                Err(e) => {
                    failure = Some(e);
                    None
                }
            })?;
            if !moved {
                // No pinned memory left: the bytes stay pageable, read now.
                b.materialize()?;
                drop(failure);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_plans_parse_and_pick_stores_by_size() {
        let plan = StagingPlan::DEFAULT;
        assert_eq!(plan.stores(4096), (Stores::Cached, CACHED_PART));
        assert_eq!(plan.stores(SMALL_PIECE).0, Stores::Cached);
        assert_eq!(plan.stores(256 << 10), (Stores::Streaming, 32 << 10));
        assert_eq!(plan.stores(1 << 20), (Stores::Demoted, 32 << 10));
        assert_eq!(plan.stores(64 << 20).0, Stores::Demoted);
        assert_eq!(plan.stores(1 << 30), (Stores::Cached, CACHED_PART));
        assert_eq!(plan.chunk(1 << 20), 1 << 20);
        assert_eq!(plan.chunk(64 << 20), 4 << 20);
        assert_eq!(plan.chunk(1 << 30), 8 << 20);
        assert_eq!(plan.fill, 1 << 20);
        let tuned = StagingPlan::parse("4, 256, 4096, 2, 8, 0, 0, 64").expect("valid plan");
        assert_eq!(
            (tuned.divisor, tuned.min, tuned.max, tuned.ring),
            (4, 256 << 10, 4 << 20, 2)
        );
        assert_eq!(
            (tuned.direct, tuned.streaming, tuned.part),
            (8 << 10, 0, 64 << 10)
        );
        assert_eq!(tuned.demote, 0);
        assert_eq!(tuned.stores(256 << 10), (Stores::Cached, CACHED_PART));
        assert_eq!(tuned.fill, StagingPlan::DEFAULT.fill);
        let short = StagingPlan::parse("8,1024,8192,4").expect("four fields are enough");
        assert_eq!(short.streaming, StagingPlan::DEFAULT.streaming);
        let packed = StagingPlan::parse("8,1024,8192,4,0,512,65536,32,8192").expect("nine fields");
        assert_eq!(packed.fill, 8 << 20);
        for bad in [
            "",
            "8,1024",
            "0,1024,8192,4",
            "8,2048,1024,4",
            "8,1024,8192,0",
            "8,x,8192,4",
            "8,1024,8192,4,0,512,1,0",
            "8,1024,8192,4,0,512,1,32,0",
            "8,1024,8192,4,0,512,1,32,1024,5",
        ] {
            assert!(StagingPlan::parse(bad).is_none(), "{bad:?} parsed");
        }
    }
}
