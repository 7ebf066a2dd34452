//! Transfers: writes through the linear staging, reads through staging buffers waited for on
//! the timeline semaphore, and the strided (row by row) paths of both.

use std::sync::Arc;

use ash::vk;
use compute_core::backend::ServerKit;
use compute_core::layout::for_each_row;
use compute_core::server::HostWrite;
use compute_core::server::ReadFuture;
use compute_core::{Bytes, CopyDescriptor, ServerError, ServerTransfer, StreamId};

use crate::batch::{Staging, stage};
use crate::context::Context;
use crate::guard::guard_error;
use crate::server::{VulkanServer, ready};

/// Staging buffers a read copies into, waited for before they return to the pool.
struct PendingRead {
    ctx: Arc<Context>,
    value: u64,
    parts: Vec<Option<(Staging, CopyDescriptor)>>,
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        // A read dropped before completion must not hand its staging back while the GPU writes
        // it.
        if let Err(e) = self.ctx.wait(self.value) {
            compute_core::error::report_unreturned("vulkan: waiting for a dropped read", &e);
        }
    }
}

impl VulkanServer {
    /// One write: `data` (the descriptor's compact bytes) copied into the linear staging and a
    /// copy from there recorded. `data` is read only during the call.
    fn write_staged(
        &mut self,
        descriptor: &CopyDescriptor,
        data: &[u8],
    ) -> Result<(), ServerError> {
        descriptor.validate_write(data.len())?;
        let target = self.resolve(&descriptor.binding)?;
        if data.is_empty() {
            return Ok(());
        }
        let (src, src_offset) = self.recorder.linear.push(&self.ctx, data, 16)?;
        let regions: Vec<vk::BufferCopy> = if descriptor.is_contiguous() {
            vec![vk::BufferCopy {
                src_offset,
                dst_offset: target.offset,
                size: data.len() as u64,
            }]
        } else {
            let mut rows = Vec::new();
            for_each_row(
                &descriptor.shape,
                &descriptor.strides,
                descriptor.elem_size,
                |s, c, n| {
                    rows.push(vk::BufferCopy {
                        src_offset: src_offset + c as u64,
                        dst_offset: target.offset + s as u64,
                        size: n as u64,
                    });
                },
            );
            rows
        };
        // The regions lie inside the staging chunk and the block.
        self.recorder
            .command(stage::TRANSFER)
            .copy(src, target.buffer, &regions);
        self.recorder.dispatches += 1;
        self.after_command()
    }

    /// Record copies of `regions` from `src` into a fresh staging buffer of `size` bytes.
    pub(crate) fn stage_read(
        &mut self,
        src: vk::Buffer,
        regions: &[vk::BufferCopy],
        size: u64,
    ) -> Result<Staging, ServerError> {
        let staging = Staging::new(&self.ctx, size)?;
        // The regions lie inside both buffers; the staging buffer lives until the copy completed.
        self.recorder
            .command(stage::TRANSFER)
            .copy(src, staging.buffer(), regions);
        Ok(staging)
    }
}

impl ServerTransfer for VulkanServer {
    /// [`ServerTransfer::write`](compute_core::ServerTransfer::write).
    fn write(&mut self, writes: Vec<HostWrite>, stream: StreamId) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "write")?;
        // Completed work hands its staging buffers back before this write asks for one.
        self.recorder.recycle();
        for (descriptor, bytes) in writes {
            let data = bytes.try_as_slice()?;
            let copy = (data.len() >= compute_core::bytes::RELEASE_MIN_BYTES)
                .then(compute_core::bytes::host_copy);
            self.write_staged(&descriptor, data)?;
            drop(copy);
            // The data is in staging now; freeing a large host buffer (unmapping its pages) is
            // not the caller's wait.
            compute_core::bytes::release(bytes);
        }
        Ok(())
    }

    /// [`ServerTransfer::write_from_slice`](compute_core::ServerTransfer::write_from_slice).
    fn write_from_slice(
        &mut self,
        descriptor: CopyDescriptor,
        data: &[u8],
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "write")?;
        self.recorder.recycle();
        // Copied into staging during the call: no intermediate host copy.
        self.write_staged(&descriptor, data)
    }

    /// [`ServerTransfer::read`](compute_core::ServerTransfer::read).
    fn read(&mut self, descriptors: Vec<CopyDescriptor>, stream: StreamId) -> ReadFuture {
        // Read before the data (the status read takes a queued error first); cleared after.
        let guard = match self.ensure_not_capturing(stream, "read") {
            Ok(()) => self.read_guard_status(stream),
            Err(_) => None,
        };
        let maximum = self.properties.hardware.max_cube_count;
        let prepared = (|| {
            self.ensure_not_capturing(stream, "read")?;
            self.take_error(stream)?;
            let sources = CopyDescriptor::read_sources(&descriptors, |b| self.resolve(b))?;
            self.recorder.recycle();
            let mut parts = Vec::with_capacity(descriptors.len());
            for (descriptor, source) in descriptors.into_iter().zip(sources) {
                let span = descriptor.validated_span() as u64;
                if span == 0 {
                    parts.push(None);
                    continue;
                }
                let region = vk::BufferCopy {
                    src_offset: source.offset,
                    dst_offset: 0,
                    size: span,
                };
                let staging = self.stage_read(source.buffer, &[region], span)?;
                parts.push(Some((staging, descriptor)));
            }
            let value = self.submit_or_last()?;
            self.reset_batch_limit();
            self.cache.maybe_save();
            Ok::<_, ServerError>(PendingRead {
                ctx: self.ctx.clone(),
                value,
                parts,
            })
        })();
        let pending = match prepared {
            Ok(p) => p,
            Err(e) => return ready(Err(e)),
        };
        let stream_errors = self.stream_errors.clone();
        Box::pin(async move {
            if let Some((read, streams)) = guard
                && let Some(e) = guard_error(&read.await?, maximum)
            {
                stream_errors.push(&streams, &e);
            }
            stream_errors.take(stream)?;
            pending.ctx.wait(pending.value)?;
            let mut out = Vec::with_capacity(pending.parts.len());
            for part in &pending.parts {
                let Some((staging, descriptor)) = part else {
                    out.push(Bytes::from_vec(Vec::new()));
                    continue;
                };
                let span = descriptor.validated_span();
                let raw = staging.read(0, span);
                // Fresh host pages fault slowly on one thread (1.3 GB/s for 1 GiB on the H200
                // host): a compact read is copied in parallel.
                out.push(descriptor.gather(raw));
            }
            Ok(out)
        })
    }
}
