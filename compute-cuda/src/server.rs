//! The CUDA server: a stream per `StreamId`, pools over device memory, a module cache, graphs by
//! stream capture, NCCL collectives and event-timed profiles.

use std::collections::BTreeMap;
use std::sync::Arc;

use compute_core::backend::{CreateRules, Graphs, StreamEntry, Streams};
use compute_core::copy::Stores;
use compute_core::error::LaunchError;
use compute_core::future::DynFut;
use compute_core::graph::GraphId;
use compute_core::handle::{HandleOwner, StreamPoint};
use compute_core::kernel::KernelId;
use compute_core::layout::contiguous_strides;
use compute_core::memory::{MemoryAllocationMode, MemoryPoolsConfig, MemoryUsage, PoolConfigError};
use compute_core::profile::ProfileToken;
use compute_core::{
    Binding, Bytes, BytesKind, ComputeServer, CopyDescriptor, CubeCount, DeviceId,
    DeviceProperties, ElemType, ExecutionMode, KernelArguments, MemoryLayout,
    MemoryLayoutDescriptor, ProfileDuration, ProfileError, ReduceOperation, ServerError, StreamId,
    TimingMethod,
};
use cudarc::driver::{result, sys};
use hashbrown::HashMap;

use crate::codegen::{MAX_RANK, META_BYTES};
use crate::compiler::{self, CompiledKernel, Target};
use crate::device::CudaDevice;
use crate::driver::{Check, Context, Raw};
use crate::kernel::CudaKernel;
use crate::pinned::{PinnedBuffer, PinnedPool};
use crate::storage::{CUDA_ALIGNMENT, CudaResource, CudaStorage};
use crate::stream::{
    EventPool, GraphExec, KeepAlive, StreamQueue, StreamState, WaitEvent, WaitEvents,
};

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
struct StagingPlan {
    divisor: usize,
    min: usize,
    max: usize,
    ring: usize,
    direct: usize,
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
    fn get() -> Self {
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
struct StagingRing {
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
struct Issue {
    done: core::sync::atomic::AtomicBool,
    /// Whether the slot's closing event, if the issue carries one, was recorded.
    recorded: core::sync::atomic::AtomicBool,
}

impl Issue {
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
type IssueError = Arc<spin::Mutex<Option<ServerError>>>;

#[derive(Clone, Copy)]
struct OpenSlot {
    slot: usize,
    used: usize,
    stream: Raw<sys::CUstream>,
}

/// Writes up to this size are staged through the small ring of [`SMALL_SLOTS`] slots of
/// [`SMALL_SLOT`] bytes (1 MiB in all). On the H200 host a 4 KiB memcpy into lines of the large
/// ring that are not in cache took 0.88 us, as long as the rest of the write.
const SMALL_PIECE: usize = 64 << 10;
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
                .push((pinned.take(len.next_multiple_of(4096))?, None));
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
    fn close_on(
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

    /// Wait for every slot's last copy and free the slots.
    fn release(&mut self, events: &mut EventPool) {
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

/// Backend information of a CUDA server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaInfo {
    /// The GPU.
    pub device: CudaDevice,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Driver version, e.g. 13000.
    pub driver_version: i32,
}

/// A captured graph: the executable graph, the stream it was captured on, and the bindings it
/// recorded. [`Graphs`] keeps the stream too, but its `remove` hands back the graph alone, and a
/// release orders on that stream.
struct CudaGraph {
    exec: GraphExec,
    stream: StreamId,
    holds: Vec<Binding>,
}

/// One contiguous run of rows for a 2-D copy: offsets in the strided and compact layouts, rows,
/// row pitch of the strided side, row width; all in bytes.
struct RowBlock {
    strided: usize,
    compact: usize,
    height: usize,
    pitch: usize,
    width: usize,
}

/// Whether a tensor of `shape` with `strides` (in elements) is one run of bytes (row-major with
/// no padding; the stride of a dimension of size 1 does not matter), found without allocating.
fn is_compact(shape: &[usize], strides: &[usize]) -> bool {
    if shape.contains(&0) {
        return false;
    }
    if shape.len() < 2 {
        return true;
    }
    let mut expected = 1;
    for (&dim, &stride) in shape.iter().zip(strides).rev() {
        if dim != 1 && stride != expected {
            return false;
        }
        expected *= dim;
    }
    strides.len() == shape.len()
}

fn row_blocks(shape: &[usize], strides: &[usize], elem: usize) -> Vec<RowBlock> {
    let rank = shape.len();
    if shape.contains(&0) {
        return Vec::new();
    }
    let width = shape.last().map_or(elem, |&n| n * elem);
    if rank < 2 || strides == contiguous_strides(shape).0.as_slice() {
        let total = shape.iter().product::<usize>() * elem;
        return vec![RowBlock {
            strided: 0,
            compact: 0,
            height: 1,
            pitch: total,
            width: total,
        }];
    }
    let pitch = strides[rank - 2] * elem;
    let uniform = (0..rank - 2).all(|i| strides[i] == strides[i + 1] * shape[i + 1]);
    if uniform {
        let rows: usize = shape[..rank - 1].iter().product();
        return vec![RowBlock {
            strided: 0,
            compact: 0,
            height: rows,
            pitch,
            width,
        }];
    }
    let outer: usize = shape[..rank - 2].iter().product();
    let plane_rows = shape[rank - 2];
    let mut index = vec![0usize; rank - 2];
    let mut blocks = Vec::with_capacity(outer);
    for o in 0..outer {
        let offset: usize = index.iter().zip(strides).map(|(i, s)| i * s).sum();
        blocks.push(RowBlock {
            strided: offset * elem,
            compact: o * plane_rows * width,
            height: plane_rows,
            pitch,
            width,
        });
        for d in (0..rank - 2).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    blocks
}

/// A host <-> device 2-D copy of one row block, enqueued on `stream`.
///
/// # Safety
/// `host` must hold the compact block and `device` the strided one, both alive until the copy ran.
unsafe fn copy_block(
    block: &RowBlock,
    host: *mut u8,
    device: u64,
    to_device: bool,
    stream: sys::CUstream,
) -> Result<(), ServerError> {
    // SAFETY: the caller guarantees `host` covers the compact block.
    let host = unsafe { host.add(block.compact) };
    let device = device + block.strided as u64;
    if block.height == 1 {
        let result = if to_device {
            // SAFETY: `host` holds `width` bytes (caller), pinned or staged by the driver.
            let src = unsafe { core::slice::from_raw_parts(host.cast_const(), block.width) };
            // SAFETY: `device` holds `width` bytes (caller).
            unsafe { result::memcpy_htod_async(device, src, stream) }
        } else {
            // SAFETY: `host` holds `width` writable bytes (caller).
            let dst = unsafe { core::slice::from_raw_parts_mut(host, block.width) };
            // SAFETY: `device` holds `width` bytes (caller).
            unsafe { result::memcpy_dtoh_async(dst, device, stream) }
        };
        return result.check(if to_device {
            "cuMemcpyHtoDAsync"
        } else {
            "cuMemcpyDtoHAsync"
        });
    }
    let (host_type, device_type) = (
        sys::CUmemorytype::CU_MEMORYTYPE_HOST,
        sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
    );
    let d = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: if to_device { host_type } else { device_type },
        srcHost: if to_device {
            host.cast_const().cast()
        } else {
            core::ptr::null()
        },
        srcDevice: if to_device { 0 } else { device },
        srcArray: core::ptr::null_mut(),
        srcPitch: if to_device { block.width } else { block.pitch },
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: if to_device { device_type } else { host_type },
        dstHost: if to_device {
            core::ptr::null_mut()
        } else {
            host.cast()
        },
        dstDevice: if to_device { device } else { 0 },
        dstArray: core::ptr::null_mut(),
        dstPitch: if to_device { block.pitch } else { block.width },
        WidthInBytes: block.width,
        Height: block.height,
    };
    // SAFETY: the descriptor describes ranges the caller keeps alive.
    unsafe { sys::cuMemcpy2DAsync_v2(&d, stream) }
        .result()
        .check("cuMemcpy2DAsync")
}

fn ready<T: Send + 'static>(value: T) -> DynFut<T> {
    Box::pin(core::future::ready(value))
}

/// The server of one GPU.
pub struct CudaServer {
    device: CudaDevice,
    context: Arc<Context>,
    owner: HandleOwner,
    properties: DeviceProperties,
    target: Target,
    streams: Streams<CudaStorage, StreamQueue, Vec<Binding>>,
    events: EventPool,
    pinned: Arc<PinnedPool>,
    staging: StagingRing,
    /// Where writes of at most [`SMALL_PIECE`] bytes are staged: a ring small enough to stay in
    /// the core's cache (fresh lines of the large ring cost their fetch on every write).
    small_staging: StagingRing,
    /// The last staged piece's driver calls handed to the copy team, and their stream.
    issuing: Option<(Arc<Issue>, Raw<sys::CUstream>)>,
    /// Where the issues put their first error, and that error once the server took it.
    issue_errors: IssueError,
    issue_error: Option<ServerError>,
    kernels: HashMap<(KernelId, bool), Arc<CompiledKernel>>,
    graphs: Graphs<CudaGraph>,
    profiles: HashMap<u64, Raw<sys::CUevent>>,
    next_profile: u64,
    /// One communication stream per group: NCCL calls of two groups issued in different orders
    /// on two devices would deadlock on one shared stream (each device's first call waits for a
    /// peer whose stream is blocked behind the other group's call).
    comm_streams: BTreeMap<Vec<DeviceId>, StreamId>,
    collective_groups: Vec<Vec<DeviceId>>,
}

impl core::fmt::Debug for CudaServer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CudaServer")
            .field("device", &self.device)
            .field("streams", &self.streams.len())
            .field("kernels", &self.kernels.len())
            .finish_non_exhaustive()
    }
}

impl CudaServer {
    pub(crate) fn new(
        device: CudaDevice,
        context: Arc<Context>,
        properties: DeviceProperties,
    ) -> Result<Self, ServerError> {
        static NEXT_SERVER: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
        use sys::CUdevice_attribute as A;
        let target = Target {
            major: context.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            minor: context.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            driver: crate::driver::driver_version(),
        };
        let pinned = PinnedPool::new(context.clone());
        let events = EventPool::new(WaitEvents::new(context.clone()));
        let owner = HandleOwner {
            device: compute_core::Device::to_id(&device),
            server: NEXT_SERVER.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
        };
        Ok(Self {
            device,
            owner,
            context,
            streams: Streams::new(owner, properties.memory.clone()),
            properties,
            target,
            events,
            pinned,
            staging: StagingRing::default(),
            small_staging: StagingRing::default(),
            issuing: None,
            issue_errors: IssueError::default(),
            issue_error: None,
            kernels: HashMap::new(),
            graphs: Graphs::default(),
            profiles: HashMap::new(),
            next_profile: 1,
            comm_streams: BTreeMap::new(),
            collective_groups: Vec::new(),
        })
    }

    /// The pinned staging pool of this device.
    pub fn pinned_pool(&self) -> &Arc<PinnedPool> {
        &self.pinned
    }

    /// The CUDA layout of a `create`: 256-byte starts, 128-byte row pitch, one page at most.
    fn create_rules(&self) -> CreateRules {
        CreateRules {
            alignment: CUDA_ALIGNMENT,
            pitch_alignment: self.properties.pitch_alignment,
            max_size: self.properties.memory.max_page_size,
        }
    }

    /// The stream `id` (created on first use), with the device's context bound. What its
    /// completed work kept alive is retired on the way, unless a capture runs on it (a capturing
    /// stream's events are never queried).
    fn stream(&mut self, id: StreamId) -> Result<&mut StreamState, ServerError> {
        self.context.bind()?;
        let state = self
            .streams
            .get_or_create(id, || Ok((CudaStorage::new(), StreamQueue::new()?)))?;
        if state.capture.is_none() {
            state.queue.retire(&mut self.events);
        }
        Ok(state)
    }

    fn resolve(&mut self, binding: &Binding) -> Result<CudaResource, ServerError> {
        self.streams.resolve(binding)
    }

    /// The capture rule for `what` on `stream`; binds the context and creates the stream first,
    /// as every caller goes on to the driver.
    fn ensure_not_capturing(&mut self, stream: StreamId, what: &str) -> Result<(), ServerError> {
        self.stream(stream)?;
        self.streams.ensure_not_capturing(stream, what)
    }

    /// An event on `other` that covers its command `seq`, recording one only when none does.
    fn marker(
        &mut self,
        other: StreamId,
        seq: u64,
    ) -> Result<Option<Raw<sys::CUevent>>, ServerError> {
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
    fn order_after(&mut self, stream: StreamId, bindings: &[&Binding]) -> Result<(), ServerError> {
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
    fn mark(
        &mut self,
        stream: StreamId,
        bindings: &[&Binding],
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
                Some(holds) => holds.push((*binding).clone()),
                None if binding.handle().stream() != stream => {
                    others.push(KeepAlive::Binding((*binding).clone()));
                }
                None => {}
            }
        }
        let capturing = state.capture.is_some();
        state
            .queue
            .hold(&mut self.events, extra.into_iter().chain(others), capturing)
    }

    fn compiled(
        &mut self,
        kernel: &CudaKernel,
        checked: bool,
    ) -> Result<Arc<CompiledKernel>, ServerError> {
        if let Some(found) = self.kernels.get(&(kernel.id, checked)) {
            return Ok(found.clone());
        }
        kernel.definition.validate(&self.properties.hardware)?;
        let compiled = Arc::new(compiler::compile(
            &kernel.definition,
            kernel.id,
            checked,
            self.target,
        )?);
        self.kernels.insert((kernel.id, checked), compiled.clone());
        Ok(compiled)
    }

    /// A future completing when `event` (recorded just before) completed; the event goes back to
    /// its pool then.
    fn event_future(
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
    fn record_fresh(&mut self, stream: StreamId) -> Result<WaitEvent, ServerError> {
        let raw = self.stream(stream)?.queue.raw;
        let event = self.events.shared().take()?;
        // SAFETY: event and stream are alive.
        unsafe { result::event::record(event.raw(), raw.0) }.check("cuEventRecord")?;
        Ok(event)
    }

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
    fn write_staged(
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
    fn settle(&mut self) -> Result<(), ServerError> {
        self.settle_quietly();
        match self.issue_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// [`Self::settle`] for calls that cannot report an error: it stays for the next one.
    fn settle_quietly(&mut self) {
        if let Some((issue, _)) = self.issuing.take() {
            // Every issue waits for the one before it: once the last is done, all are.
            issue.wait();
            if let Some(e) = self.issue_errors.lock().take() {
                self.issue_error.get_or_insert(e);
            }
        }
    }

    fn write_one(
        &mut self,
        stream: StreamId,
        descriptor: CopyDescriptor,
        bytes: Bytes,
    ) -> Result<(), ServerError> {
        let contiguous = is_compact(&descriptor.shape, &descriptor.strides);
        if contiguous && bytes.kind() != BytesKind::Pinned {
            return self.write_pageable(stream, descriptor, bytes.try_as_slice()?);
        }
        descriptor.validate_write(bytes.len())?;
        if bytes.is_empty() {
            return Ok(());
        }
        let target = self.resolve(&descriptor.binding)?;
        let binding = descriptor.binding.clone();
        let raw = self.stream(stream)?.queue.raw;
        self.settle()?;
        self.order_after(stream, &[&binding])?;
        let keep = if contiguous {
            let src = bytes.try_as_slice()?;
            // SAFETY: `src` is pinned and kept alive (below) until the copy completed; `target`
            // holds `src.len()` bytes (validated).
            unsafe { result::memcpy_htod_async(target.ptr, src, raw.0) }
                .check("cuMemcpyHtoDAsync")?;
            KeepAlive::Bytes(bytes)
        } else {
            let (host, hold) = if bytes.kind() == BytesKind::Pinned {
                let ptr = bytes.try_as_slice()?.as_ptr().cast_mut();
                (ptr, KeepAlive::Bytes(bytes))
            } else {
                let mut staging = self.pinned.take(bytes.len())?;
                compute_core::HostBuffer::as_bytes_mut(&mut staging)
                    .copy_from_slice(bytes.try_as_slice()?);
                (staging.as_ptr(), KeepAlive::Pinned(staging))
            };
            let blocks = row_blocks(&descriptor.shape, &descriptor.strides, descriptor.elem_size);
            for block in &blocks {
                // SAFETY: `host` is pinned and kept alive by `hold` until the copy completed;
                // the strided span fits `target` (validated).
                unsafe { copy_block(block, host, target.ptr, true, raw.0) }?;
            }
            hold
        };
        self.mark(stream, &[&binding], Some(keep))
    }

    /// A contiguous write from pageable host bytes, which it reads only before it returns (they
    /// are copied into pinned staging, or handed to the driver's own staging copy): the path of
    /// both owned pageable [`Bytes`] and a borrowed slice ([`ComputeServer::write_from_slice`]).
    fn write_pageable(
        &mut self,
        stream: StreamId,
        descriptor: CopyDescriptor,
        src: &[u8],
    ) -> Result<(), ServerError> {
        descriptor.validate_write(src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let target = self.resolve(&descriptor.binding)?;
        let binding = descriptor.binding.clone();
        let raw = self.stream(stream)?.queue.raw;
        // A large staged write may go on while the driver calls of the pieces staged before it
        // on the same stream are still being made (they and its own are made in order): what it
        // enqueues before its own DMA is only stream waits, which those calls may follow too.
        // Any other write comes after them.
        let direct = src.len() <= StagingPlan::get().direct;
        let staged = src.len() > SMALL_PIECE && !direct;
        if !staged || self.issuing.as_ref().is_some_and(|(_, s)| s.0 != raw.0) {
            self.settle()?;
        }
        self.order_after(stream, &[&binding])?;
        if direct {
            // SAFETY: pageable host-to-device copies return once the driver staged the bytes;
            // `target` holds `src.len()` bytes (validated).
            unsafe { result::memcpy_htod_async(target.ptr, src, raw.0) }
                .check("cuMemcpyHtoDAsync")?;
        } else {
            self.write_staged(raw, target.ptr, src)?;
        }
        if staged && binding.handle().stream() != stream {
            // Keeping a buffer of another stream's pool alive can record an event on the
            // stream, which must follow the DMA.
            self.settle()?;
        }
        self.mark(stream, &[&binding], None)
    }

    fn read_inner(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream: StreamId,
    ) -> Result<DynFut<Result<Vec<Bytes>, ServerError>>, ServerError> {
        self.settle()?;
        crate::driver::take_release_error()?;
        self.ensure_not_capturing(stream, "read")?;
        let mut sources = Vec::with_capacity(descriptors.len());
        for descriptor in &descriptors {
            descriptor.validate()?;
            sources.push(self.resolve(&descriptor.binding)?);
        }
        let bindings: Vec<Binding> = descriptors.iter().map(|d| d.binding.clone()).collect();
        let refs: Vec<&Binding> = bindings.iter().collect();
        self.order_after(stream, &refs)?;
        let raw = self.stream(stream)?.queue.raw;
        let mut outputs = Vec::with_capacity(descriptors.len());
        for (descriptor, source) in descriptors.iter().zip(&sources) {
            let len = descriptor.compact_size();
            if len == 0 {
                outputs.push(None);
                continue;
            }
            let buffer = self.pinned.take(len)?;
            for block in row_blocks(&descriptor.shape, &descriptor.strides, descriptor.elem_size) {
                // SAFETY: `buffer` is pinned, holds the compact tensor and lives in the future
                // until the copy completed; the strided span fits the source (validated).
                unsafe { copy_block(&block, buffer.as_ptr(), source.ptr, false, raw.0) }?;
            }
            outputs.push(Some(buffer));
        }
        self.mark(stream, &refs, None)?;
        let event = self.record_fresh(stream)?;
        let done = self.event_future(event);
        Ok(Box::pin(async move {
            done.await?;
            let _alive = bindings;
            Ok(outputs
                .into_iter()
                .map(|b| match b {
                    Some(buffer) => Bytes::from_host_buffer(Box::new(buffer)),
                    None => Bytes::from_vec(Vec::new()),
                })
                .collect())
        }))
    }

    /// The three `u32` of a dynamic cube count, read after the work queued so far.
    /// Launch the executable graph `exec` on `stream`, ordered after the last uses of `holds`
    /// (the bindings it recorded) on other streams, and mark them used by it.
    fn replay_holding(
        &mut self,
        exec: Raw<sys::CUgraphExec>,
        stream: StreamId,
        holds: &[Binding],
    ) -> Result<(), ServerError> {
        let refs: Vec<&Binding> = holds.iter().collect();
        self.order_after(stream, &refs)?;
        let raw = self.stream(stream)?.queue.raw;
        // SAFETY: the executable graph and the stream are alive; the graph's memory is kept
        // alive by `holds`.
        unsafe { result::graph::launch(exec.0, raw.0) }.check("cuGraphLaunch")?;
        self.mark(stream, &refs, None)
    }

    fn dynamic_count(
        &mut self,
        binding: &Binding,
        stream: StreamId,
    ) -> Result<[u32; 3], ServerError> {
        self.ensure_not_capturing(stream, "a launch with a dynamic cube count")?;
        let source = self.resolve(binding)?;
        if source.len < 12 {
            return Err(compute_core::error::LaunchError::DynamicCount {
                offset: binding.handle().slice_offset_start(),
                size: source.len,
            }
            .into());
        }
        self.order_after(stream, &[binding])?;
        let raw = self.stream(stream)?.queue.raw;
        let mut count = [0u32; 3];
        // SAFETY: 12 bytes into a local array; synchronous with respect to the stream's work.
        unsafe { result::memcpy_dtoh_async(&mut count[..], source.ptr, raw.0) }
            .check("reading a dynamic cube count")?;
        // SAFETY: the stream is alive.
        unsafe { result::stream::synchronize(raw.0) }.check("cuStreamSynchronize")?;
        Ok(count)
    }

    fn check_group(&self, devices: &[DeviceId]) -> Result<Vec<DeviceId>, ServerError> {
        compute_core::collective::check_group(
            devices,
            self.owner.device,
            crate::driver::device_count(),
            "CUDA",
        )
    }
}

/// Bytes of one launch parameter slot (the biggest parameter is a `Meta`).
const SLOT_WORDS: usize = META_BYTES.div_ceil(8);

fn meta_slot(shape: &[usize], strides: &[usize]) -> Result<[u64; SLOT_WORDS], ServerError> {
    if shape.len() > MAX_RANK || strides.len() != shape.len() {
        return Err(compute_core::error::LaunchError::MetadataTooLarge {
            rank: shape.len().max(strides.len()),
            maximum: MAX_RANK,
        }
        .into());
    }
    let mut words = [0u32; 1 + 2 * MAX_RANK];
    words[0] = shape.len() as u32;
    for (i, (&n, &s)) in shape.iter().zip(strides).enumerate() {
        words[1 + i] = n.min(u32::MAX as usize) as u32;
        words[1 + MAX_RANK + i] = s.min(u32::MAX as usize) as u32;
    }
    let mut slot = [0u64; SLOT_WORDS];
    bytemuck::cast_slice_mut::<u64, u8>(&mut slot)[..META_BYTES]
        .copy_from_slice(bytemuck::cast_slice(&words));
    Ok(slot)
}

impl ComputeServer for CudaServer {
    type Kernel = CudaKernel;
    type Storage = CudaStorage;
    type Info = CudaInfo;

    fn info(&self) -> CudaInfo {
        CudaInfo {
            device: self.device,
            compute_capability: (self.target.major as u32, self.target.minor as u32),
            driver_version: self.target.driver,
        }
    }

    fn properties(&self) -> DeviceProperties {
        self.properties.clone()
    }

    fn owner(&self) -> HandleOwner {
        self.owner
    }

    fn create(
        &mut self,
        descriptors: &[MemoryLayoutDescriptor],
        stream: StreamId,
    ) -> Result<Vec<MemoryLayout>, ServerError> {
        // The pools may hand back blocks to the driver: the DMAs into them must be enqueued.
        self.settle()?;
        let (owner, rules) = (self.owner, self.create_rules());
        self.stream(stream)?
            .create(owner, stream, descriptors, &rules)
    }

    fn write(
        &mut self,
        writes: Vec<(CopyDescriptor, Bytes)>,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "write")?;
        for (descriptor, bytes) in writes {
            self.write_one(stream, descriptor, bytes)?;
        }
        Ok(())
    }

    fn write_from_slice(
        &mut self,
        descriptor: CopyDescriptor,
        data: &[u8],
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "write")?;
        if is_compact(&descriptor.shape, &descriptor.strides) {
            // Staged straight from the borrowed bytes: no intermediate host copy.
            self.write_pageable(stream, descriptor, data)
        } else {
            self.write_one(stream, descriptor, Bytes::from_slice(data))
        }
    }

    fn read(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        match self.read_inner(descriptors, stream) {
            Ok(future) => future,
            Err(e) => ready(Err(e)),
        }
    }

    fn get_resource(
        &mut self,
        binding: Binding,
        stream: StreamId,
    ) -> Result<CudaResource, ServerError> {
        self.settle()?;
        let resource = self.resolve(&binding)?;
        self.ensure_not_capturing(stream, "get_resource")?;
        if let Some(point) = binding.handle().access().last()
            && let Some(other) = self.streams.get_mut(point.stream)
        {
            other.queue.wait_idle(&mut self.events)?;
        }
        self.stream(stream)?;
        if let Some(state) = self.streams.get_mut(stream) {
            state.queue.wait_idle(&mut self.events)?;
        }
        Ok(resource)
    }

    unsafe fn launch(
        &mut self,
        kernel: CudaKernel,
        count: CubeCount,
        arguments: KernelArguments,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.settle()?;
        let definition = &kernel.definition;
        // The kernel's own limits (cube dimensions, shared and private memory) are checked once,
        // with the rest of the IR, when it is compiled.
        definition.check_arguments(&arguments)?;
        count.check(&self.properties.hardware)?;
        let compiled = self.compiled(&kernel, mode == ExecutionMode::Checked)?;
        let grid = match &count {
            CubeCount::Static(x, y, z) => [*x, *y, *z],
            CubeCount::Dynamic(binding) => self.dynamic_count(binding, stream)?,
        };
        if grid.contains(&0) {
            return Ok(());
        }
        let max = self.properties.hardware.max_cube_count;
        if grid.iter().zip(max).any(|(&g, m)| g > m) {
            return Err(LaunchError::CubeCountTooLarge {
                count: grid,
                maximum: max,
            }
            .into());
        }
        let layout = &compiled.layout;
        let mut slots: Vec<[u64; SLOT_WORDS]> =
            Vec::with_capacity(2 * layout.buffers + layout.meta.len() + layout.scalars.len());
        for (arg, decl) in arguments.buffers.iter().zip(definition.buffers()) {
            let resource = self.resolve(&arg.binding)?;
            let item = decl.item().size() as u64;
            let align = item.min(16);
            if resource.ptr % align != 0 {
                return Err(compute_core::error::LaunchError::MisalignedBuffer {
                    kernel: definition.name().into(),
                    name: decl.name.clone(),
                    offset: resource.ptr % align,
                    alignment: align,
                }
                .into());
            }
            let mut ptr = [0u64; SLOT_WORDS];
            ptr[0] = resource.ptr;
            let mut len = [0u64; SLOT_WORDS];
            len[0] = resource.len / item;
            slots.push(ptr);
            slots.push(len);
        }
        for &b in &layout.meta {
            let arg = &arguments.buffers[b];
            slots.push(meta_slot(&arg.shape, &arg.strides)?);
        }
        for value in &arguments.scalars {
            let mut slot = [0u64; SLOT_WORDS];
            slot[0] = value.native_bits();
            slots.push(slot);
        }
        let mut params: Vec<*mut core::ffi::c_void> =
            slots.iter_mut().map(|s| s.as_mut_ptr().cast()).collect();
        let mut bindings: Vec<&Binding> = arguments.buffers.iter().map(|b| &b.binding).collect();
        if let CubeCount::Dynamic(b) = &count {
            bindings.push(b);
        }
        self.order_after(stream, &bindings)?;
        let raw = self.stream(stream)?.queue.raw;
        let [bx, by, bz] = compiled.cube_dim;
        // SAFETY: the parameters match the generated signature (`ParamLayout`), every pointer is
        // a live device range kept alive by stream order or `mark`; for unchecked launches the
        // caller promised in-bounds accesses.
        unsafe {
            sys::cuLaunchKernel(
                compiled.function.0,
                grid[0],
                grid[1],
                grid[2],
                bx,
                by,
                bz,
                layout.shared_bytes as u32,
                raw.0,
                params.as_mut_ptr(),
                core::ptr::null_mut(),
            )
        }
        .result()
        .check("cuLaunchKernel")?;
        self.mark(stream, &bindings, None)
    }

    fn flush(&mut self, stream: StreamId) -> Result<(), ServerError> {
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

    fn sync(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
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

    fn stream_ids(&self) -> Vec<StreamId> {
        self.streams.ids()
    }

    fn memory_usage(&mut self, stream: StreamId) -> Result<MemoryUsage, ServerError> {
        self.context.bind()?;
        if let Some(state) = self.streams.get_mut(stream) {
            // What completed work kept alive (a dropped graph's buffers, say) is free by now:
            // report it so, without waiting for a later call to retire it.
            state.queue.retire_completed(&mut self.events);
        }
        self.stream(stream)?;
        Ok(self.streams.memory_usage(stream))
    }

    fn memory_cleanup(&mut self, stream: StreamId) {
        self.settle_quietly();
        if self.context.bind().is_err() {
            return;
        }
        // Freeing device or pinned memory synchronises the device implicitly, which invalidates
        // a capture running on any stream of it: while one runs, the cleanup waits for a later
        // call (what it would free stays pooled and reusable meanwhile).
        if self.streams.any_capturing() {
            return;
        }
        self.staging.release(&mut self.events);
        self.small_staging.release(&mut self.events);
        if let Some(state) = self.streams.get_mut(stream)
            && state.capture.is_none()
        {
            if let Err(e) = state.queue.wait_idle(&mut self.events) {
                crate::driver::record_release_error(e);
            }
            self.streams.cleanup(stream);
        }
    }

    fn retire_stream(&mut self, stream: StreamId, wait: bool) -> bool {
        let Some(raw) = self.streams.get(stream).map(|s| s.queue.raw) else {
            return true;
        };
        if self.context.bind().is_err() {
            return false;
        }
        // A capturing stream is not retired, and not even queried: a status query of a
        // capturing stream invalidates its capture.
        if self.streams.is_capturing(stream) {
            return false;
        }
        if wait {
            // The copy team's driver calls may target the stream.
            self.settle_quietly();
        } else {
            // Without waiting: nothing handed to the copy team, and the stream idle.
            if self.issuing.is_some() {
                return false;
            }
            // SAFETY: the stream is alive (owned by its state).
            let idle = unsafe { sys::cuStreamQuery(raw.0) } == sys::CUresult::CUDA_SUCCESS;
            if !idle {
                return false;
            }
        }
        let (staging, small_staging, events) =
            (&mut self.staging, &mut self.small_staging, &mut self.events);
        // Retired when not capturing (checked again), idle and holding no live handle. Dropping
        // the state frees its pools' device memory (the stream is idle by then) and synchronizes
        // and destroys the CUDA stream and its events.
        self.streams.try_retire(stream, |state| {
            // A staging slot whose copies ran on the stream gets its closing event now (the
            // stream is destroyed below); then its work completes and releases what it kept
            // alive.
            staging.close_on(state.queue.raw, events).is_ok()
                && small_staging.close_on(state.queue.raw, events).is_ok()
                && state.queue.wait_idle(events).is_ok()
        })
    }

    fn allocation_mode(
        &mut self,
        mode: MemoryAllocationMode,
        stream: StreamId,
    ) -> MemoryAllocationMode {
        self.stream(stream)
            .map_or(MemoryAllocationMode::Auto, |state| state.memory.mode(mode))
    }

    fn configure_memory_pools(
        &mut self,
        config: &MemoryPoolsConfig,
        stream: StreamId,
    ) -> Result<bool, PoolConfigError> {
        config.resolve(&self.properties.memory)?;
        self.settle_quietly();
        // Binds the context (the rebuild frees blocks) and creates the stream if needed; the
        // layout is kept for later streams even when that fails.
        let created = self.stream(stream).is_ok();
        let applied = self.streams.configure_memory_pools(config, stream)?;
        Ok(created && applied)
    }

    fn staging(&mut self, bytes: &mut [&mut Bytes], file_only: bool) -> Result<(), ServerError> {
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

    fn graph_prepare(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.settle()?;
        self.stream(stream)?.prepare_graph(stream)
    }

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

    fn profile_start(&mut self, stream: StreamId) -> Result<ProfileToken, ProfileError> {
        self.settle()?;
        self.ensure_not_capturing(stream, "profile")?;
        let raw = self.stream(stream)?.queue.raw;
        let event =
            Raw(result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .check("cuEventCreate")?);
        // SAFETY: event and stream are alive.
        unsafe { result::event::record(event.0, raw.0) }.check("cuEventRecord")?;
        let id = self.next_profile;
        self.next_profile += 1;
        self.profiles.insert(id, event);
        Ok(ProfileToken { id })
    }

    fn profile_end(
        &mut self,
        token: ProfileToken,
        stream: StreamId,
    ) -> DynFut<Result<ProfileDuration, ProfileError>> {
        let Some(start) = self.profiles.remove(&token.id) else {
            return ready(Err(ProfileError::Unavailable(format!(
                "profile token {} was not started on this server",
                token.id
            ))));
        };
        let end = (|| {
            self.settle()?;
            let raw = self.stream(stream)?.queue.raw;
            let end = Raw(result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .check("cuEventCreate")?);
            // SAFETY: event and stream are alive.
            unsafe { result::event::record(end.0, raw.0) }.check("cuEventRecord")?;
            Ok::<_, ServerError>(end)
        })();
        let context = self.context.clone();
        Box::pin(async move {
            let (start, end) = (start, end);
            let outcome = end.and_then(|end| {
                context.bind()?;
                // SAFETY: both events were recorded and are owned by this future.
                let waited = unsafe { result::event::synchronize(end.0) }.check("profile end");
                let elapsed = waited.and_then(|()| {
                    // SAFETY: both events were recorded and have completed.
                    unsafe { result::event::elapsed(start.0, end.0) }.check("cuEventElapsedTime")
                });
                // SAFETY: owned here, destroyed once.
                crate::driver::released("cuEventDestroy", unsafe { result::event::destroy(end.0) });
                elapsed
            });
            // SAFETY: owned here, destroyed once.
            crate::driver::released("cuEventDestroy", unsafe { result::event::destroy(start.0) });
            let ms = outcome?;
            Ok(ProfileDuration {
                duration: core::time::Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3),
                timing: TimingMethod::Device,
            })
        })
    }

    fn ensure_init_collective(
        &mut self,
        devices: &[DeviceId],
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.settle()?;
        let group = self.check_group(devices)?;
        self.stream(stream)?;
        crate::collective::communicator(&group, self.owner.device)?;
        if !self.collective_groups.contains(&group) {
            self.collective_groups.push(group);
        }
        Ok(())
    }

    fn all_reduce(
        &mut self,
        src: Binding,
        dst: Binding,
        dtype: ElemType,
        devices: Vec<DeviceId>,
        op: ReduceOperation,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.settle()?;
        let group = self.check_group(&devices)?;
        compute_core::collective::check_all_reduce(
            &group,
            self.collective_groups.contains(&group) && crate::collective::initialised(&group),
            src.size(),
            dst.size(),
            dtype,
        )?;
        crate::collective::data_type(dtype)?;
        crate::collective::communicator(&group, self.owner.device)?;
        let source = self.resolve(&src)?;
        let target = self.resolve(&dst)?;
        // The communication stream runs after the work of `stream` issued so far.
        self.stream(stream)?;
        let comm_stream = *self
            .comm_streams
            .entry(group.clone())
            .or_insert_with(StreamId::fresh);
        let user_seq = self.streams.get(stream).map_or(0, |s| s.queue.seq);
        if let Some(event) = self.marker(stream, user_seq)? {
            let raw = self.stream(comm_stream)?.queue.raw;
            // SAFETY: both alive.
            unsafe {
                result::stream::wait_event(
                    raw.0,
                    event.0,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }
            .check("cuStreamWaitEvent")?;
        }
        self.order_after(comm_stream, &[&src, &dst])?;
        let raw = self.stream(comm_stream)?.queue.raw;
        let count = (src.size() / dtype.size() as u64) as usize;
        if count > 0 {
            let me = self.owner.device;
            crate::collective::all_reduce(
                &group, me, source.ptr, target.ptr, count, dtype, op, raw,
            )?;
        }
        self.mark(comm_stream, &[&src, &dst], None)
    }

    fn sync_collective(&mut self, _stream: StreamId) -> DynFut<Result<(), ServerError>> {
        let comms: Vec<StreamId> = self.comm_streams.values().copied().collect();
        let waits: Vec<_> = comms.into_iter().map(|c| self.sync(c)).collect();
        Box::pin(async move {
            for wait in waits {
                wait.await?;
            }
            Ok(())
        })
    }
}

impl Drop for CudaServer {
    fn drop(&mut self) {
        self.settle_quietly();
        if self.context.bind().is_err() {
            return;
        }
        for (_, state) in self.streams.iter_mut() {
            if let Err(e) = state.queue.wait_idle(&mut self.events) {
                crate::driver::record_release_error(e);
            }
        }
        self.staging.release(&mut self.events);
        self.small_staging.release(&mut self.events);
        self.graphs.drain().for_each(drop);
        for (_, event) in self.profiles.drain() {
            // SAFETY: owned by the server; the streams are idle.
            crate::driver::released("cuEventDestroy", unsafe { result::event::destroy(event.0) });
        }
        for (_, state) in self.streams.drain() {
            // The CUDA stream is synchronized and destroyed first, then its pools are freed.
            let StreamEntry {
                memory,
                capture,
                queue,
            } = state;
            drop(queue);
            drop(memory);
            drop(capture);
        }
        self.kernels.clear();
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

    #[test]
    fn contiguous_tensors_are_one_linear_copy() {
        let blocks = row_blocks(&[3, 5], &[5, 1], 4);
        assert_eq!(blocks.len(), 1);
        assert_eq!((blocks[0].height, blocks[0].width), (1, 60));
        assert!(row_blocks(&[0, 5], &[5, 1], 4).is_empty());
    }

    #[test]
    fn compact_layouts_are_found_without_allocating() {
        assert!(is_compact(&[7], &[1]));
        assert!(is_compact(&[3, 5], &[5, 1]));
        // One padded row is still one run of bytes.
        assert!(is_compact(&[1, 5], &[32, 1]));
        assert!(!is_compact(&[3, 5], &[32, 1]));
        assert!(!is_compact(&[2, 3, 5], &[100, 8, 1]));
        assert!(!is_compact(&[0, 5], &[5, 1]));
        let pitched = compute_core::layout::pitched_strides(&[2, 3, 5], 4, 128);
        assert!(!is_compact(&[2, 3, 5], &pitched));
    }

    #[test]
    fn pitched_tensors_are_one_2d_copy() {
        let strides = compute_core::layout::pitched_strides(&[2, 3, 5], 4, 128);
        let blocks = row_blocks(&[2, 3, 5], &strides, 4);
        assert_eq!(blocks.len(), 1);
        let b = &blocks[0];
        // A 20-byte row pads to 32 bytes (the pitch scales with the row, up to 128).
        assert_eq!((b.height, b.pitch, b.width), (6, 32, 20));
    }

    #[test]
    fn irregular_strides_copy_plane_by_plane() {
        // Planes 100 elements apart, rows 8 apart: not uniform, one 2-D copy per plane.
        let blocks = row_blocks(&[2, 3, 5], &[100, 8, 1], 2);
        assert_eq!(blocks.len(), 2);
        assert_eq!((blocks[1].strided, blocks[1].compact), (200, 30));
        assert_eq!(
            (blocks[1].height, blocks[1].pitch, blocks[1].width),
            (3, 16, 10)
        );
    }

    #[test]
    fn launch_parameters_are_little_endian_words() {
        let slot = meta_slot(&[3, 4], &[4, 1]).unwrap();
        let words: &[u32] = bytemuck::cast_slice(&slot);
        assert_eq!(&words[..3], &[2, 3, 4]);
        assert_eq!(words[1 + MAX_RANK], 4);
        assert!(meta_slot(&[1; 9], &[1; 9]).is_err());
    }
}
