//! Kernel launches: arguments resolved to host memory, the launch checks, and where a launch
//! runs (the stream's worker, or the calling thread for a few units on an idle stream); with
//! them, the other [`ComputeServer`] core calls (`get_resource`, flush, sync).

use std::sync::Arc;

use compute_core::backend::ServerKit;
use compute_core::future::DynFut;
use compute_core::handle::BufferArgument;
use compute_core::{
    Binding, ComputeServer, CubeCount, ExecutionMode, KernelLaunch, ServerError, StreamId,
};

use crate::compiler::{self, BufferArg, Plan};
use crate::kernel::CpuKernel;
use crate::server::{CpuInfo, CpuServer};
use crate::storage::{CpuResource, CpuStorage};

/// Launches of at most this many units run on the calling thread when their stream is idle.
const INLINE_UNITS: u64 = 1024;

enum CountSource {
    Static([u32; 3]),
    Dynamic(CpuResource),
}

struct ResolvedBuffer {
    resource: CpuResource,
    shape: Vec<usize>,
    strides: Vec<usize>,
    binding: Binding,
}

/// A launch with every argument resolved to host memory: run now, or kept in a graph.
pub struct RecordedLaunch {
    plan: Arc<Plan>,
    count: CountSource,
    count_binding: Option<Binding>,
    buffers: Vec<ResolvedBuffer>,
    scalars: Vec<compute_core::kernel::ScalarValue>,
    checked: bool,
}

impl RecordedLaunch {
    pub(crate) fn run(&self) -> Result<(), ServerError> {
        let count = match &self.count {
            CountSource::Static(c) => *c,
            CountSource::Dynamic(res) => {
                if res.len() < 12 {
                    return Err(compute_core::error::LaunchError::DynamicCount {
                        offset: 0,
                        size: res.len() as u64,
                    }
                    .into());
                }
                let mut raw = [0u8; 12];
                // SAFETY: the resource holds at least 12 bytes (checked) and stays alive through
                // `count_binding`; stream order makes the bytes final.
                unsafe { core::ptr::copy_nonoverlapping(res.ptr(), raw.as_mut_ptr(), 12) };
                let c: [u32; 3] = bytemuck::pod_read_unaligned(&raw);
                c
            }
        };
        if count.contains(&0) {
            return Ok(());
        }
        let args: Vec<BufferArg<'_>> = self
            .buffers
            .iter()
            .map(|b| BufferArg {
                ptr: b.resource.ptr(),
                len_bytes: b.resource.len(),
                shape: &b.shape,
                strides: &b.strides,
            })
            .collect();
        // SAFETY: each resource stays alive through its binding in `self.buffers`; stream order and
        // cross-stream waits ensure no other command touches these buffers meanwhile; unchecked
        // launches come from `launch_unchecked`, whose caller promised in-range accesses.
        unsafe { self.plan.execute(count, &args, &self.scalars, self.checked) }
    }

    pub(crate) fn bindings(&self) -> impl Iterator<Item = &Binding> {
        self.buffers
            .iter()
            .map(|b| &b.binding)
            .chain(self.count_binding.iter())
    }
}

impl CpuServer {
    pub(crate) fn plan(&mut self, kernel: &CpuKernel) -> Result<Arc<Plan>, ServerError> {
        if let Some(plan) = self.plans.get(&kernel.id()) {
            return Ok(plan.clone());
        }
        kernel
            .definition()
            .validate(&self.streams.properties().hardware)?;
        let plan = Arc::new(compiler::compile(kernel.definition())?);
        self.plans.insert(kernel.id(), plan.clone());
        Ok(plan)
    }
}

impl ComputeServer for CpuServer {
    type Kernel = CpuKernel;
    type Storage = CpuStorage;
    type Info = CpuInfo;

    fn info(&self) -> CpuInfo {
        CpuInfo {
            device: self.device,
            threads: rayon::current_num_threads(),
            jit: compiler::jit::enabled(),
            cpu_features: compiler::jit::features().describe(),
        }
    }

    fn get_resource(
        &mut self,
        binding: Binding,
        stream: StreamId,
    ) -> Result<CpuResource, ServerError> {
        let resource = self.resolve(&binding)?;
        if let Some(point) = binding.handle().access().last()
            && let Some(other) = self.streams.get(point.stream)
        {
            other.queue.progress().wait_for(point.seq);
        }
        self.stream(stream)?.queue.wait_idle();
        Ok(resource)
    }

    unsafe fn launch(
        &mut self,
        launch: KernelLaunch<CpuKernel>,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        launch.check(&self.streams.properties().hardware)?;
        let (kernel, count, arguments, mode) = launch.into_parts();
        let cube_size = u64::from(kernel.definition().cube_size());
        let plan = self.plan(&kernel)?;
        let (count, count_binding) = match count {
            CubeCount::Static(x, y, z) => (CountSource::Static([x, y, z]), None),
            CubeCount::Dynamic(binding) => {
                (CountSource::Dynamic(self.resolve(&binding)?), Some(binding))
            }
        };
        let mut buffers = Vec::with_capacity(arguments.buffers.len());
        for BufferArgument {
            binding,
            shape,
            strides,
        } in arguments.buffers
        {
            buffers.push(ResolvedBuffer {
                resource: self.resolve(&binding)?,
                shape: shape.0,
                strides: strides.0,
                binding,
            });
        }
        let launch = Arc::new(RecordedLaunch {
            plan,
            count,
            count_binding,
            buffers,
            scalars: arguments.scalars,
            checked: mode == ExecutionMode::Checked,
        });
        let state = self.stream(stream)?;
        if let Some(capture) = &mut state.capture {
            capture.push(launch);
            return Ok(());
        }
        let bindings: Vec<Binding> = launch.bindings().cloned().collect();
        let refs: Vec<&Binding> = bindings.iter().collect();
        // A launch of a few units runs on the calling thread when the stream is idle: waking
        // the stream's worker would cost more than the kernel.
        let small = match launch.count {
            CountSource::Static(c) => {
                c.iter()
                    .fold(cube_size, |n, &x| n.saturating_mul(u64::from(x)))
                    <= INLINE_UNITS
            }
            CountSource::Dynamic(_) => false,
        };
        self.submit_with(stream, &refs, Box::new(move || launch.run()), small)?;
        Ok(())
    }

    fn flush(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.stream(stream)?.queue.take_error().map_or(Ok(()), Err)
    }

    fn sync(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
        if let Err(e) = self.ensure_not_capturing(stream, "sync") {
            return Box::pin(core::future::ready(Err(e)));
        }
        self.sync_marker(stream)
    }
}
