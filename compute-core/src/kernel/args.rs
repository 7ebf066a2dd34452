//! What `#[kernel]` functions take: element types for generic parameters and buffer arguments
//! for their launchers.

use super::scalar::ScalarValue;
use crate::elem::ElemType;
use crate::handle::{Binding, BufferArgument, Handle};
use crate::layout::{Shape, Strides};

/// A Rust type that is a kernel element type: bound of a `#[kernel]` function's type parameters
/// (added by the macro) and type of its scalar parameters.
pub trait KernelElem: Copy + Send + Sync + 'static {
    /// The element type.
    const ELEM: ElemType;
    /// The value as a launch argument.
    fn scalar(self) -> ScalarValue;
}

/// The floating-point kernel element types.
pub trait KernelFloat: KernelElem {}

/// The integer kernel element types.
pub trait KernelInt: KernelElem {}

macro_rules! kernel_elems {
    ($($t:ty => $e:ident),* $(,)?) => {
        $(impl KernelElem for $t {
            const ELEM: ElemType = ElemType::$e;
            fn scalar(self) -> ScalarValue {
                ScalarValue::$e(self)
            }
        })*
    };
}

kernel_elems!(
    bool => Bool, i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16,
    u32 => U32, u64 => U64, half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64,
);

impl KernelFloat for half::f16 {}
impl KernelFloat for half::bf16 {}
impl KernelFloat for f32 {}
impl KernelFloat for f64 {}
impl KernelInt for i8 {}
impl KernelInt for i16 {}
impl KernelInt for i32 {}
impl KernelInt for i64 {}
impl KernelInt for u8 {}
impl KernelInt for u16 {}
impl KernelInt for u32 {}
impl KernelInt for u64 {}

/// What a `#[kernel]` launcher takes for a slice parameter: a [`Handle`] (by value or
/// reference), a [`Binding`], or a [`BufferArgument`] carrying tensor shape and strides (for
/// `x.shape(d)`, `x.stride(d)`, `x.rank()`).
pub trait BufferArg {
    /// The launch argument.
    fn buffer_argument(self) -> BufferArgument;
}

impl BufferArg for BufferArgument {
    fn buffer_argument(self) -> BufferArgument {
        self
    }
}

impl BufferArg for Binding {
    fn buffer_argument(self) -> BufferArgument {
        BufferArgument {
            binding: self,
            shape: Shape::default(),
            strides: Strides::default(),
        }
    }
}

impl BufferArg for Handle {
    fn buffer_argument(self) -> BufferArgument {
        self.binding().buffer_argument()
    }
}

impl BufferArg for &Handle {
    fn buffer_argument(self) -> BufferArgument {
        self.clone().binding().buffer_argument()
    }
}
