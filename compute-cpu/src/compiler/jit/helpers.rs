//! Functions the generated code calls for what has no machine instruction: transcendental math
//! (the same Rust functions the interpreter uses, so both paths give the same bits), half-precision
//! conversions, the f32 atomic add, and tensor metadata.

use core::sync::atomic::{AtomicU32, Ordering};

use half::{bf16, f16};

use super::super::lanes::erf;
use super::super::plane::PlaneFn;
use super::Ctx;

macro_rules! math {
    ($($name:ident: $t:ty => |$x:ident| $e:expr;)*) => {$(
        pub(super) extern "C" fn $name($x: $t) -> $t { $e }
    )*};
}

math! {
    exp_f32: f32 => |x| x.exp();
    ln_f32: f32 => |x| x.ln();
    ln1p_f32: f32 => |x| x.ln_1p();
    sin_f32: f32 => |x| x.sin();
    cos_f32: f32 => |x| x.cos();
    tanh_f32: f32 => |x| x.tanh();
    erf_f32: f32 => |x| erf(x as f64) as f32;
    exp_f64: f64 => |x| x.exp();
    ln_f64: f64 => |x| x.ln();
    ln1p_f64: f64 => |x| x.ln_1p();
    sin_f64: f64 => |x| x.sin();
    cos_f64: f64 => |x| x.cos();
    tanh_f64: f64 => |x| x.tanh();
    erf_f64: f64 => |x| erf(x);
    floor_f32: f32 => |x| x.floor();
    floor_f64: f64 => |x| x.floor();
    ceil_f32: f32 => |x| x.ceil();
    ceil_f64: f64 => |x| x.ceil();
    trunc_f32: f32 => |x| x.trunc();
    trunc_f64: f64 => |x| x.trunc();
    nearest_f32: f32 => |x| x.round_ties_even();
    nearest_f64: f64 => |x| x.round_ties_even();
}

pub(super) extern "C" fn pow_f32(x: f32, y: f32) -> f32 {
    x.powf(y)
}
pub(super) extern "C" fn pow_f64(x: f64, y: f64) -> f64 {
    x.powf(y)
}
pub(super) extern "C" fn rem_f32(x: f32, y: f32) -> f32 {
    x % y
}
pub(super) extern "C" fn rem_f64(x: f64, y: f64) -> f64 {
    x % y
}
pub(super) extern "C" fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}
pub(super) extern "C" fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
    a.mul_add(b, c)
}

// Half precision: the bits travel as the low 16 bits of a u32.
pub(super) extern "C" fn f16_to_f32(x: u32) -> f32 {
    f16::from_bits(x as u16).to_f32()
}
pub(super) extern "C" fn f32_to_f16(x: f32) -> u32 {
    f16::from_f32(x).to_bits() as u32
}
pub(super) extern "C" fn bf16_to_f32(x: u32) -> f32 {
    bf16::from_bits(x as u16).to_f32()
}
pub(super) extern "C" fn f32_to_bf16(x: f32) -> u32 {
    bf16::from_f32(x).to_bits() as u32
}
pub(super) extern "C" fn f16_to_f64(x: u32) -> f64 {
    f16::from_bits(x as u16).to_f64()
}
pub(super) extern "C" fn f64_to_f16(x: f64) -> u32 {
    f16::from_f64(x).to_bits() as u32
}
pub(super) extern "C" fn bf16_to_f64(x: u32) -> f64 {
    bf16::from_bits(x as u16).to_f64()
}
pub(super) extern "C" fn f64_to_bf16(x: f64) -> u32 {
    bf16::from_f64(x).to_bits() as u32
}

/// `*p += f32::from_bits(v)` atomically; the previous bits.
///
/// # Safety
/// `p` is valid and 4-byte aligned for atomic accesses (the generated code passes an in-range
/// element of a bound buffer or shared array, or the worker's sink).
pub(super) unsafe extern "C" fn atomic_add_f32(p: *mut u8, v: u32) -> u32 {
    // SAFETY: the caller's contract.
    let a = unsafe { AtomicU32::from_ptr(p.cast()) };
    let add = f32::from_bits(v);
    let mut cur = a.load(Ordering::Relaxed);
    loop {
        let new = (f32::from_bits(cur) + add).to_bits();
        match a.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(prev) => break prev,
            Err(x) => cur = x,
        }
    }
}

/// Shape (`stride == 0`) or stride (`stride != 0`) of dimension `dim` of buffer `buf`'s tensor,
/// saturated to u32; 0 past the rank.
///
/// # Safety
/// `ctx` is the launch context the generated code was called with, and `buf` one of its buffers.
pub(super) unsafe extern "C" fn meta(ctx: *const Ctx, buf: u32, dim: u64, stride: u32) -> u32 {
    // SAFETY: the caller's contract: `ctx` lives for the launch and `buf` is in range.
    let ctx = unsafe { &*ctx };
    // SAFETY: `metas` holds one entry per buffer for the launch.
    let m = unsafe { &*ctx.metas.add(buf as usize) };
    let (ptr, len) = if stride != 0 {
        (m.strides, m.strides_len)
    } else {
        (m.shape, m.shape_len)
    };
    if ptr.is_null() {
        return 0;
    }
    // SAFETY: the launch keeps the metadata slice of `len` entries alive.
    let meta = unsafe { core::slice::from_raw_parts(ptr, len) };
    usize::try_from(dim)
        .ok()
        .and_then(|d| meta.get(d))
        .map_or(0, |&v| v.min(u32::MAX as usize) as u32)
}

/// Rank of buffer `buf`'s tensor metadata.
///
/// # Safety
/// As for [`meta`].
pub(super) unsafe extern "C" fn rank(ctx: *const Ctx, buf: u32) -> u32 {
    // SAFETY: the caller's contract.
    let ctx = unsafe { &*ctx };
    // SAFETY: `metas` holds one entry per buffer for the launch.
    unsafe { &*ctx.metas.add(buf as usize) }.shape_len as u32
}

/// Plane step descriptors, boxed: the generated code embeds their addresses, so they must not
/// move while the list grows.
#[allow(clippy::vec_box)]
pub(super) type PlaneSteps = Vec<Box<PlaneStep>>;

/// A plane operation over one cube's per-unit slots (see `analysis::CubeNode::Plane`).
#[derive(Debug)]
pub(super) struct PlaneStep {
    /// The interpreter's kernel of the operation (its register layout is unit-major).
    pub f: PlaneFn,
    pub x_off: u32,
    pub x_bytes: u32,
    /// Slot of the `u32` lane operand of broadcasts and shuffles.
    pub lane_off: Option<u32>,
    pub out_off: u32,
    pub out_bytes: u32,
    pub width: usize,
    /// Slot of the returned flag: returned units are inactive.
    pub ret_off: Option<u32>,
    /// Slots of the masks in force: units with any of them clear are inactive.
    pub masks: Vec<u32>,
    pub units: usize,
    pub stride: u32,
}

/// Gather the operands of every unit, run the plane kernel, scatter the results.
///
/// # Safety
/// `step` is a live `PlaneStep` and `state` the worker's state of the step's layout (`units`
/// slots of `stride` bytes holding the offsets it names).
pub(super) unsafe extern "C" fn plane_step(step: *const PlaneStep, state: *mut u8) {
    // SAFETY: the caller's contract.
    let st = unsafe { &*step };
    let n = st.units;
    let slot = |u: usize, off: u32| u * st.stride as usize + off as usize;
    let gather = |off: u32, bytes: u32| {
        let mut v = vec![0u64; (n * bytes as usize).div_ceil(8).max(1)];
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
        for u in 0..n {
            let b = bytes as usize;
            // SAFETY: the slot lies inside the state (the caller's contract).
            let src = unsafe { core::slice::from_raw_parts(state.add(slot(u, off)), b) };
            dst[u * b..(u + 1) * b].copy_from_slice(src);
        }
        v
    };
    let x = gather(st.x_off, st.x_bytes);
    let lane = st.lane_off.map_or_else(|| vec![0u64], |o| gather(o, 4));
    let mask: Vec<u8> = (0..n)
        .map(|u| {
            // SAFETY: the flag and mask bytes lie inside the state (as above).
            let byte = |off: u32| unsafe { *state.add(slot(u, off)) };
            let returned = st.ret_off.is_some_and(|r| byte(r) != 0);
            let masked = st.masks.iter().any(|&m| byte(m) == 0);
            (!returned && !masked) as u8
        })
        .collect();
    let mut out = vec![0u64; (n * st.out_bytes as usize).div_ceil(8).max(1)];
    (st.f)(&x, &lane, &mut out, &mask, st.width);
    let src: &[u8] = bytemuck::cast_slice(&out);
    for u in 0..n {
        let b = st.out_bytes as usize;
        // SAFETY: as above, for writes: the state is this worker's own.
        let dst = unsafe { core::slice::from_raw_parts_mut(state.add(slot(u, st.out_off)), b) };
        dst.copy_from_slice(&src[u * b..(u + 1) * b]);
    }
}
