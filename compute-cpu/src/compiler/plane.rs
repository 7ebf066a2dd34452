//! Plane (warp, subgroup) operations: planes are runs of [`PLANE_SIZE`] consecutive units of a
//! cube; they read only the active units.

use bytemuck::Pod;
use compute_core::elem::ElemType;
use compute_core::kernel::PlaneOp;
use half::{bf16, f16};

use super::PLANE_SIZE;
use super::lanes::{self, Op2, view, view_mut};
use super::words::Word;

const P: usize = PLANE_SIZE as usize;

/// `(x, lane, out, mask, width)`; `lane` is unused by reductions and ballots.
pub(crate) type PlaneFn = fn(&[u64], &[u64], &mut [u64], &[u8], usize);

fn reduce<T: Pod, O: Op2<T>>(x: &[u64], _lane: &[u64], out: &mut [u64], mask: &[u8], w: usize) {
    let n = mask.len() * w;
    let (x, out) = (view::<T>(x, n), view_mut::<T>(out, n));
    for (p, m) in mask.chunks(P).enumerate() {
        let base = p * P;
        for c in 0..w {
            let mut acc: Option<T> = None;
            for (j, &active) in m.iter().enumerate() {
                if active != 0 {
                    let v = x[(base + j) * w + c];
                    acc = Some(match acc {
                        None => v,
                        Some(a) => O::f(a, v),
                    });
                }
            }
            let r = acc.unwrap_or_else(T::zeroed);
            for j in 0..m.len() {
                out[(base + j) * w + c] = r;
            }
        }
    }
}

/// Unit `lane[l]` of `l`'s plane, 0 when that unit is past the cube or the plane.
pub(crate) fn shuffle<W: Word>(x: &[u64], lane: &[u64], out: &mut [u64], mask: &[u8], w: usize) {
    let lanes = mask.len();
    let (x, out) = (view::<W>(x, lanes * w), view_mut::<W>(out, lanes * w));
    let lane = view::<u32>(lane, lanes);
    for l in 0..lanes {
        let src = (l / P) * P + lane[l] as usize;
        let o = &mut out[l * w..(l + 1) * w];
        if (lane[l] as usize) < P && src < lanes {
            o.copy_from_slice(&x[src * w..(src + 1) * w]);
        } else {
            o.fill(W::default());
        }
    }
}

/// A `u32x4` mask of the active units whose bool is set.
pub(crate) fn ballot(x: &[u64], _lane: &[u64], out: &mut [u64], mask: &[u8], _w: usize) {
    let lanes = mask.len();
    let (x, out) = (view::<u8>(x, lanes), view_mut::<u32>(out, lanes * 4));
    for (p, m) in mask.chunks(P).enumerate() {
        let base = p * P;
        let mut bits = 0u32;
        for (j, &active) in m.iter().enumerate() {
            if active != 0 && x[base + j] != 0 {
                bits |= 1 << j;
            }
        }
        for j in 0..m.len() {
            out[(base + j) * 4..(base + j + 1) * 4].copy_from_slice(&[bits, 0, 0, 0]);
        }
    }
}

macro_rules! reduce_by_num {
    ($elem:expr, $op:ty) => {
        match $elem {
            ElemType::I8 => Some(reduce::<i8, $op> as PlaneFn),
            ElemType::I16 => Some(reduce::<i16, $op> as PlaneFn),
            ElemType::I32 => Some(reduce::<i32, $op> as PlaneFn),
            ElemType::I64 => Some(reduce::<i64, $op> as PlaneFn),
            ElemType::U8 => Some(reduce::<u8, $op> as PlaneFn),
            ElemType::U16 => Some(reduce::<u16, $op> as PlaneFn),
            ElemType::U32 => Some(reduce::<u32, $op> as PlaneFn),
            ElemType::U64 => Some(reduce::<u64, $op> as PlaneFn),
            ElemType::F16 => Some(reduce::<f16, $op> as PlaneFn),
            ElemType::BF16 => Some(reduce::<bf16, $op> as PlaneFn),
            ElemType::F32 => Some(reduce::<f32, $op> as PlaneFn),
            ElemType::F64 => Some(reduce::<f64, $op> as PlaneFn),
            ElemType::Bool => None,
        }
    };
}

/// The kernel of a plane reduction on `elem`.
pub(crate) fn reduce_fn(op: PlaneOp, elem: ElemType) -> Option<PlaneFn> {
    match op {
        PlaneOp::Sum => reduce_by_num!(elem, lanes::Add),
        PlaneOp::Prod => reduce_by_num!(elem, lanes::Mul),
        PlaneOp::Min => reduce_by_num!(elem, lanes::Min),
        PlaneOp::Max => reduce_by_num!(elem, lanes::Max),
        PlaneOp::All => (elem == ElemType::Bool).then_some(reduce::<u8, lanes::BitAnd> as PlaneFn),
        PlaneOp::Any => (elem == ElemType::Bool).then_some(reduce::<u8, lanes::BitOr> as PlaneFn),
    }
}
