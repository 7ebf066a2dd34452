//! The memory manager of one stream: routing requests to pools, out-of-memory recovery, usage.

use core::fmt;

use crate::error::ServerError;
use crate::storage::{ComputeStorage, StorageHandle};

use super::exclusive::{ExclusivePool, Reuse};
use super::pool::{AllocError, Pool, Release};
use super::sliced::SlicedPool;
use super::{
    DETACHED_TAG, IMPLICIT_TAG, MemoryAllocationMode, MemoryDeviceProperties, MemoryPoolsConfig,
    MemoryUsage, PERSISTENT_TAG, PoolConfigError, PoolKind, PoolSpec, SliceHandle, SliceId,
};

/// The pool a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// A configured dynamic pool, by index.
    Dynamic(usize),
    /// The implicit exclusive pool, for requests larger than every configured pool.
    Implicit,
    /// The persistent pool.
    Persistent,
}

type DynPool<S> = Box<dyn Pool<S> + Send + Sync>;

/// Memory management of one stream: pools of slices over one [`ComputeStorage`].
///
/// In [`MemoryAllocationMode::Auto`] a request of `size` bytes goes to the first configured pool
/// that serves that size, or, when it is larger than all of them, to an implicit exclusive pool
/// (its free blocks are only released by an explicit cleanup). In
/// [`MemoryAllocationMode::Persistent`] every request goes to the persistent pool, which gives
/// each slice a block of exactly its (aligned) size and reuses free blocks of exactly that size.
///
/// Slice offsets are aligned to the larger of the storage's and the device's alignment; sizes are
/// rounded up to it (a zero-size request takes one alignment unit).
pub struct MemoryManagement<S: ComputeStorage> {
    storage: S,
    props: MemoryDeviceProperties,
    alignment: u64,
    pools: Vec<DynPool<S>>,
    implicit: ExclusivePool,
    persistent: ExclusivePool,
    mode: MemoryAllocationMode,
}

impl<S: ComputeStorage> fmt::Debug for MemoryManagement<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryManagement")
            .field("props", &self.props)
            .field("alignment", &self.alignment)
            .field("pools", &self.pools.len())
            .field("mode", &self.mode)
            .field("usage", &self.memory_usage())
            .finish_non_exhaustive()
    }
}

/// Build the dynamic pools of a validated layout.
fn build_pools<S: ComputeStorage>(specs: &[PoolSpec]) -> Vec<DynPool<S>> {
    specs
        .iter()
        .enumerate()
        .map(|(index, spec)| -> DynPool<S> {
            let tag = index as u8;
            match spec.kind {
                PoolKind::Sliced {
                    page_size,
                    max_slice_size,
                } => Box::new(SlicedPool::new(
                    tag,
                    page_size,
                    max_slice_size,
                    spec.cap,
                    spec.dealloc_period,
                )),
                PoolKind::Exclusive { max_alloc_size } => Box::new(ExclusivePool::new(
                    tag,
                    "exclusive pool",
                    max_alloc_size,
                    spec.cap,
                    spec.dealloc_period,
                    Reuse::UpToTwice,
                )),
            }
        })
        .collect()
}

fn implicit_pool() -> ExclusivePool {
    ExclusivePool::new(
        IMPLICIT_TAG,
        "implicit exclusive pool",
        u64::MAX,
        None,
        None,
        Reuse::UpToTwice,
    )
}

impl<S: ComputeStorage> MemoryManagement<S> {
    /// A manager over `storage` with the pools of `config`.
    ///
    /// # Errors
    /// The layout's [`PoolConfigError`] when it is invalid on a device with these limits.
    pub fn new(
        storage: S,
        config: &MemoryPoolsConfig,
        props: MemoryDeviceProperties,
    ) -> Result<Self, PoolConfigError> {
        let specs = config.resolve(&props)?;
        let alignment = storage.alignment().max(props.alignment).max(1);
        Ok(MemoryManagement {
            storage,
            props,
            alignment,
            pools: build_pools(&specs),
            implicit: implicit_pool(),
            persistent: ExclusivePool::new(
                PERSISTENT_TAG,
                "persistent pool",
                u64::MAX,
                None,
                None,
                Reuse::Exact,
            ),
            mode: MemoryAllocationMode::Auto,
        })
    }

    /// The pool of `target`, and the storage.
    fn split(&mut self, target: Target) -> (&mut dyn Pool<S>, &mut S) {
        let pool: &mut dyn Pool<S> = match target {
            Target::Dynamic(index) => &mut *self.pools[index],
            Target::Implicit => &mut self.implicit,
            Target::Persistent => &mut self.persistent,
        };
        (pool, &mut self.storage)
    }

    /// The size a request occupies: rounded up to the alignment, at least one alignment unit.
    fn padded(&self, size: u64) -> Option<u64> {
        size.max(1).checked_next_multiple_of(self.alignment)
    }

    /// Which pool serves a request of `size` bytes, and its padded size.
    fn route(&self, size: u64) -> Result<(Target, u64), ServerError> {
        // The largest request whose padded size still fits one page (backends report an
        // aligned `max_page_size`, so this is `max_page_size` itself).
        let max = self.props.max_page_size / self.alignment * self.alignment;
        let too_large = || ServerError::BufferTooLarge {
            requested: size,
            maximum: max,
        };
        let padded = self.padded(size).ok_or_else(too_large)?;
        if padded > max {
            return Err(too_large());
        }
        if self.mode == MemoryAllocationMode::Persistent {
            return Ok((Target::Persistent, padded));
        }
        let target = self
            .pools
            .iter()
            .position(|pool| pool.accepts(size, padded))
            .map_or(Target::Implicit, Target::Dynamic);
        Ok((target, padded))
    }

    /// Reserve a slice of `size` bytes, in the current allocation mode.
    ///
    /// Reuses free memory of the chosen pool first; only when none fits does it ask the storage
    /// for a block. When the storage refuses (or the pool's cap is reached), every free page and
    /// block is released and the request retried once. A zero-size request gives a valid handle
    /// whose range is empty.
    ///
    /// # Errors
    /// [`ServerError::BufferTooLarge`] when the request is larger than the device's
    /// `max_page_size` (rounded down to the alignment), [`ServerError::OutOfMemory`] when the
    /// retry failed too; the manager stays usable.
    pub fn reserve(&mut self, size: u64) -> Result<SliceHandle, ServerError> {
        let (target, padded) = self.route(size)?;
        let (pool, storage) = self.split(target);
        let first = match pool.try_reserve(size, padded) {
            Some(handle) => Ok(handle),
            None => pool.alloc(storage, size, padded),
        };
        let result = match first {
            Ok(handle) => Ok(handle),
            Err(_) => {
                self.cleanup(true);
                let (pool, storage) = self.split(target);
                match pool.try_reserve(size, padded) {
                    Some(handle) => Ok(handle),
                    None => pool.alloc(storage, size, padded),
                }
            }
        };
        let (pool, storage) = self.split(target);
        match result {
            Ok(handle) => {
                pool.after_reserve(storage);
                Ok(handle)
            }
            Err(error) => Err(ServerError::OutOfMemory {
                requested: size,
                reason: match error {
                    AllocError::Cap { .. } => format!(
                        "{}: {error}, even after releasing free pages",
                        pool.describe()
                    ),
                    AllocError::Storage(_) => format!(
                        "{}: {error}, even after releasing free pages and retrying",
                        pool.describe()
                    ),
                },
            }),
        }
    }

    /// [`reserve`](Self::reserve), or, while a graph capture runs on the stream (`capturing`),
    /// [`reserve_no_alloc`](Self::reserve_no_alloc) with a [`ServerError::Capture`] when the
    /// request would need a fresh driver allocation.
    pub fn reserve_for(&mut self, size: u64, capturing: bool) -> Result<SliceHandle, ServerError> {
        if !capturing {
            return self.reserve(size);
        }
        self.reserve_no_alloc(size).ok_or_else(|| {
            ServerError::from(crate::error::CaptureError::NeedsAllocation { requested: size })
        })
    }

    /// Reserve a slice like [`reserve`](Self::reserve), but only from memory already held: never
    /// calls the storage (neither to allocate nor to release).
    ///
    /// Returns `None` when the request would need a new block from the driver (or is larger than
    /// the device allows). Used during graph capture.
    pub fn reserve_no_alloc(&mut self, size: u64) -> Option<SliceHandle> {
        let (target, padded) = self.route(size).ok()?;
        let (pool, _) = self.split(target);
        pool.try_reserve(size, padded)
    }

    /// The storage range of a live slice: its block, its aligned offset, and its requested size.
    ///
    /// `None` for an unknown or free slice (and for [`SliceHandle::detached`] ones).
    pub fn get(&mut self, id: SliceId) -> Option<StorageHandle> {
        match id.tag() {
            PERSISTENT_TAG => Pool::<S>::get(&self.persistent, id),
            IMPLICIT_TAG => Pool::<S>::get(&self.implicit, id),
            DETACHED_TAG => None,
            index => self.pools.get(usize::from(index))?.get(id),
        }
    }

    /// The backend resource of the sub-range `[offset_start, size - offset_end)` of a live slice.
    pub fn get_resource(
        &mut self,
        id: SliceId,
        offset_start: u64,
        offset_end: u64,
    ) -> Option<S::Resource> {
        let handle = self.get(id)?.offset_range(offset_start, offset_end);
        self.storage.get(&handle)
    }

    /// The storage the slices live in.
    pub fn storage(&mut self) -> &mut S {
        &mut self.storage
    }

    /// Return free pages and blocks to the driver.
    ///
    /// `explicit`: every free page and block of every pool, the persistent pool included.
    /// Otherwise only what the dealloc policies allow: in the pools that have a `dealloc_period`,
    /// the pages and blocks that stayed free and unused for at least that many allocations.
    pub fn cleanup(&mut self, explicit: bool) {
        let release = if explicit {
            Release::All
        } else {
            Release::Idle
        };
        for pool in &mut self.pools {
            pool.release(&mut self.storage, release);
        }
        Pool::<S>::release(&mut self.implicit, &mut self.storage, release);
        if explicit {
            Pool::<S>::release(&mut self.persistent, &mut self.storage, Release::All);
        }
    }

    /// Live slices, their bytes, and the bytes held from the driver, over every pool.
    pub fn memory_usage(&self) -> MemoryUsage {
        self.pools
            .iter()
            .map(|pool| pool.usage())
            .chain([
                Pool::<S>::usage(&self.implicit),
                Pool::<S>::usage(&self.persistent),
            ])
            .fold(MemoryUsage::default(), MemoryUsage::combine)
    }

    /// Set the allocation mode of later reservations; returns the mode it replaces.
    pub fn mode(&mut self, mode: MemoryAllocationMode) -> MemoryAllocationMode {
        core::mem::replace(&mut self.mode, mode)
    }

    /// The allocation mode.
    pub fn current_mode(&self) -> MemoryAllocationMode {
        self.mode
    }

    /// Install a new layout of the dynamic pools.
    ///
    /// `Ok(true)`: nothing was live in the dynamic pools (the implicit one included); their free
    /// pages were released and the new pools installed. `Ok(false)`: some slice is still live, the
    /// old layout is kept. The persistent pool is never affected.
    ///
    /// # Errors
    /// The layout's [`PoolConfigError`] when it is invalid (nothing changes then).
    pub fn reconfigure(&mut self, config: &MemoryPoolsConfig) -> Result<bool, PoolConfigError> {
        let specs = config.resolve(&self.props)?;
        if self.pools.iter().any(|pool| pool.has_live()) || Pool::<S>::has_live(&self.implicit) {
            return Ok(false);
        }
        for pool in &mut self.pools {
            pool.release(&mut self.storage, Release::All);
        }
        Pool::<S>::release(&mut self.implicit, &mut self.storage, Release::All);
        self.pools = build_pools(&specs);
        self.implicit = implicit_pool();
        Ok(true)
    }

    /// Number of configured dynamic pools (the implicit and persistent pools not counted).
    pub fn pools_len(&self) -> usize {
        self.pools.len()
    }
}
