//! # compute-cuda
//!
//! The CUDA backend of the compute runtime, on [cudarc]'s driver, NVRTC and NCCL bindings, every
//! library loaded at run time: the crate builds without a CUDA toolkit, and without a driver
//! [`CudaRuntime::availability`](compute_core::Runtime::availability) says why instead of panicking.
//!
//! - Kernels in the portable IR are translated to CUDA C++ ([`codegen`]) and compiled by NVRTC for
//!   the device's architecture; modules are cached in memory and on disk.
//! - Each [`StreamId`](compute_core::StreamId) gets a CUDA stream; buffers used across streams are
//!   ordered with events recorded only when another stream needs them.
//! - Memory is compute-core's pools over `cuMemAlloc` blocks ([`CudaStorage`]); transfers go
//!   through pinned staging memory; tensors are pitched and copied with 2-D copies.
//! - Graphs are CUDA graphs made by stream capture; collectives go through NCCL on a dedicated
//!   communication stream; `profile` uses CUDA events.
//!
//! ```no_run
//! use compute_core::{Bytes, ComputeClient};
//! use compute_cuda::{CudaDevice, CudaRuntime};
//!
//! let client = ComputeClient::<CudaRuntime>::load(&CudaDevice::default());
//! let handle = client.create(Bytes::from_elems(vec![1u32, 2, 3]));
//! assert_eq!(client.read_one(handle).unwrap().to_elems::<u32>(), vec![1, 2, 3]);
//! ```

mod collective;
mod compiler;
mod device;
mod driver;
mod graph;
mod kernel;
mod launch;
mod pinned;
mod profile;
mod runtime;
mod server;
mod staging;
mod storage;
mod stream;
mod transfer;

pub use compiler::codegen;

pub use compiler::{CompileCounts, CompiledKernel, cache_dir, compile_counts};
/// The cudarc version this backend is built on, for raw baselines and interop.
pub use cudarc;
pub use device::{CUDA_DEVICE_TYPE, CudaDevice};
pub use driver::{driver_available, inject_release_failures, nvrtc_available};
pub use kernel::CudaKernel;
pub use pinned::{PinnedBuffer, PinnedPool};
pub use runtime::{CUDA_PITCH_ALIGNMENT, CudaRuntime};
pub use server::{CudaInfo, CudaServer};
pub use storage::{CUDA_ALIGNMENT, CudaResource, CudaStorage};
