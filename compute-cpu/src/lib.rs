//! # compute-cpu
//!
//! The CPU backend of the compute runtime. Memory is host memory carved by compute-core's pools;
//! every stream has a worker thread that runs its commands in order (a launch returns before the
//! kernel runs, except small launches on an idle stream, which run on the calling thread); kernels
//! in the portable IR are compiled to machine code by a cranelift JIT ([`compiler::jit`]: cubes in
//! parallel over a thread pool, each cube one native function looping over its units between
//! barriers), with a SIMT interpreter (the units of a cube in lockstep over lanes) as the reference
//! and the fallback. `COMPUTE_CPU_JIT=0` selects the interpreter; `properties().name` and
//! [`CpuInfo`] report the executor and the CPU features in use.
//!
//! ```
//! use compute_core::{Bytes, ComputeClient};
//! use compute_cpu::{CpuDevice, CpuRuntime};
//!
//! let client = ComputeClient::<CpuRuntime>::load(&CpuDevice::default());
//! let handle = client.create(Bytes::from_elems(vec![1u32, 2, 3]));
//! assert_eq!(client.read_one(handle).unwrap().to_elems::<u32>(), vec![1, 2, 3]);
//! ```

mod collective;
pub mod compiler;
mod device;
mod graph;
mod kernel;
mod launch;
mod profile;
mod runtime;
mod server;
mod storage;
mod transfer;
mod worker;

pub use device::{CPU_DEVICE_TYPE, CpuDevice, DEFAULT_DEVICE_COUNT, device_count};
pub use kernel::CpuKernel;
pub use runtime::{CPU_PITCH_ALIGNMENT, CpuRuntime};
pub use server::{CpuInfo, CpuServer};
pub use storage::{CPU_ALIGNMENT, CpuResource, CpuStorage};
