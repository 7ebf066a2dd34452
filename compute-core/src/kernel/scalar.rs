//! Scalar values passed to kernels at launch.

use serde::{Deserialize, Serialize};

use crate::elem::ElemType;

/// One scalar argument of a launch, typed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum ScalarValue {
    /// A boolean.
    Bool(bool),
    /// An `i8`.
    I8(i8),
    /// An `i16`.
    I16(i16),
    /// An `i32`.
    I32(i32),
    /// An `i64`.
    I64(i64),
    /// A `u8`.
    U8(u8),
    /// A `u16`.
    U16(u16),
    /// A `u32`.
    U32(u32),
    /// A `u64`.
    U64(u64),
    /// An `f16`.
    F16(half::f16),
    /// A `bf16`.
    BF16(half::bf16),
    /// An `f32`.
    F32(f32),
    /// An `f64`.
    F64(f64),
}

impl ScalarValue {
    /// The element type of the value.
    pub fn elem_type(&self) -> ElemType {
        match self {
            ScalarValue::Bool(_) => ElemType::Bool,
            ScalarValue::I8(_) => ElemType::I8,
            ScalarValue::I16(_) => ElemType::I16,
            ScalarValue::I32(_) => ElemType::I32,
            ScalarValue::I64(_) => ElemType::I64,
            ScalarValue::U8(_) => ElemType::U8,
            ScalarValue::U16(_) => ElemType::U16,
            ScalarValue::U32(_) => ElemType::U32,
            ScalarValue::U64(_) => ElemType::U64,
            ScalarValue::F16(_) => ElemType::F16,
            ScalarValue::BF16(_) => ElemType::BF16,
            ScalarValue::F32(_) => ElemType::F32,
            ScalarValue::F64(_) => ElemType::F64,
        }
    }
}

macro_rules! impl_from_scalar {
    ($($t:ty => $v:ident),* $(,)?) => {
        $(impl From<$t> for ScalarValue {
            fn from(value: $t) -> Self {
                ScalarValue::$v(value)
            }
        })*
    };
}

impl_from_scalar!(
    bool => Bool, i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64,
);
