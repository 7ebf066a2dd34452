//! The structured errors of collectives and of the multi-process rendezvous.

use crate::device::DeviceId;
use core::fmt;

/// What the participants of a collective round disagree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MismatchKind {
    /// The number of bytes contributed.
    Size,
    /// The element type.
    DType,
    /// The reduction operation.
    Operation,
    /// The round number (one participant issued more or fewer collectives on the communicator).
    Round,
}

impl fmt::Display for MismatchKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MismatchKind::Size => "size",
            MismatchKind::DType => "element type",
            MismatchKind::Operation => "operation",
            MismatchKind::Round => "round number",
        })
    }
}

/// An error of a collective or of the rendezvous that joins processes into a world.
///
/// Every participant of a failed round gets one: a rank that does not arrive, dies or disagrees
/// makes the others fail within the rendezvous timeout instead of waiting for ever.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// A rendezvous variable is not set.
    #[error("environment variable {name} is not set: {hint}")]
    MissingVariable {
        /// The variable.
        name: String,
        /// What it should hold.
        hint: String,
    },
    /// A rendezvous variable does not parse or is out of range.
    #[error("environment variable {name}={value:?} is invalid: {reason}")]
    InvalidVariable {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A participant did not arrive (or did not answer) within the timeout.
    #[error("timed out after {timeout_ms} ms waiting for {waiting_for}")]
    Timeout {
        /// Who or what was waited for.
        waiting_for: String,
        /// The timeout.
        timeout_ms: u64,
    },
    /// A rank's connection closed or failed (the process died or left).
    #[error("rank {rank} was lost: {reason}")]
    PeerLost {
        /// The rank lost.
        rank: usize,
        /// What the connection reported.
        reason: String,
    },
    /// The participants of a round disagree on its size, element type, operation or number.
    #[error(
        "collective round {round}: participants disagree on the {kind}: {expected} here, {found} at {participant}"
    )]
    Mismatch {
        /// The round (per communicator, from 1).
        round: u64,
        /// What they disagree on.
        kind: MismatchKind,
        /// The value of the participant that checked.
        expected: String,
        /// The other participant's value.
        found: String,
        /// Who the other participant is (a device, or a rank).
        participant: String,
    },
    /// A rank joined with another `WORLD_SIZE` than rank 0's.
    #[error("rank {rank} joined with WORLD_SIZE={found}, but rank 0 has WORLD_SIZE={expected}")]
    WorldSize {
        /// The rank that disagrees.
        rank: usize,
        /// Rank 0's world size.
        expected: usize,
        /// The rank's world size.
        found: usize,
    },
    /// Two processes joined with the same rank.
    #[error("rank {rank} joined twice")]
    DuplicateRank {
        /// The rank.
        rank: usize,
    },
    /// A socket operation failed (binding the store, say).
    #[error("{what}: {reason}")]
    Io {
        /// What was being done.
        what: String,
        /// The operating system's message.
        reason: String,
    },
    /// A peer sent something this rank cannot understand.
    #[error("collective protocol error: {0}")]
    Protocol(String),
    /// The process has joined another world already (or joining it failed before).
    #[error("this process already joined a world: {0}")]
    AlreadyJoined(String),
    /// A collective's group does not contain the device that runs it.
    #[error("collective group {group:?} does not contain this device {device}")]
    NotInGroup {
        /// The group (sorted, without repeats).
        group: Vec<DeviceId>,
        /// The device the call ran on.
        device: DeviceId,
    },
    /// A collective's group names a device this backend does not have.
    #[error(
        "collective group names device {device}, which does not exist ({count} {backend} devices)"
    )]
    UnknownDevice {
        /// The device named.
        device: DeviceId,
        /// How many devices of the backend's type there are.
        count: u32,
        /// The backend.
        backend: String,
    },
    /// A collective over a group before `ensure_init_collective` for that group.
    #[error("all_reduce over {group:?} before ensure_init_collective for that group")]
    NotInitialised {
        /// The group.
        group: Vec<DeviceId>,
    },
    /// An all-reduce with no contribution at all.
    #[error("all_reduce with no contribution")]
    NoContribution,
    /// Contributions of one round that differ in size.
    #[error("all_reduce contributions differ in size: {first} and {other} bytes")]
    ContributionSizes {
        /// Bytes of the first contribution.
        first: u64,
        /// Bytes of one that differs.
        other: u64,
    },
    /// An all-reduce whose input and output differ in size, or are not whole elements.
    #[error("all_reduce from {src} to {dst} bytes of {dtype}")]
    Sizes {
        /// Bytes of the input.
        src: u64,
        /// Bytes of the output.
        dst: u64,
        /// The element type.
        dtype: crate::elem::ElemType,
    },
}
