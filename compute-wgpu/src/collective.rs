//! Collectives between wgpu devices through host staging: each device's contribution is read
//! back, reduced on the host by compute-core's [`HostRendezvous`], and written to its output.
//! The bookkeeping (groups, round numbers, pending outputs, workers, errors) is compute-core's
//! [`HostCollectives`].
//!
//! A collective worker thread per server and group runs the group's rounds in issue order, off
//! the server lock (a round waits for the other devices of its group). Groups get their own
//! workers so that rounds of two groups sharing devices, issued in different orders on different
//! devices (two threads), cannot wait on each other. Until a round has written its output, later
//! work on the server that touches that output waits for it (which orders rounds of different
//! groups that share memory).

use compute_core::collective::{HostCollectives, HostRendezvous};
use compute_core::future::Receiver;
use compute_core::memory::SliceId;
use compute_core::{DeviceId, ElemType, ReduceOperation, ServerError};

use crate::storage::WgpuResource;

/// One device's part of an all-reduce, handed to the worker.
pub(crate) struct Round {
    /// Completes when `staging` holds the contribution.
    pub(crate) mapped: Receiver<Result<(), wgpu::BufferAsyncError>>,
    pub(crate) staging: wgpu::Buffer,
    pub(crate) delta: u64,
    pub(crate) len: u64,
    pub(crate) group: Vec<DeviceId>,
    pub(crate) seq: u64,
    pub(crate) me: DeviceId,
    pub(crate) dtype: ElemType,
    pub(crate) op: ReduceOperation,
    pub(crate) dst: WgpuResource,
    pub(crate) dst_slice: SliceId,
    /// When the output starts or ends inside a 4-byte word (wgpu writes whole words): the
    /// words it covers, read back with the contribution (`delta` = the output's start in them).
    /// The round merges its result into them, so the bytes of the words outside the output are
    /// written back as they were. Nothing else changes them in between: earlier work is before
    /// the read in queue order, and later work touching the output's slice (which holds those
    /// words: slices are aligned to at least 4 bytes) waits for the round.
    pub(crate) dst_words: Option<DstWords>,
}

/// The 4-byte words an unaligned output covers, being read back.
pub(crate) struct DstWords {
    pub(crate) mapped: Receiver<Result<(), wgpu::BufferAsyncError>>,
    pub(crate) staging: wgpu::Buffer,
    pub(crate) delta: u64,
}

/// The collective state of one server: compute-core's bookkeeping, with a worker per group.
pub(crate) type Collectives = HostCollectives<Vec<DeviceId>, Round>;

/// Queue a round on the worker of its group.
pub(crate) fn submit(
    collectives: &mut Collectives,
    queue: &wgpu::Queue,
    round: Round,
) -> Result<(), ServerError> {
    let group = round.group.clone();
    let slice = round.dst_slice;
    collectives.submit(&group, slice, round, "compute-wgpu collectives", || {
        let queue = queue.clone();
        move |round| run_round(round, &queue)
    })
}

fn run_round(round: Round, queue: &wgpu::Queue) -> Result<(), ServerError> {
    let mapped = compute_core::block_on(round.mapped)
        .ok_or_else(|| ServerError::Driver("the read of a collective input was dropped".into()))?;
    mapped.map_err(|e| ServerError::Driver(format!("reading a collective input: {e}")))?;
    let data = {
        let view = round
            .staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| ServerError::Driver(format!("reading a collective input: {e}")))?;
        view[round.delta as usize..(round.delta + round.len) as usize].to_vec()
    };
    round.staging.unmap();
    let out = HostRendezvous::global().all_reduce(
        &round.group,
        round.seq,
        round.me,
        data,
        round.dtype,
        round.op,
    )?;
    match round.dst_words {
        None => crate::server::write_aligned(queue, &round.dst, &out)?,
        Some(words) => {
            let mapped = compute_core::block_on(words.mapped).ok_or_else(|| {
                ServerError::Driver("the read of a collective output's edges was dropped".into())
            })?;
            mapped.map_err(|e| ServerError::Driver(format!("reading a collective output: {e}")))?;
            let mut merged = words
                .staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| ServerError::Driver(format!("reading a collective output: {e}")))?
                .to_vec();
            words.staging.unmap();
            let delta = words.delta as usize;
            let start = round.dst.offset - words.delta;
            if !merged.len().is_multiple_of(4) || merged.len() < delta + out.len() {
                return Err(ServerError::Unsupported(format!(
                    "wgpu: a collective output of {} bytes at byte {} ends inside the last word \
                     of a buffer of {} bytes",
                    out.len(),
                    round.dst.offset,
                    round.dst.buffer.size()
                )));
            }
            merged[delta..delta + out.len()].copy_from_slice(&out);
            queue.write_buffer(&round.dst.buffer, start, &merged);
        }
    }
    queue.submit([]);
    Ok(())
}
