//! NCCL communicators, shared by the servers of one process.
//!
//! In one process, the first server of a group to call `ensure_init_collective` creates the
//! communicators of every device of the group at once (`ncclCommInitAll`); each server then uses
//! its own rank's. A group of one device gets a one-rank communicator, which NCCL runs as a local
//! copy.
//!
//! When the process has joined a world of processes (compute-core's
//! [`init_world`](compute_core::collective::init_world)), a group spans every process: the
//! processes exchange their group sizes and rank 0's `ncclGetUniqueId` through rank 0's store (one
//! key per communicator, `nccl/<communicator>/...`), meet at a store barrier, and each process
//! creates the communicators of its own devices with `ncclCommInitRank`, inside
//! `ncclGroupStart`/`ncclGroupEnd` (a process may drive several ranks). The NCCL ranks follow
//! the world's ranks, then the order of the devices in each process's group.
//!
//! Several devices of a group are often driven by one thread (`all_reduce` on the client of each
//! device in turn), and NCCL may block inside one device's call until the others' arrive: such
//! calls must reach NCCL together, inside one `ncclGroupStart`/`ncclGroupEnd`. Each device's
//! `all_reduce` therefore *arrives* at the process's [`Gathered`] meeting point with its part;
//! the arrival that completes the round (every device of the group in this process) issues the
//! whole round as one NCCL group call, whatever thread it is on. Until then the call's buffers
//! are held by the round; once issued, by the process until their server records them on its
//! communication stream (after the NCCL kernel). A use of the result on the device
//! ([`CudaServer::marker`] on the communication stream, `sync_collective`) first waits for the
//! round to be issued, at most the rendezvous timeout: one thread that waits on a device before
//! it issued the other devices' calls gets [`CollectiveError::Timeout`], not a hang.
//!
//! With `COMPUTE_COLLECTIVE_CHECK=1` (or `compute_core::collective::set_checked(true)`), every all-reduce first exchanges a 32-byte header (round,
//! element type, operation, element count) with `ncclAllGather` and waits for it, at most the
//! rendezvous timeout: participants that disagree all get
//! [`CollectiveError::Mismatch`](compute_core::collective::CollectiveError), and none runs the
//! reduction; a participant that never comes makes the others abort the communicator and fail
//! with a timeout. The check waits on the host, so each rank must be driven by its own thread
//! (one process per GPU, as launchers start them).

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use compute_core::backend::ServerKit;
use compute_core::collective::{
    AllReduce, CHECK_VAR, CollectiveError, Gathered, MismatchKind, World,
};
use compute_core::future::DynFut;
use compute_core::handle::HandleOwner;
use compute_core::{
    Binding, ComputeServer, DeviceId, ElemType, ReduceOperation, ServerCollective, ServerError,
    StreamId,
};
use cudarc::driver::{result as driver, sys as driver_sys};
use cudarc::nccl::{result as nccl, sys};
use hashbrown::HashMap;

use crate::driver::{Check, Context, Raw};
use crate::server::CudaServer;

/// Bytes of the header the checked mode exchanges.
const HEADER: usize = 32;
const MAGIC: u32 = 0x4b48_4343;

/// One group's communicators in this process.
struct Group {
    /// By position of the device in the group.
    comms: Vec<Raw<sys::ncclComm_t>>,
    /// The primary contexts of the group's devices, retained while the communicators live.
    _contexts: Vec<Context>,
    /// The checked mode's per-device state, by position.
    checks: Vec<Option<HeaderCheck>>,
    /// The error that broke the group (a checked exchange that timed out aborts it).
    failed: Option<CollectiveError>,
}

/// Device buffers and the round counter of one device's header exchanges.
struct HeaderCheck {
    send: u64,
    recv: u64,
    ranks: usize,
    round: u64,
}

type Comms = HashMap<Vec<DeviceId>, Group>;

/// A process-wide table, locked (a panic while it was held leaves it usable: its entries are
/// each complete).
fn global<T: Default>(cell: &'static OnceLock<Mutex<T>>) -> MutexGuard<'static, T> {
    cell.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn registry() -> MutexGuard<'static, Comms> {
    static COMMS: OnceLock<Mutex<Comms>> = OnceLock::new();
    global(&COMMS)
}

fn nccl_error(what: &str, e: nccl::NcclError) -> ServerError {
    ServerError::Driver(format!("{what}: {e:?}"))
}

/// The communicators of `group` within this process (`ncclCommInitAll`).
fn init_local(group: &[DeviceId]) -> Result<Group, ServerError> {
    let devices: Vec<i32> = group.iter().map(|d| d.index_id as i32).collect();
    let mut raw = vec![core::ptr::null_mut(); devices.len()];
    // SAFETY: `raw` has room for one communicator per device of `devices`.
    unsafe { nccl::comm_init_all(raw.as_mut_ptr(), devices.len() as i32, devices.as_ptr()) }
        .map_err(|e| nccl_error("ncclCommInitAll", e))?;
    Ok(Group {
        checks: raw.iter().map(|_| None).collect(),
        comms: raw.into_iter().map(Raw).collect(),
        _contexts: Vec::new(),
        failed: None,
    })
}

fn u64_of(bytes: &[u8], what: &str) -> Result<u64, ServerError> {
    let arr: [u8; 8] = bytes.try_into().map_err(|_| {
        ServerError::from(CollectiveError::Protocol(format!(
            "{what}: {} bytes, expected 8",
            bytes.len()
        )))
    })?;
    Ok(u64::from_le_bytes(arr))
}

/// The communicators of this process's devices of `group`, a group spanning `world`.
fn init_world(world: &World, group: &[DeviceId], me: usize) -> Result<Group, ServerError> {
    let key = world.communicator(group);
    let prefix = format!("nccl/{key}");
    world.set(
        &format!("{prefix}/count/{}", world.rank()),
        &(group.len() as u64).to_le_bytes(),
    )?;
    let mut counts = Vec::with_capacity(world.size());
    for rank in 0..world.size() {
        let what = format!("{prefix}/count/{rank}");
        counts.push(u64_of(&world.get(&what)?, &what)? as usize);
    }
    let base: usize = counts[..world.rank()].iter().sum();
    let ranks: usize = counts.iter().sum();
    let id_key = format!("{prefix}/id");
    let id = if world.rank() == 0 {
        let id = nccl::get_uniqueid().map_err(|e| nccl_error("ncclGetUniqueId", e))?;
        let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
        world.set(&id_key, &bytes)?;
        id
    } else {
        let bytes = world.get(&id_key)?;
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        if bytes.len() != id.internal.len() {
            return Err(CollectiveError::Protocol(format!(
                "{id_key}: {} bytes, expected {}",
                bytes.len(),
                id.internal.len()
            ))
            .into());
        }
        for (d, s) in id.internal.iter_mut().zip(bytes) {
            *d = s as core::ffi::c_char;
        }
        id
    };
    // Every rank holds the id: NCCL's (unbounded) init starts only once all are here.
    world.barrier(&format!("{prefix}/ready"))?;
    let contexts: Vec<Context> = group
        .iter()
        .map(|d| Context::retain(d.index_id))
        .collect::<Result<_, _>>()?;
    let mut raw = vec![core::ptr::null_mut(); group.len()];
    nccl::group_start().map_err(|e| nccl_error("ncclGroupStart", e))?;
    let mut init = Ok(());
    for (i, ctx) in contexts.iter().enumerate() {
        init = ctx.bind().and_then(|()| {
            // SAFETY: `raw[i]` receives the communicator; `id` is the world's, `base + i` a rank
            // below `ranks`; the device's context is current.
            unsafe { nccl::comm_init_rank(&mut raw[i], ranks as i32, id, (base + i) as i32) }
                .map(drop)
                .map_err(|e| nccl_error("ncclCommInitRank", e))
        });
        if init.is_err() {
            break;
        }
    }
    let ended = nccl::group_end().map_err(|e| nccl_error("ncclGroupEnd", e));
    // Leave the calling server's own context current.
    contexts[me].bind()?;
    init?;
    ended?;
    Ok(Group {
        checks: raw.iter().map(|_| None).collect(),
        comms: raw.into_iter().map(Raw).collect(),
        _contexts: contexts,
        failed: None,
    })
}

/// The communicator of `me` in `group` (sorted, deduplicated), creating the group's on first use.
pub(crate) fn communicator(
    group: &[DeviceId],
    me: DeviceId,
) -> Result<Raw<sys::ncclComm_t>, ServerError> {
    let rank = group.iter().position(|d| *d == me).ok_or_else(|| {
        ServerError::from(compute_core::collective::CollectiveError::NotInGroup {
            group: group.to_vec(),
            device: me,
        })
    })?;
    let mut comms = registry();
    if let Some(g) = comms.get(group) {
        if let Some(e) = &g.failed {
            return Err(e.clone().into());
        }
        return Ok(g.comms[rank]);
    }
    if !crate::driver::nccl_available() {
        return Err(ServerError::Unavailable(
            "libnccl not found: collectives need NCCL".into(),
        ));
    }
    // NCCL is configured by its own environment (`NCCL_*`), which the runtime leaves to the
    // user: it writes no environment variable. Hosts that must keep NVLink multicast off set
    // `NCCL_NVLS_ENABLE=0` themselves (no `ncclConfig_t` field turns NVLS off).
    let created = match compute_core::collective::world::world() {
        Some(world) => init_world(world, group, rank)?,
        None => init_local(group)?,
    };
    let mine = created.comms[rank];
    comms.insert(group.to_vec(), created);
    Ok(mine)
}

/// Whether the group has communicators already.
pub(crate) fn initialised(group: &[DeviceId]) -> bool {
    registry().contains_key(group)
}

/// NCCL's type for `dtype`.
pub(crate) fn data_type(dtype: ElemType) -> Result<sys::ncclDataType_t, ServerError> {
    use sys::ncclDataType_t as T;
    Ok(match dtype {
        ElemType::I8 => T::ncclInt8,
        ElemType::U8 => T::ncclUint8,
        ElemType::I32 => T::ncclInt32,
        ElemType::U32 => T::ncclUint32,
        ElemType::I64 => T::ncclInt64,
        ElemType::U64 => T::ncclUint64,
        ElemType::F16 => T::ncclFloat16,
        ElemType::BF16 => T::ncclBfloat16,
        ElemType::F32 => T::ncclFloat32,
        ElemType::F64 => T::ncclFloat64,
        other => {
            return Err(ServerError::Unsupported(format!(
                "all_reduce over {other} (NCCL has no such type)"
            )));
        }
    })
}

/// NCCL's operation for `op`.
pub(crate) fn reduce_op(op: ReduceOperation) -> sys::ncclRedOp_t {
    match op {
        ReduceOperation::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOperation::Mean => sys::ncclRedOp_t::ncclAvg,
        ReduceOperation::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOperation::Min => sys::ncclRedOp_t::ncclMin,
    }
}

fn header_bytes(round: u64, dtype: ElemType, op: ReduceOperation, count: usize) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..12].copy_from_slice(&round.to_le_bytes());
    h[12..16].copy_from_slice(&(data_type(dtype).map_or(u32::MAX, |t| t as u32)).to_le_bytes());
    h[16..20].copy_from_slice(&(op as u32).to_le_bytes());
    h[20..28].copy_from_slice(&(count as u64).to_le_bytes());
    h
}

/// Compare the gathered headers with ours: the first disagreement, naming the NCCL rank.
fn compare_headers(
    ours: &[u8; HEADER],
    all: &[u8],
    dtype: ElemType,
    op: ReduceOperation,
    count: usize,
) -> Result<(), CollectiveError> {
    let word = |h: &[u8], at: usize, n: usize| {
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(&h[at..at + n]);
        u64::from_le_bytes(v)
    };
    let round = word(ours, 4, 8);
    for (rank, theirs) in all.chunks_exact(HEADER).enumerate() {
        let mismatch = |kind, expected: String, found: String| CollectiveError::Mismatch {
            round,
            kind,
            expected,
            found,
            participant: format!("NCCL rank {rank}"),
        };
        if word(theirs, 0, 4) != MAGIC as u64 {
            return Err(CollectiveError::Protocol(format!(
                "NCCL rank {rank} sent no collective header (is {CHECK_VAR}=1 set on every rank?)"
            )));
        }
        if word(theirs, 4, 8) != round {
            return Err(mismatch(
                MismatchKind::Round,
                round.to_string(),
                word(theirs, 4, 8).to_string(),
            ));
        }
        if word(theirs, 12, 4) != word(ours, 12, 4) {
            return Err(mismatch(
                MismatchKind::DType,
                dtype.to_string(),
                format!("NCCL type {}", word(theirs, 12, 4)),
            ));
        }
        if word(theirs, 16, 4) != word(ours, 16, 4) {
            return Err(mismatch(
                MismatchKind::Operation,
                format!("{op:?}"),
                format!("operation {}", word(theirs, 16, 4)),
            ));
        }
        if word(theirs, 20, 8) != count as u64 {
            return Err(mismatch(
                MismatchKind::Size,
                format!("{count} elements"),
                format!("{} elements", word(theirs, 20, 8)),
            ));
        }
    }
    Ok(())
}

/// The checked mode: exchange headers over `comm` on `stream` and wait (bounded) for them.
fn check_header(
    group: &[DeviceId],
    me: usize,
    comm: Raw<sys::ncclComm_t>,
    dtype: ElemType,
    op: ReduceOperation,
    count: usize,
    stream: Raw<driver_sys::CUstream>,
) -> Result<(), ServerError> {
    let (send, recv, ranks, round) = {
        let mut comms = registry();
        let g = comms.get_mut(group).ok_or_else(|| {
            ServerError::from(compute_core::collective::CollectiveError::NotInitialised {
                group: group.to_vec(),
            })
        })?;
        if let Some(e) = &g.failed {
            return Err(e.clone().into());
        }
        if g.checks[me].is_none() {
            // SAFETY: writes one int.
            let ranks = unsafe { nccl::comm_count(comm.0) }
                .map_err(|e| nccl_error("ncclCommCount", e))? as usize;
            // SAFETY: the calling server's context is current; the buffers live as long as the
            // process's communicators (never freed, 32 bytes per rank).
            let send = unsafe { driver::malloc_sync(HEADER) }.check("cuMemAlloc (header)")?;
            // SAFETY: as above.
            let recv =
                unsafe { driver::malloc_sync(HEADER * ranks) }.check("cuMemAlloc (headers)")?;
            g.checks[me] = Some(HeaderCheck {
                send,
                recv,
                ranks,
                round: 0,
            });
        }
        let Some(c) = g.checks[me].as_mut() else {
            unreachable!("set just above")
        };
        c.round += 1;
        (c.send, c.recv, c.ranks, c.round)
    };
    let ours = header_bytes(round, dtype, op, count);
    let mut all = vec![0u8; HEADER * ranks];
    // SAFETY: `send` holds HEADER bytes, `recv` HEADER * ranks, `all` as many on the host; the
    // stream is alive and waited for below before `ours` and `all` go.
    unsafe {
        driver::memcpy_htod_async(send, &ours[..], stream.0).check("cuMemcpyHtoDAsync (header)")?;
        nccl::all_gather(
            send as *const _,
            recv as *mut _,
            HEADER,
            sys::ncclDataType_t::ncclUint8,
            comm.0,
            stream.0.cast(),
        )
        .map_err(|e| nccl_error("ncclAllGather (header)", e))?;
        driver::memcpy_dtoh_async(&mut all[..], recv, stream.0)
            .check("cuMemcpyDtoHAsync (headers)")?;
    }
    let timeout = compute_core::collective::rendezvous_timeout();
    let deadline = Instant::now() + timeout;
    // Bounded by the deadline.
    loop {
        // SAFETY: the stream is alive.
        match unsafe { driver_sys::cuStreamQuery(stream.0) } {
            driver_sys::CUresult::CUDA_SUCCESS => break,
            driver_sys::CUresult::CUDA_ERROR_NOT_READY if Instant::now() < deadline => {
                // A peer that died shows up as NCCL's asynchronous error (a remote or system
                // error); end the wait then, rather than at the deadline.
                let mut state = sys::ncclResult_t::ncclSuccess;
                // SAFETY: `comm` is alive; writes one result.
                let asked = unsafe { sys::ncclCommGetAsyncError(comm.0, &mut state) };
                if asked == sys::ncclResult_t::ncclSuccess
                    && !matches!(
                        state,
                        sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
                    )
                {
                    let e = CollectiveError::Io {
                        what: format!("NCCL, in the header exchange of round {round} of {group:?}"),
                        reason: format!("{state:?} (a rank failed or left)"),
                    };
                    // SAFETY: the communicator is not used after an abort (the group is failed).
                    if let Err(abort) = unsafe { nccl::comm_abort(comm.0) } {
                        compute_core::error::report_unreturned(
                            "cuda: ncclCommAbort of a failed group",
                            &format!("{abort:?}"),
                        );
                    }
                    if let Some(g) = registry().get_mut(group) {
                        g.failed = Some(e.clone());
                    }
                    return Err(e.into());
                }
                std::thread::sleep(core::time::Duration::from_micros(200));
            }
            driver_sys::CUresult::CUDA_ERROR_NOT_READY => {
                let e = CollectiveError::Timeout {
                    waiting_for: format!(
                        "every NCCL rank of {group:?} to exchange the header of round {round}"
                    ),
                    timeout_ms: timeout.as_millis() as u64,
                };
                // SAFETY: the communicator is not used after an abort (the group is failed).
                if let Err(abort) = unsafe { nccl::comm_abort(comm.0) } {
                    compute_core::error::report_unreturned(
                        "cuda: ncclCommAbort of a failed group",
                        &format!("{abort:?}"),
                    );
                }
                if let Some(g) = registry().get_mut(group) {
                    g.failed = Some(e.clone());
                }
                return Err(e.into());
            }
            other => {
                return Err(ServerError::Driver(format!(
                    "cuStreamQuery after the header exchange: {other:?}"
                )));
            }
        }
    }
    compare_headers(&ours, &all, dtype, op, count).map_err(ServerError::from)
}

/// One device's `all_reduce`, gathered until its round is whole (see the module docs).
pub(crate) struct Call {
    comm: Raw<sys::ncclComm_t>,
    src: u64,
    dst: u64,
    count: usize,
    dtype: ElemType,
    op: ReduceOperation,
    stream: Raw<cudarc::driver::sys::CUstream>,
    /// The server that made the call, and the buffers it keeps alive.
    owner: HandleOwner,
    keep: [Binding; 2],
}

impl Call {
    /// Enqueue this call's `ncclAllReduce` on its stream.
    fn enqueue(&self) -> Result<(), ServerError> {
        let dt = data_type(self.dtype)?;
        // SAFETY: `src` and `dst` are device ranges of `count` elements, kept alive by the
        // call's bindings (then by `issued` until their stream holds them); `comm` lives in the
        // process registry; the stream is alive while its server has a call in a round (a
        // server waits for its rounds before it drops).
        unsafe {
            nccl::all_reduce(
                self.src as *const _,
                self.dst as *mut _,
                self.count,
                dt,
                reduce_op(self.op),
                self.comm.0,
                self.stream.0.cast(),
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_error("ncclAllReduce", e))
    }
}

/// The process's meeting point of `all_reduce` calls.
fn gathered() -> &'static Gathered<Call> {
    static GATHERED: OnceLock<Gathered<Call>> = OnceLock::new();
    GATHERED.get_or_init(Gathered::new)
}

/// Issued calls' buffers by server, with the call's group: held until that server records them
/// on its communication stream ([`CudaServer::collect_issued`]).
type Issued = HashMap<HandleOwner, Vec<(Vec<DeviceId>, [Binding; 2])>>;

fn issued() -> MutexGuard<'static, Issued> {
    static ISSUED: OnceLock<Mutex<Issued>> = OnceLock::new();
    global(&ISSUED)
}

/// The first disagreement of a round's calls (element type, operation, element count): NCCL
/// would hang or read past a buffer on one.
fn disagreement(round: u64, calls: &[(DeviceId, Call)]) -> Option<CollectiveError> {
    let (_, first) = calls.first()?;
    calls.iter().skip(1).find_map(|(device, c)| {
        let mismatch = |kind, expected: String, found: String| CollectiveError::Mismatch {
            round,
            kind,
            expected,
            found,
            participant: format!("device {device}"),
        };
        if c.dtype != first.dtype {
            Some(mismatch(
                MismatchKind::DType,
                first.dtype.to_string(),
                c.dtype.to_string(),
            ))
        } else if c.op != first.op {
            Some(mismatch(
                MismatchKind::Operation,
                format!("{:?}", first.op),
                format!("{:?}", c.op),
            ))
        } else if c.count != first.count {
            Some(mismatch(
                MismatchKind::Size,
                format!("{} elements", first.count),
                format!("{} elements", c.count),
            ))
        } else {
            None
        }
    })
}

/// Issue a whole round: every call's `ncclAllReduce` inside one NCCL group, then hand the
/// buffers to their servers.
fn issue_round(
    group: &[DeviceId],
    round: u64,
    calls: Vec<(DeviceId, Call)>,
) -> Result<(), ServerError> {
    if let Some(e) = disagreement(round, &calls) {
        return Err(e.into());
    }
    nccl::group_start().map_err(|e| nccl_error("ncclGroupStart", e))?;
    let enqueued = calls.iter().try_for_each(|(_, c)| c.enqueue());
    let ended = nccl::group_end().map_err(|e| nccl_error("ncclGroupEnd", e));
    let mut held = issued();
    for (_, c) in calls {
        held.entry(c.owner)
            .or_default()
            .push((group.to_vec(), c.keep));
    }
    enqueued.and(ended.map(|_| ()))
}

/// The checked mode's all-reduce: the header exchange with the other ranks (waited for on the
/// host: one thread per rank, by the mode's contract), then the call at once.
fn checked_all_reduce(group: &[DeviceId], me: DeviceId, call: &Call) -> Result<(), ServerError> {
    let position = group.iter().position(|d| *d == me).unwrap_or(0);
    check_header(
        group,
        position,
        call.comm,
        call.dtype,
        call.op,
        call.count,
        call.stream,
    )?;
    call.enqueue()
}

/// The server's collective calls: one communication stream per group, ordered after the work of
/// the calling stream.
impl CudaServer {
    /// The group `devices` (sorted, deduplicated), checked against this server's device and
    /// the devices of the process.
    pub(crate) fn check_group(&self, devices: &[DeviceId]) -> Result<Vec<DeviceId>, ServerError> {
        compute_core::collective::check_group(
            devices,
            self.owner.device,
            crate::driver::device_count(),
            "CUDA",
        )
    }
}

impl CudaServer {
    /// Record the buffers of this server's issued calls on their communication streams (after
    /// the NCCL kernels), taking them from the process's hold.
    pub(crate) fn collect_issued(&mut self) -> Result<(), ServerError> {
        let Some(mine) = issued().remove(&self.owner) else {
            return Ok(());
        };
        for (group, [src, dst]) in mine {
            if let Some(&comm_stream) = self.comm_streams.get(&group) {
                self.mark(comm_stream, [&src, &dst], None)?;
            }
        }
        Ok(())
    }

    /// Wait until this server's rounds of `group` are issued (at most the rendezvous timeout),
    /// then record their buffers.
    pub(crate) fn await_round(&mut self, group: &[DeviceId]) -> Result<(), ServerError> {
        let me = self.owner.device;
        if gathered().pending(group, me) {
            gathered().wait(group, me, compute_core::collective::rendezvous_timeout())?;
        } else {
            // A failure of a round another server issued is this call's to return.
            gathered().wait(group, me, std::time::Duration::ZERO)?;
        }
        self.collect_issued()
    }

    /// The group whose communication stream is `stream`, if it is one.
    pub(crate) fn comm_group(&self, stream: StreamId) -> Option<Vec<DeviceId>> {
        self.comm_streams
            .iter()
            .find(|(_, s)| **s == stream)
            .map(|(g, _)| g.clone())
    }
}

impl ServerCollective for CudaServer {
    /// `ensure_init_collective`: the group's NCCL communicator, made once.
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

    /// `all_reduce`: on the group's communication stream, after the work of `stream` issued so
    /// far.
    fn all_reduce(&mut self, reduce: AllReduce, stream: StreamId) -> Result<(), ServerError> {
        self.settle()?;
        let group = self.check_group(&reduce.devices)?;
        reduce.check(
            &group,
            self.collective_groups.contains(&group) && crate::collective::initialised(&group),
        )?;
        crate::collective::data_type(reduce.dtype)?;
        crate::collective::communicator(&group, self.owner.device)?;
        let source = self.resolve(&reduce.src)?;
        let target = self.resolve(&reduce.dst)?;
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
                driver::stream::wait_event(
                    raw.0,
                    event.0,
                    driver_sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }
            .check("cuStreamWaitEvent")?;
        }
        self.order_after(comm_stream, [&reduce.src, &reduce.dst])?;
        let raw = self.stream(comm_stream)?.queue.raw;
        let count = (reduce.src.size() / reduce.dtype.size() as u64) as usize;
        let me = self.owner.device;
        if count > 0 {
            let call = Call {
                comm: crate::collective::communicator(&group, me)?,
                src: source.ptr,
                dst: target.ptr,
                count,
                dtype: reduce.dtype,
                op: reduce.op,
                stream: raw,
                owner: self.owner,
                keep: [reduce.src.clone(), reduce.dst.clone()],
            };
            if compute_core::collective::checked() {
                checked_all_reduce(&group, me, &call)?;
                return self.mark(comm_stream, [&reduce.src, &reduce.dst], None);
            }
            let issue = |round, calls| {
                let issued = issue_round(&group, round, calls);
                // NCCL made the other devices' contexts current to enqueue their kernels.
                crate::driver::forget_current_context();
                issued
            };
            let arrived = gathered().arrive(&group, me, call, issue);
            self.context.bind()?;
            arrived?;
        }
        // Later uses of the buffers order after the communication stream (a use before the round
        // is issued waits for it first: `marker`).
        self.mark(comm_stream, [&reduce.src, &reduce.dst], None)?;
        self.collect_issued()
    }

    /// `sync_collective`: every communication stream's sync, once this server's rounds are
    /// issued.
    fn sync_collective(&mut self, _stream: StreamId) -> DynFut<Result<(), ServerError>> {
        let groups: Vec<Vec<DeviceId>> = self.comm_streams.keys().cloned().collect();
        for group in &groups {
            if let Err(e) = self.await_round(group) {
                return Box::pin(core::future::ready(Err(e)));
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_compare() {
        let ours = header_bytes(3, ElemType::F32, ReduceOperation::Sum, 10);
        let same = [ours, ours].concat();
        assert!(compare_headers(&ours, &same, ElemType::F32, ReduceOperation::Sum, 10).is_ok());
        let cases = [
            (
                header_bytes(3, ElemType::I32, ReduceOperation::Sum, 10),
                MismatchKind::DType,
            ),
            (
                header_bytes(3, ElemType::F32, ReduceOperation::Max, 10),
                MismatchKind::Operation,
            ),
            (
                header_bytes(3, ElemType::F32, ReduceOperation::Sum, 11),
                MismatchKind::Size,
            ),
            (
                header_bytes(4, ElemType::F32, ReduceOperation::Sum, 10),
                MismatchKind::Round,
            ),
        ];
        for (theirs, kind) in cases {
            let all = [ours, theirs].concat();
            let e =
                compare_headers(&ours, &all, ElemType::F32, ReduceOperation::Sum, 10).unwrap_err();
            assert!(
                matches!(&e, CollectiveError::Mismatch { kind: k, participant, round: 3, .. }
                    if *k == kind && participant == "NCCL rank 1"),
                "{e:?}"
            );
        }
        let zero = [ours, [0; HEADER]].concat();
        assert!(matches!(
            compare_headers(&ours, &zero, ElemType::F32, ReduceOperation::Sum, 10),
            Err(CollectiveError::Protocol(_))
        ));
    }
}
