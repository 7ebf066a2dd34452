//! The CPU executor of the portable kernel IR.
//!
//! [`compile`] builds both the interpreter's plan described below and, where the [`jit`] covers
//! the kernel and is enabled, its machine code, which then runs the launches
//! ([`Plan::executor`] says which).
//!
//! [`compile`] turns a [`KernelDefinition`] into a [`Plan`] once: registers (one slab of
//! `cube_size x width` components per SSA value and variable) and a tree of control nodes over
//! flat instructions, each a lane kernel picked for its types. [`Plan::execute`] runs the cubes of
//! a launch in parallel on rayon's pool; the units of a cube run in lockstep, one instruction over
//! all units at a time, under an active-unit mask that `if`, loops, `break`, `continue` and
//! `return` narrow. Since every unit finishes an instruction before any starts the next, barriers
//! need no work and shared memory (private to each cube) is exact.
//!
//! ```
//! use compute_core::elem::ElemType;
//! use compute_core::kernel::{KernelBuilder, ScalarValue};
//! use compute_cpu::compiler::{HostArg, compile};
//!
//! let mut k = KernelBuilder::new("scale", [64, 1, 1]);
//! let x = k.output("x", ElemType::F32, 1);
//! let a = k.scalar("a", ElemType::F32);
//! let i = k.absolute_pos();
//! let xi = k.load(x, i);
//! let r = k.mul(xi, a);
//! k.store(x, i, r);
//! let plan = compile(&k.build().unwrap()).unwrap();
//!
//! let mut data = vec![1.0f32; 100];
//! let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut data);
//! plan.execute_host([2, 1, 1], &mut [HostArg::new(bytes)], &[ScalarValue::F32(3.0)])
//!     .unwrap();
//! assert!(data.iter().all(|&v| v == 3.0));
//! ```

mod global;
pub mod jit;
mod lanes;
mod plan;
mod plane;
mod range;
mod run;
mod words;

use compute_core::error::{LaunchError, ServerError};
#[cfg(doc)]
use compute_core::kernel::KernelDefinition;
use compute_core::kernel::ScalarValue;

pub use plan::{Executor, Plan, compile, compile_interpreted, compile_jit};

use global::GlobalMem;
use run::Launch;

/// Units per plane (warp) on the CPU: planes are runs of 32 consecutive units of a cube.
pub const PLANE_SIZE: u32 = 32;

/// The largest number of units in one cube.
pub const MAX_UNITS_PER_CUBE: u32 = 1024;

/// The largest shared memory of one cube, in bytes.
pub const MAX_SHARED_MEMORY_BYTES: u64 = 64 * 1024;

/// How a launch of `total` cubes is split over rayon's pool: `(cubes per piece, pieces,
/// threads)`. `COMPUTE_CPU_SPLIT` pieces per thread (default 4): more pieces balance the load
/// better, each costs a task and the piece's per-unit state.
pub(crate) fn split(total: u64) -> (u64, u64, u64) {
    static PER_THREAD: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let per_thread = *PER_THREAD.get_or_init(|| {
        compute_core::env::parsed("COMPUTE_CPU_SPLIT", |v| {
            v.parse::<u64>().ok().filter(|n| (1..=256).contains(n))
        })
        .unwrap_or(4)
    });
    let threads = rayon::current_num_threads() as u64;
    let chunk = (total / (threads * per_thread)).max(1);
    (chunk, total.div_ceil(chunk), threads)
}

/// One buffer bound to a launch, as raw memory (see [`Plan::execute`] for the contract).
#[derive(Debug, Clone, Copy)]
pub struct BufferArg<'a> {
    /// Start of the buffer, aligned to the buffer's element size.
    pub ptr: *mut u8,
    /// Size in bytes.
    pub len_bytes: usize,
    /// Shape of the attached tensor (empty for a plain buffer).
    pub shape: &'a [usize],
    /// Strides in elements of the attached tensor (empty for a plain buffer).
    pub strides: &'a [usize],
}

/// One buffer bound to a launch as a borrowed host slice, for [`Plan::execute_host`].
#[derive(Debug)]
pub struct HostArg<'a> {
    /// The buffer's bytes, aligned to the buffer's element size.
    pub data: &'a mut [u8],
    /// Shape of the attached tensor (empty for a plain buffer).
    pub shape: &'a [usize],
    /// Strides in elements of the attached tensor (empty for a plain buffer).
    pub strides: &'a [usize],
}

impl<'a> HostArg<'a> {
    /// A plain buffer without tensor metadata.
    pub fn new(data: &'a mut [u8]) -> Self {
        Self {
            data,
            shape: &[],
            strides: &[],
        }
    }

    /// A buffer with tensor metadata.
    pub fn tensor(data: &'a mut [u8], shape: &'a [usize], strides: &'a [usize]) -> Self {
        Self {
            data,
            shape,
            strides,
        }
    }
}

impl Plan {
    /// Run the kernel over `cube_count` cubes on the given buffers (in declaration order) and
    /// scalars. `bounds_checked`: out-of-range global loads read 0 and stores are dropped;
    /// otherwise the indices are trusted.
    ///
    /// Fails with a [`LaunchError`] (`ArgumentCount`, `ScalarType`, `MisalignedBuffer`) on a wrong
    /// number of buffers or scalars, a scalar of the wrong type, or a misaligned buffer.
    ///
    /// # Safety
    /// For the duration of the call, each `ptr` is valid for reads of `len_bytes` bytes, and for
    /// writes where the kernel declares the buffer read-write; nothing else accesses that memory
    /// except through this launch (two arguments may alias each other). Without
    /// `bounds_checked`, every global access the kernel makes is in range.
    pub unsafe fn execute(
        &self,
        cube_count: [u32; 3],
        buffers: &[BufferArg<'_>],
        scalars: &[ScalarValue],
        bounds_checked: bool,
    ) -> Result<(), ServerError> {
        let count = |what: &'static str, expected: usize, found: usize| {
            ServerError::from(LaunchError::ArgumentCount {
                kernel: self.name.clone(),
                what,
                expected,
                found,
            })
        };
        if buffers.len() != self.buffers.len() {
            return Err(count("buffers", self.buffers.len(), buffers.len()));
        }
        if scalars.len() != self.scalars.len() {
            return Err(count("scalars", self.scalars.len(), scalars.len()));
        }
        for ((name, elem), value) in self.scalars.iter().zip(scalars) {
            if value.elem_type() != *elem {
                return Err(LaunchError::ScalarType {
                    kernel: self.name.clone(),
                    name: name.clone(),
                    expected: *elem,
                    found: value.elem_type(),
                }
                .into());
            }
        }
        let mut bufs = Vec::with_capacity(buffers.len());
        for (info, arg) in self.buffers.iter().zip(buffers) {
            let size = info.elem.size();
            if arg.len_bytes >= size && !(arg.ptr as usize).is_multiple_of(size) {
                return Err(LaunchError::MisalignedBuffer {
                    kernel: self.name.clone(),
                    name: info.name.clone(),
                    offset: arg.ptr as u64 % size as u64,
                    alignment: size as u64,
                }
                .into());
            }
            let entries = (arg.len_bytes / (size * info.width)) as u64;
            // SAFETY: the caller's contract: valid for the launch, accessed only through it;
            // alignment checked above; `entries` whole entries fit in `len_bytes`.
            bufs.push(unsafe { GlobalMem::new(arg.ptr, entries, info.width, size) });
        }
        if cube_count.contains(&0) {
            return Ok(());
        }
        let launch = Launch {
            bufs,
            shapes: buffers.iter().map(|b| b.shape).collect(),
            strides: buffers.iter().map(|b| b.strides).collect(),
            scalars,
            cube_count,
            checked: bounds_checked,
        };
        match &self.jit {
            Some(jit) => jit.run_launch(&launch),
            None => self.run_launch(&launch),
        }
        Ok(())
    }

    /// [`execute`](Self::execute) on host slices, safely: always bounds-checked, since nothing
    /// here promises that the kernel's indices are in range.
    pub fn execute_host(
        &self,
        cube_count: [u32; 3],
        buffers: &mut [HostArg<'_>],
        scalars: &[ScalarValue],
    ) -> Result<(), ServerError> {
        let args: Vec<BufferArg<'_>> = buffers
            .iter_mut()
            .map(|b| BufferArg {
                ptr: b.data.as_mut_ptr(),
                len_bytes: b.data.len(),
                shape: b.shape,
                strides: b.strides,
            })
            .collect();
        // SAFETY: each pointer comes from a live `&mut [u8]` of `len_bytes` bytes, borrowed for
        // the call, so nothing else accesses it; the launch is checked, so every access is in
        // range.
        unsafe { self.execute(cube_count, &args, scalars, true) }
    }
}

#[cfg(test)]
mod tests;
