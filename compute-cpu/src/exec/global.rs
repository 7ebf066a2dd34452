//! Global buffers: the raw-pointer edge of the executor.
//!
//! Cubes run on several threads and a kernel may race on an element (GPU memory models allow
//! it), so every access to global memory is a relaxed atomic load or store of one component:
//! racing kernels read torn vectors, never undefined behaviour. Relaxed atomics compile to plain
//! moves on x86-64 and AArch64.

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

// SAFETY: the memory is only touched through atomic operations (see the module docs), and
// `GlobalMem::new`'s contract keeps it valid for the whole launch.
unsafe impl Send for GlobalMem {}
// SAFETY: as for `Send`: shared access is atomic.
unsafe impl Sync for GlobalMem {}

impl GlobalMem {
    /// # Safety
    /// `ptr` is valid for reads (and writes, for a read-write buffer) of `len * width * elem_size`
    /// bytes, aligned to `elem_size`, for as long as the value is used, and is only accessed
    /// atomically or not at all by others in that time.
    pub(crate) unsafe fn new(ptr: *mut u8, len: u64, width: usize, elem_size: usize) -> Self {
        Self {
            ptr,
            len,
            width,
            elem_size,
        }
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

/// Hint the cache to fetch the run of `bytes` bytes after the one at `base`, which the worker's
/// next cube most likely accesses: scalar atomic accesses alone keep too few cache misses in
/// flight to saturate memory bandwidth.
#[inline(always)]
fn prefetch_next(mem: &GlobalMem, first: u64, lanes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let start = first + lanes as u64;
        let end = (start + lanes as u64).min(mem.len);
        if start >= end {
            return;
        }
        let from = mem.component(start, 0) as usize;
        let to = mem.component(end, 0) as usize;
        for line in (from & !63..to).step_by(64) {
            // SAFETY: prefetching has no side effects and never faults; `sse` is part of the
            // x86-64 baseline.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    line as *const i8,
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (mem, first, lanes);
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
    prefetch_next(mem, first, lanes);
    let base = mem.component(first, 0);
    for (k, o) in view_mut::<W>(out, lanes * mem.width).iter_mut().enumerate() {
        // SAFETY: entries `first..first + lanes` are in range (asserted); `GlobalMem::new`
        // guarantees validity and alignment.
        *o = unsafe { W::load_at(base.wrapping_add(k * size_of::<W>())) };
    }
}

/// Store entries `first..first + lanes` (all in range) for every unit.
pub(crate) fn store_run<W: AtomicWord>(mem: &GlobalMem, first: u64, value: &[u64], lanes: usize) {
    assert!(run_in_range(mem, first, lanes));
    prefetch_next(mem, first, lanes);
    let base = mem.component(first, 0);
    for (k, &v) in view::<W>(value, lanes * mem.width).iter().enumerate() {
        // SAFETY: as in `load_run`; the compiler only stores to read-write buffers.
        unsafe { W::store_at(base.wrapping_add(k * size_of::<W>()), v) };
    }
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
        prefetch_next(mem, first, mask.len());
        let base = mem.component(first, 0);
        for (k, o) in out.iter_mut().enumerate() {
            // SAFETY: entries `first..first + lanes` are in range (checked by `contiguous`);
            // `GlobalMem::new` guarantees validity and alignment.
            *o = unsafe { W::load_at(base.wrapping_add(k * size_of::<W>())) };
        }
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
        prefetch_next(mem, first, mask.len());
        let base = mem.component(first, 0);
        for (k, &v) in value.iter().enumerate() {
            // SAFETY: as in `load`'s contiguous path; the compiler only stores to read-write
            // buffers.
            unsafe { W::store_at(base.wrapping_add(k * size_of::<W>()), v) };
        }
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
