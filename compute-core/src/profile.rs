//! Profiling results.

use core::time::Duration;

use serde::{Deserialize, Serialize};

/// Where a duration was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TimingMethod {
    /// Device timestamps (CUDA events, timestamp queries): device time only.
    Device,
    /// The host's clock around a full sync: includes launch and synchronisation costs.
    Host,
}

/// The duration of profiled work and how it was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileDuration {
    /// The measured time.
    pub duration: Duration,
    /// How it was measured.
    pub timing: TimingMethod,
}

/// A profile in progress on a stream, as returned by a server's `profile_start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProfileToken {
    /// Backend-defined id of the start mark.
    pub id: u64,
}
