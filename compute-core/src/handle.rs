//! Handles to device memory, the bindings kernels and copies take, and launch arguments.

use std::sync::Arc;

use crate::device::DeviceId;
use crate::error::{LayoutError, ServerError};
use crate::kernel::ScalarValue;
use crate::layout::{Shape, Strides};
use crate::memory::SliceHandle;
use crate::stream::StreamId;

/// Which server a handle belongs to: its device and the server instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandleOwner {
    /// The device.
    pub device: DeviceId,
    /// A process-unique id of the server instance.
    pub server: u64,
}

impl HandleOwner {
    /// The owner for a new server of `device`: a server id no other server of the process has.
    pub fn fresh(device: DeviceId) -> Self {
        static NEXT_SERVER: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
        Self {
            device,
            server: NEXT_SERVER.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// A point in a stream's order: the `seq`-th command submitted to `stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamPoint {
    /// The stream.
    pub stream: StreamId,
    /// Sequence number of the command on that stream.
    pub seq: u64,
}

/// The last stream command that used a buffer, so that a use on another stream can wait for it.
#[derive(Debug, Default)]
pub struct AccessLog {
    last: spin::Mutex<Option<StreamPoint>>,
}

impl AccessLog {
    /// Record `point` as the latest use and return the previous one.
    #[inline]
    pub fn replace(&self, point: StreamPoint) -> Option<StreamPoint> {
        self.last.lock().replace(point)
    }

    /// The latest use.
    #[inline]
    pub fn last(&self) -> Option<StreamPoint> {
        *self.last.lock()
    }
}

/// A reference-counted handle to a range of device memory.
///
/// The memory returns to its pool when the last handle and the last binding made from it (including
/// the copies held by work still in flight) are dropped.
#[derive(Debug, Clone)]
pub struct Handle {
    memory: SliceHandle,
    offset_start: u64,
    offset_end: u64,
    size: u64,
    owner: HandleOwner,
    stream: StreamId,
    access: Arc<AccessLog>,
}

impl Handle {
    /// A handle over the whole of `memory`, the size it was reserved with (backends and the
    /// client build these).
    ///
    /// The size is taken from the slice, never from the caller, so that no handle can claim
    /// bytes past its slice; [`range`](Self::range) makes a checked sub-handle.
    pub fn new(memory: SliceHandle, owner: HandleOwner, stream: StreamId) -> Self {
        let size = memory.size();
        Self {
            memory,
            offset_start: 0,
            offset_end: 0,
            size,
            owner,
            stream,
            access: Arc::default(),
        }
    }

    /// The same memory without its first `offset` bytes.
    pub fn offset_start(mut self, offset: u64) -> Self {
        let offset = offset.min(self.size());
        self.offset_start += offset;
        self
    }

    /// The same memory without its last `offset` bytes.
    pub fn offset_end(mut self, offset: u64) -> Self {
        let offset = offset.min(self.size());
        self.offset_end += offset;
        self
    }

    /// A handle on the byte range `[start, start + len)` of this one.
    pub fn range(self, start: u64, len: u64) -> Result<Self, ServerError> {
        let size = self.size();
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(LayoutError::RangeOutOfBounds { start, len, size }.into());
        }
        Ok(self.offset_start(start).offset_end(size - start - len))
    }

    /// Size in bytes of the visible range.
    #[inline]
    pub fn size(&self) -> u64 {
        self.size - self.offset_start - self.offset_end
    }

    /// Offset of the visible range from the start of the slice.
    #[inline]
    pub fn slice_offset_start(&self) -> u64 {
        self.offset_start
    }

    /// Bytes hidden at the end of the slice.
    #[inline]
    pub fn slice_offset_end(&self) -> u64 {
        self.offset_end
    }

    /// The pool slice behind the handle.
    #[inline]
    pub fn memory(&self) -> &SliceHandle {
        &self.memory
    }

    /// Which server allocated it.
    #[inline]
    pub fn owner(&self) -> HandleOwner {
        self.owner
    }

    /// The stream it was allocated on.
    #[inline]
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The handle's access log (for cross-stream ordering).
    #[inline]
    pub fn access(&self) -> &AccessLog {
        &self.access
    }

    /// Whether both handles share the same pool slice.
    pub fn same_memory(&self, other: &Handle) -> bool {
        self.memory.id() == other.memory.id()
    }

    /// A binding for a kernel or a copy; it keeps the memory alive as long as it lives.
    #[inline]
    pub fn binding(self) -> Binding {
        Binding { handle: self }
    }

    /// A descriptor to read the handle's bytes as a 1-D tensor of bytes.
    pub fn copy_descriptor_bytes(self) -> CopyDescriptor {
        let size = self.size() as usize;
        CopyDescriptor::new(self.binding(), [size], [1], 1)
    }
}

/// Memory bound to a kernel argument or a copy: keeps the memory alive while work uses it.
#[derive(Debug, Clone)]
pub struct Binding {
    handle: Handle,
}

impl Binding {
    /// The handle the binding was made from.
    #[inline]
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Size in bytes of the bound range.
    #[inline]
    pub fn size(&self) -> u64 {
        self.handle.size()
    }

    /// Check that the binding belongs to `owner`.
    #[inline]
    pub fn check_owner(&self, owner: HandleOwner) -> Result<(), ServerError> {
        let found = self.handle.owner;
        if found == owner {
            Ok(())
        } else if found.device == owner.device {
            Err(ServerError::ServerReplaced {
                device: owner.device,
            })
        } else {
            Err(ServerError::WrongDevice {
                expected: owner.device,
                found: found.device,
            })
        }
    }
}

/// A tensor to read or write: memory plus the shape and strides it is laid out with.
#[derive(Debug, Clone)]
pub struct CopyDescriptor {
    /// The memory.
    pub binding: Binding,
    /// The tensor's shape.
    pub shape: Shape,
    /// Its strides, in elements.
    pub strides: Strides,
    /// Size of one element in bytes.
    pub elem_size: usize,
}

impl CopyDescriptor {
    /// A descriptor from its parts.
    pub fn new(
        binding: Binding,
        shape: impl Into<Shape>,
        strides: impl Into<Strides>,
        elem_size: usize,
    ) -> Self {
        Self {
            binding,
            shape: shape.into(),
            strides: strides.into(),
            elem_size,
        }
    }

    /// Size of the data without padding, in bytes (wraps for shapes too large for `usize`;
    /// [`validate`](Self::validate) rejects those).
    pub fn compact_size(&self) -> usize {
        self.shape.num_elements().wrapping_mul(self.elem_size)
    }

    /// Whether the strides are the row-major strides of the shape without padding: the tensor's
    /// bytes are one compact run.
    pub fn is_contiguous(&self) -> bool {
        self.strides.0 == crate::layout::contiguous_strides(&self.shape).0
    }

    /// [`span`](Self::span) of a [validated](Self::validate) descriptor (which cannot
    /// overflow).
    pub fn validated_span(&self) -> usize {
        self.span().unwrap_or(0)
    }

    /// The compact bytes of this tensor, read from `strided`, which holds its strided span
    /// from the first element: a contiguous tensor is copied on several threads (fresh host
    /// pages and mapped readback memory are slow to touch from one), a strided one row by row.
    pub fn gather(&self, strided: &[u8]) -> crate::bytes::Bytes {
        if self.is_contiguous() {
            return crate::bytes::Bytes::from_slice_parallel(strided);
        }
        let mut buf = crate::bytes::AlignedBuf::zeroed(self.compact_size());
        let dst = buf.as_mut_slice();
        crate::layout::for_each_row(&self.shape, &self.strides, self.elem_size, |s, c, n| {
            dst[c..c + n].copy_from_slice(&strided[s..s + n]);
        });
        crate::bytes::Bytes::from_aligned(buf)
    }

    /// Bytes from the first to one past the last element, `None` on overflow or when shape and
    /// strides differ in rank.
    pub fn span(&self) -> Option<usize> {
        if self.shape.rank() != self.strides.rank() {
            return None;
        }
        crate::layout::strided_span(&self.shape, &self.strides, self.elem_size)
    }

    /// The sources of a read, in order: each descriptor [validated](Self::validate), then its
    /// binding resolved by `resolve` (the backend's resolve).
    ///
    /// # Errors
    /// The first descriptor's validation error or resolve error.
    pub fn read_sources<R>(
        descriptors: &[CopyDescriptor],
        mut resolve: impl FnMut(&Binding) -> Result<R, ServerError>,
    ) -> Result<Vec<R>, ServerError> {
        let mut sources = Vec::with_capacity(descriptors.len());
        for descriptor in descriptors {
            descriptor.validate()?;
            sources.push(resolve(&descriptor.binding)?);
        }
        Ok(sources)
    }

    /// Check the descriptor fits its memory and is row-major, as the runtime lays tensors out.
    ///
    /// Every size is computed with checked arithmetic: a shape, stride or element size whose
    /// product overflows is a [`LayoutError::SizeOverflow`], never a wrapped value. Aliasing
    /// strides are rejected (see [`check_row_major`](crate::layout::check_row_major)).
    pub fn validate(&self) -> Result<(), ServerError> {
        if self.elem_size == 0 {
            return Err(LayoutError::ZeroElemSize.into());
        }
        crate::layout::check_row_major(&self.shape, &self.strides)?;
        let overflow = || LayoutError::SizeOverflow {
            shape: self.shape.0.clone(),
            strides: self.strides.0.clone(),
            elem_size: self.elem_size,
        };
        crate::layout::checked_compact_size(&self.shape, self.elem_size)?;
        let span = self.span().ok_or_else(overflow)? as u64;
        let size = self.binding.size();
        if span > size {
            return Err(LayoutError::OutOfBounds {
                shape: self.shape.0.clone(),
                strides: self.strides.0.clone(),
                span,
                size,
            }
            .into());
        }
        Ok(())
    }

    /// The check of every write: [`validate`](Self::validate), and `len` (the host data's
    /// length) exactly the descriptor's compact size, else [`LayoutError::DataLength`].
    pub fn validate_write(&self, len: usize) -> Result<(), ServerError> {
        self.validate()?;
        let expected = self.compact_size();
        if len != expected {
            return Err(LayoutError::DataLength {
                given: len as u64,
                expected: expected as u64,
            }
            .into());
        }
        Ok(())
    }
}

/// A buffer argument of a launch, with optional tensor metadata the kernel can query.
#[derive(Debug, Clone)]
pub struct BufferArgument {
    /// The memory.
    pub binding: Binding,
    /// Shape of the tensor (empty for a plain buffer).
    pub shape: Shape,
    /// Strides of the tensor in elements (empty for a plain buffer).
    pub strides: Strides,
}

/// The arguments of a launch: buffers in declaration order, then scalars in declaration order.
#[derive(Debug, Clone, Default)]
pub struct KernelArguments {
    /// Buffer arguments.
    pub buffers: Vec<BufferArgument>,
    /// Scalar arguments.
    pub scalars: Vec<ScalarValue>,
}

impl KernelArguments {
    /// No arguments.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a plain buffer.
    pub fn buffer(mut self, binding: Binding) -> Self {
        self.buffers.push(BufferArgument {
            binding,
            shape: Shape::default(),
            strides: Strides::default(),
        });
        self
    }

    /// Append a buffer with its tensor shape and strides.
    pub fn tensor(
        mut self,
        binding: Binding,
        shape: impl Into<Shape>,
        strides: impl Into<Strides>,
    ) -> Self {
        self.buffers.push(BufferArgument {
            binding,
            shape: shape.into(),
            strides: strides.into(),
        });
        self
    }

    /// Append a scalar.
    pub fn scalar(mut self, value: impl Into<ScalarValue>) -> Self {
        self.scalars.push(value.into());
        self
    }

    /// Check every buffer belongs to `owner`.
    #[inline]
    pub fn check_owner(&self, owner: HandleOwner) -> Result<(), ServerError> {
        self.buffers
            .iter()
            .try_for_each(|b| b.binding.check_owner(owner))
    }
}

/// How many cubes a launch runs.
#[derive(Debug, Clone)]
pub enum CubeCount {
    /// A count known on the host.
    Static(u32, u32, u32),
    /// A count read at execution time from a buffer of three `u32` (x, y, z).
    Dynamic(Binding),
}

impl CubeCount {
    /// A one-dimensional count.
    pub fn new_1d(x: u32) -> Self {
        CubeCount::Static(x, 1, 1)
    }

    /// Enough cubes of `per_cube` units to cover `units` units in x.
    pub fn cover(units: usize, per_cube: u32) -> Self {
        CubeCount::Static(units.div_ceil(per_cube.max(1) as usize) as u32, 1, 1)
    }
}

/// Whether a launch checks bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecutionMode {
    /// Out-of-range loads read 0, out-of-range stores are dropped.
    Checked,
    /// No bounds checks; the caller promised there are no out-of-range accesses.
    Unchecked,
}
