//! The CPU server: per-stream workers, pools over host storage, a plan cache, graphs and
//! host-staged collectives.

use std::collections::BTreeMap;
use std::sync::Arc;

use compute_core::backend::{CreateRules, Graphs, StreamEntry, Streams};
use compute_core::collective::HostRendezvous;
use compute_core::future::{DynFut, oneshot};
use compute_core::graph::GraphId;
use compute_core::handle::{BufferArgument, HandleOwner, StreamPoint};
use compute_core::kernel::KernelId;
use compute_core::layout::{contiguous_strides, for_each_row};
use compute_core::memory::{MemoryAllocationMode, MemoryPoolsConfig, MemoryUsage, PoolConfigError};
use compute_core::profile::{ProfileTable, ProfileToken, host_profile};
use compute_core::{
    Binding, Bytes, ComputeServer, CopyDescriptor, CubeCount, DeviceId, DeviceProperties, ElemType,
    ExecutionMode, Handle, KernelArguments, MemoryLayout, MemoryLayoutDescriptor, ProfileDuration,
    ProfileError, ReduceOperation, ServerError, StreamId,
};
use hashbrown::HashMap;

use crate::device::{CpuDevice, device_count};
use crate::exec::{self, BufferArg, Plan};
use crate::kernel::CpuKernel;
use crate::storage::{CPU_ALIGNMENT, CpuResource, CpuStorage};
use crate::worker::{Command, Progress, Worker};

/// Launches of at most this many units run on the calling thread when their stream is idle.
const INLINE_UNITS: u64 = 1024;

/// Backend information of a CPU server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuInfo {
    /// The logical device.
    pub device: CpuDevice,
    /// Worker threads the executor spreads cubes over.
    pub threads: usize,
    /// Whether kernels compile to machine code (`COMPUTE_CPU_JIT`, on by default); the few the
    /// JIT does not cover run on the interpreter (`COMPUTE_CPU_JIT_LOG=1` names them, and
    /// [`Plan::executor`](crate::exec::Plan::executor) tells for one plan).
    pub jit: bool,
    /// The instruction-set features in use, e.g. `x86_64 avx2 fma sse4.1`.
    pub cpu_features: String,
}

/// A stream: its pools, its capture (the launches recorded so far) and its worker thread.
type StreamState = StreamEntry<CpuStorage, Worker, Vec<Arc<RecordedLaunch>>>;

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
struct RecordedLaunch {
    plan: Arc<Plan>,
    count: CountSource,
    count_binding: Option<Binding>,
    buffers: Vec<ResolvedBuffer>,
    scalars: Vec<compute_core::kernel::ScalarValue>,
    checked: bool,
}

impl RecordedLaunch {
    fn run(&self) -> Result<(), ServerError> {
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

    fn bindings(&self) -> impl Iterator<Item = &Binding> {
        self.buffers
            .iter()
            .map(|b| &b.binding)
            .chain(self.count_binding.iter())
    }
}

/// A captured graph: the launches it replays.
type CpuGraph = Vec<Arc<RecordedLaunch>>;

/// The server of one logical CPU device.
pub struct CpuServer {
    device: CpuDevice,
    owner: HandleOwner,
    properties: DeviceProperties,
    streams: Streams<CpuStorage, Worker, Vec<Arc<RecordedLaunch>>>,
    plans: HashMap<KernelId, Arc<Plan>>,
    graphs: Graphs<CpuGraph>,
    profiles: ProfileTable<()>,
    /// One communication stream per collective group, like one NCCL communicator each: two
    /// groups sharing a queue could deadlock (each device waiting in a different group's round).
    comm_streams: BTreeMap<Vec<DeviceId>, StreamId>,
}

impl CpuServer {
    /// A server for `device`, with `properties` describing it.
    pub fn new(device: CpuDevice, properties: DeviceProperties) -> Self {
        static NEXT_SERVER: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
        let owner = HandleOwner {
            device: compute_core::Device::to_id(&device),
            server: NEXT_SERVER.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
        };
        Self {
            device,
            owner,
            streams: Streams::new(owner, properties.memory.clone()),
            properties,
            plans: HashMap::new(),
            graphs: Graphs::default(),
            profiles: ProfileTable::default(),
            comm_streams: BTreeMap::new(),
        }
    }

    /// The CPU's layout of a `create`: 32-byte starts, its pitch alignment, one page at most.
    fn create_rules(&self) -> CreateRules {
        CreateRules {
            alignment: CPU_ALIGNMENT,
            pitch_alignment: self.properties.pitch_alignment,
            max_size: self.properties.memory.max_page_size,
        }
    }

    fn stream(&mut self, id: StreamId) -> Result<&mut StreamState, ServerError> {
        let index = self.device.index;
        self.streams.get_or_create(id, || {
            let worker = Worker::spawn(format!("cpu{index}-{id}"))?;
            Ok((CpuStorage::new(), worker))
        })
    }

    fn resolve(&mut self, binding: &Binding) -> Result<CpuResource, ServerError> {
        self.streams.resolve(binding)
    }

    /// Points of other streams that the next command of `stream` must wait for.
    fn waits<'b>(
        &self,
        stream: StreamId,
        bindings: impl Iterator<Item = &'b Binding>,
    ) -> Vec<(Arc<Progress>, u64)> {
        let mut waits = Vec::new();
        for binding in bindings {
            if let Some(point) = binding.handle().access().last()
                && point.stream != stream
                && let Some(other) = self.streams.get(point.stream)
            {
                waits.push((other.queue.progress().clone(), point.seq));
            }
        }
        waits
    }

    /// Submit `command` on `stream` after the last uses of `bindings`, and record it as their use.
    fn submit(
        &mut self,
        stream: StreamId,
        bindings: &[&Binding],
        command: Command,
    ) -> Result<u64, ServerError> {
        self.submit_with(stream, bindings, command, false)
    }

    /// [`submit`](Self::submit); with `inline`, the command runs at once on the calling thread
    /// when the stream is idle (for small launches and sync markers).
    fn submit_with(
        &mut self,
        stream: StreamId,
        bindings: &[&Binding],
        command: Command,
        inline: bool,
    ) -> Result<u64, ServerError> {
        let waits = self.waits(stream, bindings.iter().copied());
        let state = self.stream(stream)?;
        let seq = if inline {
            state.queue.submit_or_run(waits, command)
        } else {
            state.queue.submit(waits, command)
        };
        for binding in bindings {
            binding
                .handle()
                .access()
                .replace(StreamPoint { stream, seq });
        }
        Ok(seq)
    }

    fn ensure_not_capturing(&self, stream: StreamId, what: &str) -> Result<(), ServerError> {
        self.streams.ensure_not_capturing(stream, what)
    }

    fn plan(&mut self, kernel: &CpuKernel) -> Result<Arc<Plan>, ServerError> {
        if let Some(plan) = self.plans.get(&kernel.id) {
            return Ok(plan.clone());
        }
        kernel.definition.validate(&self.properties.hardware)?;
        let plan = Arc::new(exec::compile(&kernel.definition)?);
        self.plans.insert(kernel.id, plan.clone());
        Ok(plan)
    }

    fn sync_marker(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
        let (tx, rx) = oneshot();
        let errors = match self.stream(stream) {
            Ok(state) => state.queue.errors().clone(),
            Err(e) => return Box::pin(core::future::ready(Err(e))),
        };
        let command: Command = Box::new(move || {
            let first = compute_core::error::take_first(&mut errors.lock());
            tx.send(first.map_or(Ok(()), Err));
            Ok(())
        });
        if let Err(e) = self.submit_with(stream, &[], command, true) {
            return Box::pin(core::future::ready(Err(e)));
        }
        Box::pin(async move { rx.await.unwrap_or_else(|| Err(worker_gone())) })
    }

    fn check_group(&self, devices: &[DeviceId]) -> Result<Vec<DeviceId>, ServerError> {
        compute_core::collective::check_group(devices, self.owner.device, device_count(), "CPU")
    }
}

fn worker_gone() -> ServerError {
    ServerError::Driver("the stream worker stopped before answering".into())
}

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

impl ComputeServer for CpuServer {
    type Kernel = CpuKernel;
    type Storage = CpuStorage;
    type Info = CpuInfo;

    fn info(&self) -> CpuInfo {
        CpuInfo {
            device: self.device,
            threads: rayon::current_num_threads(),
            jit: exec::jit::enabled(),
            cpu_features: exec::jit::features().describe(),
        }
    }

    fn properties(&self) -> DeviceProperties {
        self.properties.clone()
    }

    fn owner(&self) -> HandleOwner {
        self.owner
    }

    fn create(
        &mut self,
        descriptors: &[MemoryLayoutDescriptor],
        stream: StreamId,
    ) -> Result<Vec<MemoryLayout>, ServerError> {
        let (owner, rules) = (self.owner, self.create_rules());
        self.stream(stream)?
            .create(owner, stream, descriptors, &rules)
    }

    fn create_buffer(&mut self, size: u64, stream: StreamId) -> Result<Handle, ServerError> {
        let (owner, rules) = (self.owner, self.create_rules());
        self.stream(stream)?
            .create_buffer(owner, stream, size, &rules)
    }

    fn write(
        &mut self,
        writes: Vec<(CopyDescriptor, Bytes)>,
        stream: StreamId,
    ) -> Result<(), ServerError> {
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

    fn read(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        let prepared = (|| {
            self.ensure_not_capturing(stream, "read")?;
            let mut sources = Vec::with_capacity(descriptors.len());
            for descriptor in &descriptors {
                descriptor.validate()?;
                sources.push(self.resolve(&descriptor.binding)?);
            }
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
        kernel: CpuKernel,
        count: CubeCount,
        arguments: KernelArguments,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        kernel.definition.check_arguments(&arguments)?;
        count.check(&self.properties.hardware)?;
        let cube_size = u64::from(kernel.definition.cube_size());
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
        match self.stream(stream)?.queue.take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn sync(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
        if let Err(e) = self.ensure_not_capturing(stream, "sync") {
            return Box::pin(core::future::ready(Err(e)));
        }
        self.sync_marker(stream)
    }

    fn stream_ids(&self) -> Vec<StreamId> {
        self.streams.ids()
    }

    fn memory_usage(&mut self, stream: StreamId) -> Result<MemoryUsage, ServerError> {
        Ok(self.stream(stream)?.memory.memory_usage())
    }

    fn memory_cleanup(&mut self, stream: StreamId) {
        self.streams.cleanup(stream);
    }

    fn retire_stream(&mut self, stream: StreamId, wait: bool) -> bool {
        // Its queued work runs first (queued commands hold the bindings they use); other
        // streams' commands that wait for it hold its progress counter (an `Arc`), not the state.
        // Dropping the state frees its pools and stops its worker thread.
        self.streams.try_retire(stream, |state| {
            if wait {
                state.queue.wait_idle();
                true
            } else {
                state.queue.is_idle()
            }
        })
    }

    fn allocation_mode(
        &mut self,
        mode: MemoryAllocationMode,
        stream: StreamId,
    ) -> MemoryAllocationMode {
        self.stream(stream)
            .map_or(MemoryAllocationMode::Auto, |state| state.memory.mode(mode))
    }

    fn configure_memory_pools(
        &mut self,
        config: &MemoryPoolsConfig,
        stream: StreamId,
    ) -> Result<bool, PoolConfigError> {
        self.streams.configure_memory_pools(config, stream)
    }

    fn graph_prepare(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.stream(stream)?.prepare_graph(stream)
    }

    fn begin_capture(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.stream(stream)?.begin_capture(stream, Vec::new())
    }

    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, ServerError> {
        let launches = self.stream(stream)?.end_capture(stream)?;
        Ok(self.graphs.insert(stream, launches))
    }

    fn graph_replay(&mut self, graph: GraphId, stream: StreamId) -> Result<(), ServerError> {
        self.ensure_not_capturing(stream, "graph replay")?;
        let launches = self.graphs.for_replay(graph, stream)?.clone();
        for launch in launches {
            let bindings: Vec<Binding> = launch.bindings().cloned().collect();
            let refs: Vec<&Binding> = bindings.iter().collect();
            self.submit(stream, &refs, Box::new(move || launch.run()))?;
        }
        Ok(())
    }

    fn graph_release(&mut self, graph: GraphId) {
        self.graphs.remove(graph);
    }

    fn profile_start(&mut self, stream: StreamId) -> Result<ProfileToken, ProfileError> {
        self.ensure_not_capturing(stream, "profile")?;
        Ok(self.profiles.start(None))
    }

    fn profile_end(
        &mut self,
        token: ProfileToken,
        stream: StreamId,
    ) -> DynFut<Result<ProfileDuration, ProfileError>> {
        match self.profiles.end(token) {
            Ok((start, _)) => host_profile(start, self.sync(stream)),
            Err(e) => Box::pin(core::future::ready(Err(e))),
        }
    }

    fn ensure_init_collective(
        &mut self,
        devices: &[DeviceId],
        _stream: StreamId,
    ) -> Result<(), ServerError> {
        let group = self.check_group(devices)?;
        HostRendezvous::global().register(&group);
        self.comm_streams
            .entry(group)
            .or_insert_with(StreamId::fresh);
        Ok(())
    }

    fn all_reduce(
        &mut self,
        src: Binding,
        dst: Binding,
        dtype: ElemType,
        devices: Vec<DeviceId>,
        op: ReduceOperation,
        _stream: StreamId,
    ) -> Result<(), ServerError> {
        let group = self.check_group(&devices)?;
        let comm = self.comm_streams.get(&group).copied();
        compute_core::collective::check_all_reduce(
            &group,
            comm.is_some(),
            src.size(),
            dst.size(),
            dtype,
        )?;
        let Some(comm) = comm else {
            unreachable!("check_all_reduce refuses a group that was not initialised")
        };
        let source = self.resolve(&src)?;
        let target = self.resolve(&dst)?;
        let me = self.owner.device;
        let round = HostRendezvous::global().next_round(&group, me);
        let (keep_src, keep_dst) = (src.clone(), dst.clone());
        let command: Command = Box::new(move || {
            let _alive = (&keep_src, &keep_dst);
            // SAFETY: the bindings keep both ranges alive; stream waits order their contents.
            let data = unsafe { core::slice::from_raw_parts(source.ptr(), source.len()) }.to_vec();
            let out = HostRendezvous::global().all_reduce(&group, round, me, data, dtype, op)?;
            // SAFETY: `target` holds `out.len()` bytes (sizes checked equal at submission).
            unsafe { core::ptr::copy_nonoverlapping(out.as_ptr(), target.ptr(), out.len()) };
            Ok(())
        });
        self.submit(comm, &[&src, &dst], command)?;
        Ok(())
    }

    fn sync_collective(&mut self, _stream: StreamId) -> DynFut<Result<(), ServerError>> {
        let comms: Vec<StreamId> = self.comm_streams.values().copied().collect();
        let markers: Vec<_> = comms.into_iter().map(|c| self.sync_marker(c)).collect();
        Box::pin(async move {
            for marker in markers {
                marker.await?;
            }
            Ok(())
        })
    }
}

impl Drop for CpuServer {
    fn drop(&mut self) {
        // Commands hold raw pointers into the pools: let them finish before storage is freed.
        for (_, state) in self.streams.iter() {
            state.queue.wait_idle();
        }
    }
}
