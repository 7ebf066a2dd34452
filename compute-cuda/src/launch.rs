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

use crate::compiler::codegen::{MAX_RANK, META_BYTES};
use crate::compiler::{self, CompiledKernel};
use crate::driver::Check;
use crate::kernel::CudaKernel;
use crate::server::{CudaInfo, CudaServer};
use crate::storage::{CudaResource, CudaStorage};

/// Words of the biggest launch parameter, a `Meta`.
pub(crate) const SLOT_WORDS: usize = META_BYTES.div_ceil(8);

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
        self.order_after(stream, [binding])?;
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
        launch.check(&self.streams.properties().hardware)?;
        let (kernel, count, arguments, mode) = launch.into_parts();
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
        // The parameter words and `kernelParams` array of the last launch, emptied: no
        // allocation once their capacity suffices. Each parameter takes the words it needs (one
        // for a pointer, a length or a scalar; `SLOT_WORDS` for a `Meta`); `params` holds each
        // one's first word index until every word is written, then its address.
        let mut words = core::mem::take(&mut self.launch_words);
        let mut params = core::mem::take(&mut self.launch_params);
        words.clear();
        params.clear();
        words.reserve(2 * layout.buffers + SLOT_WORDS * layout.meta.len() + layout.scalars.len());
        for (arg, decl) in arguments.buffers.iter().zip(definition.buffers()) {
            let resource = self.resolve(&arg.binding)?;
            let item = decl.item().size() as u64;
            // Item sizes are almost always powers of two: a mask and a shift instead of two
            // divisions on the launch path.
            let (misaligned, entries) = if item.is_power_of_two() {
                (
                    resource.ptr & (item.min(16) - 1),
                    resource.len >> item.trailing_zeros(),
                )
            } else {
                (resource.ptr % item.min(16), resource.len / item)
            };
            if misaligned != 0 {
                return Err(compute_core::error::LaunchError::MisalignedBuffer {
                    kernel: definition.name().into(),
                    name: decl.name.clone(),
                    offset: misaligned,
                    alignment: item.min(16),
                }
                .into());
            }
            params.push(words.len());
            words.push(resource.ptr);
            params.push(words.len());
            words.push(entries);
        }
        for &b in &layout.meta {
            let arg = &arguments.buffers[b];
            params.push(words.len());
            words.extend_from_slice(&meta_slot(&arg.shape, &arg.strides)?);
        }
        for value in &arguments.scalars {
            // Little-endian: a narrower scalar's bytes are the word's first bytes.
            params.push(words.len());
            words.push(value.native_bits());
        }
        // Every word is written (no reallocation can move them any more): indices to addresses.
        let base = words.as_mut_ptr() as usize;
        for p in params.iter_mut() {
            *p = base + *p * core::mem::size_of::<u64>();
        }
        let dynamic = match &count {
            CubeCount::Dynamic(b) => Some(b),
            CubeCount::Static(..) => None,
        };
        let bindings = || arguments.buffers.iter().map(|b| &b.binding).chain(dynamic);
        self.order_after(stream, bindings())?;
        let raw = self.stream(stream)?.queue.raw;
        let [bx, by, bz] = compiled.cube_dim;
        // SAFETY: `params` holds one address per parameter of the generated signature
        // (`ParamLayout` order), each into `words`, which stays untouched until the driver,
        // which copies the values, returns; every device pointer is a live range kept alive by
        // stream order or `mark`; for unchecked launches the caller promised in-bounds
        // accesses.
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
                params.as_mut_ptr().cast::<*mut core::ffi::c_void>(),
                core::ptr::null_mut(),
            )
        }
        .result()
        .check("cuLaunchKernel")?;
        self.launch_params = params;
        self.launch_words = words;
        self.mark(stream, bindings(), None)
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
        let slot = meta_slot(&[3, 4], &[4, 1]).unwrap();
        let words: &[u32] = bytemuck::cast_slice(&slot);
        assert_eq!(&words[..3], &[2, 3, 4]);
        assert_eq!(words[1 + MAX_RANK], 4);
        assert!(meta_slot(&[1; 9], &[1; 9]).is_err());
    }
}
