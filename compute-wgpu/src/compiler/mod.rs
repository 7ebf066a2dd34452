//! IR -> WGSL: the wgpu backend's kernel compiler.
//!
//! Every buffer parameter `k` is bound at `@binding(k)` as a read-write storage array (read-write
//! even for read-only parameters: wgpu tracks usage per `wgpu::Buffer`, and pool slices of one
//! page share a buffer, so a read-only and a read-write binding of one page in one dispatch would
//! conflict). After the buffers comes the launch *info* buffer, an `array<u32>` with:
//!
//! - the scalar arguments, one word each (two, low word first, for 64-bit types);
//! - per buffer a header of four words: the offset of the bound range inside the binding (in
//!   items, since a binding must start at `min_storage_buffer_offset_alignment`), its length in
//!   items, the rank of its tensor metadata and the word offset of that metadata;
//! - the metadata: shape, then strides, of each buffer that has them.
//!
//! Types WGSL lacks are emulated: bool, i8/i16, u8/u16 and bf16 values are computed in `bool`,
//! `i32`, `u32` and `f32` (wrapped to their width, or rounded to bf16, after every operation),
//! and their buffers are `array<u32>` words (`array<atomic<u32>>` when writable) holding the
//! elements' bytes: loads extract them, stores clear and set their bytes atomically (or store
//! whole words), so units writing neighbouring elements never race. Items of 8 and 16
//! components are WGSL arrays, operated on component by component, and their buffers runs of
//! scalars. `f32` sin/cos use an accurate range reduction, `f16` transcendental functions and fma
//! go through `f32`, and `f64` round is computed half to even, whatever the driver's own do.

mod wgsl;

pub use wgsl::compile;

use compute_core::ElemType;

/// What the adapter offers that kernels may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ShaderCapabilities {
    /// `f16` (`SHADER_F16`).
    pub f16: bool,
    /// `f64` (`SHADER_F64`).
    pub f64: bool,
    /// `i64`/`u64` (`SHADER_INT64`).
    pub int64: bool,
    /// Subgroup operations (`SUBGROUP`).
    pub subgroups: bool,
    /// `atomic<f32>` add (`SHADER_FLOAT32_ATOMIC`).
    pub float32_atomics: bool,
    /// `atomic<u64>` and `atomic<i64>` with every operation (`SHADER_INT64_ATOMIC_ALL_OPS`).
    pub int64_atomics: bool,
}

impl ShaderCapabilities {
    /// The capabilities of a device with `features`.
    pub fn from_features(features: wgpu::Features) -> Self {
        Self {
            f16: features.contains(wgpu::Features::SHADER_F16),
            f64: features.contains(wgpu::Features::SHADER_F64),
            int64: features.contains(wgpu::Features::SHADER_INT64),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            float32_atomics: features.contains(wgpu::Features::SHADER_FLOAT32_ATOMIC),
            int64_atomics: features.contains(wgpu::Features::SHADER_INT64_ATOMIC_ALL_OPS),
        }
    }

    /// The element types kernels may use on such a device: WGSL's own, and the emulated ones
    /// (bool, i8, i16, u8, u16, bf16: computed in 32-bit types, packed in `u32` words in buffers).
    pub fn elem_types(&self) -> Vec<ElemType> {
        let mut types = vec![
            ElemType::Bool,
            ElemType::I8,
            ElemType::I16,
            ElemType::I32,
            ElemType::U8,
            ElemType::U16,
            ElemType::U32,
            ElemType::BF16,
            ElemType::F32,
        ];
        if self.f16 {
            types.push(ElemType::F16);
        }
        if self.int64 {
            types.extend([ElemType::I64, ElemType::U64]);
        }
        if self.f64 {
            types.push(ElemType::F64);
        }
        types
    }
}

/// Where a compiled kernel reads its launch arguments in the info buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoLayout {
    /// Word offset of each scalar parameter.
    pub scalar_offsets: Vec<u32>,
    /// Word offset of the first buffer header.
    pub header_offset: u32,
    /// Words before the metadata (scalars and headers).
    pub fixed_words: u32,
}

/// Words of one buffer header in the info buffer.
pub const HEADER_WORDS: u32 = 4;

/// A kernel compiled to WGSL.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    /// The WGSL source, entry point `main`.
    pub source: String,
    /// The info buffer layout the source reads.
    pub info: InfoLayout,
    /// Size in bytes of one item of each buffer parameter.
    pub buffer_item_sizes: Vec<u64>,
}
