//! # compute-wgpu
//!
//! The wgpu backend of the compute runtime. Every adapter wgpu finds (filtered by `WGPU_BACKEND`)
//! backs logical devices, each requested with the adapter's real limits and features. Memory is
//! compute-core's pools over `wgpu::Buffer` blocks; kernels in the portable IR are compiled to
//! WGSL (one pipeline per kernel and bounds-check mode, cached by kernel id; types and vector
//! widths WGSL lacks are emulated, see [`compiler`]); launches, copies and timestamps are recorded
//! into per-batch arenas (no allocation per launch) and batched into few submissions on the
//! device's queue (on a GPU the batch starts small after each wait and doubles while the host
//! keeps filling it), with bind groups cached per (pipeline, bound ranges) and the launch info in
//! one persistent buffer (dynamic offsets); reads go through staging buffers and `map_async`.
//! A submit thread per device encodes the batches into command buffers, submits them and
//! performs the writes, in issue order (wgpu's `finish` and the freeing of finished command
//! buffers are most of a launch's host cost; the caller's thread only records). Every wait of the
//! device (`sync`, reads, profiles, collectives, the retiring of finished batches) runs on one
//! poll thread, which blocks in `device.poll`; a future awaits its answer. Two threads in
//! `device.poll` at once gave launch+sync a 10 ms tail on an H100.
//!
//! ```no_run
//! use compute_core::{Bytes, ComputeClient};
//! use compute_wgpu::{WgpuDevice, WgpuRuntime};
//!
//! let client = ComputeClient::<WgpuRuntime>::load(&WgpuDevice::default());
//! let handle = client.create(Bytes::from_elems(vec![1u32, 2, 3]));
//! assert_eq!(client.read_one(handle).unwrap().to_elems::<u32>(), vec![1, 2, 3]);
//! ```

mod batch;
mod collective;
pub mod compiler;
mod device;
mod graph;
mod kernel;
mod launch;
mod poller;
mod profile;
mod runtime;
mod server;
mod storage;
mod submitter;
mod transfer;

pub use device::{
    MIN_LOGICAL_DEVICES, WGPU_DEVICE_TYPE, WgpuDevice, adapter_count, availability, backends,
    device_count, raw_device,
};
pub use kernel::WgpuKernel;
pub use runtime::WgpuRuntime;
pub use server::{WgpuInfo, WgpuServer};
pub use storage::{STORAGE_USAGES, WgpuResource, WgpuStorage};
pub use wgpu;
