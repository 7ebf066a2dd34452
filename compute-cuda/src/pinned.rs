//! Pinned (page-locked) host memory: staging for transfers and the memory reads return.
//!
//! Buffers come from a [`PinnedPool`] by power-of-two size class and go back to it when dropped,
//! so steady-state transfers allocate no pinned memory (`cuMemHostAlloc` costs milliseconds).

use std::sync::Arc;

use compute_core::{HostBuffer, ServerError};
use cudarc::driver::{result, sys};

use crate::driver::{Context, Raw};

/// Smallest size class, in bytes.
const MIN_CLASS: usize = 4096;
/// Free pinned bytes the pool keeps at most; buffers beyond are returned to the driver.
const MAX_CACHED: usize = 2 << 30;

struct FreeLists {
    by_class: hashbrown::HashMap<usize, Vec<Raw<*mut u8>>>,
    cached: usize,
}

/// A pool of pinned host buffers of one device's context.
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
            free: spin::Mutex::new(FreeLists {
                by_class: hashbrown::HashMap::new(),
                cached: 0,
            }),
        })
    }

    fn class(len: usize) -> usize {
        len.max(MIN_CLASS).next_power_of_two()
    }

    /// A pinned buffer of `len` bytes (contents unspecified).
    pub fn take(self: &Arc<Self>, len: usize) -> Result<PinnedBuffer, ServerError> {
        let class = Self::class(len);
        let reused = {
            let mut free = self.free.lock();
            let ptr = free.by_class.get_mut(&class).and_then(Vec::pop);
            if ptr.is_some() {
                free.cached -= class;
            }
            ptr
        };
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
                Raw(raw.cast::<u8>())
            }
        };
        Ok(PinnedBuffer {
            ptr,
            len,
            class,
            pool: self.clone(),
        })
    }

    fn give_back(&self, ptr: Raw<*mut u8>, class: usize) {
        let mut evicted = Vec::new();
        let keep = {
            let mut free = self.free.lock();
            // Make room by evicting buffers of other sizes: the one just used is the likeliest
            // to be needed again (a loop of same-size transfers must not allocate every time).
            while free.cached + class > MAX_CACHED {
                let victim = free
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
                    free.cached -= victim_class;
                }
            }
            if free.cached + class <= MAX_CACHED {
                free.cached += class;
                free.by_class.entry(class).or_default().push(ptr);
                true
            } else {
                false
            }
        };
        if !keep {
            evicted.push(ptr);
        }
        if evicted.is_empty() || self.context.bind().is_err() {
            return;
        }
        for p in evicted {
            // SAFETY: allocated by `take` with cuMemHostAlloc and referenced by nothing else.
            crate::driver::released("cuMemFreeHost", unsafe { result::free_host(p.0.cast()) });
        }
    }

    /// Return every cached buffer to the driver.
    pub fn trim(&self) {
        let lists = core::mem::take(&mut self.free.lock().by_class);
        self.free.lock().cached = 0;
        if self.context.bind().is_err() {
            return;
        }
        for ptr in lists.into_values().flatten() {
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
        self.pool.give_back(self.ptr, self.class);
    }
}
