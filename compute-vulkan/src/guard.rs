//! The indirect dispatch guard: a launch with a dynamic cube count first runs a one-unit kernel
//! that copies the count into the server's own argument buffer, replacing a count over the
//! device's `max_cube_count` by zero (an empty dispatch) and recording the first such count in a
//! status buffer; the launch then dispatches from the argument buffer. The status is read (and
//! cleared) by the next sync, which returns `LaunchError::CubeCountTooLarge`. This is what wgpu's
//! indirect validation does, plus the report.

use compute_core::kernel::{KernelBuilder, KernelDefinition};
use compute_core::{Bytes, ElemType, Handle};

use crate::kernel::VulkanKernel;

/// Bytes of the argument buffer (3 x u32 and a pad word) and of the status buffer (a flag, then
/// the count).
pub(crate) const GUARD_BYTES: u64 = 16;

/// The guard's kernel, its argument and status buffers, and whether an indirect launch was
/// recorded since the status was last read.
pub(crate) struct IndirectGuard {
    pub(crate) kernel: VulkanKernel,
    pub(crate) args: Handle,
    pub(crate) status: Handle,
    pub(crate) unread: bool,
}

/// Zeroed status bytes.
pub(crate) fn cleared_status() -> Bytes {
    Bytes::from_vec(vec![0; GUARD_BYTES as usize])
}

/// `args = any axis 0 || count <= max ? count : 0`, and the first over-limit count into
/// `status` (flag 1, then x, y, z).
pub(crate) fn guard_kernel() -> KernelDefinition {
    let mut k = KernelBuilder::new("compute_indirect_guard", [1, 1, 1]);
    let count = k.input("count", ElemType::U32, 1);
    let args = k.output("args", ElemType::U32, 1);
    let status = k.output("status", ElemType::U32, 1);
    let max = [
        k.scalar("max_x", ElemType::U32),
        k.scalar("max_y", ElemType::U32),
        k.scalar("max_z", ElemType::U32),
    ];
    let xyz = [
        k.load(count, 0u32),
        k.load(count, 1u32),
        k.load(count, 2u32),
    ];
    let mut empty = k.eq(xyz[0], 0u32);
    let mut over = k.gt(xyz[0], max[0]);
    for axis in 1..3 {
        let zero = k.eq(xyz[axis], 0u32);
        empty = k.or(empty, zero);
        let above = k.gt(xyz[axis], max[axis]);
        over = k.or(over, above);
    }
    let no = k.lit_bool(false);
    let bad = k.select(empty, no, over);
    for (axis, &v) in xyz.iter().enumerate() {
        let out = k.select(bad, 0u32, v);
        k.store(args, axis as u32, out);
    }
    k.if_(bad, |k| {
        let flag = k.load(status, 0u32);
        let first = k.eq(flag, 0u32);
        k.if_(first, |k| {
            k.store(status, 0u32, 1u32);
            for (axis, &v) in xyz.iter().enumerate() {
                k.store(status, axis as u32 + 1, v);
            }
        });
    });
    k.build().expect("the indirect guard is a valid kernel")
}
