//! Errors returned by the runtime.

use crate::device::DeviceId;

/// An error reported by a compute server.
///
/// Errors of fire-and-forget calls (`launch`, `write`, `create`, ...) are queued on their stream and
/// returned by the next `flush`, `sync` or read on that stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    /// The device could not satisfy an allocation, even after releasing free pages and retrying.
    #[error("out of memory: could not allocate {requested} bytes ({reason})")]
    OutOfMemory {
        /// Bytes requested.
        requested: u64,
        /// Why the allocation failed (the limit it hit, the driver's message).
        reason: String,
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
    /// An argument was invalid (sizes that do not match, a bad shape, a range out of bounds).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A kernel failed to compile.
    #[error("kernel compilation failed: {0}")]
    Compilation(String),
    /// A kernel failed while executing.
    #[error("kernel execution failed: {0}")]
    Execution(String),
    /// A feature the backend or the device does not have.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An operation that is not allowed while a graph capture is running on the stream.
    #[error("not allowed during graph capture: {0}")]
    Capture(String),
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
