//! The CPU server: per-stream workers, pools over host storage, a plan cache, graphs and
//! host-staged collectives.

use std::collections::BTreeMap;
use std::sync::Arc;

use compute_core::backend::{CreateRules, Graphs, StreamEntry, Streams};
use compute_core::future::{DynFut, oneshot};
use compute_core::graph::GraphId;
use compute_core::handle::{HandleOwner, StreamPoint};
use compute_core::kernel::KernelId;
use compute_core::memory::{
    HostMemoryUsage, MemoryAllocationMode, MemoryPoolsConfig, MemoryUsage, PoolConfigError,
};
use compute_core::profile::{ProfileTable, ProfileToken};
use compute_core::{
    Binding, Bytes, ComputeServer, CopyDescriptor, CubeCount, DeviceId, DeviceProperties, ElemType,
    ExecutionMode, Handle, KernelArguments, MemoryLayout, MemoryLayoutDescriptor, ProfileDuration,
    ProfileError, ReduceOperation, ServerError, StreamId,
};
use hashbrown::HashMap;

use crate::compiler::{self, Plan};
use crate::device::CpuDevice;
use crate::graph::CpuGraph;
use crate::kernel::CpuKernel;
use crate::launch::RecordedLaunch;
use crate::storage::{CPU_ALIGNMENT, CpuResource, CpuStorage};
use crate::worker::{Command, Progress, Worker};

/// Backend information of a CPU server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuInfo {
    /// The logical device.
    pub device: CpuDevice,
    /// Worker threads the executor spreads cubes over.
    pub threads: usize,
    /// Whether kernels compile to machine code (`COMPUTE_CPU_JIT`, on by default); the few the
    /// JIT does not cover run on the interpreter (`COMPUTE_CPU_JIT_LOG=1` names them, and
    /// [`Plan::executor`](crate::compiler::Plan::executor) tells for one plan).
    pub jit: bool,
    /// The instruction-set features in use, e.g. `x86_64 avx2 fma sse4.1`.
    pub cpu_features: String,
}

/// A stream: its pools, its capture (the launches recorded so far) and its worker thread.
pub(crate) type StreamState = StreamEntry<CpuStorage, Worker, Vec<Arc<RecordedLaunch>>>;

/// The server of one logical CPU device.
pub struct CpuServer {
    pub(crate) device: CpuDevice,
    pub(crate) owner: HandleOwner,
    pub(crate) properties: DeviceProperties,
    pub(crate) streams: Streams<CpuStorage, Worker, Vec<Arc<RecordedLaunch>>>,
    pub(crate) plans: HashMap<KernelId, Arc<Plan>>,
    pub(crate) graphs: Graphs<CpuGraph>,
    pub(crate) profiles: ProfileTable<()>,
    /// One communication stream per collective group, like one NCCL communicator each: two
    /// groups sharing a queue could deadlock (each device waiting in a different group's round).
    pub(crate) comm_streams: BTreeMap<Vec<DeviceId>, StreamId>,
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

    /// The CPU's layout of a `create`: 32-byte starts, its pitch alignment (the pools refuse
    /// one allocation above `max_page_size`).
    fn create_rules(&self) -> CreateRules {
        CreateRules {
            alignment: CPU_ALIGNMENT,
            pitch_alignment: self.properties.pitch_alignment,
        }
    }

    pub(crate) fn stream(&mut self, id: StreamId) -> Result<&mut StreamState, ServerError> {
        let index = self.device.index;
        self.streams.get_or_create(id, || {
            let worker = Worker::spawn(format!("cpu{index}-{id}"))?;
            Ok((CpuStorage::new(), worker))
        })
    }

    pub(crate) fn resolve(&mut self, binding: &Binding) -> Result<CpuResource, ServerError> {
        self.streams.resolve(binding)
    }

    /// Points of other streams that the next command of `stream` must wait for.
    pub(crate) fn waits<'b>(
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
    pub(crate) fn submit(
        &mut self,
        stream: StreamId,
        bindings: &[&Binding],
        command: Command,
    ) -> Result<u64, ServerError> {
        self.submit_with(stream, bindings, command, false)
    }

    /// [`submit`](Self::submit); with `inline`, the command runs at once on the calling thread
    /// when the stream is idle (for small launches and sync markers).
    pub(crate) fn submit_with(
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

    pub(crate) fn ensure_not_capturing(
        &self,
        stream: StreamId,
        what: &str,
    ) -> Result<(), ServerError> {
        self.streams.ensure_not_capturing(stream, what)
    }

    pub(crate) fn sync_marker(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
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
}

pub(crate) fn worker_gone() -> ServerError {
    ServerError::Driver("the stream worker stopped before answering".into())
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
        let owner = self.owner;
        self.stream(stream)?.create_buffer(owner, stream, size)
    }

    fn write(
        &mut self,
        writes: Vec<(CopyDescriptor, Bytes)>,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.write_all(writes, stream)
    }

    fn read(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        self.read_all(descriptors, stream)
    }

    fn get_resource(
        &mut self,
        binding: Binding,
        stream: StreamId,
    ) -> Result<CpuResource, ServerError> {
        self.resource_when_idle(binding, stream)
    }

    unsafe fn launch(
        &mut self,
        kernel: CpuKernel,
        count: CubeCount,
        arguments: KernelArguments,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        // SAFETY: the caller's contract of `launch` is passed on unchanged.
        unsafe { self.launch_kernel(kernel, count, arguments, mode, stream) }
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

    fn host_memory_usage(&mut self) -> HostMemoryUsage {
        // Device memory is host memory here: writes copy straight into the pools and a read
        // copies into the `Bytes` it returns (the caller's); nothing is staged.
        HostMemoryUsage::default()
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
        self.replay(graph, stream)
    }

    fn graph_release(&mut self, graph: GraphId) {
        self.graphs.remove(graph);
    }

    fn profile_start(&mut self, stream: StreamId) -> Result<ProfileToken, ProfileError> {
        self.start_profile(stream)
    }

    fn profile_end(
        &mut self,
        token: ProfileToken,
        stream: StreamId,
    ) -> DynFut<Result<ProfileDuration, ProfileError>> {
        self.end_profile(token, stream)
    }

    fn ensure_init_collective(
        &mut self,
        devices: &[DeviceId],
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.init_collective(devices, stream)
    }

    fn all_reduce(
        &mut self,
        src: Binding,
        dst: Binding,
        dtype: ElemType,
        devices: Vec<DeviceId>,
        op: ReduceOperation,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.all_reduce_on_group(src, dst, dtype, devices, op, stream)
    }

    fn sync_collective(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
        self.sync_groups(stream)
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
