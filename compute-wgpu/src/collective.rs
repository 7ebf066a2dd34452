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

use compute_core::collective::{AllReduce, HostCollectives, HostRendezvous};
use compute_core::future::{DynFut, Receiver};
use compute_core::memory::SliceId;
use compute_core::{DeviceId, ElemType, ReduceOperation, ServerCollective, ServerError, StreamId};

use crate::server::WgpuServer;
use crate::storage::WgpuResource;
use crate::transfer::{Staging, map_read};

/// One device's part of an all-reduce, handed to the worker.
pub(crate) struct Round {
    /// Completes when `staging` holds the contribution.
    pub(crate) mapped: Receiver<Result<(), wgpu::BufferAsyncError>>,
    pub(crate) staging: Staging,
    pub(crate) delta: u64,
    pub(crate) len: u64,
    pub(crate) group: Vec<DeviceId>,
    pub(crate) seq: u64,
    pub(crate) me: DeviceId,
    pub(crate) dtype: ElemType,
    pub(crate) op: ReduceOperation,
    pub(crate) dst: WgpuResource,
    pub(crate) dst_slice: SliceId,
    /// The 4-byte words the output covers only partly (an unaligned head, an unaligned tail;
    /// wgpu writes whole words), read back with the contribution: the round merges its result
    /// into them, so the words' bytes outside the output are written back as they were.
    /// Nothing else changes them in between: earlier work is before the read in queue order, and
    /// later work touching the output's slice (which holds those words: slices are aligned to at
    /// least 4 bytes) waits for the round.
    pub(crate) edges: Vec<EdgeWord>,
}

/// One 4-byte word an unaligned output covers partly, being read back.
pub(crate) struct EdgeWord {
    /// Byte offset of the word in the output's buffer.
    pub(crate) at: u64,
    pub(crate) mapped: Receiver<Result<(), wgpu::BufferAsyncError>>,
    pub(crate) staging: Staging,
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
    // The whole words of the output, then its partly covered edge words, merged.
    let start = round.dst.offset;
    let end = start + out.len() as u64;
    let (lo, hi) = (start.next_multiple_of(4), end / 4 * 4);
    if lo < hi {
        queue.write_buffer(
            &round.dst.buffer,
            lo,
            &out[(lo - start) as usize..(hi - start) as usize],
        );
    }
    for edge in round.edges {
        let mapped = compute_core::block_on(edge.mapped).ok_or_else(|| {
            ServerError::Driver("the read of a collective output's edge was dropped".into())
        })?;
        mapped.map_err(|e| ServerError::Driver(format!("reading a collective output: {e}")))?;
        let mut word = [0u8; 4];
        word.copy_from_slice(
            &edge
                .staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| ServerError::Driver(format!("reading a collective output: {e}")))?
                [..4],
        );
        edge.staging.unmap();
        for (b, byte) in word.iter_mut().enumerate() {
            let at = edge.at + b as u64;
            if (start..end).contains(&at) {
                *byte = out[(at - start) as usize];
            }
        }
        queue.write_buffer(&round.dst.buffer, edge.at, &word);
    }
    queue.submit([]);
    Ok(())
}

impl ServerCollective for WgpuServer {
    /// `ensure_init_collective`: the group registered with the host rendezvous and this server.
    fn ensure_init_collective(
        &mut self,
        devices: &[DeviceId],
        _stream: StreamId,
    ) -> Result<(), ServerError> {
        self.collectives.init(devices)
    }

    /// `all_reduce`: stage this device's contribution (and the output's partly covered words)
    /// and hand the round to the group's worker.
    fn all_reduce(&mut self, reduce: AllReduce, _stream: StreamId) -> Result<(), ServerError> {
        let group = self.collectives.check_all_reduce(&reduce)?;
        let source = self.resolve(&reduce.src)?;
        let target = self.resolve(&reduce.dst)?;
        let (staging, delta) = if source.size == 0 {
            (self.readback_buffer("compute-wgpu empty collective", 4), 0)
        } else {
            self.stage_read(&source, source.size)?
        };
        // The words the output covers only partly, read back with the contribution.
        let (start, end) = (target.offset, target.offset + target.size);
        let mut edge_words = Vec::new();
        if target.size > 0 && !start.is_multiple_of(4) {
            edge_words.push(start / 4 * 4);
        }
        if target.size > 0 && !end.is_multiple_of(4) && edge_words.last() != Some(&(end / 4 * 4)) {
            edge_words.push(end / 4 * 4);
        }
        let mut edge_reads = Vec::with_capacity(edge_words.len());
        for &at in &edge_words {
            let word = WgpuResource {
                buffer: target.buffer.clone(),
                offset: at,
                size: 4,
            };
            edge_reads.push((at, self.stage_read(&word, 4)?.0));
        }
        let index = self.submit_always()?;
        let mapped = map_read(&staging);
        let edges = edge_reads
            .into_iter()
            .map(|(at, staging)| crate::collective::EdgeWord {
                at,
                mapped: map_read(&staging),
                staging,
            })
            .collect();
        self.poller.wait(index, None);
        let seq = self.collectives.next_round(&group, self.owner.device);
        let round = Round {
            mapped,
            staging,
            delta,
            len: source.size,
            group,
            seq,
            me: self.owner.device,
            dtype: reduce.dtype,
            op: reduce.op,
            dst: target,
            dst_slice: reduce.dst.handle().memory().id(),
            edges,
        };
        crate::collective::submit(&mut self.collectives, &self.queue, round)
    }

    /// `sync_collective`: completes when every group worker has run the rounds issued so far.
    fn sync_collective(&mut self, _stream: StreamId) -> DynFut<Result<(), ServerError>> {
        self.collectives.sync()
    }
}
