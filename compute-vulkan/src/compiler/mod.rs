//! IR -> SPIR-V: the Vulkan backend's kernel compiler, and (crate-internal, in `pipeline`) the
//! compute pipelines made from its modules and their on-disk cache.
//!
//! # Argument contract (shared by the compiler and the server)
//!
//! Descriptor set 0 holds one storage buffer per buffer parameter, binding `k` for parameter `k`,
//! and, when [`SpirvKernel::uses_info`] is set, the read-only *info* buffer (a runtime array of
//! `u32`) at binding [`SpirvKernel::info_binding`].
//!
//! The *argument words* are, in order:
//! - the scalar parameters, one word each, 64-bit ones as two words (low word first) starting at
//!   an even word index ([`ArgLayout::scalar_words`]);
//! - per buffer parameter `k`, two words at [`ArgLayout::buffer_words`]`[k]`: the offset of the
//!   bound range inside the descriptor's range, in items (descriptors start at a multiple of
//!   `minStorageBufferOffsetAlignment`), and the length of the bound range in items (saturated to
//!   `u32::MAX`).
//!
//! They live in the push-constant block (offset 0, [`ArgLayout::words`] x 4 bytes) when
//! [`ArgLayout::in_push_constants`]; otherwise at word 0 of the info buffer.
//!
//! After the argument words (at word [`ArgLayout::info_header_word`] of the info buffer, which is 0
//! when the arguments are push constants) come two words per buffer: the rank of its tensor
//! metadata (0 without) and the word index of that metadata in the info buffer; the metadata of a
//! buffer is `shape[rank]` then `strides[rank]`, one `u32` word each.
//!
//! Workgroup size is the kernel's cube dim (`LocalSize` execution mode); cube counts come from the
//! `NumWorkgroups` builtin, so indirect dispatches work unchanged.
//!
//! A scalar argument word holds the value's bits in its low bits (`bool` as 0/1, 8/16-bit values
//! in the low byte/half-word, upper bits ignored); a 64-bit scalar is its low word then its high
//! word.
//!
//! # Why a direct word emitter
//!
//! The module is written word by word (enum values from the `spirv` crate) rather than through
//! WGSL and naga: WGSL has no `f64`, `i64`/`u64`, 8- and 16-bit integers, `bf16` storage,
//! subgroup arithmetic on every type, push constants, 64-bit or float atomics, and naga's SPIR-V
//! backend cannot express 8/16-bit integers. Emitting SPIR-V directly reaches all of them, and only
//! the capabilities a kernel uses are declared ([`SpirvKernel::capabilities`]).
//!
//! # Module shape
//!
//! - Logical addressing, `GLSL450` memory model; `GLSL.std.450` for the math built-ins.
//! - Every IR value is one SPIR-V id per component, so widths 8 and 16 (no such vectors in
//!   Vulkan SPIR-V) are simply 8 or 16 scalars; operations are per component.
//! - A buffer of width `w` is a runtime array of `min(w, 4)`-component vectors (`ArrayStride` the
//!   chunk size) and an item of width 8 or 16 is 2 or 4 consecutive chunks: a `f32x4` item is one
//!   128-bit load or store. `bool` is stored as `u8` (0/1, `!= 0` on load), `bf16` as `u16` (computed
//!   in `f32`, rounded to nearest even after every operation, NaN kept).
//! - Shared memory (Workgroup) and local arrays (Function, zero-initialised) are flat arrays of
//!   `len * width` scalars of the register type (shared `bool`/`bf16` as `u8`/`u16` when the
//!   device has 8/16-bit integers, so shared arrays take the bytes
//!   `KernelDefinition::shared_memory_bytes` counts); variables are one Function variable per
//!   component.
//! - Bounds checks (global in `checked` launches, shared and local always) are structured
//!   selections: a guarded load merges with 0 through an `OpPhi`, stores and atomics are skipped.
//! - Atomics are relaxed (as CUDA's and WGSL's), Device scope on buffers, Workgroup scope on
//!   shared memory; `atomic_store` is an `OpAtomicExchange` (the IR returns the previous value).
//!   The barrier is `OpControlBarrier(Workgroup, Workgroup, AcquireRelease | WorkgroupMemory |
//!   UniformMemory)`.
//! - Float math: see the `math` module (own `f64` routines for exp/log/sin/cos/tanh/pow/erf/
//!   log1p, own log, sin, cos, tanh, erf, log1p and an exact float remainder for every type;
//!   `f16` and `bf16` compute their transcendental functions in `f32`). Steps that must stay
//!   exact carry `NoContraction`.
//! - Structured control flow: `OpSelectionMerge` for `if`, `OpLoopMerge` with a continue block
//!   for loops; a range loop's continue block adds the step and leaves the loop where `i + step`
//!   would overflow; statements after `return`/`break`/`continue` in a block are dropped.
//!
//! # What the device must enable
//!
//! The server enables the Vulkan features matching [`SpirvKernel::capabilities`]: `Int8` ->
//! `shaderInt8`, `Int16` -> `shaderInt16`, `Int64` -> `shaderInt64`, `Float16` ->
//! `shaderFloat16`, `Float64` -> `shaderFloat64`, `StorageBuffer8BitAccess` ->
//! `storageBuffer8BitAccess`, `StorageBuffer16BitAccess` -> `storageBuffer16BitAccess`,
//! `Int64Atomics` -> `shaderBufferInt64Atomics`/`shaderSharedInt64Atomics`,
//! `AtomicFloat32AddEXT` -> `shaderBufferFloat32AtomicAdd`/`shaderSharedFloat32AtomicAdd`
//! (`VK_EXT_shader_atomic_float`), `GroupNonUniform*` -> the subgroup operations. Only the plane
//! *product* of 64-bit integers uses 64-bit subgroup arithmetic (`shaderSubgroupExtendedTypes`,
//! Vulkan 1.2; flagged by [`SpirvKernel::subgroup_extended_types`]); 8/16-bit integers and `f16`
//! are reduced in 32 bits, 64-bit sums/min/max are built from 32-bit reductions, and
//! broadcasts/shuffles move 64-bit integers as two halves, so they need nothing more. Simplest: enable every feature [`SpirvCaps`] reports, once, at device creation.
//!
//! The compiler requires `shaderInt8` (`shaderInt16`) for any 8-bit (16-bit) integer, including
//! `bool` buffers (stored as `u8`) and `bf16` buffers (stored as `u16`).

#[cfg(test)]
mod device_tests;
mod emit;
mod math;
mod ops;
pub(crate) mod pipeline;
#[cfg(test)]
mod tests;
mod words;

pub use emit::compile;

/// The buffer vector widths the compiler accepts.
pub(crate) const VALID_WIDTHS: [u8; 5] = [1, 2, 4, 8, 16];

/// What the device offers that kernels may use (from `VkPhysicalDeviceFeatures2`, the Vulkan
/// 1.1/1.2 feature structs, subgroup properties and extensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SpirvCaps {
    /// SPIR-V version the device consumes, as `(major, minor)`: 1.3 for Vulkan 1.1, 1.5 for 1.2,
    /// 1.6 for 1.3.
    pub version: (u8, u8),
    /// `shaderFloat16` (arithmetic on f16).
    pub float16: bool,
    /// `shaderFloat64`.
    pub float64: bool,
    /// `shaderInt8` (arithmetic on 8-bit integers).
    pub int8: bool,
    /// `shaderInt16`.
    pub int16: bool,
    /// `shaderInt64`.
    pub int64: bool,
    /// `storageBuffer8BitAccess`.
    pub storage8: bool,
    /// `storageBuffer16BitAccess`.
    pub storage16: bool,
    /// Subgroup basic + arithmetic + ballot + shuffle operations in the compute stage.
    pub subgroups: bool,
    /// `shaderBufferInt64Atomics`.
    pub int64_atomics_buffer: bool,
    /// `shaderSharedInt64Atomics`.
    pub int64_atomics_shared: bool,
    /// `shaderBufferFloat32AtomicAdd` (VK_EXT_shader_atomic_float).
    pub float32_atomic_add_buffer: bool,
    /// `shaderSharedFloat32AtomicAdd`.
    pub float32_atomic_add_shared: bool,
    /// `maxPushConstantsSize` in bytes.
    pub max_push_constant_bytes: u32,
}

/// Where a compiled kernel reads its launch arguments (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ArgLayout {
    /// Word index of each scalar parameter in the argument words.
    pub scalar_words: Vec<u32>,
    /// Word index of each buffer's (offset, length) pair in the argument words.
    pub buffer_words: Vec<u32>,
    /// Number of argument words.
    pub words: u32,
    /// Whether the argument words are the push-constant block (else the start of the info buffer).
    pub in_push_constants: bool,
    /// Word index in the info buffer of the first (rank, metadata offset) pair.
    pub info_header_word: u32,
}

/// A kernel compiled to SPIR-V.
#[derive(Debug, Clone)]
pub struct SpirvKernel {
    /// The module, entry point `main`.
    pub words: Vec<u32>,
    /// The argument layout the module reads.
    pub args: ArgLayout,
    /// Whether the module reads the info buffer (tensor metadata, or arguments that did not fit
    /// the push constants). When false the pipeline layout has no info binding.
    pub uses_info: bool,
    /// Binding of the info buffer (the number of buffer parameters).
    pub info_binding: u32,
    /// Size in bytes of one item of each buffer parameter.
    pub buffer_item_sizes: Vec<u64>,
    /// Bytes of the push-constant block (0 when the arguments live in the info buffer or there are
    /// none).
    pub push_constant_bytes: u32,
    /// Whether the module uses subgroup operations or builtins (the pipeline's stage must
    /// support them).
    pub uses_subgroups: bool,
    /// Whether the module multiplies 64-bit integers over a subgroup (`plane_prod`), which needs
    /// `shaderSubgroupExtendedTypes` (Vulkan 1.2); launch it only where the device has it.
    pub subgroup_extended_types: bool,
    /// The SPIR-V capabilities the module declares (see the module docs for the matching
    /// Vulkan features).
    pub capabilities: Vec<spirv::Capability>,
    /// The SPIR-V extensions the module declares (device extensions the server must enable, e.g.
    /// `SPV_EXT_shader_atomic_float_add` -> `VK_EXT_shader_atomic_float`).
    pub extensions: Vec<String>,
}
