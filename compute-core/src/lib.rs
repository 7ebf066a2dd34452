//! # compute-core
//!
//! The backend-independent core of the compute runtime: the [`Runtime`] and [`ComputeServer`]
//! traits every backend implements, the [`ComputeClient`] frameworks program against, memory
//! management generic over [`ComputeStorage`], [`Bytes`], and the portable kernel IR.
//!
//! Code written generic over `R: Runtime` runs on every backend:
//!
//! ```ignore
//! use compute_core::{ComputeClient, Runtime, Bytes};
//!
//! fn round_trip<R: Runtime>(client: &ComputeClient<R>) -> Vec<f32> {
//!     let handle = client.create(Bytes::from_elems(vec![1.0f32, 2.0, 3.0]));
//!     client.read_one(handle).expect("read").to_elems::<f32>()
//! }
//! ```

// `#[kernel]` expands to `::compute_core::...` paths; this makes them resolve in this crate too.
extern crate self as compute_core;

pub mod backend;
pub mod bytes;
pub mod client;
pub mod collective;
pub mod copy;
pub mod device;
pub mod elem;
pub mod env;
pub mod error;
mod exclusive;
pub mod future;
pub mod graph;
pub mod handle;
pub mod kernel;
pub mod layout;
pub mod memory;
mod probe;
pub mod profile;
pub mod properties;
pub mod runtime;
pub mod server;
pub mod storage;
pub mod stream;
pub mod submit;
pub mod throughput;

pub use bytes::{Bytes, BytesKind, HostBuffer};
pub use client::ComputeClient;
pub use collective::ReduceOperation;
pub use device::{Device, DeviceId};
pub use elem::{Elem, ElemType};
pub use error::{CaptureError, GraphError, ProfileError, ServerError};
pub use future::{DynFut, block_on};
pub use graph::{Graph, GraphId};
pub use handle::{
    Binding, BufferArgument, CopyDescriptor, CubeCount, ExecutionMode, Handle, KernelArguments,
};
pub use layout::{MemoryLayout, MemoryLayoutDescriptor, MemoryLayoutPolicy, Shape, Strides};
pub use memory::{HostMemoryUsage, MemoryAllocationMode, MemoryPoolsConfig, MemoryUsage};
pub use profile::{ProfileDuration, TimingMethod};
pub use properties::{DeviceProperties, Features, HardwareProperties, VectorSize};
pub use runtime::Runtime;
pub use server::{
    ComputeServer, HostWrite, KernelLaunch, ProfileFuture, ReadFuture, ServerCollective,
    ServerGraph, ServerMemory, ServerProfile, ServerTransfer,
};
pub use storage::{ComputeStorage, ManagedResource, StorageHandle, StorageId};
pub use stream::StreamId;
pub use throughput::{KernelConfig, ThroughputKey, ThroughputValue};
