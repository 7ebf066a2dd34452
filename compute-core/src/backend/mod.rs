//! The kit a backend server is built from: the rules every backend shares, written once.
//!
//! - [`Streams`]: each stream's memory, capture state and backend queue; the stream, binding and
//!   memory methods of [`ComputeServer`](crate::ComputeServer), and the capture rule (no
//!   `graph_prepare`, capture or profile while a capture runs on the stream; persistent memory
//!   while a graph is prepared or captured).
//! - [`Graphs`]: the registry of captured graphs, with the replay rule (a graph replays on the
//!   stream it was captured on).
//!
//! - [`bind`]: the bound range of a buffer argument and the launch info words, for the backends
//!   that bind buffer ranges (wgpu, Vulkan).
//! - [`KernelCache`]: a server's compiled kernels per kernel id and bounds-check mode, the last
//!   one found answering without hashing.
//! - [`ServerKit`]: how a server hands its `Streams` and `Graphs` to the default methods of the
//!   role traits in [`server`](crate::server), so the kit's rule is written there once rather
//!   than in each backend's trait impl.
//!
//! A backend keeps only what is truly its own: the driver calls, its compiler and its command
//! recording. The collective checks live in [`collective`](crate::collective), the launch limits
//! in [`KernelDefinition::validate`](crate::kernel::KernelDefinition::validate), the scalar
//! encoding in [`ScalarValue`](crate::kernel::ScalarValue), the error queue in
//! [`error`](crate::error).

pub mod bind;
mod errors;
mod graphs;
mod kernels;
mod kit;
mod streams;

pub use errors::{MarkedStreams, StreamErrors};
pub use graphs::Graphs;
pub use kernels::KernelCache;
pub use kit::{KitStreamEntry, KitStreams, ServerKit};
pub use streams::{CreateRules, StreamEntry, Streams};
