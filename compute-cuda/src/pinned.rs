//! Pinned (page-locked) host memory: staging for transfers and the memory reads return.
//!
//! Buffers come from a [`PinnedPool`] by power-of-two size class and go back to it when dropped,
//! so steady-state transfers allocate no pinned memory (`cuMemHostAlloc` costs milliseconds).
//! The pool counts what it allocated (see [`PinnedUsage`]): the free buffers it keeps, the
//! buffers the server holds, and those handed to callers.

use std::sync::Arc;

use compute_core::{HostBuffer, ServerError};
use cudarc::driver::{result, sys};

use crate::driver::{Context, Raw};

/// Smallest size class, in bytes.
const MIN_CLASS: usize = 4096;
/// Free pinned bytes the pool keeps at most; buffers beyond are returned to the driver.
const MAX_CACHED: usize = 2 << 30;

/// Who a taken [`PinnedBuffer`] belongs to, for the pool's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// The server: a staging slot, the staging of a strided write in flight, the buffer of a
    /// read whose future has not finished.
    Server,
    /// A caller: the [`Bytes`](compute_core::Bytes) a read returned, bytes `staging` moved into
    /// pinned memory, a buffer taken with [`PinnedPool::take`].
    Caller,
}

/// Pinned bytes of one pool, in whole size classes (what `cuMemHostAlloc` allocated: a 5 KiB
/// buffer counts 8 KiB), allocated and not yet freed. Every buffer is in exactly one of the
/// three.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PinnedUsage {
    /// Free buffers kept for reuse (at most [`MAX_CACHED`]).
    pub(crate) cached: u64,
    /// Buffers taken by the server ([`Holder::Server`]).
    pub(crate) held: u64,
    /// Buffers handed to callers ([`Holder::Caller`]), back in `cached` (or freed) when they
    /// drop.
    pub(crate) handed_out: u64,
}

/// The free buffers by class and the counts, under the pool's lock. Pure bookkeeping: the driver
/// calls (allocation, free) are the pool's, made outside the lock.
struct FreeLists {
    by_class: hashbrown::HashMap<usize, Vec<Raw<*mut u8>>>,
    /// Bytes of the free buffers.
    cached: usize,
    /// Bytes of the buffers taken, by holder.
    held: usize,
    handed_out: usize,
}

impl FreeLists {
    fn new() -> Self {
        Self {
            by_class: hashbrown::HashMap::new(),
            cached: 0,
            held: 0,
            handed_out: 0,
        }
    }

    fn taken(&mut self, holder: Holder) -> &mut usize {
        match holder {
            Holder::Server => &mut self.held,
            Holder::Caller => &mut self.handed_out,
        }
    }

    /// A free buffer of `class` for `holder`, if one is kept.
    fn reuse(&mut self, class: usize, holder: Holder) -> Option<Raw<*mut u8>> {
        let ptr = self.by_class.get_mut(&class).and_then(Vec::pop)?;
        self.cached -= class;
        *self.taken(holder) += class;
        Some(ptr)
    }

    /// A buffer of `class` just allocated from the driver for `holder`.
    fn allocated(&mut self, class: usize, holder: Holder) {
        *self.taken(holder) += class;
    }

    /// A buffer of `class` moves from `from` to `to`.
    fn moved(&mut self, class: usize, from: Holder, to: Holder) {
        *self.taken(from) -= class;
        *self.taken(to) += class;
    }

    /// `ptr` (of `class`, taken by `holder`) comes back: kept, after evicting free buffers of
    /// other classes to make room, unless it does not fit. Returns the buffers to free (the
    /// evicted ones, and `ptr` itself when it is not kept).
    fn give_back(&mut self, ptr: Raw<*mut u8>, class: usize, holder: Holder) -> Vec<Raw<*mut u8>> {
        *self.taken(holder) -= class;
        let mut evicted = Vec::new();
        // Make room by evicting buffers of other sizes: the one just used is the likeliest
        // to be needed again (a loop of same-size transfers must not allocate every time).
        while self.cached + class > MAX_CACHED {
            let victim = self
                .by_class
                .iter_mut()
                .filter(|(c, list)| **c != class && !list.is_empty())
                .map(|(c, list)| (*c, list))
                .next();
            let Some((victim_class, list)) = victim else {
                break;
            };
            if let Some(p) = list.pop() {
                evicted.push(p);
                self.cached -= victim_class;
            }
        }
        if self.cached + class <= MAX_CACHED {
            self.cached += class;
            self.by_class.entry(class).or_default().push(ptr);
        } else {
            evicted.push(ptr);
        }
        evicted
    }

    /// Every free buffer, now no longer counted.
    fn drain(&mut self) -> Vec<Raw<*mut u8>> {
        self.cached = 0;
        core::mem::take(&mut self.by_class)
            .into_values()
            .flatten()
            .collect()
    }

    fn usage(&self) -> PinnedUsage {
        PinnedUsage {
            cached: self.cached as u64,
            held: self.held as u64,
            handed_out: self.handed_out as u64,
        }
    }
}

/// A pool of pinned host buffers of one device's context. Each [`CudaServer`](crate::CudaServer)
/// makes its own (two servers of one device share none); the buffers it hands out keep it
/// alive, so it may outlive its server while a caller holds what a read returned.
pub struct PinnedPool {
    context: Arc<Context>,
    free: spin::Mutex<FreeLists>,
}

impl core::fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PinnedPool")
            .field("cached", &self.free.lock().cached)
            .finish()
    }
}

impl PinnedPool {
    pub(crate) fn new(context: Arc<Context>) -> Arc<Self> {
        Arc::new(Self {
            context,
            free: spin::Mutex::new(FreeLists::new()),
        })
    }

    fn class(len: usize) -> usize {
        len.max(MIN_CLASS).next_power_of_two()
    }

    /// A pinned buffer of `len` bytes (contents unspecified), the caller's: the server's
    /// [`host_memory_usage`](compute_core::ServerMemory::host_memory_usage) does not count it
    /// until it drops back into the pool.
    pub fn take(self: &Arc<Self>, len: usize) -> Result<PinnedBuffer, ServerError> {
        self.take_for(len, Holder::Caller)
    }

    /// A pinned buffer of `len` bytes the server holds (counted as its own until
    /// [`PinnedBuffer::hand_out`]).
    pub(crate) fn take_held(self: &Arc<Self>, len: usize) -> Result<PinnedBuffer, ServerError> {
        self.take_for(len, Holder::Server)
    }

    fn take_for(self: &Arc<Self>, len: usize, holder: Holder) -> Result<PinnedBuffer, ServerError> {
        let class = Self::class(len);
        let reused = self.free.lock().reuse(class, holder);
        let ptr = match reused {
            Some(ptr) => ptr,
            None => {
                self.context.bind()?;
                // SAFETY: plain allocation of `class` bytes of portable pinned memory.
                let raw = unsafe { result::malloc_host(class, sys::CU_MEMHOSTALLOC_PORTABLE) }
                    .map_err(|e| ServerError::OutOfMemory {
                        requested: class as u64,
                        reason: format!("cuMemHostAlloc: {}", crate::driver::describe(e)),
                    })?;
                self.free.lock().allocated(class, holder);
                Raw(raw.cast::<u8>())
            }
        };
        Ok(PinnedBuffer {
            ptr,
            len,
            class,
            holder,
            pool: self.clone(),
        })
    }

    fn give_back(&self, ptr: Raw<*mut u8>, class: usize, holder: Holder) {
        let freed = self.free.lock().give_back(ptr, class, holder);
        if freed.is_empty() || self.context.bind().is_err() {
            return;
        }
        for p in freed {
            // SAFETY: allocated by `take` with cuMemHostAlloc and referenced by nothing else.
            crate::driver::released("cuMemFreeHost", unsafe { result::free_host(p.0.cast()) });
        }
    }

    /// What the pool holds now, by holder.
    pub(crate) fn usage(&self) -> PinnedUsage {
        self.free.lock().usage()
    }

    /// Return every cached buffer to the driver.
    pub fn trim(&self) {
        let freed = self.free.lock().drain();
        if self.context.bind().is_err() {
            return;
        }
        for ptr in freed {
            // SAFETY: cached buffers are owned by the pool alone.
            crate::driver::released("cuMemFreeHost", unsafe { result::free_host(ptr.0.cast()) });
        }
    }
}

impl Drop for PinnedPool {
    fn drop(&mut self) {
        self.trim();
    }
}

/// A pinned host buffer; back to its pool when dropped.
pub struct PinnedBuffer {
    ptr: Raw<*mut u8>,
    len: usize,
    class: usize,
    holder: Holder,
    pool: Arc<PinnedPool>,
}

impl PinnedBuffer {
    /// Address of the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated for the buffer: its size class (at least [`len`](Self::len)).
    pub(crate) fn reserved(&self) -> usize {
        self.class
    }

    /// The buffer goes to a caller (in the `Bytes` a read returns): its pool counts it as
    /// handed out, not as the server's, from now on.
    pub(crate) fn hand_out(&mut self) {
        if self.holder == Holder::Server {
            self.pool
                .free
                .lock()
                .moved(self.class, Holder::Server, Holder::Caller);
            self.holder = Holder::Caller;
        }
    }
}

impl HostBuffer for PinnedBuffer {
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `ptr` holds at least `class >= len` bytes owned by this buffer.
        unsafe { core::slice::from_raw_parts(self.ptr.0, self.len) }
    }

    fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.0, self.len) }
    }

    fn is_pinned(&self) -> bool {
        true
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        self.pool.give_back(self.ptr, self.class, self.holder);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up address: the bookkeeping never dereferences or frees it.
    fn fake(at: usize) -> Raw<*mut u8> {
        Raw(core::ptr::without_provenance_mut(at))
    }

    fn usage(cached: usize, held: usize, handed_out: usize) -> PinnedUsage {
        PinnedUsage {
            cached: cached as u64,
            held: held as u64,
            handed_out: handed_out as u64,
        }
    }

    #[test]
    fn the_pool_counts_free_held_and_handed_out_buffers_by_class() {
        assert_eq!(PinnedPool::class(1), MIN_CLASS);
        assert_eq!(PinnedPool::class(5 << 10), 8 << 10);
        let mut free = FreeLists::new();
        assert_eq!(free.usage(), PinnedUsage::default());
        // A staging slot and a read's buffer, fresh from the driver.
        let slot = PinnedPool::class(128 << 10);
        free.allocated(slot, Holder::Server);
        let read = PinnedPool::class(5 << 10);
        free.allocated(read, Holder::Server);
        assert_eq!(free.usage(), usage(0, slot + read, 0));
        // The read's future finishes: its buffer is the caller's.
        free.moved(read, Holder::Server, Holder::Caller);
        assert_eq!(free.usage(), usage(0, slot, read));
        // The caller drops it: kept for reuse.
        assert!(
            free.give_back(fake(0x1000), read, Holder::Caller)
                .is_empty()
        );
        assert_eq!(free.usage(), usage(read, slot, 0));
        // The next read of that class reuses it; another class finds nothing.
        assert!(
            free.reuse(PinnedPool::class(4 << 10), Holder::Server)
                .is_none()
        );
        assert_eq!(
            free.reuse(read, Holder::Server).map(|p| p.0.addr()),
            Some(0x1000)
        );
        assert_eq!(free.usage(), usage(0, slot + read, 0));
        assert!(
            free.give_back(fake(0x1000), read, Holder::Server)
                .is_empty()
        );
        assert!(
            free.give_back(fake(0x2000), slot, Holder::Server)
                .is_empty()
        );
        assert_eq!(free.usage(), usage(read + slot, 0, 0));
        let freed = free.drain();
        assert_eq!(freed.len(), 2);
        assert_eq!(free.usage(), PinnedUsage::default());
    }

    #[test]
    fn buffers_beyond_the_cache_bound_are_freed_and_no_longer_counted() {
        let mut free = FreeLists::new();
        let big = MAX_CACHED / 2;
        for _ in 0..3 {
            free.allocated(big, Holder::Caller);
        }
        let small = MIN_CLASS;
        free.allocated(small, Holder::Server);
        assert!(
            free.give_back(fake(0x1000), small, Holder::Server)
                .is_empty()
        );
        assert!(
            free.give_back(fake(0x10_0000), big, Holder::Caller)
                .is_empty()
        );
        assert_eq!(free.usage(), usage(small + big, 0, 2 * big));
        // The second big buffer evicts the small one (another class) to make room for itself.
        let evicted = free.give_back(fake(0x20_0000), big, Holder::Caller);
        assert_eq!(
            evicted.iter().map(|p| p.0.addr()).collect::<Vec<_>>(),
            [0x1000]
        );
        assert_eq!(free.usage(), usage(MAX_CACHED, 0, big));
        // The third does not fit beside two of its own class: freed at once.
        let freed = free.give_back(fake(0x30_0000), big, Holder::Caller);
        assert_eq!(
            freed.iter().map(|p| p.0.addr()).collect::<Vec<_>>(),
            [0x30_0000]
        );
        assert_eq!(free.usage(), usage(MAX_CACHED, 0, 0));
    }
}
