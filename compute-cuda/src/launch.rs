//! Kernel launches: the module of a kernel (compiled once per checked/unchecked variant), the
//! launch checks, dynamic cube counts, and the launch parameters packed after the compiled
//! kernel's [`ParamLayout`](crate::compiler::codegen::ParamLayout); with them, the other
//! [`ComputeServer`] core calls (`get_resource`, flush, sync).

use std::sync::Arc;

use compute_core::backend::ServerKit;
use compute_core::error::LaunchError;
use compute_core::future::DynFut;
use compute_core::{
    Binding, ComputeServer, CubeCount, ExecutionMode, KernelLaunch, ServerError, StreamId,
};
use cudarc::driver::{result, sys};
use smallvec::SmallVec;

use crate::compiler::codegen::{MAX_RANK, META_BYTES};
use crate::compiler::{self, CompiledKernel, PackedParams};
use crate::driver::Check;
use crate::kernel::CudaKernel;
use crate::server::{CudaInfo, CudaServer};
use crate::storage::{CudaResource, CudaStorage};

/// Words of one launch parameter slot (the biggest parameter is a `Meta`).
pub(crate) const SLOT_WORDS: usize = META_BYTES.div_ceil(8);

/// Bytes of one launch parameter slot.
pub(crate) const SLOT_BYTES: usize = SLOT_WORDS * 8;

/// The `Meta` of a buffer argument: its rank, then shape and strides (each clamped to `u32`).
fn meta_words(shape: &[usize], strides: &[usize]) -> Result<[u32; 1 + 2 * MAX_RANK], ServerError> {
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
    Ok(words)
}

/// Where a launch's parameter values go, in [`ParamLayout`](crate::compiler::codegen::ParamLayout)
/// order: the kernel's packed buffer at the offsets the driver reported (one copy for the
/// driver to take), or one slot per parameter (the pointer array of `kernelParams`).
enum ParamSink<'a> {
    Packed {
        table: &'a PackedParams,
        bytes: &'a mut [u8],
        next: usize,
    },
    Slots(&'a mut Vec<[u64; SLOT_WORDS]>),
}

impl ParamSink<'_> {
    /// The next parameter: `value`'s little-endian bytes, cut to the parameter's size (a
    /// narrower scalar keeps its low bytes) or padded with zeros.
    fn push(&mut self, value: &[u8]) {
        match self {
            ParamSink::Packed { table, bytes, next } => {
                let (offset, size) = table.params[*next];
                *next += 1;
                let (offset, size) = (offset as usize, size as usize);
                let n = size.min(value.len());
                bytes[offset..offset + n].copy_from_slice(&value[..n]);
                bytes[offset + n..offset + size].fill(0);
            }
            ParamSink::Slots(slots) => {
                let mut slot = [0u64; SLOT_WORDS];
                let n = value.len().min(SLOT_BYTES);
                bytemuck::cast_slice_mut::<u64, u8>(&mut slot)[..n].copy_from_slice(&value[..n]);
                slots.push(slot);
            }
        }
    }
}

impl CudaServer {
    pub(crate) fn compiled(
        &mut self,
        kernel: &CudaKernel,
        checked: bool,
    ) -> Result<Arc<CompiledKernel>, ServerError> {
        if let Some(found) = self.kernels.get(kernel.id(), checked) {
            return Ok(found);
        }
        kernel
            .definition()
            .validate(&self.streams.properties().hardware)?;
        let compiled = Arc::new(compiler::compile(
            kernel.definition(),
            kernel.id(),
            checked,
            self.target,
        )?);
        self.kernels.insert(kernel.id(), checked, compiled.clone());
        Ok(compiled)
    }

    /// The three `u32` of a dynamic cube count, read after the work queued so far.
    pub(crate) fn dynamic_count(
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

    /// `get_resource`: the memory behind `binding`, once the work that last used it and the work
    /// of `stream` completed.
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

    /// `launch`: the launch checks, the parameters packed after the compiled
    /// [`ParamLayout`](crate::compiler::codegen::ParamLayout) (pointer and length of every
    /// buffer, the metadata slots, the scalars), then `cuLaunchKernel`.
    ///
    /// # Safety
    /// As [`ComputeServer::launch`](compute_core::ComputeServer::launch): an unchecked launch
    /// must stay in bounds.
    unsafe fn launch(
        &mut self,
        launch: KernelLaunch<CudaKernel>,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.settle()?;
        let (kernel, count, arguments, mode) =
            launch.checked(&self.streams.properties().hardware)?;
        let definition = kernel.definition();
        let compiled = self.compiled(&kernel, mode == ExecutionMode::Checked)?;
        let grid = match &count {
            CubeCount::Static(x, y, z) => [*x, *y, *z],
            CubeCount::Dynamic(binding) => self.dynamic_count(binding, stream)?,
        };
        if grid.contains(&0) {
            return Ok(());
        }
        let max = self.streams.properties().hardware.max_cube_count;
        if grid.iter().zip(max).any(|(&g, m)| g > m) {
            return Err(LaunchError::CubeCountTooLarge {
                count: grid,
                maximum: max,
            }
            .into());
        }
        let layout = &compiled.layout;
        let count_params = 2 * layout.buffers + layout.meta.len() + layout.scalars.len();
        // The buffers of the last launch, emptied: no allocation once their capacity suffices.
        let mut packed = core::mem::take(&mut self.launch_packed);
        let mut slots = core::mem::take(&mut self.launch_slots);
        slots.clear();
        {
            let mut sink = match &compiled.packed {
                Some(table) => {
                    packed.clear();
                    packed.resize(table.bytes.div_ceil(8), 0);
                    ParamSink::Packed {
                        table,
                        bytes: &mut bytemuck::cast_slice_mut::<u64, u8>(&mut packed)[..table.bytes],
                        next: 0,
                    }
                }
                None => {
                    slots.reserve(count_params);
                    ParamSink::Slots(&mut slots)
                }
            };
            for (arg, decl) in arguments.buffers.iter().zip(definition.buffers()) {
                let resource = self.streams.resolve(&arg.binding)?;
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
                sink.push(&resource.ptr.to_le_bytes());
                sink.push(&(resource.len / item).to_le_bytes());
            }
            for &b in &layout.meta {
                let arg = &arguments.buffers[b];
                sink.push(bytemuck::cast_slice(&meta_words(&arg.shape, &arg.strides)?));
            }
            for value in &arguments.scalars {
                sink.push(&value.native_bits().to_le_bytes());
            }
        }
        let mut bindings: SmallVec<[&Binding; 16]> =
            arguments.buffers.iter().map(|b| &b.binding).collect();
        if let CubeCount::Dynamic(b) = &count {
            bindings.push(b);
        }
        self.order_after(stream, &bindings)?;
        let raw = self.stream(stream)?.queue.raw;
        let [bx, by, bz] = compiled.cube_dim;
        // On the stack for the usual kernel: no allocation on the launch path.
        let mut params: SmallVec<[*mut core::ffi::c_void; 32]> = SmallVec::new();
        let mut packed_size = compiled.packed.as_ref().map_or(0, |t| t.bytes);
        let mut extra = [
            sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut core::ffi::c_void,
            packed.as_mut_ptr().cast(),
            sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut core::ffi::c_void,
            (&mut packed_size as *mut usize).cast(),
            sys::CU_LAUNCH_PARAM_END_AS_INT as usize as *mut core::ffi::c_void,
        ];
        let (kernel_params, extra) = match &compiled.packed {
            // No parameters at all: neither form.
            Some(table) if table.bytes == 0 => (core::ptr::null_mut(), core::ptr::null_mut()),
            Some(_) => (core::ptr::null_mut(), extra.as_mut_ptr()),
            None => {
                compiler::count_unpacked_launch();
                params.extend(slots.iter_mut().map(|s| s.as_mut_ptr().cast()));
                (params.as_mut_ptr(), core::ptr::null_mut())
            }
        };
        // SAFETY: the parameters match the generated signature: the packed buffer holds each at
        // the offset and size the driver reported for this function (`PackedParams`), or
        // `kernel_params` points to one live slot per parameter in `ParamLayout` order. Every
        // pointer is a live device range kept alive by stream order or `mark`; for unchecked
        // launches the caller promised in-bounds accesses. The driver copies the parameters
        // before returning, so the buffers may be reused after the call.
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
                kernel_params,
                extra,
            )
        }
        .result()
        .check("cuLaunchKernel")?;
        drop(params);
        self.launch_slots = slots;
        self.launch_packed = packed;
        self.mark(stream, &bindings, None)
    }

    fn flush(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.flush_stream(stream)
    }

    fn sync(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
        self.sync_stream(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_parameters_are_little_endian_words() {
        let words = meta_words(&[3, 4], &[4, 1]).unwrap();
        assert_eq!(&words[..3], &[2, 3, 4]);
        assert_eq!(words[1 + MAX_RANK], 4);
        assert_eq!(words[1 + MAX_RANK + 1], 1);
        assert!(meta_words(&[1; 9], &[1; 9]).is_err());
        assert!(meta_words(&[1, 2], &[1]).is_err());
    }

    #[test]
    fn packed_parameters_land_at_the_driver_offsets() {
        // A pointer, a length, a 68-byte Meta (4-aligned) and a 1-byte scalar then a 2-byte one.
        let table = PackedParams {
            params: vec![(0, 8), (8, 8), (16, 68), (84, 1), (86, 2)],
            bytes: 88,
        };
        let mut bytes = [0xaau8; 88];
        let meta = meta_words(&[2], &[1]).unwrap();
        {
            let mut sink = ParamSink::Packed {
                table: &table,
                bytes: &mut bytes,
                next: 0,
            };
            sink.push(&0x1122_3344_5566_7788u64.to_le_bytes());
            sink.push(&5u64.to_le_bytes());
            sink.push(bytemuck::cast_slice(&meta));
            sink.push(
                &compute_core::kernel::ScalarValue::I8(-2)
                    .native_bits()
                    .to_le_bytes(),
            );
            sink.push(
                &compute_core::kernel::ScalarValue::U16(0xbeef)
                    .native_bits()
                    .to_le_bytes(),
            );
        }
        assert_eq!(&bytes[..8], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&bytes[8..16], &5u64.to_le_bytes());
        assert_eq!(&bytes[16..20], &1u32.to_le_bytes());
        assert_eq!(&bytes[20..24], &2u32.to_le_bytes());
        assert_eq!(&bytes[16 + 4 * (1 + MAX_RANK)..][..4], &1u32.to_le_bytes());
        assert_eq!(bytes[84], 0xfe);
        // The padding byte between the two scalars is left as it was.
        assert_eq!(bytes[85], 0xaa);
        assert_eq!(&bytes[86..88], &[0xef, 0xbe]);

        let mut slots = Vec::new();
        {
            let mut sink = ParamSink::Slots(&mut slots);
            sink.push(&0xfeu64.to_le_bytes()[..1]);
            sink.push(bytemuck::cast_slice(&meta));
        }
        assert_eq!(slots.len(), 2);
        assert_eq!(slots[0][0], 0xfe);
        assert_eq!(
            &bytemuck::cast_slice::<u64, u32>(&slots[1])[..3],
            &[1, 2, 0]
        );
    }
}
