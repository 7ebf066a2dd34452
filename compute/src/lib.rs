//! # compute
//!
//! The crate to depend on: [`compute-core`](compute_core) (re-exported here: `compute::ComputeClient`,
//! `compute::Runtime`, `compute::kernel::KernelBuilder`, ...) and every backend enabled by a
//! feature, as a module named after it:
//!
//! | feature | module | runtime |
//! |---|---|---|
//! | `cpu` (default) | [`compute::cpu`](cpu) | `compute::cpu::CpuRuntime` |
//! | `wgpu` | `compute::wgpu` | `compute::wgpu::WgpuRuntime` |
//! | `vulkan` | `compute::vulkan` | `compute::vulkan::VulkanRuntime` |
//! | `cuda` | `compute::cuda` | `compute::cuda::CudaRuntime` |
//!
//! Every GPU library is loaded at run time, so enabling a backend never breaks the build on a
//! machine without its driver. Which backend runs is chosen at run time by [`Backend::best`]
//! (the first available of cuda, vulkan, wgpu, cpu; `COMPUTE_BACKEND=name` overrides), and code
//! written once, generic over `R: Runtime`, runs on the chosen backend through [`RunOn`] and
//! [`Backend::run`], without `cfg` in user code:
//!
//! ```
//! use compute::{Backend, Bytes, ComputeClient, RunOn, Runtime};
//!
//! struct RoundTrip(Vec<u32>);
//!
//! impl RunOn for RoundTrip {
//!     type Output = Vec<u32>;
//!     fn run<R: Runtime>(self, client: ComputeClient<R>) -> Vec<u32> {
//!         let handle = client.create(Bytes::from_elem_slice(&self.0));
//!         client.read_one(handle).expect("read").to_elems::<u32>()
//!     }
//! }
//!
//! let choice = Backend::best().expect("a backend");
//! println!("running on {} ({})", choice.backend, choice.reason);
//! let out = choice.run(RoundTrip(vec![1, 2, 3])).expect("load");
//! assert_eq!(out, [1, 2, 3]);
//! ```

mod select;

pub use compute_core;
pub use compute_core::*;
pub use select::{BACKEND_ENV, Backend, BackendError, BackendStatus, Choice, RunOn};

/// The CPU backend (feature `cpu`).
#[cfg(feature = "cpu")]
pub use compute_cpu as cpu;
/// The CUDA backend (feature `cuda`).
#[cfg(feature = "cuda")]
pub use compute_cuda as cuda;
/// The Vulkan backend (feature `vulkan`).
#[cfg(feature = "vulkan")]
pub use compute_vulkan as vulkan;
/// The wgpu backend (feature `wgpu`).
#[cfg(feature = "wgpu")]
pub use compute_wgpu as wgpu;
