//! Host-to-device and device-to-host copies: `write`, `read`, and the staging
//! they go through. A write goes to `queue.write_buffer` on the submit thread, whole 4-byte words
//! only (the words a write covers only partly are read back and merged first); a read records a
//! copy into a staging buffer and maps it once its submission completed. Every `MAP_READ`
//! readback buffer of the crate is a [`Staging`], counted for
//! [`host_memory_usage`](compute_core::ServerMemory::host_memory_usage).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use compute_core::backend::ServerKit;
use compute_core::future::oneshot;
use compute_core::layout::for_each_row;
use compute_core::server::HostWrite;
use compute_core::server::ReadFuture;
use compute_core::{Bytes, CopyDescriptor, ServerError, ServerTransfer, StreamId};

use crate::batch::Command;
use crate::launch::GuardRead;
use crate::poller::gone;
use crate::server::{WgpuServer, ready};
use crate::storage::WgpuResource;
use crate::submitter::WritePart;

/// Bytes of the server's live readback buffers ([`Staging`]s), shared with the threads that drop
/// them: read and profile futures (on the caller's thread), collective workers.
#[derive(Debug, Clone, Default)]
pub(crate) struct StagingBytes(Arc<AtomicU64>);

impl StagingBytes {
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// A `MAP_READ | COPY_DST` readback buffer, counted in its server's [`StagingBytes`] from its
/// creation ([`WgpuServer::readback_buffer`]) until it is dropped. The crate keeps none for
/// reuse: each lives as long as the read (or sync, profile, collective round) it serves.
pub(crate) struct Staging {
    buffer: wgpu::Buffer,
    counted: StagingBytes,
}

impl Staging {
    /// The wgpu buffer (to record a copy into; the clone is not counted twice).
    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

impl core::ops::Deref for Staging {
    type Target = wgpu::Buffer;

    fn deref(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        self.counted
            .0
            .fetch_sub(self.buffer.size(), Ordering::AcqRel);
    }
}

/// A part of a read: nothing to copy, or a staging buffer the bytes land in.
pub(crate) enum ReadPart {
    Empty,
    Staged {
        staging: Staging,
        mapped: compute_core::future::Receiver<Result<(), wgpu::BufferAsyncError>>,
        delta: usize,
        span: usize,
        descriptor: CopyDescriptor,
    },
}

/// The bytes of a write that fall into 4-byte words it covers only partly, by word offset in the
/// buffer: `(first byte in the word, start in the host data, length)` for each piece.
pub(crate) type EdgeWords = std::collections::BTreeMap<u64, Vec<(usize, usize, usize)>>;

/// Plan the write of `len` bytes (from byte `from` of the host data) at `offset` bytes into
/// `target`, changing exactly those bytes: the whole 4-byte words it covers go into `parts`
/// (`queue.write_buffer` needs a 4-byte aligned offset and length), the words it covers only
/// partly (an unaligned head or tail) into `edges`, to be merged with the buffer's contents.
pub(crate) fn plan_write(
    target: &WgpuResource,
    offset: u64,
    from: usize,
    len: usize,
    parts: &mut Vec<WritePart>,
    edges: &mut EdgeWords,
) {
    if len == 0 {
        return;
    }
    let start = target.offset + offset;
    let end = start + len as u64;
    let (lo, hi) = (start.next_multiple_of(4), end / 4 * 4);
    if lo < hi {
        let n = (hi - lo) as usize;
        parts.push(WritePart {
            at: lo,
            from: from + (lo - start) as usize,
            len: n,
            padded: n,
        });
    }
    let mut edge = |word: u64| {
        let (a, b) = (start.max(word), end.min(word + 4));
        edges.entry(word).or_default().push((
            (a - word) as usize,
            from + (a - start) as usize,
            (b - a) as usize,
        ));
    };
    let head = start / 4 * 4;
    let unaligned_start = !start.is_multiple_of(4);
    if unaligned_start {
        edge(head);
    }
    let tail = end / 4 * 4;
    // An unaligned tail in the head's word was covered with the head.
    let tail_in_head = unaligned_start && tail == head;
    if !end.is_multiple_of(4) && !tail_in_head {
        edge(tail);
    }
}

pub(crate) fn map_read(
    staging: &wgpu::Buffer,
) -> compute_core::future::Receiver<Result<(), wgpu::BufferAsyncError>> {
    let (tx, rx) = oneshot();
    staging
        .slice(..)
        .map_async(wgpu::MapMode::Read, move |result| tx.send(result));
    rx
}

impl WgpuServer {
    /// A fresh readback buffer (`MAP_READ | COPY_DST`) of `size` bytes, counted in
    /// [`host_memory`](Self::host_memory) until dropped.
    pub(crate) fn readback_buffer(&self, label: &'static str, size: u64) -> Staging {
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.staging_bytes.0.fetch_add(size, Ordering::AcqRel);
        Staging {
            buffer,
            counted: self.staging_bytes.clone(),
        }
    }

    /// The 4-byte words `edges` of `buffer` as they are after every command and write issued so
    /// far, with the pieces of `data` the edges name written over them. The server issues
    /// nothing in between, so writing the merged words back changes exactly the written bytes.
    pub(crate) fn merge_edges(
        &mut self,
        buffer: &wgpu::Buffer,
        edges: &EdgeWords,
        data: &[u8],
    ) -> Result<Vec<(u64, [u8; 4])>, ServerError> {
        let staging = self.readback_buffer("compute-wgpu partial words", 4 * edges.len() as u64);
        for (k, &word) in edges.keys().enumerate() {
            self.push(Command::Copy {
                src: buffer.clone(),
                src_offset: word,
                dst: staging.buffer().clone(),
                dst_offset: 4 * k as u64,
                size: 4,
            });
        }
        let index = self.submit_always()?;
        let mapped = map_read(&staging);
        self.wait_for(index)?;
        compute_core::block_on(mapped)
            .ok_or_else(gone)?
            .map_err(|e| ServerError::Driver(format!("mapping a readback buffer: {e}")))?;
        let words = {
            let view = staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| ServerError::Driver(format!("reading a readback buffer: {e}")))?;
            edges
                .iter()
                .enumerate()
                .map(|(k, (&at, pieces))| {
                    let mut word = [0u8; 4];
                    word.copy_from_slice(&view[4 * k..4 * k + 4]);
                    for &(first, src, n) in pieces {
                        word[first..first + n].copy_from_slice(&data[src..src + n]);
                    }
                    (at, word)
                })
                .collect()
        };
        staging.unmap();
        Ok(words)
    }

    /// Record a copy of `len` bytes of `source` into a fresh staging buffer: the buffer and the
    /// offset of the first byte in it.
    pub(crate) fn stage_read(
        &mut self,
        source: &WgpuResource,
        len: u64,
    ) -> Result<(Staging, u64), ServerError> {
        let start = source.offset / 4 * 4;
        let delta = source.offset - start;
        let size = (delta + len)
            .next_multiple_of(4)
            .min(source.buffer.size() - start);
        let staging = self.readback_buffer("compute-wgpu readback", size);
        self.push(Command::Copy {
            src: source.buffer.clone(),
            src_offset: start,
            dst: staging.buffer().clone(),
            dst_offset: 0,
            size,
        });
        Ok((staging, delta))
    }
}

impl ServerTransfer for WgpuServer {
    /// `write`: each write's whole words through `queue.write_buffer` on the submit thread, after
    /// the batch recorded before it; partly covered words merged with the buffer's contents.
    fn write(&mut self, writes: Vec<HostWrite>, stream: StreamId) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "write")?;
        for (descriptor, bytes) in writes {
            descriptor.validate_write(bytes.len())?;
            let target = self.resolve(&descriptor.binding)?;
            if bytes.is_empty() {
                continue;
            }
            let mut parts = Vec::new();
            let mut edges = EdgeWords::new();
            if descriptor.is_contiguous() {
                plan_write(&target, 0, 0, bytes.len(), &mut parts, &mut edges);
            } else {
                let mut rows = Vec::new();
                for_each_row(
                    &descriptor.shape,
                    &descriptor.strides,
                    descriptor.elem_size,
                    |s, c, n| {
                        rows.push((s, c, n));
                    },
                );
                for (strided, compact, len) in rows {
                    plan_write(
                        &target,
                        strided as u64,
                        compact,
                        len,
                        &mut parts,
                        &mut edges,
                    );
                }
            }
            // Words the write covers only partly are merged with what the buffer holds after
            // the work issued before (a round trip, for unaligned heads and tails only).
            let words = if edges.is_empty() {
                Vec::new()
            } else {
                self.merge_edges(&target.buffer, &edges, bytes.try_as_slice()?)?
            };
            // `write_buffer` lands before the next submission: the batch recorded so far goes
            // first, then the write, both on the submit thread (which also frees the bytes).
            self.submit()?;
            self.submitter
                .write(target.buffer.clone(), parts, words, bytes)?;
        }
        Ok(())
    }

    /// `read`: copies into staging buffers, submitted at once, mapped and gathered (compact)
    /// once the submission completed.
    fn read(&mut self, descriptors: Vec<CopyDescriptor>, stream: StreamId) -> ReadFuture {
        let prepared = (|| {
            self.ensure_not_capturing(stream, "read")?;
            self.take_error(stream)?;
            let sources = CopyDescriptor::read_sources(&descriptors, |b| self.resolve(b))?;
            let mut staged = Vec::with_capacity(descriptors.len());
            for (descriptor, source) in descriptors.iter().zip(&sources) {
                let span = descriptor.validated_span();
                if span == 0 {
                    staged.push(None);
                } else {
                    let (buffer, delta) = self.stage_read(source, span as u64)?;
                    staged.push(Some((buffer, delta as usize, span)));
                }
            }
            let guard = self.stage_guard_status();
            self.idle();
            let index = self.submit_indexed(false)?;
            let guard = guard.map(GuardRead::map);
            Ok::<_, ServerError>((staged, index, guard))
        })();
        let (staged, index, guard) = match prepared {
            Ok(p) => p,
            Err(e) => return ready(Err(e)),
        };
        let maximum = self.streams.properties().hardware.max_cube_count;
        let parts: Vec<ReadPart> = staged
            .into_iter()
            .zip(descriptors)
            .map(|(staged, descriptor)| match staged {
                None => ReadPart::Empty,
                Some((staging, delta, span)) => ReadPart::Staged {
                    mapped: map_read(&staging),
                    staging,
                    delta,
                    span,
                    descriptor,
                },
            })
            .collect();
        let completed = index.map(|index| self.completion(index));
        let stream_errors = self.stream_errors.clone();
        Box::pin(async move {
            // The maps complete during this wait (their callbacks run on the poll thread).
            if let Some(completed) = completed {
                completed.await?;
            }
            if let Some(guard) = guard {
                guard.deliver(maximum, &stream_errors).await?;
            }
            stream_errors.take(stream)?;
            let mut out = Vec::with_capacity(parts.len());
            for part in parts {
                match part {
                    ReadPart::Empty => out.push(Bytes::from_vec(Vec::new())),
                    ReadPart::Staged {
                        staging,
                        mapped,
                        delta,
                        span,
                        descriptor,
                    } => {
                        mapped.await.ok_or_else(gone)?.map_err(|e| {
                            ServerError::Driver(format!("mapping a readback buffer: {e}"))
                        })?;
                        let bytes = {
                            let view = staging.slice(..).get_mapped_range().map_err(|e| {
                                ServerError::Driver(format!("reading a readback buffer: {e}"))
                            })?;
                            let raw = &view[delta..delta + span];
                            // Mapped readback memory of a discrete GPU reads slowly on one
                            // thread (1.4 GB/s on the H200's Vulkan driver): a compact read is
                            // copied in parallel.
                            descriptor.gather(raw)
                        };
                        staging.unmap();
                        out.push(bytes);
                    }
                }
            }
            Ok(out)
        })
    }
}
