//! Host-to-device and device-to-host copies: `write` and `read`. The CPU's
//! "device" memory is host memory, so a copy is a strided row copy run on the stream's worker.

use compute_core::backend::ServerKit;
use compute_core::future::oneshot;
use compute_core::layout::{contiguous_strides, for_each_row};
use compute_core::server::HostWrite;
use compute_core::server::ReadFuture;
use compute_core::{Binding, Bytes, CopyDescriptor, ServerError, ServerTransfer, StreamId};

use crate::server::{CpuServer, worker_gone};
use crate::worker::Command;

impl CpuServer {}

/// Copy compact `src` into the strided tensor at `dst`.
///
/// # Safety
/// `dst` must be valid for writes over the whole strided span of the tensor.
unsafe fn scatter_rows(src: &[u8], dst: *mut u8, shape: &[usize], strides: &[usize], elem: usize) {
    if strides == contiguous_strides(shape).0.as_slice() {
        // SAFETY: the compact and strided layouts coincide; `dst` holds `src.len()` bytes (caller).
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        return;
    }
    for_each_row(shape, strides, elem, |strided, compact, len| {
        // SAFETY: every row lies inside the strided span (caller contract); `src` is compact.
        unsafe { core::ptr::copy_nonoverlapping(src[compact..].as_ptr(), dst.add(strided), len) };
    });
}

/// Copy the strided tensor at `src` into compact `dst`.
///
/// # Safety
/// `src` must be valid for reads over the whole strided span of the tensor.
unsafe fn gather_rows(
    src: *const u8,
    dst: &mut [u8],
    shape: &[usize],
    strides: &[usize],
    elem: usize,
) {
    if strides == contiguous_strides(shape).0.as_slice() {
        // SAFETY: layouts coincide; `src` holds `dst.len()` bytes (caller contract).
        unsafe { core::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        return;
    }
    for_each_row(shape, strides, elem, |strided, compact, len| {
        // SAFETY: every row lies inside the strided span (caller contract); `dst` is compact.
        unsafe {
            core::ptr::copy_nonoverlapping(src.add(strided), dst[compact..].as_mut_ptr(), len)
        };
    });
}

impl ServerTransfer for CpuServer {
    fn write(&mut self, writes: Vec<HostWrite>, stream: StreamId) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "write")?;
        for (descriptor, bytes) in writes {
            descriptor.validate_write(bytes.len())?;
            let target = self.resolve(&descriptor.binding)?;
            let binding = descriptor.binding.clone();
            let command: Command = Box::new(move || {
                let src = bytes.try_as_slice()?;
                // SAFETY: `validate` checked the strided span fits the bound memory, which the
                // descriptor keeps alive until this command has run.
                unsafe {
                    scatter_rows(
                        src,
                        target.ptr(),
                        &descriptor.shape,
                        &descriptor.strides,
                        descriptor.elem_size,
                    )
                };
                Ok(())
            });
            self.submit(stream, &[&binding], command)?;
        }
        Ok(())
    }

    fn read(&mut self, descriptors: Vec<CopyDescriptor>, stream: StreamId) -> ReadFuture {
        let prepared = (|| {
            self.ensure_not_capturing(stream, "read")?;
            let sources = CopyDescriptor::read_sources(&descriptors, |b| self.resolve(b))?;
            Ok::<_, ServerError>(sources)
        })();
        let sources = match prepared {
            Ok(s) => s,
            Err(e) => return Box::pin(core::future::ready(Err(e))),
        };
        let (tx, rx) = oneshot();
        let errors = match self.stream(stream) {
            Ok(state) => state.queue.errors().clone(),
            Err(e) => return Box::pin(core::future::ready(Err(e))),
        };
        let bindings: Vec<Binding> = descriptors.iter().map(|d| d.binding.clone()).collect();
        let command: Command = Box::new(move || {
            if let Some(e) = compute_core::error::take_first(&mut errors.lock()) {
                tx.send(Err(e));
                return Ok(());
            }
            let out = descriptors
                .iter()
                .zip(&sources)
                .map(|(d, src)| {
                    let mut buf = compute_core::bytes::AlignedBuf::zeroed(d.compact_size());
                    // SAFETY: `validate` checked the span fits the bound memory, kept alive by `d`.
                    unsafe {
                        gather_rows(
                            src.ptr(),
                            buf.as_mut_slice(),
                            &d.shape,
                            &d.strides,
                            d.elem_size,
                        )
                    };
                    Bytes::from_aligned(buf)
                })
                .collect();
            tx.send(Ok(out));
            Ok(())
        });
        let refs: Vec<&Binding> = bindings.iter().collect();
        if let Err(e) = self.submit(stream, &refs, command) {
            return Box::pin(core::future::ready(Err(e)));
        }
        Box::pin(async move { rx.await.unwrap_or_else(|| Err(worker_gone())) })
    }
}
