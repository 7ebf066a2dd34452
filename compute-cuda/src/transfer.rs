//! Host <-> device copies: `write` (pinned bytes straight, pageable ones through the staging
//! ring, strided tensors as 2-D copies of row blocks) and `read` into pinned buffers.

use compute_core::backend::ServerKit;
use compute_core::layout::contiguous_strides;
use compute_core::server::HostWrite;
use compute_core::server::ReadFuture;
use compute_core::{
    Binding, Bytes, BytesKind, CopyDescriptor, ServerError, ServerTransfer, StreamId,
};
use cudarc::driver::{result, sys};

use crate::driver::Check;
use crate::server::{CudaServer, ready};
use crate::staging::{SMALL_PIECE, StagingPlan};
use crate::stream::KeepAlive;

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

impl CudaServer {
    pub(crate) fn write_one(
        &mut self,
        stream: StreamId,
        descriptor: CopyDescriptor,
        bytes: Bytes,
    ) -> Result<(), ServerError> {
        let contiguous = is_compact(&descriptor.shape, &descriptor.strides);
        if contiguous && bytes.kind() != BytesKind::Pinned {
            let written = self.write_pageable(stream, descriptor, bytes.try_as_slice()?);
            // Read no more: a large buffer is freed off this path (as costly as the copy).
            compute_core::bytes::release(bytes);
            return written;
        }
        descriptor.validate_write(bytes.len())?;
        if bytes.is_empty() {
            return Ok(());
        }
        let target = self.resolve(&descriptor.binding)?;
        let binding = descriptor.binding.clone();
        let raw = self.stream(stream)?.queue.raw;
        self.settle()?;
        self.order_after(stream, [&binding])?;
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
                let mut staging = self.pinned.take_held(bytes.len())?;
                compute_core::HostBuffer::as_bytes_mut(&mut staging)
                    .copy_from_slice(bytes.try_as_slice()?);
                compute_core::bytes::release(bytes);
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
        self.mark(stream, [&binding], Some(keep))
    }

    /// A contiguous write from pageable host bytes, which it reads only before it returns (they
    /// are copied into pinned staging, or handed to the driver's own staging copy): the path of
    /// both owned pageable [`Bytes`] and a borrowed slice
    /// ([`ServerTransfer::write_from_slice`](compute_core::ServerTransfer::write_from_slice)).
    pub(crate) fn write_pageable(
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
        // Large buffers released meanwhile are freed after this copy, not during it.
        let _copy = (src.len() >= compute_core::bytes::RELEASE_MIN_BYTES)
            .then(compute_core::bytes::host_copy);
        // A large staged write may go on while the driver calls of the pieces staged before it
        // on the same stream are still being made (they and its own are made in order): what it
        // enqueues before its own DMA is only stream waits, which those calls may follow too.
        // Any other write comes after them.
        let direct = src.len() <= StagingPlan::get().direct;
        let staged = src.len() > SMALL_PIECE && !direct;
        if !staged || self.issuing.as_ref().is_some_and(|(_, s)| s.0 != raw.0) {
            self.settle()?;
        }
        self.order_after(stream, [&binding])?;
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
        self.mark(stream, [&binding], None)
    }

    pub(crate) fn read_inner(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream: StreamId,
    ) -> Result<ReadFuture, ServerError> {
        self.settle()?;
        crate::driver::take_release_error()?;
        self.ensure_not_capturing(stream, "read")?;
        let sources = CopyDescriptor::read_sources(&descriptors, |b| self.resolve(b))?;
        let bindings: Vec<Binding> = descriptors.iter().map(|d| d.binding.clone()).collect();
        let refs: Vec<&Binding> = bindings.iter().collect();
        self.order_after(stream, refs.iter().copied())?;
        let raw = self.stream(stream)?.queue.raw;
        let mut outputs = Vec::with_capacity(descriptors.len());
        for (descriptor, source) in descriptors.iter().zip(&sources) {
            let len = descriptor.compact_size();
            if len == 0 {
                outputs.push(None);
                continue;
            }
            let buffer = self.pinned.take_held(len)?;
            for block in row_blocks(&descriptor.shape, &descriptor.strides, descriptor.elem_size) {
                // SAFETY: `buffer` is pinned, holds the compact tensor and lives in the future
                // until the copy completed; the strided span fits the source (validated).
                unsafe { copy_block(&block, buffer.as_ptr(), source.ptr, false, raw.0) }?;
            }
            outputs.push(Some(buffer));
        }
        self.mark(stream, refs.iter().copied(), None)?;
        let event = self.record_fresh(stream)?;
        let done = self.event_future(event);
        Ok(Box::pin(async move {
            done.await?;
            let _alive = bindings;
            Ok(outputs
                .into_iter()
                .map(|b| match b {
                    Some(mut buffer) => {
                        // From here on the caller's: no longer counted by `host_memory_usage`.
                        buffer.hand_out();
                        Bytes::from_host_buffer(Box::new(buffer))
                    }
                    None => Bytes::from_vec(Vec::new()),
                })
                .collect())
        }))
    }
}

impl ServerTransfer for CudaServer {
    fn read(&mut self, descriptors: Vec<CopyDescriptor>, stream: StreamId) -> ReadFuture {
        match self.read_inner(descriptors, stream) {
            Ok(future) => future,
            Err(e) => ready(Err(e)),
        }
    }

    /// `write`: each copy in order, refused while a capture runs.
    fn write(&mut self, writes: Vec<HostWrite>, stream: StreamId) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "write")?;
        for (descriptor, bytes) in writes {
            self.write_one(stream, descriptor, bytes)?;
        }
        Ok(())
    }

    /// `write_from_slice`: a compact write is staged straight from `data`.
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
