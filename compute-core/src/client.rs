//! [`ComputeClient`]: the entry point through which frameworks use a device.
//!
//! Size: the client implements the whole `ComputeClient` spec, method by method in the spec's
//! order; each method is short and delegates to the server.

use core::future::Future;
use core::time::Duration;
use std::collections::VecDeque;
use std::sync::Arc;

use hashbrown::HashMap;

use crate::bytes::Bytes;
use crate::collective::{AllReduce, ReduceOperation};
use crate::device::{Device, DeviceId, registry_get_or_create, registry_set};
use crate::elem::ElemType;
use crate::error::{LayoutError, ProfileError, ServerError};
use crate::exclusive::ExclusiveGate;
use crate::future::{DynFut, block_on};
use crate::graph::Graph;
use crate::handle::{
    CopyDescriptor, CubeCount, ExecutionMode, Handle, HandleOwner, KernelArguments,
};
use crate::layout::{MemoryLayout, MemoryLayoutDescriptor, Shape, contiguous_strides};
use crate::memory::{
    HostMemoryUsage, MemoryAllocationMode, MemoryPoolsConfig, MemoryUsage, SliceHandle,
};
use crate::profile::ProfileDuration;
use crate::properties::{DeviceProperties, Features, VectorSize};
use crate::runtime::Runtime;
use crate::server::{
    ComputeServer, KernelLaunch, ServerCollective, ServerGraph, ServerMemory, ServerProfile,
    ServerTransfer,
};
use crate::storage::{ComputeStorage, ManagedResource};
use crate::stream::{RetireSink, StreamId, register_sink};
use crate::throughput::{KernelConfig, ThroughputKey, ThroughputValue};

type Resource<R> = <<<R as Runtime>::Server as ComputeServer>::Storage as ComputeStorage>::Resource;
type Info<R> = <<R as Runtime>::Server as ComputeServer>::Info;

/// State shared by every client of one device.
///
/// The server sits behind a lock that parks waiting threads (`std::sync::Mutex`: a brief spin,
/// then a futex wait), not a spin lock: some server calls are long (an NVRTC compile, a pipeline
/// creation, a cache write), and threads spinning through them starved the holder on machines
/// with fewer cores than threads (the `server lock contention` bench row).
struct ClientShared<R: Runtime> {
    server: std::sync::Mutex<R::Server>,
    owner: HandleOwner,
    info: Info<R>,
    properties: Arc<DeviceProperties>,
    errors: spin::Mutex<HashMap<StreamId, VecDeque<ServerError>>>,
    gate: ExclusiveGate,
    /// Streams announced as retired (thread exits, last clients of forked streams).
    sink: Arc<RetireSink>,
    /// Retired streams the server could not free yet (memory still in use), asked again later.
    retiring: spin::Mutex<Vec<StreamId>>,
    /// Streams between `graph_prepare` and `stop_capture`: `memory_cleanup` from another stream
    /// leaves their pools alone (the warm-up's free blocks are what the capture allocates from).
    preparing: spin::Mutex<Vec<StreamId>>,
}

/// A forked stream's lease: shared by the clients on that stream (and the graphs captured
/// there); the last one dropped retires the stream.
struct StreamLease<R: Runtime> {
    shared: Arc<ClientShared<R>>,
    stream: StreamId,
}

impl<R: Runtime> Drop for StreamLease<R> {
    fn drop(&mut self) {
        self.shared.sink.push(self.stream);
        // Retire now unless the server is busy (this may run inside a server call, through a
        // dropped lazy `Bytes` holding a client, say): then the next server call does.
        if self.shared.gate.held_by_other() {
            return;
        }
        let guard = match self.shared.server.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if let Some(mut server) = guard {
            self.shared.retire_announced(&mut server, false);
        }
    }
}

/// The entry point to a device: allocation, transfers, launches, synchronisation, graphs,
/// collectives and profiling. Cheap to clone; every clone reaches the same server.
///
/// Calls that enqueue work return at once. Their errors are queued on the stream and returned by
/// the next [`flush`](Self::flush), [`sync`](Self::sync) or read on that stream.
///
/// # Streams
///
/// A client works on the calling thread's default stream ([`StreamId::current`]), or on a stream
/// of its own: [`fork_stream`](Self::fork_stream) returns a client on a new stream, shared by its
/// clones and by the graphs captured on it. A stream is *retired* — its pools freed (their
/// reserved memory returned to the driver) and its backend queue released (the CPU's worker
/// thread, the CUDA stream) — once nothing will use it again and nothing of it is in use:
/// a thread's default stream when the thread exits, a forked stream when its last client (and
/// last graph) drops, in both cases once every handle allocated on it has been dropped and its
/// queued work has run. Handles of a stream keep it from being retired, never the other way
/// round: a handle that outlives its stream's clients stays valid, and the stream is retired
/// after it drops (at the next [`memory_usage`](Self::memory_usage),
/// [`memory_cleanup`](Self::memory_cleanup) or retirement on the device).
///
/// # Graph capture
///
/// Capture on a stream of its own ([`fork_stream`](Self::fork_stream)): call
/// [`graph_prepare`](Self::graph_prepare), run the work once (the warm-up, which allocates what
/// the graph will use), then [`start_capture`](Self::start_capture), the same work, and
/// [`stop_capture`](Self::stop_capture).
/// - `graph_prepare` switches the stream's allocations to the exact-size persistent pool, and
///   they stay there until `stop_capture` switches the stream back to the dynamic pools (the
///   warm-up's allocations are then persistent blocks, reused by size).
/// - Inside the capture window (between `start_capture` and `stop_capture`) an allocation
///   succeeds when the warm-up left a free persistent block of exactly that size (a buffer the
///   warm-up allocated and dropped); any other allocation fails with [`ServerError::Capture`],
///   as do a sync and a read.
/// - A [`Graph`] keeps every buffer it recorded alive (and its stream's client) until it is
///   dropped: its handles can be dropped right after the capture, and a replay still reads and
///   writes those buffers. Dropping the graph frees them once its replays have run (a sync
///   after the drop is enough for [`memory_usage`](Self::memory_usage) to show it).
pub struct ComputeClient<R: Runtime> {
    shared: Arc<ClientShared<R>>,
    stream: Option<StreamId>,
    properties: Arc<DeviceProperties>,
    lease: Option<Arc<StreamLease<R>>>,
}

impl<R: Runtime> Clone for ComputeClient<R> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            stream: self.stream,
            properties: self.properties.clone(),
            lease: self.lease.clone(),
        }
    }
}

impl<R: Runtime> core::fmt::Debug for ComputeClient<R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ComputeClient")
            .field("runtime", &R::name())
            .field("device", &self.shared.owner.device)
            .field("stream", &self.stream_id())
            .finish()
    }
}

impl<R: Runtime> ClientShared<R> {
    fn new(server: R::Server) -> Self {
        let owner = server.owner();
        let info = server.info();
        let properties = Arc::new(server.properties());
        Self {
            server: std::sync::Mutex::new(server),
            owner,
            info,
            properties,
            errors: spin::Mutex::new(HashMap::new()),
            gate: ExclusiveGate::default(),
            sink: register_sink(),
            retiring: spin::Mutex::new(Vec::new()),
            preparing: spin::Mutex::new(Vec::new()),
        }
    }

    /// Take the newly announced streams and, when there are some or `retry` is set, ask the
    /// server to retire every stream waiting for it; keep those it cannot free yet. `retry` (the
    /// explicit memory calls) also lets the server wait for those streams' work.
    fn retire_announced(&self, server: &mut R::Server, retry: bool) {
        let announced = if self.sink.signalled() {
            self.sink.take()
        } else {
            Vec::new()
        };
        if announced.is_empty() && !retry {
            return;
        }
        let mut retiring = self.retiring.lock();
        retiring.extend(announced);
        if retiring.is_empty() {
            return;
        }
        let mut retired = Vec::new();
        retiring.retain(|&id| {
            let done = server.retire_stream(id, retry);
            if done {
                retired.push(id);
            }
            !done
        });
        drop(retiring);
        if !retired.is_empty() {
            self.preparing.lock().retain(|p| !retired.contains(p));
            let mut errors = self.errors.lock();
            for id in retired {
                errors.remove(&id);
            }
        }
    }
}

impl<R: Runtime> ComputeClient<R> {
    fn from_shared(shared: Arc<ClientShared<R>>) -> Self {
        let properties = shared.properties.clone();
        Self {
            shared,
            stream: None,
            properties,
            lease: None,
        }
    }

    /// A client on a new stream of its own, shared by its clones (and by graphs captured on
    /// it); the other properties are this client's. Safe: no other client works on that stream
    /// unless it is a clone of the returned one, and the work of one client value is ordered by
    /// `&self` calls on it. The stream is retired (pools freed, backend queue released) when the
    /// last of those clients and graphs drops, once the handles allocated on it are dropped and
    /// its work has run (see [Streams](Self#streams)).
    pub fn fork_stream(&self) -> Self {
        let stream = StreamId::fresh();
        Self {
            shared: self.shared.clone(),
            stream: Some(stream),
            properties: self.properties.clone(),
            lease: Some(Arc::new(StreamLease {
                shared: self.shared.clone(),
                stream,
            })),
        }
    }

    /// Get the info of the current backend.
    pub fn info(&self) -> &Info<R> {
        &self.shared.info
    }

    /// Create a new client with a new server, and make it the one [`load`](Self::load) returns for
    /// this device from now on.
    pub fn init<D: Device>(device: &D, server: R::Server) -> Self {
        let shared = Arc::new(ClientShared::new(server));
        registry_set::<R, ClientShared<R>>(device.to_id(), shared.clone());
        Self::from_shared(shared)
    }

    /// Load the client for the given device, starting its server on first use.
    ///
    /// # Panics
    /// Panics if the server cannot be started (no driver, no such device); use
    /// [`try_load`](Self::try_load) to get the error instead.
    pub fn load<D: Device>(device: &D) -> Self {
        match Self::try_load(device) {
            Ok(client) => client,
            Err(e) => panic!("cannot load {} device {:?}: {e}", R::name(), device.to_id()),
        }
    }

    /// Load the client for the given device, or return why its server cannot be started.
    pub fn try_load<D: Device>(device: &D) -> Result<Self, ServerError> {
        let id = device.to_id();
        let shared = registry_get_or_create::<R, ClientShared<R>, ServerError>(id, || {
            let server = R::create_server(&R::Device::from_id(id))?;
            Ok(ClientShared::new(server))
        })?;
        Ok(Self::from_shared(shared))
    }

    /// A client on a new server of its own for `device`, shared with nothing: [`load`](Self::load)
    /// keeps returning the registered one. Its clones share its server; its handles are foreign
    /// to the other servers of the device. For work that must see exact device-wide figures
    /// ([`memory_usage`](Self::memory_usage)) whatever else the process runs.
    pub fn isolated<D: Device>(device: &D) -> Result<Self, ServerError> {
        let server = R::create_server(&R::Device::from_id(device.to_id()))?;
        Ok(Self::from_shared(Arc::new(ClientShared::new(server))))
    }

    /// Set the stream in which the current client is operating on.
    ///
    /// # Safety
    /// The caller takes over ordering between this client's work and work issued by other clients
    /// on the same stream id from other threads: the runtime orders buffers across streams, but
    /// interleaving two threads' commands on one stream is the caller's responsibility.
    ///
    /// A client set to another stream drops its share of a [forked](Self::fork_stream) stream.
    /// A stream set this way is not retired by the runtime (it cannot know when its last user
    /// is done); prefer [`fork_stream`](Self::fork_stream).
    pub unsafe fn set_stream(&mut self, stream_id: StreamId) {
        if self.stream != Some(stream_id) {
            self.lease = None;
        }
        self.stream = Some(stream_id);
    }

    /// The stream this client works on: the pinned one, or the calling thread's default stream.
    pub fn stream_id(&self) -> StreamId {
        self.stream.unwrap_or_else(StreamId::current)
    }

    /// The device this client drives.
    pub fn device_id(&self) -> DeviceId {
        self.shared.owner.device
    }

    /// Run `f` with the server locked, waiting first while another thread runs an `exclusive`
    /// task on this device.
    pub(crate) fn with_server<T>(&self, f: impl FnOnce(&mut R::Server) -> T) -> T {
        loop {
            self.shared.gate.wait_until_open();
            // A panic inside a server call leaves the server as the call left it; later calls
            // still reach it (and report its errors) rather than panicking on the poison.
            let mut server = self
                .shared
                .server
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if self.shared.gate.held_by_other() {
                drop(server);
                continue;
            }
            if self.shared.sink.signalled() {
                self.shared.retire_announced(&mut server, false);
            }
            return f(&mut server);
        }
    }

    fn push_error(&self, stream: StreamId, error: ServerError) {
        self.shared
            .errors
            .lock()
            .entry(stream)
            .or_default()
            .push_back(error);
    }

    fn take_error(&self, stream: StreamId) -> Result<(), ServerError> {
        let mut errors = self.shared.errors.lock();
        match errors.get_mut(&stream).and_then(crate::error::take_first) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn defer(&self, stream: StreamId, result: Result<(), ServerError>) {
        if let Err(e) = result {
            self.push_error(stream, e);
        }
    }

    fn failed_handle(&self, stream: StreamId) -> Handle {
        Handle::new(SliceHandle::detached(), self.shared.owner, stream)
    }

    fn failed_layout(&self, stream: StreamId, shape: Shape, elem_size: usize) -> MemoryLayout {
        let strides = contiguous_strides(&shape);
        MemoryLayout {
            memory: self.failed_handle(stream),
            shape,
            strides,
            elem_size,
        }
    }

    // ----------------------------------------------------------------------------------------
    // Reads
    // ----------------------------------------------------------------------------------------

    fn read_descriptors(
        &self,
        descriptors: Vec<CopyDescriptor>,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        let stream = self.stream_id();
        let checked = self.take_error(stream).and_then(|()| {
            descriptors.iter().try_for_each(|d| {
                d.binding.check_owner(self.shared.owner)?;
                d.validate()
            })
        });
        match checked {
            Err(e) => Box::pin(core::future::ready(Err(e))),
            Ok(()) => self.with_server(|server| server.read(descriptors, stream)),
        }
    }

    /// Given bindings, returns owned resources as bytes.
    pub fn read_async(
        &self,
        handles: Vec<Handle>,
    ) -> impl Future<Output = Result<Vec<Bytes>, ServerError>> + Send + use<R> {
        let descriptors = handles
            .into_iter()
            .map(Handle::copy_descriptor_bytes)
            .collect();
        self.read_descriptors(descriptors)
    }

    /// Given bindings, returns owned resources as bytes.
    ///
    /// # Panics
    /// Panics if the read operation fails.
    pub fn read(&self, handles: Vec<Handle>) -> Vec<Bytes> {
        block_on(self.read_async(handles)).unwrap_or_else(|e| panic!("read failed: {e}"))
    }

    /// Given a binding, returns owned resource as bytes.
    pub fn read_one(&self, handle: Handle) -> Result<Bytes, ServerError> {
        Ok(block_on(self.read_async(vec![handle]))?.remove(0))
    }

    /// Given a binding, returns owned resource as bytes.
    ///
    /// # Panics
    /// Panics if the read operation fails. Useful for tests.
    pub fn read_one_unchecked(&self, handle: Handle) -> Bytes {
        self.read_one(handle)
            .unwrap_or_else(|e| panic!("read failed: {e}"))
    }

    /// Given tensor descriptors, returns their data as compact bytes (padding removed).
    ///
    /// The strides must be row-major with a unit last stride, as the runtime creates them.
    pub fn read_tensor_async(
        &self,
        descriptors: Vec<CopyDescriptor>,
    ) -> impl Future<Output = Result<Vec<Bytes>, ServerError>> + Send + use<R> {
        self.read_descriptors(descriptors)
    }

    /// Given tensor descriptors, returns their data as compact bytes.
    ///
    /// # Panics
    /// Panics if the read operation fails.
    ///
    /// The tensor must be in the same layout as created by the runtime, or more strict.
    /// Contiguous tensors are always fine, strided tensors are only ok if the stride is similar to
    /// the one created by the runtime (i.e. padded on only the last dimension).
    pub fn read_tensor(&self, descriptors: Vec<CopyDescriptor>) -> Vec<Bytes> {
        block_on(self.read_tensor_async(descriptors))
            .unwrap_or_else(|e| panic!("read_tensor failed: {e}"))
    }

    /// Given a tensor descriptor, returns its data as compact bytes. See [`read_tensor`](Self::read_tensor).
    pub fn read_one_tensor_async(
        &self,
        descriptor: CopyDescriptor,
    ) -> impl Future<Output = Result<Bytes, ServerError>> + Send + use<R> {
        let fut = self.read_descriptors(vec![descriptor]);
        async move { Ok(fut.await?.remove(0)) }
    }

    /// Given a tensor descriptor, returns its data as compact bytes.
    ///
    /// # Panics
    /// Panics if the read operation fails. See [`read_tensor`](Self::read_tensor).
    pub fn read_one_unchecked_tensor(&self, descriptor: CopyDescriptor) -> Bytes {
        block_on(self.read_one_tensor_async(descriptor))
            .unwrap_or_else(|e| panic!("read_tensor failed: {e}"))
    }

    /// Reads the device resource described by `descriptor` lazily.
    ///
    /// The returned [`Bytes`] performs the device-to-host copy on first access, keeping the source
    /// allocation alive until then, so many tensors can be serialised one after the other without
    /// holding them all in host memory. The data reflects the device state at first access: the
    /// buffer must not be mutated between this call and the first read.
    pub fn read_lazy(&self, descriptor: CopyDescriptor) -> Bytes {
        let client = self.clone();
        let len = descriptor.compact_size();
        Bytes::lazy(len, move || {
            block_on(client.read_one_tensor_async(descriptor))
        })
    }

    /// Reads the device resource described by `descriptor` lazily, async variant.
    ///
    /// The future is immediately ready and yields a lazy [`Bytes`] (see [`read_lazy`](Self::read_lazy)).
    pub fn read_lazy_async(
        &self,
        descriptor: CopyDescriptor,
    ) -> impl Future<Output = Result<Bytes, ServerError>> + Send + use<R> {
        core::future::ready(Ok(self.read_lazy(descriptor)))
    }

    /// Given a resource handle, returns the storage resource, once the work on this client's
    /// stream that uses it has finished. The resource keeps the allocation alive.
    pub fn get_resource(
        &self,
        handle: Handle,
    ) -> Result<ManagedResource<Resource<R>>, ServerError> {
        let stream = self.stream_id();
        self.take_error(stream)?;
        handle.clone().binding().check_owner(self.shared.owner)?;
        let binding = handle.clone().binding();
        let resource = self.with_server(|server| server.get_resource(binding, stream))?;
        Ok(ManagedResource::new(resource, handle))
    }

    // ----------------------------------------------------------------------------------------
    // Allocation and writes
    // ----------------------------------------------------------------------------------------

    /// Allocate and fill tensors; errors are returned, not queued.
    pub fn try_create_tensors(
        &self,
        descriptors: Vec<(MemoryLayoutDescriptor, Bytes)>,
    ) -> Result<Vec<MemoryLayout>, ServerError> {
        let stream = self.stream_id();
        for (descriptor, bytes) in &descriptors {
            let expected = descriptor.checked_compact_size()?;
            if bytes.len() != expected {
                return Err(LayoutError::DataLength {
                    given: bytes.len() as u64,
                    expected: expected as u64,
                }
                .into());
            }
        }
        let layout_descriptors: Vec<_> = descriptors.iter().map(|(d, _)| d.clone()).collect();
        self.with_server(|server| {
            let layouts = server.create(&layout_descriptors, stream)?;
            let writes = layouts
                .iter()
                .zip(descriptors)
                .filter(|(_, (_, bytes))| !bytes.is_empty())
                .map(|(layout, (_, bytes))| (layout.copy_descriptor(), bytes))
                .collect::<Vec<_>>();
            if !writes.is_empty() {
                server.write(writes, stream)?;
            }
            Ok(layouts)
        })
    }

    /// Allocate tensors without filling them; errors are returned, not queued.
    pub fn try_empty_tensors(
        &self,
        descriptors: Vec<MemoryLayoutDescriptor>,
    ) -> Result<Vec<MemoryLayout>, ServerError> {
        let stream = self.stream_id();
        self.with_server(|server| server.create(&descriptors, stream))
    }

    /// Allocate `size` bytes; errors are returned, not queued.
    pub fn try_empty(&self, size: usize) -> Result<Handle, ServerError> {
        let stream = self.stream_id();
        self.with_server(|server| server.create_buffer(size as u64, stream))
    }

    /// Allocate a buffer holding `data`; errors are returned, not queued.
    pub fn try_create(&self, data: Bytes) -> Result<Handle, ServerError> {
        let stream = self.stream_id();
        self.with_server(|server| {
            let handle = server.create_buffer(data.len() as u64, stream)?;
            if !data.is_empty() {
                let descriptor = handle.clone().copy_descriptor_bytes();
                server.write(vec![(descriptor, data)], stream)?;
            }
            Ok(handle)
        })
    }

    fn layouts_or_failed(
        &self,
        result: Result<Vec<MemoryLayout>, ServerError>,
        shapes: Vec<(Shape, usize)>,
    ) -> Vec<MemoryLayout> {
        let stream = self.stream_id();
        match result {
            Ok(layouts) => layouts,
            Err(e) => {
                self.push_error(stream, e);
                shapes
                    .into_iter()
                    .map(|(shape, elem)| self.failed_layout(stream, shape, elem))
                    .collect()
            }
        }
    }

    /// Returns a resource handle containing the given data.
    ///
    /// The bytes are read before this returns (the rest is non-blocking). A backend that stages
    /// host writes itself (CUDA) copies them straight into its staging, with no intermediate host
    /// copy; elsewhere they are first copied into owned [`Bytes`], as [`create`](Self::create)
    /// of owned bytes avoids.
    pub fn create_from_slice(&self, slice: &[u8]) -> Handle {
        let stream = self.stream_id();
        let created = self.with_server(|server| {
            let handle = server.create_buffer(slice.len() as u64, stream)?;
            if !slice.is_empty() {
                let descriptor = handle.clone().copy_descriptor_bytes();
                server.write_from_slice(descriptor, slice, stream)?;
            }
            Ok(handle)
        });
        created.unwrap_or_else(|e| {
            self.push_error(stream, e);
            self.failed_handle(stream)
        })
    }

    /// Returns a resource handle containing the given [`Bytes`]. Non-blocking.
    ///
    /// If the allocation fails, the error is queued on the stream and the handle returned is empty
    /// (any use of it fails).
    pub fn create(&self, data: Bytes) -> Handle {
        let stream = self.stream_id();
        self.try_create(data).unwrap_or_else(|e| {
            self.push_error(stream, e);
            self.failed_handle(stream)
        })
    }

    /// Write data into an existing allocation, in place (same device pointer).
    ///
    /// This is how a captured [`Graph`]'s inputs are refreshed between replays: the graph records
    /// raw device pointers, so new input bytes must land in the very buffer the capture read from.
    /// Issue it from the capture stream so the write orders against the replays instead of racing
    /// them. `data` may be shorter than the handle (the start is written), never longer.
    ///
    /// Non-blocking: the write is enqueued on this client's current stream.
    pub fn write(&self, handle: &Handle, data: Bytes) {
        let stream = self.stream_id();
        let result = handle
            .clone()
            .binding()
            .check_owner(self.shared.owner)
            .and_then(|()| handle.clone().range(0, data.len() as u64))
            .and_then(|target| {
                if data.is_empty() {
                    return Ok(());
                }
                let descriptor = target.copy_descriptor_bytes();
                self.with_server(|server| server.write(vec![(descriptor, data)], stream))
            });
        self.defer(stream, result);
    }

    /// Given a resource and shape, stores it and returns the tensor handle and strides.
    ///
    /// The layout is up to the runtime: contiguous, or pitched (rows padded to an alignment, see
    /// [`DeviceProperties::pitch_alignment`]). Index and read it with the returned strides.
    /// Prefer [`create_tensor`](Self::create_tensor).
    pub fn create_tensor_from_slice(
        &self,
        slice: &[u8],
        shape: Shape,
        elem_size: usize,
    ) -> MemoryLayout {
        self.create_tensor(Bytes::from_slice(slice), shape, elem_size)
    }

    /// Given a resource and shape, stores it and returns the tensor handle and strides.
    ///
    /// This may or may not return contiguous strides: the layout is up to the runtime (contiguous,
    /// or pitched so that every row is aligned for the widest loads). The strides must be taken
    /// into account when indexing and reading the tensor (see [`read_tensor`](Self::read_tensor)).
    pub fn create_tensor(&self, bytes: Bytes, shape: Shape, elem_size: usize) -> MemoryLayout {
        let descriptor = MemoryLayoutDescriptor::optimized(shape.clone(), elem_size);
        let result = self.try_create_tensors(vec![(descriptor, bytes)]);
        self.layouts_or_failed(result, vec![(shape, elem_size)])
            .remove(0)
    }

    /// Reserves all shapes in a single storage buffer, copies the corresponding data into each
    /// handle, and returns the handles for them. Prefer [`create_tensors`](Self::create_tensors).
    pub fn create_tensors_from_slices(
        &self,
        descriptors: Vec<(MemoryLayoutDescriptor, &[u8])>,
    ) -> Vec<MemoryLayout> {
        self.create_tensors(
            descriptors
                .into_iter()
                .map(|(d, s)| (d, Bytes::from_slice(s)))
                .collect(),
        )
    }

    /// Reserves all shapes in a single storage buffer, copies the corresponding data into each
    /// handle, and returns the handles for them. See [`create_tensor`](Self::create_tensor).
    pub fn create_tensors(
        &self,
        descriptors: Vec<(MemoryLayoutDescriptor, Bytes)>,
    ) -> Vec<MemoryLayout> {
        let shapes = descriptors
            .iter()
            .map(|(d, _)| (d.shape.clone(), d.elem_size))
            .collect();
        let result = self.try_create_tensors(descriptors);
        self.layouts_or_failed(result, shapes)
    }

    /// Reserves `size` bytes in the storage, and returns a handle over them.
    pub fn empty(&self, size: usize) -> Handle {
        let stream = self.stream_id();
        self.try_empty(size).unwrap_or_else(|e| {
            self.push_error(stream, e);
            self.failed_handle(stream)
        })
    }

    /// Reserves `shape` in the storage, and returns a tensor handle for it. See
    /// [`create_tensor`](Self::create_tensor).
    pub fn empty_tensor(&self, shape: Shape, elem_size: usize) -> MemoryLayout {
        let descriptor = MemoryLayoutDescriptor::optimized(shape.clone(), elem_size);
        let result = self.try_empty_tensors(vec![descriptor]);
        self.layouts_or_failed(result, vec![(shape, elem_size)])
            .remove(0)
    }

    /// Reserves all shapes in a single storage buffer, and returns the handles for them. See
    /// [`create_tensor`](Self::create_tensor).
    pub fn empty_tensors(&self, descriptors: Vec<MemoryLayoutDescriptor>) -> Vec<MemoryLayout> {
        let shapes = descriptors
            .iter()
            .map(|d| (d.shape.clone(), d.elem_size))
            .collect();
        let result = self.try_empty_tensors(descriptors);
        self.layouts_or_failed(result, shapes)
    }

    /// Marks the given [`Bytes`] as staging buffers: deferred (file-backed, lazy) bytes are read
    /// now, and bytes move to pinned memory where the backend has it. With `file_only`, only
    /// file-backed bytes are touched.
    ///
    /// This does host work on the calling thread; it does not wait for the device.
    pub fn staging<'a, I>(&self, bytes: I, file_only: bool)
    where
        I: Iterator<Item = &'a mut Bytes>,
    {
        let stream = self.stream_id();
        let mut all: Vec<&mut Bytes> = bytes.collect();
        let result = self.with_server(|server| server.staging(&mut all, file_only));
        self.defer(stream, result);
    }

    // ----------------------------------------------------------------------------------------
    // Exclusive and persistent sections
    // ----------------------------------------------------------------------------------------

    /// Run `task` on the calling thread with no other thread's work on this device interleaved:
    /// other clients' calls wait until it returns. Work `task` issues is flushed at the end, and
    /// the first error of the stream is returned.
    pub fn exclusive<'a, Re: Send + 'static, F: FnOnce() -> Re + Send + 'a>(
        &'a self,
        task: F,
    ) -> Result<Re, ServerError> {
        struct Exit<'g>(&'g ExclusiveGate);
        impl Drop for Exit<'_> {
            fn drop(&mut self) {
                self.0.exit();
            }
        }
        self.shared.gate.enter();
        let _exit = Exit(&self.shared.gate);
        // Every call already holding the server lock finishes before the task starts.
        drop(
            self.shared
                .server
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        let out = task();
        self.flush()?;
        Ok(out)
    }

    /// Run `task(input)` with this stream's allocations served by the persistent pool (exact-size
    /// blocks kept for the lifetime of the data: model weights, graph inputs), then return to the
    /// mode the stream had before (the automatic mode, unless the section is nested in another
    /// one or in a [`graph_prepare`](Self::graph_prepare) window).
    pub fn memory_persistent_allocation<
        'a,
        Re: Send,
        Input: Send,
        F: FnOnce(Input) -> Re + Send + 'a,
    >(
        &'a self,
        input: Input,
        task: F,
    ) -> Result<Re, ServerError> {
        // The mode found at entry is restored, not `Auto`: a section nested in another one, or
        // in a `graph_prepare` window, leaves the outer one's mode in place.
        struct Restore<'c, R: Runtime>(&'c ComputeClient<R>, StreamId, MemoryAllocationMode);
        impl<R: Runtime> Drop for Restore<'_, R> {
            fn drop(&mut self) {
                let (stream, mode) = (self.1, self.2);
                self.0.with_server(|s| s.allocation_mode(mode, stream));
            }
        }
        let stream = self.stream_id();
        self.take_error(stream)?;
        let previous =
            self.with_server(|s| s.allocation_mode(MemoryAllocationMode::Persistent, stream));
        let restore = Restore(self, stream, previous);
        let out = task(input);
        drop(restore);
        self.take_error(stream)?;
        Ok(out)
    }

    // ----------------------------------------------------------------------------------------
    // Transfers between clients and collectives
    // ----------------------------------------------------------------------------------------

    /// Transfer data from one client to another.
    ///
    /// The copy goes through host memory; it waits for `src`'s data on this client's stream.
    /// Errors are queued on `dst_server`'s stream.
    ///
    /// The handle's size must be a whole number of `dtype` elements: otherwise the error
    /// ([`LayoutError::NotWholeElements`]) is queued on `dst_server`'s stream and nothing is
    /// copied (no tail is dropped silently).
    pub fn to_client(&mut self, src: Handle, dst_server: &Self, dtype: ElemType) -> Handle {
        let size = src.size() as usize;
        let elem = dtype.size().max(1);
        if !size.is_multiple_of(elem) {
            let stream = dst_server.stream_id();
            dst_server.push_error(
                stream,
                LayoutError::NotWholeElements {
                    len: size as u64,
                    elem_size: elem,
                }
                .into(),
            );
            return dst_server.failed_handle(stream);
        }
        let descriptor = CopyDescriptor::new(
            src.binding(),
            [size / dtype.size().max(1)],
            [1],
            dtype.size(),
        );
        self.to_client_tensor(descriptor, dst_server, dtype)
    }

    /// Transfer data from one client to another.
    ///
    /// Make sure the source description can be read in a contiguous manner. The result is a
    /// contiguous buffer holding the compact tensor data.
    pub fn to_client_tensor(
        &mut self,
        src_descriptor: CopyDescriptor,
        dst_server: &Self,
        dtype: ElemType,
    ) -> Handle {
        let stream = dst_server.stream_id();
        let result = if src_descriptor.elem_size != dtype.size() {
            Err(LayoutError::ElemSize {
                dtype,
                elem_size: src_descriptor.elem_size,
            }
            .into())
        } else {
            block_on(self.read_one_tensor_async(src_descriptor))
                .and_then(|bytes| dst_server.try_create(bytes))
        };
        result.unwrap_or_else(|e| {
            dst_server.push_error(stream, e);
            dst_server.failed_handle(stream)
        })
    }

    /// Set up communication between `device_ids` (this client's device among them).
    /// Errors are queued on the stream.
    pub fn ensure_init_collective(&mut self, device_ids: Vec<DeviceId>) {
        let stream = self.stream_id();
        let result = self.with_server(|s| s.ensure_init_collective(&device_ids, stream));
        self.defer(stream, result);
    }

    /// Wait on the communication stream: every collective this client's device has issued has
    /// finished when this returns. Errors are queued on the stream.
    pub fn sync_collective(&self) {
        let stream = self.stream_id();
        let fut = self.with_server(|s| s.sync_collective(stream));
        self.defer(stream, block_on(fut));
    }

    /// Perform an all_reduce operation on the given devices: every device calls it with its own
    /// `src` and `dst`; each `dst` receives the reduction of all `src`. Non-blocking; it runs on
    /// the communication stream, after the work on this stream that wrote `src`.
    pub fn all_reduce(
        &mut self,
        src: Handle,
        dst: Handle,
        dtype: ElemType,
        device_ids: Vec<DeviceId>,
        op: ReduceOperation,
    ) {
        let stream = self.stream_id();
        let owner = self.shared.owner;
        let src = src.binding();
        let dst = dst.binding();
        let result = src
            .check_owner(owner)
            .and_then(|()| dst.check_owner(owner))
            .and_then(|()| {
                let reduce = AllReduce {
                    src,
                    dst,
                    dtype,
                    devices: device_ids,
                    op,
                };
                self.with_server(|s| s.all_reduce(reduce, stream))
            });
        self.defer(stream, result);
    }

    // ----------------------------------------------------------------------------------------
    // Launches and synchronisation
    // ----------------------------------------------------------------------------------------

    fn launch_inner(
        &self,
        kernel: <R::Server as ComputeServer>::Kernel,
        count: CubeCount,
        bindings: KernelArguments,
        mode: ExecutionMode,
    ) {
        let stream = self.stream_id();
        let owner = self.shared.owner;
        let mut result = bindings.check_owner(owner);
        if let (Ok(()), CubeCount::Dynamic(binding)) = (&result, &count) {
            result = binding.check_owner(owner);
        }
        // The launch is built where the server takes it: each move of the 160-byte value
        // through a closure is a copy on the launch path.
        let result = match result {
            Ok(()) => self.with_server(|s| {
                let launch = KernelLaunch {
                    kernel,
                    count,
                    arguments: bindings,
                    mode,
                };
                // SAFETY: for `Unchecked`, the caller of `launch_unchecked` upholds its contract.
                unsafe { s.launch(launch, stream) }
            }),
            Err(e) => Err(e),
        };
        self.defer(stream, result);
    }

    /// Launches the kernel with the given bindings. Out-of-range loads read 0 and out-of-range
    /// stores are dropped. Non-blocking.
    pub fn launch(
        &self,
        kernel: <R::Server as ComputeServer>::Kernel,
        count: CubeCount,
        bindings: KernelArguments,
    ) {
        self.launch_inner(kernel, count, bindings, ExecutionMode::Checked)
    }

    /// Launches the kernel with the given bindings without performing any bound checks.
    ///
    /// # Safety
    /// To ensure this is safe, you must verify your kernel:
    /// - Has no out-of-bound reads and writes that can happen.
    /// - Has no infinite loops that might never terminate.
    pub unsafe fn launch_unchecked(
        &self,
        kernel: <R::Server as ComputeServer>::Kernel,
        count: CubeCount,
        bindings: KernelArguments,
    ) {
        self.launch_inner(kernel, count, bindings, ExecutionMode::Unchecked)
    }

    /// Flush all outstanding commands, and return the first error queued on the stream.
    pub fn flush(&self) -> Result<(), ServerError> {
        let stream = self.stream_id();
        self.take_error(stream)?;
        self.with_server(|s| s.flush(stream))
    }

    /// Wait for the completion of every task on this client's stream.
    pub fn sync(&self) -> DynFut<Result<(), ServerError>> {
        let stream = self.stream_id();
        if let Err(e) = self.take_error(stream) {
            return Box::pin(core::future::ready(Err(e)));
        }
        self.with_server(|s| s.sync(stream))
    }

    // ----------------------------------------------------------------------------------------
    // Graphs
    // ----------------------------------------------------------------------------------------

    /// Prepare this client's stream for a graph capture: enable the persistent pool and capture
    /// recording. Call this before the warm-up run, then [`start_capture`](Self::start_capture)
    /// around the run to record.
    pub fn graph_prepare(&self) -> Result<(), ServerError> {
        let stream = self.stream_id();
        self.take_error(stream)?;
        self.with_server(|s| s.graph_prepare(stream))?;
        let mut preparing = self.shared.preparing.lock();
        if !preparing.contains(&stream) {
            preparing.push(stream);
        }
        Ok(())
    }

    /// Begin recording launches on this client's stream into a graph rather than executing them.
    ///
    /// Capture on a stream of its own ([`fork_stream`](Self::fork_stream)), after
    /// `graph_prepare` and a warm-up; between this and [`stop_capture`](Self::stop_capture)
    /// no sync, read or allocation without a matching warm-up block may happen (they fail with
    /// [`ServerError::Capture`]). See [Graph capture](Self#graph-capture).
    pub fn start_capture(&self) -> Result<(), ServerError> {
        let stream = self.stream_id();
        self.take_error(stream)?;
        self.with_server(|s| s.begin_capture(stream))
    }

    /// Stop recording and return the captured graph, ready to replay.
    pub fn stop_capture(&self) -> Result<Graph<R>, ServerError> {
        let stream = self.stream_id();
        let id = self.with_server(|s| s.end_capture(stream));
        self.shared.preparing.lock().retain(|&p| p != stream);
        let id = id?;
        self.take_error(stream)?;
        Ok(Graph::new(self.clone(), id, stream))
    }

    // ----------------------------------------------------------------------------------------
    // Properties and memory
    // ----------------------------------------------------------------------------------------

    /// Get the properties of the device.
    pub fn properties(&self) -> &DeviceProperties {
        &self.properties
    }

    /// Get the features supported by the compute server.
    pub fn features(&self) -> &Features {
        &self.properties.features
    }

    /// Mutable properties of this client (a private copy: other clients keep theirs).
    ///
    /// # Warning
    /// For private use only.
    pub fn properties_mut(&mut self) -> Option<&mut DeviceProperties> {
        Some(Arc::make_mut(&mut self.properties))
    }

    /// Total memory usage across all streams on this client's device.
    ///
    /// Folds every stream's usage with [`MemoryUsage::combine`], so the result is the same
    /// whichever thread asks.
    ///
    /// Streams waiting to be retired are retired first where they can be (see
    /// [Streams](Self#streams)).
    pub fn memory_usage(&self) -> Result<MemoryUsage, ServerError> {
        self.with_server(|s| {
            self.shared.retire_announced(s, true);
            s.stream_ids()
                .into_iter()
                .try_fold(MemoryUsage::default(), |acc, id| {
                    Ok(acc.combine(s.memory_usage(id)?))
                })
        })
    }

    /// The host memory the device's server keeps for transfers: staging buffers, readback
    /// buffers and pinned pools ([`HostMemoryUsage`]), which [`memory_usage`](Self::memory_usage)
    /// (the device pools) leaves out.
    pub fn host_memory_usage(&self) -> HostMemoryUsage {
        self.with_server(|s| s.host_memory_usage())
    }

    /// Memory usage of this client's stream only (the pools `memory_cleanup` acts on).
    pub fn stream_memory_usage(&self) -> Result<MemoryUsage, ServerError> {
        let stream = self.stream_id();
        self.with_server(|s| {
            self.shared.retire_announced(s, true);
            s.memory_usage(stream)
        })
    }

    /// Get all devices of a specific type available to this runtime.
    pub fn enumerate_devices(&self, type_id: u16) -> Vec<DeviceId> {
        R::enumerate_devices(type_id)
    }

    /// Get all devices available to this runtime.
    pub fn enumerate_all_devices(&self) -> Vec<DeviceId> {
        R::enumerate_all_devices()
    }

    /// Get the number of devices of a specific type available to this runtime.
    pub fn device_count(&self, type_id: u16) -> usize {
        self.enumerate_devices(type_id).len()
    }

    /// Get the number of devices of every type available to this runtime.
    pub fn device_count_total(&self) -> usize {
        self.enumerate_all_devices().len()
    }

    /// Change the memory allocation mode of this client's stream.
    ///
    /// # Safety
    /// This function isn't thread safe and might create memory leaks: persistent allocations are
    /// only returned to the driver by an explicit [`memory_cleanup`](Self::memory_cleanup).
    pub unsafe fn allocation_mode(&self, mode: MemoryAllocationMode) {
        let stream = self.stream_id();
        self.with_server(|s| s.allocation_mode(mode, stream));
    }

    /// Ask the client to release memory that it can release: the free pages of every stream's
    /// pools on this device (this stream's first; see [`memory_usage`](Self::memory_usage);
    /// streams of other clients between [`graph_prepare`](Self::graph_prepare) and
    /// [`stop_capture`](Self::stop_capture) are left alone, their warm-up blocks kept),
    /// the streams waiting to be retired that can be now (see [Streams](Self#streams)), and the
    /// large host buffers kept for reuse by reads (see
    /// [`bytes::trim_host_cache`](crate::bytes::trim_host_cache)).
    ///
    /// Results vary with what the allocator deems beneficial; it is not guaranteed that any memory
    /// is freed.
    pub fn memory_cleanup(&self) {
        let stream = self.stream_id();
        self.with_server(|s| {
            self.shared.retire_announced(s, true);
            s.memory_cleanup(stream);
            let preparing = self.shared.preparing.lock().clone();
            for other in s.stream_ids() {
                if other != stream && !preparing.contains(&other) {
                    s.memory_cleanup(other);
                }
            }
        });
        crate::bytes::trim_host_cache();
    }

    /// Install a new dynamic-pool layout for the device's main memory.
    ///
    /// The current stream's pools are rebuilt in place when nothing is live in them, and the layout
    /// applies to every stream created afterwards. The persistent pool is never affected. Returns
    /// `true` when the current stream's pools were rebuilt now, `false` when they kept the old
    /// layout because something was still live in them.
    ///
    /// # Panics
    /// Panics if the layout is invalid (empty list, too many pools, zero page size, slice larger
    /// than page, cap smaller than page, unavailable preset).
    pub fn configure_memory_pools(&self, pools: &MemoryPoolsConfig) -> bool {
        let stream = self.stream_id();
        match self.with_server(|s| s.configure_memory_pools(pools, stream)) {
            Ok(rebuilt) => rebuilt,
            Err(e) => panic!("invalid memory pool layout: {e}"),
        }
    }

    // ----------------------------------------------------------------------------------------
    // Profiling and probes
    // ----------------------------------------------------------------------------------------

    /// Measure the execution time of the work `func` issues on this client's stream.
    ///
    /// The stream is synchronised first; the duration is device time where the backend has
    /// timestamps, else host time around a sync, as [`ProfileDuration::timing`] says.
    pub fn profile<O: Send + 'static>(
        &self,
        func: impl FnOnce() -> O + Send,
        func_name: &str,
    ) -> Result<(O, ProfileDuration), ProfileError> {
        let stream = self.stream_id();
        block_on(self.sync())?;
        let token = self.with_server(|s| s.profile_start(stream))?;
        let out = func();
        let end = self.with_server(|s| s.profile_end(token, stream));
        let duration = block_on(end).map_err(|e| match e {
            ProfileError::Server(inner) => ProfileError::Server(ServerError::Execution(format!(
                "while profiling `{func_name}`: {inner}"
            ))),
            other => other,
        })?;
        self.take_error(stream)?;
        Ok((out, duration))
    }

    /// Returns all vector sizes that are useful to perform optimal IO operations on elements of
    /// `size` bytes, widest first.
    pub fn io_optimized_vector_sizes(
        &self,
        size: usize,
    ) -> impl Iterator<Item = VectorSize> + Clone + use<R> {
        let max = self.properties.hardware.max_load_bytes as usize;
        [16u8, 8, 4, 2, 1]
            .into_iter()
            .filter(move |&w| w == 1 || (size > 0 && w as usize * size <= max))
    }

    /// Measure the maximum throughput of the device for `key` with a probe kernel sized by
    /// `kernel_config`.
    pub fn measure_throughput(
        &self,
        key: ThroughputKey,
        kernel_config: KernelConfig,
    ) -> ThroughputValue {
        crate::probe::measure_throughput(self, key, kernel_config)
    }

    /// Calculates the launch overhead of the device by sampling: `sample` is called a few times to
    /// warm up, then repeatedly; the median of its results is returned.
    pub fn measure_launch_overhead(&self, sample: impl Fn() -> Duration) -> Duration {
        const WARMUP: usize = 3;
        const SAMPLES: usize = 31;
        for _ in 0..WARMUP {
            sample();
        }
        let mut samples: Vec<Duration> = (0..SAMPLES).map(|_| sample()).collect();
        samples.sort();
        samples[SAMPLES / 2]
    }
}
