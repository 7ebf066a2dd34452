//! The indirect dispatch guard: a launch with a dynamic cube count first runs a one-unit kernel
//! that copies the count into the server's own argument buffer, replacing a count over the
//! device's `max_cube_count` by zero (an empty dispatch) and recording the first such count in a
//! status buffer; the launch then dispatches from the argument buffer. The status is read (and
//! cleared) by the next sync, which returns `LaunchError::CubeCountTooLarge`. This is what wgpu's
//! indirect validation does, plus the report.

use compute_core::backend::ServerKit;
use compute_core::kernel::{KernelBuilder, KernelDefinition};
use compute_core::server::ReadFuture;
use compute_core::{
    Binding, Bytes, ComputeServer, CubeCount, ElemType, ExecutionMode, Handle, KernelArguments,
    KernelLaunch, ServerError, ServerTransfer, StreamId,
};

use crate::kernel::VulkanKernel;
use crate::server::VulkanServer;

/// Bytes of the argument buffer (3 x u32 and a pad word) and of the status buffer (a flag, then
/// the count).
pub(crate) const GUARD_BYTES: u64 = 16;

/// The guard's kernel, its argument and status buffers, and whether an indirect launch was
/// recorded since the status was last read.
pub(crate) struct IndirectGuard {
    pub(crate) kernel: VulkanKernel,
    pub(crate) args: Handle,
    pub(crate) status: Handle,
    /// The streams that recorded (or replayed) a guarded launch since the status was last read.
    pub(crate) streams: compute_core::backend::MarkedStreams,
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

impl VulkanServer {
    /// Run the indirect guard (see [`crate::guard`]) over the dynamic count `binding` on
    /// `stream`: the binding of the guarded count, to dispatch from.
    pub(crate) fn guard_count(
        &mut self,
        binding: Binding,
        stream: StreamId,
    ) -> Result<Binding, ServerError> {
        if self.guard.is_none() {
            self.ensure_not_capturing(
                stream,
                "the first launch with a dynamic cube count (it makes the count guard's buffers)",
            )?;
            let owner = self.owner;
            let memory = &mut self.stream(stream)?.memory;
            let args = Handle::new(memory.reserve(GUARD_BYTES)?, owner, stream);
            let status = Handle::new(memory.reserve(GUARD_BYTES)?, owner, stream);
            self.write(
                vec![(status.clone().copy_descriptor_bytes(), cleared_status())],
                stream,
            )?;
            self.guard = Some(IndirectGuard {
                kernel: guard_kernel().into(),
                args,
                status,
                streams: Default::default(),
            });
        }
        let Some(guard) = self.guard.as_mut() else {
            unreachable!("made just above")
        };
        guard.streams.mark(stream);
        let (kernel, args) = (guard.kernel.clone(), guard.args.clone());
        let max = self.properties.hardware.max_cube_count;
        let arguments = KernelArguments::new()
            .buffer(binding)
            .buffer(args.clone().binding())
            .buffer(guard.status.clone().binding())
            .scalar(max[0])
            .scalar(max[1])
            .scalar(max[2]);
        // SAFETY: a bounds-checked launch of the guard, whose buffers hold the 3 and 4 words it
        // reads and writes.
        unsafe {
            let launch = KernelLaunch {
                kernel,
                count: CubeCount::Static(1, 1, 1),
                arguments,
                mode: ExecutionMode::Checked,
            };
            self.launch(launch, stream)?;
        }
        Ok(args.binding())
    }

    /// When an indirect launch was recorded since the status was last read: a read of the
    /// guard's status, and a write clearing it after the read.
    ///
    /// With the read come the streams it covers: an over-limit error it finds is theirs
    /// (kept for them in `stream_errors`), not the reading stream's.
    pub(crate) fn read_guard_status(
        &mut self,
        stream: StreamId,
    ) -> Option<(ReadFuture, Vec<StreamId>)> {
        let guard = self.guard.as_mut()?;
        if guard.streams.is_empty() {
            return None;
        }
        let streams = guard.streams.take();
        let status = guard.status.clone();
        let read = self.read(vec![status.clone().copy_descriptor_bytes()], stream);
        if let Err(e) = self.write(
            vec![(status.copy_descriptor_bytes(), cleared_status())],
            stream,
        ) {
            self.errors.lock().push_back(e);
        }
        Some((read, streams))
    }
}

/// The over-limit count the indirect guard recorded in its status (read back as `bytes`), as the
/// error to report, if it recorded one.
pub(crate) fn guard_error(bytes: &[Bytes], maximum: [u32; 3]) -> Option<ServerError> {
    let raw = bytes.first()?.to_vec();
    let word =
        |i: usize| u32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]]);
    (raw.len() >= GUARD_BYTES as usize && word(0) != 0).then(|| {
        compute_core::error::LaunchError::CubeCountTooLarge {
            count: [word(1), word(2), word(3)],
            maximum,
        }
        .into()
    })
}
