//! [`Bytes`]: host memory handed to and returned from the runtime.
//!
//! A `Bytes` is owned (an aligned heap buffer, or a `Vec` kept without copying), backend-provided
//! (pinned host memory, through [`HostBuffer`]), a [`bytes::Bytes`] (kept without copying),
//! file-backed or lazy. File-backed and lazy bytes are read on first access: a lazy `Bytes` from
//! `read_lazy` copies device memory to the host then, and keeps its source allocation alive until
//! it does.
//!
//! # Sharing and copies
//!
//! Every representation is shared by reference count: [`Clone`] never copies the bytes (a clone
//! of a lazy or file `Bytes` shares the deferred read, which runs once for all clones), and a
//! clone stays valid after the original is dropped. Conversions with the `bytes` crate never copy
//! either: `Bytes::from(bytes::Bytes)` keeps the buffer, and `bytes::Bytes::from(Bytes)` hands
//! over the buffer (a deferred `Bytes` is read first). A copy is made only by a write that needs
//! unique ownership: [`DerefMut`](core::ops::DerefMut) on bytes shared with a clone or with a
//! `bytes::Bytes` (copy-on-write; a `bytes::Bytes` that is the last reference to its buffer is
//! taken over without a copy), and by [`Bytes::move_into`] (staging into pinned memory, a copy by
//! design). Alignment: the runtime's own buffers are aligned to [`HOST_ALIGNMENT`]; bytes from a
//! `Vec` or a `bytes::Bytes` keep their own alignment, so [`Bytes::as_elems`] may return `None`
//! for them where [`Bytes::to_elems`] (a copy) always works.
//!
//! Size: one type with several storage kinds; each kind's accessors sit with the others so the
//! contract of `Bytes` reads in one place; the rest is its unit tests.

use std::alloc::Layout;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use crate::elem::Elem;
use crate::error::{LayoutError, ServerError};

mod release;
pub use release::{
    HostCopy, RELEASE_MAX_BYTES, RELEASE_MAX_DEFER, RELEASE_MIN_BYTES, RELEASE_QUIET, host_copy,
    release, releasing_bytes,
};

/// Alignment of every buffer the runtime allocates on the host, in bytes.
pub const HOST_ALIGNMENT: usize = 64;

/// Host memory owned by something other than a plain heap buffer (pinned memory, a typed `Vec`).
pub trait HostBuffer: Send + Sync + 'static {
    /// The bytes.
    fn as_bytes(&self) -> &[u8];
    /// The bytes, mutably.
    fn as_bytes_mut(&mut self) -> &mut [u8];
    /// Whether this memory is pinned (page-locked), so devices can copy from it directly.
    fn is_pinned(&self) -> bool {
        false
    }
}

impl<E: Elem> HostBuffer for Vec<E> {
    fn as_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self)
    }
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(self)
    }
}

/// Where the bytes of a [`Bytes`] live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BytesKind {
    /// An ordinary heap buffer.
    Owned,
    /// Pinned host memory provided by a backend.
    Pinned,
    /// A range of a file, read on first access.
    File,
    /// Deferred: produced on first access (e.g. a device-to-host copy from `read_lazy`).
    Lazy,
}

/// Large host buffers dropped lately, kept for the next copy of the same length: a fresh
/// allocation of that size is fresh pages, and faulting them in costs more than the copy itself
/// (22 of the 30 ms of a 64 MiB readback on lavapipe's host, and 94-140 ms when the container
/// reclaims page cache in the fault path). Buffers of at least [`RECYCLE_MIN_BYTES`] are kept,
/// at most [`RECYCLE_MAX_BUFFERS`] and [`RECYCLE_MAX_BYTES`] in all (the oldest go first);
/// [`trim_host_cache`] (called by `memory_cleanup`) returns them to the system.
struct Recycled {
    /// Address and length of each kept buffer, oldest first.
    free: Vec<(usize, usize)>,
    bytes: usize,
}

static RECYCLED: spin::Mutex<Recycled> = spin::Mutex::new(Recycled {
    free: Vec::new(),
    bytes: 0,
});

/// Smallest buffer kept for reuse.
pub const RECYCLE_MIN_BYTES: usize = 1 << 20;
/// Buffers kept for reuse at most.
pub const RECYCLE_MAX_BUFFERS: usize = 8;
/// Bytes kept for reuse at most.
pub const RECYCLE_MAX_BYTES: usize = 256 << 20;

/// A kept buffer of exactly `len` bytes, if there is one.
fn take_recycled(len: usize) -> Option<core::ptr::NonNull<u8>> {
    if len < RECYCLE_MIN_BYTES {
        return None;
    }
    let mut cache = RECYCLED.lock();
    let i = cache.free.iter().rposition(|&(_, l)| l == len)?;
    let (addr, _) = cache.free.remove(i);
    cache.bytes -= len;
    core::ptr::NonNull::new(addr as *mut u8)
}

/// Keep the buffer at `ptr` of `len` bytes for reuse; `false` when it is not kept (the caller
/// frees it).
fn recycle(ptr: core::ptr::NonNull<u8>, len: usize) -> bool {
    if !(RECYCLE_MIN_BYTES..=RECYCLE_MAX_BYTES).contains(&len) {
        return false;
    }
    let mut evicted = Vec::new();
    {
        let mut cache = RECYCLED.lock();
        while !cache.free.is_empty()
            && (cache.free.len() >= RECYCLE_MAX_BUFFERS || cache.bytes + len > RECYCLE_MAX_BYTES)
        {
            let oldest = cache.free.remove(0);
            cache.bytes -= oldest.1;
            evicted.push(oldest);
        }
        cache.free.push((ptr.as_ptr() as usize, len));
        cache.bytes += len;
    }
    for (addr, l) in evicted {
        // SAFETY: kept buffers were allocated by `AlignedBuf` with this layout and are owned by
        // the cache alone.
        unsafe { std::alloc::dealloc(addr as *mut u8, AlignedBuf::layout(l)) };
    }
    true
}

/// Return every host buffer kept for reuse to the system.
pub fn trim_host_cache() {
    let kept = {
        let mut cache = RECYCLED.lock();
        cache.bytes = 0;
        core::mem::take(&mut cache.free)
    };
    for (addr, l) in kept {
        // SAFETY: as in `recycle`.
        unsafe { std::alloc::dealloc(addr as *mut u8, AlignedBuf::layout(l)) };
    }
}

/// Bytes of host buffers kept for reuse now.
pub fn host_cache_bytes() -> usize {
    RECYCLED.lock().bytes
}

/// Bytes per thread of [`parallel_copy`], at least.
const COPY_PIECE: usize = 4 << 20;

/// How many threads copy `len` bytes: one per [`COPY_PIECE`], at most 8 (and the host's cores).
fn copy_pieces(len: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (len / COPY_PIECE).clamp(1, cores.min(8))
}

/// `dst.copy_from_slice(src)`, in up to 8 parts of at least 4 MiB on the copy team
/// ([`crate::copy::copy_parallel`]).
///
/// Mapped device memory (write-combined or uncached host-visible memory of a discrete GPU) reads
/// at 1-2 GB/s on one thread but scales with the number of readers, and staging pageable bytes
/// into pinned memory is bound by one thread's memcpy; large transfers use this.
///
/// # Panics
/// If the lengths differ.
pub fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "parallel_copy of slices of different lengths"
    );
    let pieces = copy_pieces(src.len());
    if pieces <= 1 {
        dst.copy_from_slice(src);
        return;
    }
    crate::copy::copy_parallel(dst, src, src.len().div_ceil(pieces));
}

/// A heap buffer aligned to [`HOST_ALIGNMENT`].
pub struct AlignedBuf {
    ptr: core::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len.max(1), HOST_ALIGNMENT)
            .unwrap_or_else(|_| panic!("host buffer of {len} bytes exceeds the address space"))
    }

    /// A zero-filled buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            core::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self { ptr, len }
    }

    /// Memory for `len` bytes, contents unspecified (a kept buffer of that length, or fresh):
    /// the callers overwrite all of it.
    fn uninit(len: usize) -> core::ptr::NonNull<u8> {
        if let Some(ptr) = take_recycled(len) {
            return ptr;
        }
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        core::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
    }

    /// A buffer holding a copy of `src`.
    pub fn copy_from(src: &[u8]) -> Self {
        let ptr = Self::uninit(src.len());
        // SAFETY: `ptr` is a fresh allocation of at least `src.len()` bytes; the ranges are disjoint.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), ptr.as_ptr(), src.len()) };
        Self {
            ptr,
            len: src.len(),
        }
    }

    /// A buffer holding a copy of `src`, copied on several threads when `src` is large (see
    /// [`parallel_copy`]): for reading mapped device memory, which one thread reads slowly.
    pub fn copy_from_parallel(src: &[u8]) -> Self {
        let pieces = copy_pieces(src.len());
        if pieces <= 1 {
            return Self::copy_from(src);
        }
        let ptr = Self::uninit(src.len());
        let piece = src.len().div_ceil(pieces);
        let dst = ptr.as_ptr() as usize;
        std::thread::scope(|scope| {
            for (i, s) in src.chunks(piece).enumerate() {
                scope.spawn(move || {
                    // SAFETY: piece `i` of the fresh allocation of `src.len()` bytes is written by
                    // this thread alone; source and destination are disjoint.
                    unsafe {
                        core::ptr::copy_nonoverlapping(
                            s.as_ptr(),
                            (dst as *mut u8).add(i * piece),
                            s.len(),
                        )
                    };
                });
            }
        });
        Self {
            ptr,
            len: src.len(),
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised bytes owned by `self`.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `len` initialised bytes owned exclusively by `self`.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if recycle(self.ptr, self.len) {
            return;
        }
        // SAFETY: allocated in `zeroed`/`uninit` with this same layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) };
    }
}

type LazySource = Box<dyn FnOnce() -> Result<Bytes, ServerError> + Send>;

struct Deferred {
    len: usize,
    kind: BytesKind,
    source: spin::Mutex<Option<LazySource>>,
    value: OnceLock<Result<Box<Bytes>, ServerError>>,
}

impl Deferred {
    fn force(&self) -> &Result<Box<Bytes>, ServerError> {
        self.value.get_or_init(|| {
            let source = self.source.lock().take();
            let source = source.unwrap_or_else(|| unreachable!("a lazy source runs exactly once"));
            let bytes = source()?;
            if bytes.len() != self.len {
                return Err(ServerError::Driver(format!(
                    "lazy source produced {} bytes, {} were announced",
                    bytes.len(),
                    self.len
                )));
            }
            Ok(Box::new(bytes))
        })
    }
}

#[derive(Clone)]
enum Repr {
    Owned(Arc<AlignedBuf>),
    Host(Arc<dyn HostBuffer>),
    Shared(bytes::Bytes),
    Deferred(Arc<Deferred>),
}

/// A uniquely owned `bytes::BytesMut`, writable in place.
struct MutBuffer(bytes::BytesMut);

impl HostBuffer for MutBuffer {
    fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// The owner a `bytes::Bytes` made from an aligned buffer keeps.
struct AlignedOwner(Arc<AlignedBuf>);

impl AsRef<[u8]> for AlignedOwner {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// The owner a `bytes::Bytes` made from a host buffer keeps.
struct HostOwner(Arc<dyn HostBuffer>);

impl AsRef<[u8]> for HostOwner {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// Host bytes: what `create` takes and what reads return. Dereferences to `[u8]`.
///
/// Dereferencing a lazy or file-backed `Bytes` performs its deferred read; if that read fails the
/// dereference panics with the error. Use [`Bytes::try_as_slice`] to get the error instead.
///
/// Cheap to clone: clones share the bytes (see the [module docs](self) for when a copy is made).
#[derive(Clone)]
pub struct Bytes {
    repr: Repr,
}

impl Bytes {
    /// A copy of `data` in an aligned buffer.
    pub fn from_slice(data: &[u8]) -> Self {
        Self::from_aligned(AlignedBuf::copy_from(data))
    }

    /// Copy a slice, on several threads when it is large ([`parallel_copy`]): for reads out of
    /// mapped device memory.
    pub fn from_slice_parallel(data: &[u8]) -> Self {
        Self::from_aligned(AlignedBuf::copy_from_parallel(data))
    }

    /// Take a byte vector without copying.
    pub fn from_vec(data: Vec<u8>) -> Self {
        Self::from_host_buffer(Box::new(data))
    }

    /// Take a vector of elements without copying.
    pub fn from_elems<E: Elem>(data: Vec<E>) -> Self {
        Self::from_host_buffer(Box::new(data))
    }

    /// A copy of a slice of elements.
    pub fn from_elem_slice<E: Elem>(data: &[E]) -> Self {
        Self::from_slice(bytemuck::cast_slice(data))
    }

    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        Self::from_aligned(AlignedBuf::zeroed(len))
    }

    /// Wrap an aligned buffer.
    pub fn from_aligned(buf: AlignedBuf) -> Self {
        Self {
            repr: Repr::Owned(Arc::new(buf)),
        }
    }

    /// Wrap host memory provided by a backend or the user (pinned memory, say).
    pub fn from_host_buffer(buf: Box<dyn HostBuffer>) -> Self {
        Self {
            repr: Repr::Host(Arc::from(buf)),
        }
    }

    /// Keep a `bytes::Bytes` without copying (also `Bytes::from`).
    pub fn from_shared(bytes: bytes::Bytes) -> Self {
        Self {
            repr: Repr::Shared(bytes),
        }
    }

    /// The bytes as a `bytes::Bytes`, without copying: the buffer is handed over (kept alive by
    /// the `bytes::Bytes` and by any clone of `self`). A deferred `Bytes` is read first; its error
    /// is returned.
    pub fn try_into_shared(self) -> Result<bytes::Bytes, ServerError> {
        let mut this = self;
        this.materialize()?;
        Ok(match this.repr {
            Repr::Owned(buf) => bytes::Bytes::from_owner(AlignedOwner(buf)),
            Repr::Host(buf) => bytes::Bytes::from_owner(HostOwner(buf)),
            Repr::Shared(bytes) => bytes,
            Repr::Deferred(_) => unreachable!("materialized just above"),
        })
    }

    /// Whether the bytes are shared with a clone or another owner (so that a write through
    /// [`DerefMut`](core::ops::DerefMut) copies them first). Deferred bytes count as shared.
    pub fn is_shared(&mut self) -> bool {
        match &mut self.repr {
            Repr::Owned(buf) => Arc::get_mut(buf).is_none(),
            Repr::Host(buf) => Arc::get_mut(buf).is_none(),
            Repr::Shared(bytes) => !bytes.is_unique(),
            Repr::Deferred(_) => true,
        }
    }

    /// Make the (materialized) bytes uniquely owned: a copy when they are shared, except for a
    /// `bytes::Bytes` that is the last reference to its buffer, which is taken over.
    fn make_unique(&mut self) {
        let unique = match &mut self.repr {
            Repr::Owned(buf) => Arc::get_mut(buf).is_some(),
            Repr::Host(buf) => Arc::get_mut(buf).is_some(),
            Repr::Shared(_) | Repr::Deferred(_) => false,
        };
        if unique {
            return;
        }
        if let Repr::Shared(bytes) = &mut self.repr {
            let taken = core::mem::take(bytes);
            match taken.try_into_mut() {
                Ok(owned) => {
                    *self = Bytes::from_host_buffer(Box::new(MutBuffer(owned)));
                    return;
                }
                Err(shared) => *bytes = shared,
            }
        }
        *self = Bytes::from_slice(self);
    }

    /// Bytes produced by `source` on first access. `len` must be the length it will produce.
    ///
    /// `source` runs at most once, on the thread that first accesses the bytes.
    pub fn lazy(
        len: usize,
        source: impl FnOnce() -> Result<Bytes, ServerError> + Send + 'static,
    ) -> Self {
        Self::deferred(len, BytesKind::Lazy, Box::new(source))
    }

    /// `len` bytes of the file at `path` starting at `offset`, read on first access.
    pub fn from_file(path: impl Into<PathBuf>, offset: u64, len: usize) -> Self {
        let path = path.into();
        let source = move || read_file_range(&path, offset, len);
        Self::deferred(len, BytesKind::File, Box::new(source))
    }

    fn deferred(len: usize, kind: BytesKind, source: LazySource) -> Self {
        Self {
            repr: Repr::Deferred(Arc::new(Deferred {
                len,
                kind,
                source: spin::Mutex::new(Some(source)),
                value: OnceLock::new(),
            })),
        }
    }

    /// Whether there are no bytes. Does not trigger a deferred read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of bytes. Does not trigger a deferred read.
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Owned(buf) => buf.len,
            Repr::Host(buf) => buf.as_bytes().len(),
            Repr::Shared(bytes) => bytes.len(),
            Repr::Deferred(d) => d.len,
        }
    }

    /// Where the bytes live (for a deferred `Bytes`, what it was created as).
    pub fn kind(&self) -> BytesKind {
        match &self.repr {
            Repr::Owned(_) => BytesKind::Owned,
            Repr::Host(buf) if buf.is_pinned() => BytesKind::Pinned,
            Repr::Host(_) | Repr::Shared(_) => BytesKind::Owned,
            Repr::Deferred(d) => d.kind,
        }
    }

    /// Whether the bytes are in host memory now (false for a lazy or file `Bytes` not yet read).
    pub fn is_materialized(&self) -> bool {
        match &self.repr {
            Repr::Deferred(d) => d.value.get().is_some(),
            _ => true,
        }
    }

    /// The bytes, performing a deferred read if needed; its error is returned, not raised.
    pub fn try_as_slice(&self) -> Result<&[u8], ServerError> {
        match &self.repr {
            Repr::Owned(buf) => Ok(buf.as_slice()),
            Repr::Host(buf) => Ok(buf.as_bytes()),
            Repr::Shared(bytes) => Ok(bytes),
            Repr::Deferred(d) => match d.force() {
                Ok(bytes) => bytes.try_as_slice(),
                Err(e) => Err(e.clone()),
            },
        }
    }

    /// Perform a deferred read now (a no-op for bytes already in memory). Clones of a deferred
    /// `Bytes` share its read: the first to materialize runs it, the others share its result.
    pub fn materialize(&mut self) -> Result<(), ServerError> {
        if let Repr::Deferred(d) = &mut self.repr {
            let value = match Arc::get_mut(d) {
                Some(unique) => {
                    unique.force();
                    let value = unique.value.take();
                    value.unwrap_or_else(|| unreachable!("forced just above"))
                }
                None => d.force().clone(),
            };
            *self = *value?;
        }
        Ok(())
    }

    /// Move the bytes into memory produced by `alloc` (pinned staging memory, say), copying them.
    pub fn move_into(
        &mut self,
        alloc: impl FnOnce(usize) -> Option<Box<dyn HostBuffer>>,
    ) -> Result<bool, ServerError> {
        let src = self.try_as_slice()?;
        let Some(mut dst) = alloc(src.len()) else {
            return Ok(false);
        };
        dst.as_bytes_mut().copy_from_slice(src);
        *self = Bytes::from_host_buffer(dst);
        Ok(true)
    }

    /// A copy of the bytes as a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        self.as_ref().to_vec()
    }

    /// A copy of the bytes as a vector of elements.
    ///
    /// # Panics
    /// Panics when the length is not a whole number of `E`s (nothing is padded or dropped);
    /// [`try_to_elems`](Self::try_to_elems) returns the error instead.
    pub fn to_elems<E: Elem>(&self) -> Vec<E> {
        self.try_to_elems()
            .unwrap_or_else(|e| panic!("Bytes::to_elems: {e}"))
    }

    /// A copy of the bytes as a vector of elements, or [`LayoutError::NotWholeElements`] when
    /// the length is not a multiple of the element size.
    pub fn try_to_elems<E: Elem>(&self) -> Result<Vec<E>, LayoutError> {
        let size = core::mem::size_of::<E>();
        let bytes: &[u8] = self.as_ref();
        if size == 0 || !bytes.len().is_multiple_of(size) {
            return Err(LayoutError::NotWholeElements {
                len: bytes.len() as u64,
                elem_size: size,
            });
        }
        Ok(bytemuck::pod_collect_to_vec(bytes))
    }

    /// The bytes viewed as elements, if aligned and of a fitting length.
    pub fn as_elems<E: Elem>(&self) -> Option<&[E]> {
        bytemuck::try_cast_slice(self.as_ref()).ok()
    }
}

fn read_file_range(path: &std::path::Path, offset: u64, len: usize) -> Result<Bytes, ServerError> {
    use std::io::{Read, Seek, SeekFrom};
    let io_err = |e: std::io::Error| ServerError::FileRead {
        path: path.display().to_string(),
        offset,
        len,
        message: e.to_string(),
    };
    let mut file = std::fs::File::open(path).map_err(io_err)?;
    file.seek(SeekFrom::Start(offset)).map_err(io_err)?;
    let mut buf = AlignedBuf::zeroed(len);
    file.read_exact(buf.as_mut_slice()).map_err(io_err)?;
    Ok(Bytes::from_aligned(buf))
}

impl core::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self.try_as_slice() {
            Ok(slice) => slice,
            Err(e) => panic!("deferred read of {} bytes failed: {e}", self.len()),
        }
    }
}

impl core::ops::DerefMut for Bytes {
    /// Writable bytes: performs a deferred read, and copies bytes shared with a clone or a
    /// `bytes::Bytes` first (copy-on-write), so that a write never shows through another owner.
    fn deref_mut(&mut self) -> &mut [u8] {
        if let Err(e) = self.materialize() {
            panic!("deferred read failed: {e}");
        }
        self.make_unique();
        match &mut self.repr {
            Repr::Owned(buf) => match Arc::get_mut(buf) {
                Some(buf) => buf.as_mut_slice(),
                None => unreachable!("made unique just above"),
            },
            Repr::Host(buf) => match Arc::get_mut(buf) {
                Some(buf) => buf.as_bytes_mut(),
                None => unreachable!("made unique just above"),
            },
            Repr::Shared(_) | Repr::Deferred(_) => unreachable!("made unique just above"),
        }
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(value: Vec<u8>) -> Self {
        Bytes::from_vec(value)
    }
}

impl From<bytes::Bytes> for Bytes {
    /// Keeps the buffer, without copying.
    fn from(value: bytes::Bytes) -> Self {
        Bytes::from_shared(value)
    }
}

impl From<bytes::BytesMut> for Bytes {
    /// Keeps the buffer, without copying.
    fn from(value: bytes::BytesMut) -> Self {
        Bytes::from_shared(value.freeze())
    }
}

impl From<Bytes> for bytes::Bytes {
    /// Hands the buffer over without copying (see [`Bytes::try_into_shared`]).
    ///
    /// # Panics
    /// If the bytes are deferred and their read fails, like dereferencing them.
    fn from(value: Bytes) -> Self {
        value
            .try_into_shared()
            .unwrap_or_else(|e| panic!("deferred read failed: {e}"))
    }
}

impl From<&[u8]> for Bytes {
    fn from(value: &[u8]) -> Self {
        Bytes::from_slice(value)
    }
}

impl core::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Bytes")
            .field("len", &self.len())
            .field("kind", &self.kind())
            .field("materialized", &self.is_materialized())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn kept(len: usize) -> usize {
        RECYCLED
            .lock()
            .free
            .iter()
            .filter(|&&(_, l)| l == len)
            .count()
    }

    #[test]
    fn large_copies_reuse_dropped_buffers_within_bounds() {
        // A length no other test uses (the cache is process-wide).
        let len = (3 << 20) + 7 * 4096 + 64;
        let src: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        let first = AlignedBuf::copy_from_parallel(&src);
        let addr = first.as_slice().as_ptr() as usize;
        assert_eq!(first.as_slice(), &src[..]);
        drop(first);
        assert_eq!(kept(len), 1, "a dropped large buffer is kept");
        let other: Vec<u8> = src.iter().map(|b| b.wrapping_add(1)).collect();
        let second = AlignedBuf::copy_from(&other);
        assert_eq!(
            second.as_slice().as_ptr() as usize,
            addr,
            "the kept buffer is reused"
        );
        assert_eq!(second.as_slice(), &other[..], "and fully overwritten");
        assert_eq!(kept(len), 0);
        drop(second);
        // Small buffers are not kept, and the cache stays within its bounds.
        let small = AlignedBuf::copy_from(&src[..4096]);
        drop(small);
        assert_eq!(kept(4096), 0);
        let many: Vec<AlignedBuf> = (0..RECYCLE_MAX_BUFFERS + 3)
            .map(|_| AlignedBuf::copy_from(&src))
            .collect();
        drop(many);
        {
            let cache = RECYCLED.lock();
            assert!(cache.free.len() <= RECYCLE_MAX_BUFFERS);
            assert!(cache.bytes <= RECYCLE_MAX_BYTES);
            assert_eq!(
                cache.bytes,
                cache.free.iter().map(|&(_, l)| l).sum::<usize>()
            );
        }
        assert!(kept(len) >= 1);
        trim_host_cache();
        assert_eq!(kept(len), 0, "trim returns kept buffers");
        // Zeroed buffers never come from the cache.
        drop(AlignedBuf::copy_from(&src));
        let zeroed = AlignedBuf::zeroed(len);
        assert!(zeroed.as_slice().iter().all(|&b| b == 0));
    }

    #[test]
    fn owned_bytes_are_aligned_and_exact() {
        let b = Bytes::from_slice(&[1, 2, 3, 4, 5]);
        assert_eq!(&*b, &[1, 2, 3, 4, 5]);
        assert_eq!(b.as_ptr() as usize % HOST_ALIGNMENT, 0);
        assert_eq!(b.kind(), BytesKind::Owned);
    }

    #[test]
    fn parallel_copies_are_exact() {
        // Sizes around the 4 MiB piece: one piece, several, a ragged last one.
        for len in [0usize, 17, (4 << 20) - 1, 8 << 20, (12 << 20) + 13] {
            let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let b = Bytes::from_slice_parallel(&src);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % HOST_ALIGNMENT, 0);
            assert!(*b == src[..], "from_slice_parallel of {len} bytes differs");
            let mut dst = vec![0u8; len];
            parallel_copy(&mut dst, &src);
            assert!(dst == src, "parallel_copy of {len} bytes differs");
        }
    }

    #[test]
    fn elems_round_trip_without_copy() {
        let b = Bytes::from_elems(vec![1.5f32, -2.0, 3.25]);
        assert_eq!(b.len(), 12);
        assert_eq!(b.as_elems::<f32>().unwrap(), &[1.5, -2.0, 3.25]);
        assert_eq!(b.to_elems::<f32>(), vec![1.5, -2.0, 3.25]);
    }

    #[test]
    fn lazy_runs_once_on_first_access() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let b = Bytes::lazy(3, move || {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(Bytes::from_slice(&[7, 8, 9]))
        });
        assert_eq!(b.len(), 3);
        assert!(!b.is_materialized());
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert_eq!(&*b, &[7, 8, 9]);
        assert_eq!(&*b, &[7, 8, 9]);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn lazy_error_is_returned_by_try() {
        let b = Bytes::lazy(2, || Err(ServerError::Driver("gone".into())));
        assert_eq!(b.try_as_slice(), Err(ServerError::Driver("gone".into())));
        let wrong = Bytes::lazy(4, || Ok(Bytes::from_slice(&[1])));
        assert!(matches!(wrong.try_as_slice(), Err(ServerError::Driver(_))));
    }

    #[test]
    fn file_bytes_read_the_range() {
        let path = std::env::temp_dir().join(format!("compute-bytes-{}", std::process::id()));
        std::fs::write(&path, [0u8, 1, 2, 3, 4, 5, 6, 7]).unwrap();
        let mut b = Bytes::from_file(&path, 2, 4);
        assert_eq!(b.kind(), BytesKind::File);
        b.materialize().unwrap();
        assert_eq!(b.kind(), BytesKind::Owned);
        assert_eq!(&*b, &[2, 3, 4, 5]);
        let missing = Bytes::from_file(path.join("nope"), 0, 1);
        assert!(matches!(
            missing.try_as_slice(),
            Err(ServerError::FileRead {
                offset: 0,
                len: 1,
                ..
            })
        ));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn deref_mut_materializes() {
        let mut b = Bytes::lazy(2, || Ok(Bytes::from_slice(&[1, 2])));
        b[0] = 9;
        assert_eq!(&*b, &[9, 2]);
    }

    #[test]
    fn to_elems_never_pads_or_drops() {
        let three = Bytes::from_slice(&[1, 2, 3]);
        assert_eq!(
            three.try_to_elems::<f64>(),
            Err(LayoutError::NotWholeElements {
                len: 3,
                elem_size: 8
            })
        );
        let six = Bytes::from_slice(&[0; 6]);
        assert!(matches!(
            six.try_to_elems::<f32>(),
            Err(LayoutError::NotWholeElements {
                len: 6,
                elem_size: 4
            })
        ));
        assert_eq!(
            Bytes::from_elem_slice(&[1.5f32, 2.5]).try_to_elems::<f32>(),
            Ok(vec![1.5, 2.5])
        );
        let panicked =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| six.to_elems::<f32>()));
        assert!(panicked.is_err(), "to_elems of 6 bytes as f32 panics");
    }

    #[test]
    fn from_bytes_crate_keeps_the_buffer() {
        let shared = bytes::Bytes::from(vec![1u8, 2, 3, 4, 5]);
        let ptr = shared.as_ptr();
        let ours = Bytes::from(shared.clone());
        assert_eq!(ours.as_ptr(), ptr, "no copy into our Bytes");
        assert_eq!(&ours[..], &[1, 2, 3, 4, 5]);
        assert_eq!(ours.kind(), BytesKind::Owned);
        // And back: the same buffer again.
        let back = bytes::Bytes::from(ours);
        assert_eq!(back.as_ptr(), ptr);
        assert_eq!(back, shared);
        // A BytesMut is kept too.
        let mut m = bytes::BytesMut::with_capacity(8);
        m.extend_from_slice(&[9, 8, 7]);
        let mptr = m.as_ptr();
        let ours = Bytes::from(m);
        assert_eq!(ours.as_ptr(), mptr);
        assert_eq!(&ours[..], &[9, 8, 7]);
    }

    #[test]
    fn into_bytes_crate_hands_over_every_representation() {
        let owned = Bytes::from_slice(&[7u8; 100]);
        let ptr = owned.as_ptr();
        let keep = owned.clone();
        let shared = bytes::Bytes::from(owned);
        assert_eq!(shared.as_ptr(), ptr, "aligned buffer handed over");
        drop(keep);
        assert_eq!(
            &shared[..],
            &[7u8; 100][..],
            "the bytes::Bytes keeps it alive"
        );

        let vec = Bytes::from_elems(vec![1u32, 2, 3]);
        let ptr = vec.as_ptr();
        let shared = bytes::Bytes::from(vec);
        assert_eq!(shared.as_ptr(), ptr, "Vec handed over");
        assert_eq!(&shared[..4], &1u32.to_ne_bytes());

        let lazy = Bytes::lazy(3, || Ok(Bytes::from_slice(&[4, 5, 6])));
        assert_eq!(&bytes::Bytes::from(lazy)[..], &[4, 5, 6]);
        let failing = Bytes::lazy(3, || Err(ServerError::Driver("gone".into())));
        assert!(matches!(
            failing.try_into_shared(),
            Err(ServerError::Driver(_))
        ));
    }

    #[test]
    fn clone_shares_and_outlives_the_original() {
        let original = Bytes::from_slice(&(0..=255u8).collect::<Vec<_>>());
        let ptr = original.as_ptr();
        let mut clone = original.clone();
        assert_eq!(clone.as_ptr(), ptr, "a clone of an owned buffer shares it");
        drop(original);
        assert!(!clone.is_shared());
        assert_eq!(clone.to_vec(), (0..=255u8).collect::<Vec<_>>());
        // Unique now: a write does not copy.
        clone[0] = 42;
        assert_eq!(clone.as_ptr(), ptr);

        // Copy-on-write when shared: the other owner keeps its bytes.
        let mut a = Bytes::from_elems(vec![1u16, 2, 3]);
        let b = a.clone();
        assert!(a.is_shared());
        a[0] = 0xff;
        assert_ne!(a.as_ptr(), b.as_ptr());
        assert_eq!(b.to_elems::<u16>(), vec![1, 2, 3]);
        assert_eq!(a[0], 0xff);

        // A shared bytes::Bytes is copied on write, a unique one is taken over.
        let source = bytes::Bytes::from(vec![5u8; 16]);
        let mut ours = Bytes::from(source.clone());
        ours[0] = 1;
        assert_eq!(source[0], 5);
        let unique = bytes::Bytes::from(vec![6u8; 16]);
        let uptr = unique.as_ptr();
        let mut ours = Bytes::from(unique);
        ours[1] = 2;
        assert_eq!(
            ours.as_ptr(),
            uptr,
            "the last reference is taken over without a copy"
        );
        assert_eq!(&ours[..3], &[6, 2, 6]);
    }

    #[test]
    fn lazy_clones_share_one_read() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let lazy = Bytes::lazy(4, move || {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(Bytes::from_slice(&[1, 2, 3, 4]))
        });
        let mut clone = lazy.clone();
        drop(lazy);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        let other = clone.clone();
        assert_eq!(&other[..], &[1, 2, 3, 4]);
        clone.materialize().unwrap();
        assert_eq!(&clone[..], &[1, 2, 3, 4]);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the read ran once for all clones"
        );
        assert_eq!(clone.as_ptr(), other.as_ptr(), "and its result is shared");
    }
}
