//! Counters of range loops, per integer type.

use bytemuck::Pod;
use compute_core::elem::ElemType;

use super::lanes::{view, view_mut};

trait Counter: Pod + PartialOrd {
    fn sign(self) -> i8;
    fn step(self, by: Self) -> Option<Self>;
}

macro_rules! counter {
    ($($t:ty),*) => {$(
        impl Counter for $t {
            #[allow(unused_comparisons)]
            #[inline(always)]
            fn sign(self) -> i8 {
                if self > 0 { 1 } else if self < 0 { -1 } else { 0 }
            }
            #[inline(always)]
            fn step(self, by: Self) -> Option<Self> { self.checked_add(by) }
        }
    )*};
}

counter!(i8, i16, i32, i64, u8, u16, u32, u64);

/// `(counter, end, step, mask)`: clear the mask of units whose counter is past `end`.
pub(crate) type TestFn = fn(&[u64], &[u64], &[u64], &mut [u8]);

/// The per-type functions of a range loop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RangeFns {
    /// `mask[l] &= counter[l] still before end[l]`: `(counter, end, step, mask)`.
    pub test: TestFn,
    /// `counter[l] += step[l]` for active units, deactivating those that overflow.
    pub advance: fn(&mut [u64], &[u64], &mut [u8]),
}

fn test<T: Counter>(counter: &[u64], end: &[u64], step: &[u64], mask: &mut [u8]) {
    let n = mask.len();
    let (i, e, s) = (view::<T>(counter, n), view::<T>(end, n), view::<T>(step, n));
    for l in 0..n {
        let go = match s[l].sign() {
            1 => i[l] < e[l],
            -1 => i[l] > e[l],
            _ => false,
        };
        mask[l] &= go as u8;
    }
}

fn advance<T: Counter>(counter: &mut [u64], step: &[u64], mask: &mut [u8]) {
    let n = mask.len();
    let (i, s) = (view_mut::<T>(counter, n), view::<T>(step, n));
    for l in 0..n {
        if mask[l] != 0 {
            match i[l].step(s[l]) {
                Some(v) => i[l] = v,
                None => mask[l] = 0,
            }
        }
    }
}

/// The counter functions of an integer type.
pub(crate) fn range_fns(elem: ElemType) -> Option<RangeFns> {
    macro_rules! fns {
        ($t:ty) => {
            RangeFns {
                test: test::<$t>,
                advance: advance::<$t>,
            }
        };
    }
    Some(match elem {
        ElemType::I8 => fns!(i8),
        ElemType::I16 => fns!(i16),
        ElemType::I32 => fns!(i32),
        ElemType::I64 => fns!(i64),
        ElemType::U8 => fns!(u8),
        ElemType::U16 => fns!(u16),
        ElemType::U32 => fns!(u32),
        ElemType::U64 => fns!(u64),
        _ => return None,
    })
}
