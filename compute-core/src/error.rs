//! Errors returned by the runtime.
//!
//! [`ServerError`] is the umbrella every call returns. Mistakes in the caller's input have their own
//! structured enums, so that code can match on what went wrong and read the numbers involved:
//! [`LayoutError`] (shapes, strides, sizes, ranges, host data lengths), [`LaunchError`] (launch
//! limits and arguments) and [`ValidationError`](crate::kernel::ValidationError) (a malformed
//! kernel). Each is `#[non_exhaustive]`: new cases may be added.

use crate::device::DeviceId;
use crate::kernel::ValidationError;

/// An error reported by a compute server.
///
/// Errors of fire-and-forget calls (`launch`, `write`, `create`, ...) are queued on their stream and
/// returned by the next `flush`, `sync` or read on that stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The device could not satisfy an allocation, even after releasing free pages and retrying.
    #[error("out of memory: could not allocate {requested} bytes ({reason})")]
    OutOfMemory {
        /// Bytes requested.
        requested: u64,
        /// Why the allocation failed (the limit it hit, the driver's message).
        reason: String,
    },
    /// A single buffer larger than the device allows for one allocation (not a lack of memory).
    #[error("buffer of {requested} bytes is larger than the device's maximum of {maximum} bytes")]
    BufferTooLarge {
        /// Bytes requested.
        requested: u64,
        /// The largest single buffer the device allows.
        maximum: u64,
    },
    /// A handle was used with a client of another device.
    #[error(
        "handle belongs to another server (device {found}), but was used with device {expected}"
    )]
    WrongDevice {
        /// The device of the client the handle was used with.
        expected: DeviceId,
        /// The device the handle was allocated on.
        found: DeviceId,
    },
    /// A handle made by another server instance of the same device: the device's server was
    /// re-initialised with `ComputeClient::init`, and the handle belongs to the other instance.
    #[error(
        "handle was made by another server of device {device}: the device's server was \
         re-initialised (ComputeClient::init) between the handle's creation and this use"
    )]
    ServerReplaced {
        /// The device.
        device: DeviceId,
    },
    /// A shape, stride, size, range or host-data length that does not fit.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A launch that breaks a device limit or does not match its kernel's parameters.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// A kernel that breaks a rule of the IR (found before any backend compiles it).
    #[error(transparent)]
    InvalidKernel(#[from] ValidationError),
    /// A kernel failed to compile.
    #[error("kernel compilation failed: {0}")]
    Compilation(String),
    /// A kernel failed while executing.
    #[error("kernel execution failed: {0}")]
    Execution(String),
    /// A feature the backend or the device does not have.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A graph capture rule broken, or a capture the driver refused.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// A graph replayed where it cannot be.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A memory pool configuration that does not fit the device (pool sizes, page sizes).
    #[error("memory pool configuration: {0}")]
    PoolConfig(#[from] crate::memory::PoolConfigError),
    /// A handle whose allocation failed (the error was queued on its stream then) used as if it
    /// held memory.
    #[error("the handle has no memory: its allocation failed (see the error queued then)")]
    NoMemory,
    /// A device index past the devices of its backend.
    #[error("{backend} device {index} does not exist ({count} devices{help})")]
    DeviceNotFound {
        /// The backend.
        backend: &'static str,
        /// The index asked for.
        index: usize,
        /// How many devices the backend has.
        count: usize,
        /// How to get more, where a setting does (empty otherwise).
        help: &'static str,
    },
    /// A host file (a lazily read `Bytes`) that could not be read.
    #[error("reading {len} bytes at offset {offset} of {path}: {message}")]
    FileRead {
        /// The file.
        path: String,
        /// Byte offset of the read.
        offset: u64,
        /// Bytes asked for.
        len: usize,
        /// The I/O error.
        message: String,
    },
    /// The backend's driver is not available on this machine.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The driver reported an error.
    #[error("driver error: {0}")]
    Driver(String),
    /// A collective failed: participants that disagree, a rank that did not arrive or was lost,
    /// a bad rendezvous variable.
    #[error("collective failed: {0}")]
    Collective(#[from] crate::collective::CollectiveError),
}

impl ServerError {
    /// `what` (a sync, a read, an allocation...) asked on `stream` while a graph capture runs
    /// there.
    pub fn capture_running(what: &str, stream: crate::StreamId) -> Self {
        CaptureError::Running {
            what: what.into(),
            stream,
        }
        .into()
    }

    /// `stop_capture` on a stream where no capture was started.
    pub fn capture_not_started(stream: crate::StreamId) -> Self {
        CaptureError::NotStarted { stream }.into()
    }
}

/// A graph capture rule broken, or a capture the driver refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// An operation that is not allowed while a capture runs on the stream.
    #[error(
        "not allowed during graph capture: {what} on {stream} while a graph capture is running"
    )]
    Running {
        /// The operation (a sync, a read, a write...).
        what: String,
        /// The capturing stream.
        stream: crate::StreamId,
    },
    /// `stop_capture` without `start_capture`.
    #[error("stop_capture on {stream} without start_capture")]
    NotStarted {
        /// The stream.
        stream: crate::StreamId,
    },
    /// An allocation inside the capture window that the persistent pool cannot serve without a
    /// fresh driver allocation.
    #[error(
        "allocating {requested} bytes during graph capture would need a fresh allocation; warm up \
         after graph_prepare so the persistent pool holds it"
    )]
    NeedsAllocation {
        /// Bytes requested.
        requested: u64,
    },
    /// The driver refused or invalidated the capture.
    #[error("graph capture failed in {call}: {message}")]
    Driver {
        /// The driver call, with what was being done.
        call: String,
        /// The driver's message.
        message: String,
    },
}

/// A graph replayed where it cannot be: graphs replay on the stream they were captured on, and
/// only on their own server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// The graph is not held by this server (another device's, or already dropped).
    #[error("graph {graph:?} is not held by this server")]
    NotHeld {
        /// The graph.
        graph: crate::GraphId,
    },
    /// Replayed on another stream than the one it was captured on.
    #[error("graph {graph:?} was captured on {captured_on} and replays there, not on {stream}")]
    WrongStream {
        /// The graph.
        graph: crate::GraphId,
        /// Its capture stream.
        captured_on: crate::StreamId,
        /// The stream of the replay.
        stream: crate::StreamId,
    },
}

/// An error returned by [`ComputeClient::profile`](crate::ComputeClient::profile).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// The profiled work failed on the device.
    #[error("profiled work failed: {0}")]
    Server(#[from] ServerError),
    /// Profiling could not be started (for instance, a profile is already running on the stream).
    #[error("profiling unavailable: {0}")]
    Unavailable(String),
}

/// A shape, stride, size, range or host-data length that does not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// A tensor read as an element type whose size is not the tensor's element size.
    #[error("{dtype} elements are {} bytes, the tensor's are {elem_size}", dtype.size())]
    ElemSize {
        /// The element type asked for.
        dtype: crate::elem::ElemType,
        /// The tensor's element size in bytes.
        elem_size: usize,
    },
    /// Shape and strides of different ranks.
    #[error("shape {shape:?} (rank {}) and strides {strides:?} (rank {}) have different ranks", shape.len(), strides.len())]
    RankMismatch {
        /// The shape.
        shape: Vec<usize>,
        /// The strides.
        strides: Vec<usize>,
    },
    /// A tensor whose size in bytes (or whose span over its strides) overflows `usize`.
    #[error(
        "a tensor of shape {shape:?} with strides {strides:?} and {elem_size}-byte elements \
         is larger than the address space"
    )]
    SizeOverflow {
        /// The shape.
        shape: Vec<usize>,
        /// The strides (row-major when the tensor is being created).
        strides: Vec<usize>,
        /// Size of one element in bytes.
        elem_size: usize,
    },
    /// Strides that are not row-major with a unit last stride, or whose rows overlap (aliasing
    /// strides such as `[0, 0]`: copies never broadcast).
    #[error(
        "strides {strides:?} of shape {shape:?} are not row-major with a unit last stride and non-overlapping rows"
    )]
    NotRowMajor {
        /// The shape.
        shape: Vec<usize>,
        /// The strides.
        strides: Vec<usize>,
    },
    /// A tensor that spans more bytes than its memory holds.
    #[error(
        "tensor of shape {shape:?} and strides {strides:?} spans {span} bytes, its memory has {size}"
    )]
    OutOfBounds {
        /// The shape.
        shape: Vec<usize>,
        /// The strides.
        strides: Vec<usize>,
        /// Bytes from the first to one past the last element.
        span: u64,
        /// Bytes of the memory.
        size: u64,
    },
    /// A byte range outside a handle.
    #[error("range {start}..{start}+{len} is outside a handle of {size} bytes")]
    RangeOutOfBounds {
        /// First byte of the range.
        start: u64,
        /// Length of the range.
        len: u64,
        /// Size of the handle.
        size: u64,
    },
    /// An element size of 0.
    #[error("tensor with an element size of 0")]
    ZeroElemSize,
    /// Host data whose length differs from what the target holds.
    #[error("{given} bytes given for a target of {expected} bytes")]
    DataLength {
        /// Bytes given.
        given: u64,
        /// Bytes the target holds.
        expected: u64,
    },
    /// Bytes that are not a whole number of elements.
    #[error("{len} bytes are not a whole number of {elem_size}-byte elements")]
    NotWholeElements {
        /// Bytes given.
        len: u64,
        /// Size of one element.
        elem_size: usize,
    },
}

/// A launch that breaks a device limit or does not match its kernel's parameters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// A cube dimension of 0.
    #[error("kernel `{kernel}` has a cube dimension of 0: {cube_dim:?}")]
    CubeDimZero {
        /// The kernel.
        kernel: String,
        /// Its cube dimensions.
        cube_dim: [u32; 3],
    },
    /// A cube dimension over the device's per-axis limit.
    #[error(
        "kernel `{kernel}` has cube dimensions {cube_dim:?}, the device allows at most {maximum:?}"
    )]
    CubeDimTooLarge {
        /// The kernel.
        kernel: String,
        /// Its cube dimensions.
        cube_dim: [u32; 3],
        /// The device's limits (max_cube_dim).
        maximum: [u32; 3],
    },
    /// More units per cube than the device allows (computed without overflow).
    #[error(
        "kernel `{kernel}` has {units} units per cube, the device allows at most {maximum} (max_units_per_cube)"
    )]
    TooManyUnits {
        /// The kernel.
        kernel: String,
        /// Units per cube.
        units: u64,
        /// The device's limit.
        maximum: u32,
    },
    /// A cube count over the device's per-axis limit.
    #[error("cube count {count:?} exceeds the device's limits {maximum:?} (max_cube_count)")]
    CubeCountTooLarge {
        /// The count.
        count: [u32; 3],
        /// The device's limits.
        maximum: [u32; 3],
    },
    /// A dynamic cube count whose buffer is misplaced or too small.
    #[error(
        "dynamic cube count at byte offset {offset} in {size} bytes: it needs 12 bytes at an offset that is a multiple of 4"
    )]
    DynamicCount {
        /// Byte offset of the count in its buffer.
        offset: u64,
        /// Bytes of the count's binding.
        size: u64,
    },
    /// More shared memory than the device allows per cube.
    #[error("kernel `{kernel}` uses {bytes} bytes of shared memory, the device allows {maximum}")]
    SharedMemory {
        /// The kernel.
        kernel: String,
        /// Bytes the kernel uses.
        bytes: u64,
        /// The device's limit.
        maximum: u64,
    },
    /// More private (local array) memory per unit than the runtime allows.
    #[error(
        "kernel `{kernel}` uses {bytes} bytes of local arrays per unit, the limit is {maximum}"
    )]
    PrivateMemory {
        /// The kernel.
        kernel: String,
        /// Bytes per unit.
        bytes: u64,
        /// The limit.
        maximum: u64,
    },
    /// A launch with a different number of buffers or scalars than the kernel declares.
    #[error("kernel `{kernel}` takes {expected} {what}, the launch passes {found}")]
    ArgumentCount {
        /// The kernel.
        kernel: String,
        /// `"buffers"` or `"scalars"`.
        what: &'static str,
        /// Declared.
        expected: usize,
        /// Passed.
        found: usize,
    },
    /// A scalar of another type than declared.
    #[error("scalar `{name}` of kernel `{kernel}` is {expected}, the launch passes {found}")]
    ScalarType {
        /// The kernel.
        kernel: String,
        /// The scalar.
        name: String,
        /// Declared type.
        expected: crate::elem::ElemType,
        /// Passed type.
        found: crate::elem::ElemType,
    },
    /// A buffer whose size is not a whole number of its items.
    #[error(
        "buffer `{name}` of kernel `{kernel}` holds {bytes} bytes, not a multiple of its {item_size}-byte item"
    )]
    BufferSize {
        /// The kernel.
        kernel: String,
        /// The buffer.
        name: String,
        /// Bytes bound.
        bytes: u64,
        /// Bytes of one item.
        item_size: usize,
    },
    /// A buffer argument whose start is not aligned as its kernel's accesses need.
    #[error(
        "buffer `{name}` of kernel `{kernel}` starts at byte {offset}, not a multiple of {alignment}"
    )]
    MisalignedBuffer {
        /// The kernel.
        kernel: String,
        /// The buffer (its declared name, or its position when the backend has no name).
        name: String,
        /// The start, in bytes (in its allocation block).
        offset: u64,
        /// The alignment needed, in bytes.
        alignment: u64,
    },
    /// A buffer argument larger than the device can bind for one kernel argument.
    #[error(
        "a buffer argument of kernel `{kernel}` binds {bytes} bytes, over the device's {limit} ({maximum} bytes)"
    )]
    BindingTooLarge {
        /// The kernel.
        kernel: String,
        /// Bytes the argument binds.
        bytes: u64,
        /// The device's limit.
        maximum: u64,
        /// The limit's name in the backend's API.
        limit: &'static str,
    },
    /// Tensor metadata of a rank the backend cannot pass.
    #[error("tensor metadata of rank {rank}: at most {maximum}")]
    MetadataTooLarge {
        /// The rank.
        rank: usize,
        /// The backend's maximum rank.
        maximum: usize,
    },
    /// Tensor metadata whose shape and strides ranks differ.
    #[error(
        "buffer `{name}` of kernel `{kernel}`: shape {shape:?} and strides {strides:?} have different ranks"
    )]
    MetadataRank {
        /// The kernel.
        kernel: String,
        /// The buffer.
        name: String,
        /// The shape.
        shape: Vec<usize>,
        /// The strides.
        strides: Vec<usize>,
    },
}

/// Errors discarded by [`take_first`] since the process started.
static DISCARDED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// The error-queue contract, the same for every backend and for the client: the call that
/// reports (`flush`, `sync`, a read, a profile) returns the **first** error queued on its stream
/// since the last report, and the errors queued behind it are discarded, so that one failed
/// section (an allocation that failed, then the launches that used its empty handle) does not
/// fail the next, unrelated call. Discarded errors are counted ([`discarded_errors`]).
pub fn take_first(queue: &mut std::collections::VecDeque<ServerError>) -> Option<ServerError> {
    let first = queue.pop_front()?;
    let rest = queue.len() as u64;
    if rest > 0 {
        queue.clear();
        DISCARDED.fetch_add(rest, core::sync::atomic::Ordering::Relaxed);
    }
    Some(first)
}

/// [`take_first`] as the result of the call that reports: the first queued error, `Ok` when
/// none is queued.
///
/// # Errors
/// The first error of `queue`.
pub fn take_result(queue: &mut std::collections::VecDeque<ServerError>) -> Result<(), ServerError> {
    take_first(queue).map_or(Ok(()), Err)
}

/// How many queued errors [`take_first`] has discarded in this process (each report returns
/// the first error of its stream; the ones queued behind it are dropped and counted here).
pub fn discarded_errors() -> u64 {
    DISCARDED.load(core::sync::atomic::Ordering::Relaxed)
}

/// Errors raised where no call can return them, since the process started.
static UNRETURNED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Report an error that no call can return: one raised in a `Drop` at teardown (waiting for the
/// device before destroying what its work uses), or a second failure on a path that already
/// returns a first error (giving up a reserved submission after its submit failed). It is
/// written to stderr with `context` (what was being done) and counted ([`unreturned_errors`]):
/// never silently discarded. Errors that a later call can return go to that call's queue instead.
pub fn report_unreturned(context: &str, error: &dyn core::fmt::Display) {
    UNRETURNED.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    eprintln!("compute: {context}: {error} (no call can return this error)");
}

/// How many errors [`report_unreturned`] has reported since the process started.
pub fn unreturned_errors() -> u64 {
    UNRETURNED.load(core::sync::atomic::Ordering::Relaxed)
}
