//! Memory management: carving the big blocks a [`ComputeStorage`](crate::storage::ComputeStorage)
//! gets from the driver into the slices tensors live in.
//!
//! A [`MemoryManagement`] (one per stream) owns a storage and a set of pools:
//!
//! - **sliced pools** for small and medium sizes: a page is one storage block of the pool's page
//!   size; slices are carved out of pages at aligned offsets, split on reuse and merged again when
//!   neighbours are free;
//! - **exclusive pools** for large sizes: one storage block per slice, reused by later requests of
//!   a similar size;
//! - an implicit exclusive pool for requests larger than every configured pool;
//! - a **persistent pool** of exact-size blocks, used while the allocation mode is
//!   [`MemoryAllocationMode::Persistent`] (weights, graph capture).
//!
//! A [`SliceHandle`] is reference counted. The pool keeps one copy of it; the slice is free again
//! once every other copy (user handles and the bindings held by in-flight work) is dropped. Free
//! slices are found lazily, on the next reservation, so dropping a handle costs nothing. In steady
//! state (the same sizes reserved and freed again and again) no reservation calls the driver.
//!
//! When the driver refuses a block, the manager releases every free page and block and retries
//! once; if that fails too, the reservation is a [`ServerError::OutOfMemory`](crate::ServerError),
//! never an abort.

mod config;
mod exclusive;
mod management;
mod pool;
mod sliced;
#[cfg(test)]
mod tests;

use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use config::{MAX_POOLS, MemoryPoolsConfig, PoolConfigError, PoolKind, PoolPreset, PoolSpec};
pub use management::MemoryManagement;

/// Number of low bits of a [`SliceId`] that name the pool the slice belongs to.
const TAG_BITS: u32 = 8;
/// Tag of slice ids that belong to no pool ([`SliceHandle::detached`]).
const DETACHED_TAG: u8 = 253;
/// Tag of the implicit exclusive pool (requests larger than every configured pool).
const IMPLICIT_TAG: u8 = 254;
/// Tag of the persistent pool.
const PERSISTENT_TAG: u8 = 255;

/// Identifies one slice of a pool.
///
/// Ids are unique in the process (across streams and managers), so two handles have the same id
/// exactly when they share the same slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SliceId(u64);

impl SliceId {
    /// A fresh id for a slice of the pool tagged `tag`.
    fn fresh(tag: u8) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        SliceId((n << TAG_BITS) | u64::from(tag))
    }

    /// The tag of the pool the slice belongs to.
    fn tag(self) -> u8 {
        (self.0 & ((1 << TAG_BITS) - 1)) as u8
    }

    /// The raw value of the id (for logs).
    pub fn value(self) -> u64 {
        self.0
    }
}

/// A reference-counted handle to one slice of a pool.
///
/// Every clone is a live use of the slice. The pool holds one copy; the slice returns to its pool
/// once all the others are dropped.
///
/// A slice handle also carries the size the slice was reserved with, fixed for its life, so that
/// a [`Handle`](crate::Handle) made from it can never claim more bytes than the slice holds.
#[derive(Clone, Debug)]
pub struct SliceHandle(Arc<SliceInfo>);

#[derive(Debug)]
struct SliceInfo {
    id: SliceId,
    size: u64,
}

impl SliceHandle {
    fn new(id: SliceId, size: u64) -> Self {
        SliceHandle(Arc::new(SliceInfo { id, size }))
    }

    /// A handle that refers to no memory (for allocations that failed): its size is 0.
    ///
    /// Its id is unique and never resolves: [`MemoryManagement::get`] returns `None` for it.
    pub fn detached() -> Self {
        SliceHandle::new(SliceId::fresh(DETACHED_TAG), 0)
    }

    /// A detached handle claiming `size` bytes, for unit tests of size checks.
    #[cfg(test)]
    pub(crate) fn detached_sized(size: u64) -> Self {
        SliceHandle::new(SliceId::fresh(DETACHED_TAG), size)
    }

    /// The id of the slice.
    #[inline]
    pub fn id(&self) -> SliceId {
        self.0.id
    }

    /// The size in bytes the slice was reserved with.
    #[inline]
    pub fn size(&self) -> u64 {
        self.0.size
    }

    /// Whether only one copy of this handle is left (for a pooled slice: the pool's own one, so
    /// the slice is free).
    pub fn is_free(&self) -> bool {
        Arc::strong_count(&self.0) == 1
    }
}

/// Host memory a server keeps for its transfers, outside the device pools: staging buffers of
/// writes, readback buffers of reads, pinned host pools. What a read returns belongs to the
/// caller and is not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostMemoryUsage {
    /// Bytes of host (or host-visible staging) memory the server holds, in use or kept for
    /// reuse.
    pub bytes_reserved: u64,
    /// Of those, bytes that transfers still in flight occupy.
    pub bytes_in_use: u64,
}

/// Memory figures of one manager (or, combined, of several).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryUsage {
    /// Number of live slices.
    pub number_allocs: u64,
    /// Sum of the requested sizes of the live slices, in bytes.
    pub bytes_in_use: u64,
    /// Bytes that live slices occupy beyond their requested size: alignment rounding, and for a
    /// slice of an exclusive pool the unused tail of a reused, bigger block.
    pub bytes_padding: u64,
    /// Sum of the sizes of all blocks held from the driver, in bytes.
    pub bytes_reserved: u64,
}

impl MemoryUsage {
    /// The field-wise sum of two usages.
    pub fn combine(self, other: MemoryUsage) -> MemoryUsage {
        MemoryUsage {
            number_allocs: self.number_allocs + other.number_allocs,
            bytes_in_use: self.bytes_in_use + other.bytes_in_use,
            bytes_padding: self.bytes_padding + other.bytes_padding,
            bytes_reserved: self.bytes_reserved + other.bytes_reserved,
        }
    }
}

/// `bytes` with a binary unit (`1.50 MiB`).
fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

impl fmt::Display for MemoryUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} allocation{}, {} in use, {} padding, {} reserved",
            self.number_allocs,
            if self.number_allocs == 1 { "" } else { "s" },
            format_bytes(self.bytes_in_use),
            format_bytes(self.bytes_padding),
            format_bytes(self.bytes_reserved),
        )?;
        if self.bytes_reserved > 0 {
            let used = (self.bytes_in_use + self.bytes_padding) as f64;
            write!(
                f,
                " ({:.1}% used)",
                100.0 * used / self.bytes_reserved as f64
            )?;
        }
        Ok(())
    }
}

/// Where reservations go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemoryAllocationMode {
    /// The dynamic pools, chosen by size.
    #[default]
    Auto,
    /// The persistent pool: exact-size blocks, kept until an explicit cleanup (weights, memory a
    /// captured graph uses).
    Persistent,
}

/// Memory limits of a device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemoryDeviceProperties {
    /// Biggest block the driver may give, in bytes (no page or allocation may be larger).
    pub max_page_size: u64,
    /// Alignment, in bytes, that every slice offset must have.
    pub alignment: u64,
}
