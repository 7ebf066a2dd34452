//! The portable kernel IR: every backend compiles it (to WGSL, SPIR-V, CUDA C++) or, on the CPU,
//! executes it.
//!
//! A kernel is written with a [`KernelBuilder`], validated by [`KernelBuilder::build`] and
//! returned as a [`KernelDefinition`]: plain, serialisable data with a stable [`KernelId`].
//!
//! The model is the usual SIMT one: a launch runs a grid of cubes (`cube_count`), each of
//! `cube_dim` units that share memory and barriers. Every unit runs the body; values are per
//! unit. See [`ir`] for the operations and their exact semantics.
//!
//! ```
//! use compute_core::elem::ElemType;
//! use compute_core::kernel::KernelBuilder;
//!
//! // out[i] = sum of the row i of a [rows, cols] matrix.
//! let mut k = KernelBuilder::new("row_sum", [64, 1, 1]);
//! let m = k.input("m", ElemType::F32, 1);
//! let out = k.output("out", ElemType::F32, 1);
//! let cols = k.scalar("cols", ElemType::U32);
//! let row = k.absolute_pos();
//! let rows = k.len(out);
//! let inside = k.lt(row, rows);
//! k.if_(inside, |k| {
//!     let acc = k.var(0.0f32);
//!     let base = k.mul(row, cols);
//!     k.range(0u32, cols, 1u32, |k, j| {
//!         let idx = k.add(base, j);
//!         let v = k.load(m, idx);
//!         let sum = k.get(acc);
//!         let sum = k.add(sum, v);
//!         k.assign(acc, sum);
//!     });
//!     let sum = k.get(acc);
//!     k.store(out, row, sum);
//! });
//! let kernel = k.build().unwrap();
//! assert_eq!(kernel.id(), kernel.clone().id());
//! ```

mod args;
mod backend_kernel;
mod builder;
mod definition;
mod error;
#[doc(hidden)]
pub mod expand;
mod hash;
pub mod ir;
mod scalar;
mod types;
mod validate;

pub use args::{BufferArg, KernelElem, KernelFloat, KernelInt};
pub use backend_kernel::BackendKernel;
pub use builder::{Buffer, IntoValue, KernelBuilder, LocalArray, Memory, SharedArray, Value, Var};
pub use compute_macros::kernel;
pub use definition::KernelDefinition;
pub use error::BuildError;
pub use hash::KernelId;
pub use ir::{
    AtomicOp, BinaryOp, Block, CmpOp, MemRef, Op, PlaneOp, Stmt, UnaryOp, ValueId, VarId,
};
pub use scalar::ScalarValue;
pub use types::{
    Access, BufferDecl, Builtin, Item, LocalArrayDecl, ScalarDecl, SharedDecl, VECTOR_WIDTHS,
    VarDecl,
};
pub use validate::ValidationError;

#[cfg(test)]
mod macro_tests;
#[cfg(test)]
mod tests;
