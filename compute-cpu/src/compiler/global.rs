//! Global buffers: the raw-pointer edge of the executor.
//!
//! Cubes run on several threads and a kernel may race on an element (GPU memory models allow
//! it), so no access to global memory is a plain Rust load or store: scattered accesses are
//! relaxed atomic loads or stores of one component, and contiguous runs (every unit of a cube
//! on consecutive entries, the common case) are one bulk copy in inline assembly (`rep movsb` on
//! x86-64), whose memory accesses are opaque to the compiler and so not subject to Rust's
//! data-race rules. Racing kernels read torn vectors, never undefined behaviour. Elsewhere the
//! runs fall back to per-component relaxed atomics, which compile to plain moves on AArch64.

use core::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};

use compute_core::kernel::AtomicOp;

use super::lanes::{view, view_mut};
use super::words::Word;

/// One bound buffer of a launch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GlobalMem {
    ptr: *mut u8,
    /// Entries (vectors of the buffer's width).
    len: u64,
    /// Components per entry.
    width: usize,
    /// Bytes per component.
    elem_size: usize,
}

// SAFETY: the memory is only touched through atomic operations and opaque bulk copies (see the
// module docs), and `GlobalMem::new`'s contract keeps it valid for the whole launch.
unsafe impl Send for GlobalMem {}
// SAFETY: as for `Send`: shared access is atomic or through opaque bulk copies.
unsafe impl Sync for GlobalMem {}

impl GlobalMem {
    /// # Safety
    /// `ptr` is valid for reads (and writes, for a read-write buffer) of `len * width * elem_size`
    /// bytes, aligned to `elem_size`, for as long as the value is used, and is only accessed
    /// atomically, through this module's bulk copies, or not at all by others in that time.
    pub(crate) unsafe fn new(ptr: *mut u8, len: u64, width: usize, elem_size: usize) -> Self {
        Self {
            ptr,
            len,
            width,
            elem_size,
        }
    }

    /// Start of the buffer.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Entries of the buffer.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    fn component(&self, entry: u64, comp: usize) -> *mut u8 {
        let offset = (entry as usize)
            .wrapping_mul(self.width)
            .wrapping_add(comp)
            .wrapping_mul(self.elem_size);
        self.ptr.wrapping_add(offset)
    }
}

/// A component type with a relaxed atomic load and store.
pub(crate) trait AtomicWord: Word {
    /// # Safety
    /// `p` is valid and aligned for an atomic access of `Self`.
    unsafe fn load_at(p: *mut u8) -> Self;
    /// # Safety
    /// As for `load_at`, for writes.
    unsafe fn store_at(p: *mut u8, v: Self);
}

macro_rules! atomic_word {
    ($($t:ty => $a:ty),*) => {$(
        impl AtomicWord for $t {
            #[inline(always)]
            unsafe fn load_at(p: *mut u8) -> Self {
                // SAFETY: the caller guarantees validity and alignment.
                unsafe { <$a>::from_ptr(p.cast()) }.load(Ordering::Relaxed)
            }
            #[inline(always)]
            unsafe fn store_at(p: *mut u8, v: Self) {
                // SAFETY: the caller guarantees validity and alignment.
                unsafe { <$a>::from_ptr(p.cast()) }.store(v, Ordering::Relaxed)
            }
        }
    )*};
}

atomic_word!(u8 => AtomicU8, u16 => AtomicU16, u32 => AtomicU32, u64 => AtomicU64);

/// Copy `dst.len()` components from global memory at `src` into a register.
///
/// # Safety
/// `src` is valid for reads of `dst.len()` components and aligned for `W`; other threads access
/// that memory only atomically or through these bulk copies.
#[inline(always)]
unsafe fn copy_from_global<W: AtomicWord>(src: *const u8, dst: &mut [W]) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = size_of_val(dst);
        // SAFETY: `rep movsb` reads `bytes` bytes at `src` (valid by the caller's contract) and
        // writes them to `dst`, a register we borrow mutably; it clobbers only rcx/rsi/rdi,
        // declared here, and leaves the direction flag clear as it found it.
        unsafe {
            core::arch::asm!(
                "rep movsb",
                inout("rcx") bytes => _,
                inout("rsi") src => _,
                inout("rdi") dst.as_mut_ptr() => _,
                options(nostack, preserves_flags),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (k, o) in dst.iter_mut().enumerate() {
        // SAFETY: component `k` is in the run the caller vouches for.
        *o = unsafe { W::load_at(src.wrapping_add(k * size_of::<W>()).cast_mut()) };
    }
}

/// Copy a register's components to global memory at `dst`.
///
/// # Safety
/// `dst` is valid for writes of `src.len()` components and aligned for `W`; other threads access
/// that memory only atomically or through these bulk copies.
#[inline(always)]
unsafe fn copy_to_global<W: AtomicWord>(dst: *mut u8, src: &[W]) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = size_of_val(src);
        // SAFETY: as in `copy_from_global`, reading the borrowed register and writing the
        // caller's run.
        unsafe {
            core::arch::asm!(
                "rep movsb",
                inout("rcx") bytes => _,
                inout("rsi") src.as_ptr() => _,
                inout("rdi") dst => _,
                options(nostack, preserves_flags),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (k, &v) in src.iter().enumerate() {
        // SAFETY: component `k` is in the run the caller vouches for.
        unsafe { W::store_at(dst.wrapping_add(k * size_of::<W>()), v) };
    }
}

pub(crate) type GlobalLoadFn = fn(&GlobalMem, &[u64], &mut [u64], &[u8], bool);
pub(crate) type GlobalStoreFn = fn(&GlobalMem, &[u64], &[u64], &[u8], bool);

/// The first entry when every unit is active and unit `l` addresses entry `first + l`, all in
/// range: the access is then one contiguous run of components.
fn contiguous(mem: &GlobalMem, idx: &[u64], mask: &[u8]) -> Option<u64> {
    let first = *idx.first()?;
    let last = first.checked_add(idx.len() as u64 - 1)?;
    if last >= mem.len {
        return None;
    }
    // Branch-free folds, so both scans vectorise.
    let off = idx
        .iter()
        .zip(first..)
        .fold(0u64, |acc, (&i, expect)| acc | (i ^ expect));
    (off == 0 && all_active(mask)).then_some(first)
}

pub(crate) type RunLoadFn = fn(&GlobalMem, u64, &mut [u64], usize);
pub(crate) type RunStoreFn = fn(&GlobalMem, u64, &[u64], usize);

/// Whether entries `first..first + lanes` are all in range.
pub(crate) fn run_in_range(mem: &GlobalMem, first: u64, lanes: usize) -> bool {
    first
        .checked_add(lanes as u64)
        .is_some_and(|end| end <= mem.len)
}

/// Load entries `first..first + lanes` (all in range: see [`run_in_range`]) for every unit.
pub(crate) fn load_run<W: AtomicWord>(mem: &GlobalMem, first: u64, out: &mut [u64], lanes: usize) {
    assert!(run_in_range(mem, first, lanes));
    let base = mem.component(first, 0);
    // SAFETY: entries `first..first + lanes` are in range (asserted); `GlobalMem::new`
    // guarantees validity, alignment and that others only access the buffer atomically or
    // through bulk copies.
    unsafe { copy_from_global(base, view_mut::<W>(out, lanes * mem.width)) };
}

/// Store entries `first..first + lanes` (all in range) for every unit.
pub(crate) fn store_run<W: AtomicWord>(mem: &GlobalMem, first: u64, value: &[u64], lanes: usize) {
    assert!(run_in_range(mem, first, lanes));
    let base = mem.component(first, 0);
    // SAFETY: as in `load_run`; the compiler only stores to read-write buffers.
    unsafe { copy_to_global(base, view::<W>(value, lanes * mem.width)) };
}

/// Whether every unit is active (branch-free, so it vectorises).
pub(crate) fn all_active(mask: &[u8]) -> bool {
    mask.iter().fold(1u8, |acc, &m| acc & (m != 0) as u8) == 1
}

/// Load entry `idx[l]` for each active unit `l`; out-of-range entries read 0 when `checked`.
pub(crate) fn load<W: AtomicWord>(
    mem: &GlobalMem,
    idx: &[u64],
    out: &mut [u64],
    mask: &[u8],
    checked: bool,
) {
    let w = mem.width;
    let out = view_mut::<W>(out, mask.len() * w);
    if let Some(first) = contiguous(mem, idx, mask) {
        // SAFETY: entries `first..first + lanes` are in range (checked by `contiguous`);
        // `GlobalMem::new` guarantees validity and alignment.
        unsafe { copy_from_global(mem.component(first, 0), out) };
        return;
    }
    for (l, (&m, o)) in mask.iter().zip(out.chunks_exact_mut(w)).enumerate() {
        if m == 0 {
            continue;
        }
        let i = idx[l];
        if checked && i >= mem.len {
            o.fill(W::default());
            continue;
        }
        for (c, o) in o.iter_mut().enumerate() {
            // SAFETY: in range when checked; an unchecked launch promises in-range indices.
            // `GlobalMem::new` guarantees validity and alignment of in-range components.
            *o = unsafe { W::load_at(mem.component(i, c)) };
        }
    }
}

/// Bools are stored as bytes; anything non-zero reads as `true`.
pub(crate) fn load_bool(mem: &GlobalMem, idx: &[u64], out: &mut [u64], mask: &[u8], checked: bool) {
    load::<u8>(mem, idx, out, mask, checked);
    for b in view_mut::<u8>(out, mask.len() * mem.width) {
        *b = (*b != 0) as u8;
    }
}

/// Store `value[l]` to entry `idx[l]` for each active unit; out-of-range stores are dropped
/// when `checked`.
pub(crate) fn store<W: AtomicWord>(
    mem: &GlobalMem,
    idx: &[u64],
    value: &[u64],
    mask: &[u8],
    checked: bool,
) {
    let w = mem.width;
    let value = view::<W>(value, mask.len() * w);
    if let Some(first) = contiguous(mem, idx, mask) {
        // SAFETY: as in `load`'s contiguous path; the compiler only stores to read-write
        // buffers.
        unsafe { copy_to_global(mem.component(first, 0), value) };
        return;
    }
    for (l, (&m, v)) in mask.iter().zip(value.chunks_exact(w)).enumerate() {
        let i = idx[l];
        if m == 0 || (checked && i >= mem.len) {
            continue;
        }
        for (c, &v) in v.iter().enumerate() {
            // SAFETY: as in `load`; the compiler only stores to read-write buffers.
            unsafe { W::store_at(mem.component(i, c), v) };
        }
    }
}

/// A scalar type with atomic read-modify-write operations.
pub(crate) trait AtomicNum {
    /// The register representation.
    type S: Word;
    /// Apply `op` at `p` and return the previous value.
    ///
    /// # Safety
    /// `p` is valid for atomic reads and writes of `Self::S` and aligned.
    unsafe fn rmw(p: *mut u8, op: AtomicOp, v: Self::S, cmp: Self::S) -> Self::S;
}

macro_rules! atomic_int {
    ($($t:ty => $a:ident),*) => {$(
        impl AtomicNum for $t {
            type S = $t;
            unsafe fn rmw(p: *mut u8, op: AtomicOp, v: Self, cmp: Self) -> Self {
                use core::sync::atomic::$a;
                // SAFETY: the caller guarantees validity and alignment.
                let a = unsafe { $a::from_ptr(p.cast()) };
                let o = Ordering::AcqRel;
                match op {
                    AtomicOp::Load => a.load(Ordering::Acquire),
                    AtomicOp::Store | AtomicOp::Exchange => a.swap(v, o),
                    AtomicOp::Add => a.fetch_add(v, o),
                    AtomicOp::Sub => a.fetch_sub(v, o),
                    AtomicOp::Min => a.fetch_min(v, o),
                    AtomicOp::Max => a.fetch_max(v, o),
                    AtomicOp::And => a.fetch_and(v, o),
                    AtomicOp::Or => a.fetch_or(v, o),
                    AtomicOp::Xor => a.fetch_xor(v, o),
                    AtomicOp::CompareExchange => {
                        a.compare_exchange(cmp, v, o, Ordering::Acquire).unwrap_or_else(|x| x)
                    }
                }
            }
        }
    )*};
}

atomic_int!(i32 => AtomicI32, u32 => AtomicU32, i64 => AtomicI64, u64 => AtomicU64);

/// `f32` atomics on the bits, adds through compare-exchange loops (the builder allows load,
/// store, exchange, compare-exchange and add).
pub(crate) struct F32Atomic;

impl AtomicNum for F32Atomic {
    type S = u32;
    unsafe fn rmw(p: *mut u8, op: AtomicOp, v: u32, cmp: u32) -> u32 {
        // SAFETY: the caller guarantees validity and alignment.
        let a = unsafe { AtomicU32::from_ptr(p.cast()) };
        let o = Ordering::AcqRel;
        match op {
            AtomicOp::Load => a.load(Ordering::Acquire),
            AtomicOp::Store | AtomicOp::Exchange => a.swap(v, o),
            AtomicOp::CompareExchange => a
                .compare_exchange(cmp, v, o, Ordering::Acquire)
                .unwrap_or_else(|x| x),
            _ => {
                let add = f32::from_bits(v);
                let mut cur = a.load(Ordering::Relaxed);
                loop {
                    let new = (f32::from_bits(cur) + add).to_bits();
                    match a.compare_exchange_weak(cur, new, o, Ordering::Relaxed) {
                        Ok(prev) => break prev,
                        Err(x) => cur = x,
                    }
                }
            }
        }
    }
}

/// Where an atomic operates: a global buffer, or the executor's own shared memory.
pub(crate) struct AtomicTarget {
    pub ptr: *mut u8,
    pub len: u64,
    pub checked: bool,
}

impl AtomicTarget {
    /// The target of a global buffer.
    pub(crate) fn global(mem: &GlobalMem, checked: bool) -> Self {
        Self {
            ptr: mem.ptr,
            len: mem.len,
            checked,
        }
    }
}

pub(crate) struct AtomicArgs<'a> {
    pub op: AtomicOp,
    pub idx: &'a [u64],
    pub value: &'a [u64],
    pub compare: &'a [u64],
    pub mask: &'a [u8],
}

pub(crate) type AtomicFn = unsafe fn(&AtomicTarget, &AtomicArgs<'_>, &mut [u64]);

/// Apply an atomic for each active unit, in unit order; out-of-range units read 0 (checked).
///
/// # Safety
/// `target.ptr` is valid and aligned for atomic accesses of `target.len` entries of `T::S`.
pub(crate) unsafe fn atomic<T: AtomicNum>(t: &AtomicTarget, a: &AtomicArgs<'_>, out: &mut [u64]) {
    let lanes = a.mask.len();
    let value = view::<T::S>(a.value, lanes);
    let compare = view::<T::S>(a.compare, lanes);
    let out = view_mut::<T::S>(out, lanes);
    for l in 0..lanes {
        if a.mask[l] == 0 {
            continue;
        }
        let i = a.idx[l];
        if t.checked && i >= t.len {
            out[l] = T::S::default();
            continue;
        }
        let p = t
            .ptr
            .wrapping_add((i as usize).wrapping_mul(size_of::<T::S>()));
        // SAFETY: in range (checked) or promised in range (unchecked launch); the caller
        // guarantees validity and alignment of in-range entries.
        out[l] = unsafe { T::rmw(p, a.op, value[l], compare[l]) };
    }
}
