//! # compute-cpu
//!
//! The CPU backend of the compute runtime. Memory is host memory carved by compute-core's pools;
//! every stream has a worker thread that runs its commands in order (a launch returns before the
//! kernel runs); kernels in the portable IR run on a SIMT executor: cubes in parallel over a
//! thread pool, the units of a cube in lockstep over lanes, so barriers and shared memory are exact.
//!
//! ```
//! use compute_core::{Bytes, ComputeClient};
//! use compute_cpu::{CpuDevice, CpuRuntime};
//!
//! let client = ComputeClient::<CpuRuntime>::load(&CpuDevice::default());
//! let handle = client.create(Bytes::from_elems(vec![1u32, 2, 3]));
//! assert_eq!(client.read_one(handle).unwrap().to_elems::<u32>(), vec![1, 2, 3]);
//! ```

mod device;
pub mod exec;
mod kernel;
mod runtime;
mod server;
mod storage;
mod worker;

pub use device::{CPU_DEVICE_TYPE, CpuDevice, DEFAULT_DEVICE_COUNT, device_count};
pub use kernel::CpuKernel;
pub use runtime::{CPU_PITCH_ALIGNMENT, CpuRuntime};
pub use server::{CpuInfo, CpuServer};
pub use storage::{CPU_ALIGNMENT, CpuResource, CpuStorage};
