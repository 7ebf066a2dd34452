//! The CPU server: per-stream workers, pools over host storage, a plan cache, graphs and
//! host-staged collectives.
//!
//! This file holds the struct, its construction, the stream and submission helpers, the
//! [`ServerKit`]. The `ComputeServer` core calls (launch, `get_resource`, flush, sync) are in
//! `launch.rs`; each role trait is implemented in the file of its role: `storage.rs` (`ServerMemory`), `transfer.rs` (`ServerTransfer`), `graph.rs`
//! (`ServerGraph`), `profile.rs` (`ServerProfile`) and `collective.rs` (`ServerCollective`).

use std::collections::BTreeMap;
use std::sync::Arc;

use compute_core::backend::{CreateRules, Graphs, ServerKit, StreamEntry, Streams};
use compute_core::future::{DynFut, oneshot};
use compute_core::handle::{HandleOwner, StreamPoint};
use compute_core::kernel::KernelId;
use compute_core::profile::ProfileTable;
use compute_core::{Binding, DeviceId, DeviceProperties, ServerError, StreamId};
use hashbrown::HashMap;

use crate::compiler::Plan;
use crate::device::CpuDevice;
use crate::graph::CpuGraph;
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
        let owner = HandleOwner::fresh(compute_core::Device::to_id(&device));
        Self {
            device,
            owner,
            streams: Streams::new(owner, properties),
            plans: HashMap::new(),
            graphs: Graphs::default(),
            profiles: ProfileTable::default(),
            comm_streams: BTreeMap::new(),
        }
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

/// The kit behind the role traits' defaults: the CPU's streams, graphs and create layout.
impl ServerKit for CpuServer {
    type KitStorage = CpuStorage;
    type KitQueue = Worker;
    type KitCapture = Vec<Arc<RecordedLaunch>>;
    type KitGraph = CpuGraph;

    fn kit_streams(&self) -> &Streams<CpuStorage, Worker, Vec<Arc<RecordedLaunch>>> {
        &self.streams
    }

    fn kit_parts(
        &mut self,
    ) -> (
        &mut Streams<CpuStorage, Worker, Vec<Arc<RecordedLaunch>>>,
        &mut Graphs<CpuGraph>,
    ) {
        (&mut self.streams, &mut self.graphs)
    }

    fn stream(&mut self, id: StreamId) -> Result<&mut StreamState, ServerError> {
        let index = self.device.index;
        self.streams.get_or_create(id, || {
            let worker = Worker::spawn(format!("cpu{index}-{id}"))?;
            Ok((CpuStorage::new(), worker))
        })
    }

    /// The CPU's layout of a `create`: 32-byte starts, its pitch alignment (the pools refuse
    /// one allocation above `max_page_size`).
    fn create_rules(&self) -> CreateRules {
        CreateRules {
            alignment: CPU_ALIGNMENT,
            pitch_alignment: self.streams.properties().pitch_alignment,
        }
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
