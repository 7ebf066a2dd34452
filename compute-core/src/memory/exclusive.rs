//! Exclusive pools: one storage block per slice. Also the implicit pool for requests larger than
//! every configured pool, and the persistent pool.

use std::collections::BTreeSet;

use hashbrown::HashMap;

use crate::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};

use super::pool::{AllocError, DeallocPolicy, Pool, Release, Tracked, Tracker};
use super::{MemoryUsage, SliceHandle, SliceId};

/// Which free block a request may reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reuse {
    /// The smallest free block that holds the request, if the request needs at least half of it
    /// (`padded <= block size <= 2 * padded`).
    UpToTwice,
    /// Only a free block of exactly the request's padded size (the persistent pool).
    Exact,
}

/// One block of the storage.
#[derive(Debug)]
struct Block {
    handle: StorageHandle,
    size: u64,
    /// Whether a slice (maybe not yet found free) uses the block.
    used: bool,
    /// The pool's clock when the block was last handed out or found free.
    last_used: u64,
}

/// A slice: all of a block, or its first `size` bytes.
#[derive(Debug)]
struct Slice {
    handle: SliceHandle,
    storage: StorageHandle,
    block: StorageId,
    block_size: u64,
}

impl Tracked for Slice {
    fn handle(&self) -> &SliceHandle {
        &self.handle
    }
}

/// A pool that gives each slice a block of its own.
///
/// New blocks have the request's padded size. Free blocks are kept in a set ordered by size; a
/// request takes the smallest one allowed by the pool's [`Reuse`] rule. Freed slices are found by
/// the sweeps of a [`Tracker`]; a new block is only allocated after a full sweep found none.
#[derive(Debug)]
pub(super) struct ExclusivePool {
    tag: u8,
    name: &'static str,
    max_alloc_size: u64,
    cap: Option<u64>,
    reuse: Reuse,
    policy: DeallocPolicy,
    blocks: HashMap<StorageId, Block>,
    slices: Tracker<Slice>,
    /// Free blocks as `(size, block)`.
    free: BTreeSet<(u64, StorageId)>,
    reserved: u64,
}

impl ExclusivePool {
    pub(super) fn new(
        tag: u8,
        name: &'static str,
        max_alloc_size: u64,
        cap: Option<u64>,
        dealloc_period: Option<u64>,
        reuse: Reuse,
    ) -> Self {
        ExclusivePool {
            tag,
            name,
            max_alloc_size,
            cap,
            reuse,
            policy: DeallocPolicy::new(dealloc_period),
            blocks: HashMap::new(),
            slices: Tracker::new(),
            free: BTreeSet::new(),
            reserved: 0,
        }
    }

    /// Hand out the unused block `id` for a request of `size` bytes.
    fn hand_out(&mut self, id: StorageId, size: u64) -> SliceHandle {
        let epoch = self.policy.epoch;
        let block = self
            .blocks
            .get_mut(&id)
            .unwrap_or_else(|| unreachable!("a free block belongs to the pool"));
        block.used = true;
        block.last_used = epoch;
        let storage = StorageHandle {
            id: block.handle.id,
            utilization: StorageUtilization {
                offset: block.handle.utilization.offset,
                size,
            },
        };
        let handle = SliceHandle::new(SliceId::fresh(self.tag), size);
        self.slices.insert(
            handle.id(),
            Slice {
                handle: handle.clone(),
                storage,
                block: id,
                block_size: block.size,
            },
        );
        self.policy.tick();
        handle
    }

    /// The smallest known free block the [`Reuse`] rule lets a request of `padded` bytes take.
    fn find_free(&self, padded: u64) -> Option<(u64, StorageId)> {
        let &(block_size, id) = self.free.range((padded, StorageId(0))..).next()?;
        let allowed = match self.reuse {
            Reuse::UpToTwice => block_size <= padded.saturating_mul(2),
            Reuse::Exact => block_size == padded,
        };
        allowed.then_some((block_size, id))
    }

    /// Whether some known free block may serve a request of `padded` bytes.
    fn fits(&self, padded: u64) -> bool {
        self.find_free(padded).is_some()
    }

    fn take_free(&mut self, size: u64, padded: u64) -> Option<SliceHandle> {
        let (block_size, id) = self.find_free(padded)?;
        self.free.remove(&(block_size, id));
        Some(self.hand_out(id, size))
    }

    /// Mark the blocks of freed slices free. Returns how many there were.
    fn reclaim(&mut self, freed: Vec<Slice>) -> usize {
        let epoch = self.policy.epoch;
        for slice in &freed {
            if let Some(block) = self.blocks.get_mut(&slice.block) {
                block.used = false;
                block.last_used = epoch;
                self.free.insert((block.size, slice.block));
            }
        }
        freed.len()
    }
}

impl<S: ComputeStorage> Pool<S> for ExclusivePool {
    fn describe(&self) -> String {
        if self.max_alloc_size == u64::MAX {
            self.name.to_string()
        } else {
            format!(
                "{} (allocations up to {} bytes)",
                self.name, self.max_alloc_size
            )
        }
    }

    fn accepts(&self, size: u64, _padded: u64) -> bool {
        size <= self.max_alloc_size
    }

    fn try_reserve(&mut self, size: u64, padded: u64) -> Option<SliceHandle> {
        let freed = self.slices.sweep_cheap();
        self.reclaim(freed);
        if let Some(handle) = self.take_free(size, padded) {
            return Some(handle);
        }
        let mut slices = core::mem::replace(&mut self.slices, Tracker::new());
        slices.sweep_until(|freed| {
            self.reclaim(freed);
            self.fits(padded)
        });
        self.slices = slices;
        self.take_free(size, padded)
    }

    fn alloc(
        &mut self,
        storage: &mut S,
        size: u64,
        padded: u64,
    ) -> Result<SliceHandle, AllocError> {
        if let Some(cap) = self.cap
            && self.reserved.saturating_add(padded) > cap
        {
            return Err(AllocError::Cap {
                cap,
                reserved: self.reserved,
                needed: padded,
            });
        }
        let handle = storage.alloc(padded).map_err(AllocError::Storage)?;
        self.reserved += padded;
        self.blocks.insert(
            handle.id,
            Block {
                handle,
                size: padded,
                used: false,
                last_used: self.policy.epoch,
            },
        );
        Ok(self.hand_out(handle.id, size))
    }

    fn after_reserve(&mut self, storage: &mut S) {
        if self.policy.release_due() {
            <Self as Pool<S>>::release(self, storage, Release::Idle);
        }
    }

    fn release(&mut self, storage: &mut S, release: Release) {
        let freed = self.slices.sweep_all();
        self.reclaim(freed);
        let policy = self.policy;
        let idle: Vec<StorageId> = self
            .blocks
            .iter()
            .filter(|(_, block)| !block.used && policy.releasable(release, block.last_used))
            .map(|(&id, _)| id)
            .collect();
        for id in idle {
            let Some(block) = self.blocks.remove(&id) else {
                continue;
            };
            self.free.remove(&(block.size, id));
            storage.dealloc(block.handle.id);
            self.reserved -= block.size;
        }
    }

    fn get(&self, id: SliceId) -> Option<StorageHandle> {
        self.slices.get(id).map(|slice| slice.storage)
    }

    fn usage(&self) -> MemoryUsage {
        let mut usage = MemoryUsage {
            bytes_reserved: self.reserved,
            ..MemoryUsage::default()
        };
        for slice in self.slices.live() {
            usage.number_allocs += 1;
            usage.bytes_in_use += slice.storage.size();
            usage.bytes_padding += slice.block_size - slice.storage.size();
        }
        usage
    }

    fn has_live(&self) -> bool {
        self.slices.has_live()
    }
}
