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

    /// The value's own bits, at its own width, zero-extended to 64 bits: what a register or a
    /// launch parameter of the element's native type holds (an `i8` of -1 is `0xff`). Backends
    /// whose kernels take small types natively (CUDA's parameters, the CPU's registers) use
    /// this; the kernel reads the low bytes only.
    pub fn native_bits(&self) -> u64 {
        match *self {
            ScalarValue::Bool(b) => u64::from(b),
            ScalarValue::I8(v) => u64::from(v as u8),
            ScalarValue::I16(v) => u64::from(v as u16),
            ScalarValue::I32(v) => u64::from(v as u32),
            ScalarValue::I64(v) => v as u64,
            ScalarValue::U8(v) => u64::from(v),
            ScalarValue::U16(v) => u64::from(v),
            ScalarValue::U32(v) => u64::from(v),
            ScalarValue::U64(v) => v,
            ScalarValue::F16(v) => u64::from(v.to_bits()),
            ScalarValue::BF16(v) => u64::from(v.to_bits()),
            ScalarValue::F32(v) => u64::from(v.to_bits()),
            ScalarValue::F64(v) => v.to_bits(),
        }
    }

    /// The value as the 32-bit words of a shader whose smallest integer is 32 bits wide (WGSL,
    /// SPIR-V without the 8/16-bit capabilities): `i8` and `i16` are sign-extended to an `i32`
    /// word, `u8`/`u16`/`bool` zero-extended, 16-bit floats keep their bits in the low half,
    /// 64-bit values take two words (low first). The kernel then computes on the widened value,
    /// so the widening must follow the type's sign.
    pub fn word_bits(&self) -> [u32; 2] {
        let wide = |bits: u64| [bits as u32, (bits >> 32) as u32];
        match *self {
            ScalarValue::I8(x) => [x as i32 as u32, 0],
            ScalarValue::I16(x) => [x as i32 as u32, 0],
            ScalarValue::I64(_) | ScalarValue::U64(_) | ScalarValue::F64(_) => {
                wide(self.native_bits())
            }
            _ => [self.native_bits() as u32, 0],
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

#[cfg(test)]
mod tests {
    use super::ScalarValue;

    #[test]
    fn native_bits_keep_the_width_and_word_bits_follow_the_sign() {
        assert_eq!(ScalarValue::I8(-1).native_bits(), 0xff);
        assert_eq!(ScalarValue::I16(-2).native_bits(), 0xfffe);
        assert_eq!(ScalarValue::I32(-1).native_bits(), 0xffff_ffff);
        assert_eq!(ScalarValue::I64(-1).native_bits(), u64::MAX);
        assert_eq!(ScalarValue::U8(200).native_bits(), 200);
        assert_eq!(ScalarValue::F32(1.0).native_bits(), 0x3f80_0000);
        assert_eq!(ScalarValue::I8(-1).word_bits(), [u32::MAX, 0]);
        assert_eq!(ScalarValue::I16(-300).word_bits(), [(-300i32) as u32, 0]);
        assert_eq!(ScalarValue::U8(255).word_bits(), [255, 0]);
        assert_eq!(ScalarValue::U16(40000).word_bits(), [40000, 0]);
        assert_eq!(ScalarValue::Bool(true).word_bits(), [1, 0]);
        assert_eq!(ScalarValue::I64(-2).word_bits(), [0xffff_fffe, 0xffff_ffff]);
        assert_eq!(ScalarValue::F64(1.0).word_bits(), [0, 0x3ff0_0000]);
        assert_eq!(
            ScalarValue::F16(half::f16::ONE).word_bits(),
            [u32::from(half::f16::ONE.to_bits()), 0]
        );
    }
}
