//! [`ComputeServer`]: everything a client asks of a backend, split by role.
//!
//! [`ComputeServer`] keeps the backend's types and the calls that need them (info, resources,
//! launch, flush, sync); the rest comes from one supertrait per role, mirroring the role files
//! every backend has: [`ServerMemory`], [`ServerTransfer`], [`ServerGraph`], [`ServerProfile`]
//! and [`ServerCollective`]. Where the kit's rule is the whole body, the role trait's default
//! method is that rule, reached through [`ServerKit`]: a backend overrides it only where it does
//! more.
//!
//! A server is owned by one device and reached by every client of that device through a lock held
//! for the duration of one call. Calls that enqueue work (`create`, `write`, `launch`) return as
//! soon as the work is queued; calls that wait (`read`, `sync`, `profile_end`) return futures that
//! the client awaits *after* releasing the lock.

use crate::backend::ServerKit;
use crate::bytes::Bytes;
use crate::collective::AllReduce;
use crate::device::DeviceId;
use crate::error::{ProfileError, ServerError};
use crate::future::DynFut;
use crate::graph::GraphId;
use crate::handle::{
    Binding, CopyDescriptor, CubeCount, ExecutionMode, Handle, HandleOwner, KernelArguments,
};
use crate::kernel::{BackendKernel, KernelDefinition};
use crate::layout::{MemoryLayout, MemoryLayoutDescriptor};
use crate::memory::{
    HostMemoryUsage, MemoryAllocationMode, MemoryPoolsConfig, MemoryUsage, PoolConfigError,
};
use crate::profile::{ProfileDuration, ProfileToken};
use crate::properties::{DeviceProperties, HardwareProperties};
use crate::storage::ComputeStorage;
use crate::stream::StreamId;

/// A backend's server for one device.
///
/// Every method takes the stream the caller works on (here and in the role supertraits). Each contract below is what the conformance
/// suite checks; a backend that cannot honour one returns [`ServerError::Unsupported`].
pub trait ComputeServer:
    Send
    + Sized
    + 'static
    + ServerMemory
    + ServerTransfer
    + ServerGraph
    + ServerProfile
    + ServerCollective
{
    /// The backend's kernel type; every backend accepts the portable kernel.
    ///
    /// Cheap to clone (an `Arc` inside): generic code converts a definition once
    /// (`let kernel: <R::Server as ComputeServer>::Kernel = def.into();`) and launches clones of
    /// the kept kernel, so no launch clones or hashes the IR again.
    type Kernel: From<KernelDefinition> + Clone + Send + Sync + 'static;
    /// The raw allocator.
    type Storage: ComputeStorage;
    /// Backend information returned by `ComputeClient::info`.
    type Info: core::fmt::Debug + Clone + Send + Sync + 'static;

    /// Backend information.
    fn info(&self) -> Self::Info;

    /// Device properties, read once when the client is created; the default is the properties
    /// the kit's streams were made with.
    fn properties(&self) -> DeviceProperties {
        self.kit_streams().properties().clone()
    }

    /// Who owns the handles this server creates (its device and instance id); the default is
    /// the owner the kit's streams create handles for.
    fn owner(&self) -> HandleOwner {
        self.kit_streams().owner()
    }

    /// The storage resource behind a binding, once the work on `stream` that uses it has finished.
    fn get_resource(
        &mut self,
        binding: Binding,
        stream: StreamId,
    ) -> Result<<Self::Storage as ComputeStorage>::Resource, ServerError>;

    /// Enqueue a kernel.
    ///
    /// # Safety
    /// With [`ExecutionMode::Unchecked`] the caller guarantees the kernel makes no out-of-bounds
    /// access and terminates.
    unsafe fn launch(
        &mut self,
        launch: KernelLaunch<Self::Kernel>,
        stream: StreamId,
    ) -> Result<(), ServerError>;

    /// Submit everything queued on `stream` and report errors found so far.
    fn flush(&mut self, stream: StreamId) -> Result<(), ServerError>;

    /// A future that completes when everything submitted to `stream` so far has run.
    fn sync(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>>;
}

/// One kernel launch as [`ComputeServer::launch`] receives it.
pub struct KernelLaunch<K> {
    /// The kernel to run.
    pub kernel: K,
    /// How many cubes run it.
    pub count: CubeCount,
    /// Its buffers and scalars, in the order of its parameters.
    pub arguments: KernelArguments,
    /// Whether its accesses are bounds-checked.
    pub mode: ExecutionMode,
}

impl<B> KernelLaunch<BackendKernel<B>> {
    /// The checks every backend makes before it records a launch: the arguments match the
    /// kernel's parameters and the count is within `hardware`'s limits. (The kernel's own
    /// limits, cube dimensions and shared and private memory, are checked once, when it is
    /// compiled.) By reference: a `Result` of the whole launch would copy it on the launch path;
    /// [`Self::into_parts`] then takes it apart in place.
    ///
    /// # Errors
    /// [`ServerError::Launch`] naming what does not match.
    #[inline]
    pub fn check(&self, hardware: &HardwareProperties) -> Result<(), ServerError> {
        self.kernel.definition().check_arguments(&self.arguments)?;
        self.count.check(hardware)?;
        Ok(())
    }

    /// The launch's kernel, count, arguments and mode, taken apart (after [`Self::check`]).
    /// Always inlined: the parts stay where they are, with no copy of the whole launch.
    #[inline(always)]
    pub fn into_parts(self) -> (BackendKernel<B>, CubeCount, KernelArguments, ExecutionMode) {
        (self.kernel, self.count, self.arguments, self.mode)
    }
}

/// The memory role: allocation, pools, streams' lifetimes and host staging.
pub trait ServerMemory: ServerKit {
    /// Allocate one tensor per descriptor. With several descriptors, all are packed into one
    /// allocation. Returns the handles and the strides chosen (`Contiguous` descriptors always get
    /// row-major strides without padding). Never blocks on the device.
    ///
    /// The default is the kit's ([`ServerKit::kit_create`]).
    fn create(
        &mut self,
        descriptors: &[MemoryLayoutDescriptor],
        stream: StreamId,
    ) -> Result<Vec<MemoryLayout>, ServerError> {
        self.kit_create(descriptors, stream)
    }

    /// Allocate one contiguous buffer of `size` bytes: the fast path behind `empty` and `create`.
    ///
    /// The default is the kit's ([`ServerKit::kit_create_buffer`]): no layout bookkeeping.
    fn create_buffer(&mut self, size: u64, stream: StreamId) -> Result<Handle, ServerError> {
        self.kit_create_buffer(size, stream)
    }

    /// Every stream this server has state for (the default: the kit's streams).
    fn stream_ids(&self) -> Vec<StreamId> {
        self.kit_streams().ids()
    }

    /// Memory usage of one stream's pools (the default: the kit's, creating the stream).
    fn memory_usage(&mut self, stream: StreamId) -> Result<MemoryUsage, ServerError> {
        Ok(self.stream(stream)?.memory.memory_usage())
    }

    /// Release free pages of `stream`'s pools (the default: the kit's cleanup).
    fn memory_cleanup(&mut self, stream: StreamId) {
        self.kit_parts().0.cleanup(stream);
    }

    /// The host memory this server keeps for transfers (staging, readback, pinned pools), over
    /// all its streams. A backend without such memory (the CPU, whose device memory is host
    /// memory) reports zeros, the default.
    fn host_memory_usage(&mut self) -> HostMemoryUsage {
        HostMemoryUsage::default()
    }

    /// Retire `stream`, which no client will use again (its thread exited, or the last client of
    /// a forked stream dropped): when nothing of its pools is in use (no live handle, no capture
    /// running) and its queued work has run, free its pools (their reserved memory goes back to
    /// the driver) and release its backend queue (worker thread, driver stream), and return
    /// `true`. Return `false` and keep everything when something is still in use or, without
    /// `wait`, when its work has not all run yet: the client asks again later. With `wait` the
    /// server may block for the stream's queued work (the client passes it only from its explicit
    /// memory calls, on a user's thread); without it, it must not block (the call may come from
    /// any thread that drops a client, a runtime thread among them). A stream the server has no
    /// state for returns `true`. Work issued on the id afterwards would start a new state, as for
    /// a new stream.
    fn retire_stream(&mut self, stream: StreamId, wait: bool) -> bool;

    /// Switch `stream`'s allocation mode.
    ///
    /// Returns the mode it replaces (so a section can restore it); `Auto` for a stream that has
    /// no state. The default switches the kit's stream (created if needed).
    fn allocation_mode(
        &mut self,
        mode: MemoryAllocationMode,
        stream: StreamId,
    ) -> MemoryAllocationMode {
        self.stream(stream)
            .map_or(MemoryAllocationMode::Auto, |state| state.memory.mode(mode))
    }

    /// Install a pool layout (see `ComputeClient::configure_memory_pools`); the default is the
    /// kit's ([`Streams::configure_memory_pools`](crate::backend::Streams::configure_memory_pools)).
    fn configure_memory_pools(
        &mut self,
        config: &MemoryPoolsConfig,
        stream: StreamId,
    ) -> Result<bool, PoolConfigError> {
        self.kit_parts().0.configure_memory_pools(config, stream)
    }

    /// Move `bytes` to memory the device copies from fastest (pinned memory), or at least read
    /// deferred (file-backed, lazy) bytes now. With `file_only`, only file-backed bytes move.
    ///
    /// The default reads deferred bytes into host memory, for backends without pinned memory.
    fn staging(&mut self, bytes: &mut [&mut Bytes], file_only: bool) -> Result<(), ServerError> {
        for b in bytes.iter_mut() {
            if file_only && b.kind() != crate::bytes::BytesKind::File {
                continue;
            }
            b.materialize()?;
        }
        Ok(())
    }
}

/// One host-to-device copy of [`ServerTransfer::write`]: where the bytes land, and the compact
/// bytes.
pub type HostWrite = (CopyDescriptor, Bytes);

/// The future of [`ServerTransfer::read`]: the compact bytes of each copy.
pub type ReadFuture = DynFut<Result<Vec<Bytes>, ServerError>>;

/// The future of [`ServerProfile::profile_end`]: the profile's duration.
pub type ProfileFuture = DynFut<Result<ProfileDuration, ProfileError>>;

/// The transfer role: copies between host and device.
pub trait ServerTransfer {
    /// Enqueue host-to-device copies. `data` is compact (no padding); the descriptor's strides say
    /// where each row lands. Later work on `stream` sees the data.
    fn write(&mut self, writes: Vec<HostWrite>, stream: StreamId) -> Result<(), ServerError>;

    /// Enqueue one host-to-device copy from borrowed bytes, read only before this returns: the
    /// path behind `create_from_slice`. The default copies `data` into owned [`Bytes`] and calls
    /// [`write`](Self::write); a backend whose write copies pageable bytes into its own staging
    /// during the call overrides it to skip that intermediate copy.
    fn write_from_slice(
        &mut self,
        descriptor: CopyDescriptor,
        data: &[u8],
        stream: StreamId,
    ) -> Result<(), ServerError> {
        self.write(vec![(descriptor, Bytes::from_slice(data))], stream)
    }

    /// Enqueue device-to-host copies, ordered after the work already on `stream` (and after the
    /// last use of each buffer on any other stream). Each result is compact (padding removed).
    fn read(&mut self, descriptors: Vec<CopyDescriptor>, stream: StreamId) -> ReadFuture;
}

/// The graph role: capture and replay.
pub trait ServerGraph: ServerKit {
    /// Prepare `stream` for capture: warm-up allocations go to the persistent pool.
    ///
    /// The default is the kit's ([`ServerKit::kit_prepare_graph`]).
    fn graph_prepare(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.kit_prepare_graph(stream)
    }

    /// Start recording launches on `stream` instead of running them.
    ///
    /// The default is the kit's: refused while a capture runs on `stream`, else an empty capture
    /// (the default [`KitCapture`](ServerKit::KitCapture)) starts; allocations are persistent
    /// while it runs.
    fn begin_capture(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.stream(stream)?
            .begin_capture(stream, Default::default())
    }

    /// Stop recording and keep the graph.
    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, ServerError>;

    /// Enqueue one replay of a captured graph on `stream`.
    fn graph_replay(&mut self, graph: GraphId, stream: StreamId) -> Result<(), ServerError>;

    /// Forget a graph; its resources are freed once its replays have run.
    ///
    /// The default drops it from the kit's registry.
    fn graph_release(&mut self, graph: GraphId) {
        self.kit_parts().1.remove(graph);
    }
}

/// The profile role: timing the work queued between two points of a stream.
pub trait ServerProfile {
    /// Mark the start of a profile on `stream` (after the work already queued).
    fn profile_start(&mut self, stream: StreamId) -> Result<ProfileToken, ProfileError>;

    /// A future of the time between `token` and the end of the work queued on `stream` since.
    fn profile_end(&mut self, token: ProfileToken, stream: StreamId) -> ProfileFuture;
}

/// The collective role: all-reduce between devices.
pub trait ServerCollective {
    /// Set up communication between `devices` (this server's device among them).
    fn ensure_init_collective(
        &mut self,
        devices: &[DeviceId],
        stream: StreamId,
    ) -> Result<(), ServerError>;

    /// Enqueue this device's part of an all-reduce over `devices` on the communication stream,
    /// ordered after the work on `stream` that produced `src`.
    fn all_reduce(&mut self, reduce: AllReduce, stream: StreamId) -> Result<(), ServerError>;

    /// A future that completes when this device's collectives issued so far have finished.
    fn sync_collective(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>>;
}
