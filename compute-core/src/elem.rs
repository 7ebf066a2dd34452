//! Element types shared by the kernel IR, transfers and collectives.

use serde::{Deserialize, Serialize};

/// The type of one element of a buffer, a scalar or a kernel variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ElemType {
    /// Boolean, stored as one byte (0 or 1) in buffers.
    Bool,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
}

impl ElemType {
    /// Every element type, in declaration order.
    pub const ALL: [ElemType; 13] = [
        ElemType::Bool,
        ElemType::I8,
        ElemType::I16,
        ElemType::I32,
        ElemType::I64,
        ElemType::U8,
        ElemType::U16,
        ElemType::U32,
        ElemType::U64,
        ElemType::F16,
        ElemType::BF16,
        ElemType::F32,
        ElemType::F64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            ElemType::Bool | ElemType::I8 | ElemType::U8 => 1,
            ElemType::I16 | ElemType::U16 | ElemType::F16 | ElemType::BF16 => 2,
            ElemType::I32 | ElemType::U32 | ElemType::F32 => 4,
            ElemType::I64 | ElemType::U64 | ElemType::F64 => 8,
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            ElemType::F16 | ElemType::BF16 | ElemType::F32 | ElemType::F64
        )
    }

    /// Whether the type is a signed integer type.
    pub const fn is_signed_int(self) -> bool {
        matches!(
            self,
            ElemType::I8 | ElemType::I16 | ElemType::I32 | ElemType::I64
        )
    }

    /// Whether the type is an unsigned integer type.
    pub const fn is_unsigned_int(self) -> bool {
        matches!(
            self,
            ElemType::U8 | ElemType::U16 | ElemType::U32 | ElemType::U64
        )
    }

    /// Whether the type is an integer type (signed or unsigned).
    pub const fn is_int(self) -> bool {
        self.is_signed_int() || self.is_unsigned_int()
    }

    /// Short lowercase name, as used in error messages (`f32`, `u8`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ElemType::Bool => "bool",
            ElemType::I8 => "i8",
            ElemType::I16 => "i16",
            ElemType::I32 => "i32",
            ElemType::I64 => "i64",
            ElemType::U8 => "u8",
            ElemType::U16 => "u16",
            ElemType::U32 => "u32",
            ElemType::U64 => "u64",
            ElemType::F16 => "f16",
            ElemType::BF16 => "bf16",
            ElemType::F32 => "f32",
            ElemType::F64 => "f64",
        }
    }
}

impl core::fmt::Display for ElemType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A host type that can be stored as an element of a device buffer.
///
/// Implemented for the primitive types behind every [`ElemType`] (bool is stored as `u8`).
pub trait Elem: bytemuck::Pod + Send + Sync + core::fmt::Debug + 'static {
    /// The element type this host type stores.
    const ELEM: ElemType;
}

macro_rules! impl_elem {
    ($($t:ty => $e:ident),* $(,)?) => {
        $(impl Elem for $t { const ELEM: ElemType = ElemType::$e; })*
    };
}

impl_elem!(
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64,
);
