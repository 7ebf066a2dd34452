//! Sliced pools: pages carved into many slices, split on reuse and merged when freed.

use std::collections::{BTreeMap, BTreeSet};

use hashbrown::HashMap;

use crate::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};

use super::pool::{AllocError, DeallocPolicy, Pool, Release, Tracked, Tracker};
use super::{MemoryUsage, SliceHandle, SliceId};

/// One range of a page; the segments of a page cover it end to end, in offset order.
#[derive(Debug, Clone, Copy)]
struct Segment {
    size: u64,
    free: bool,
}

/// One block of the storage.
#[derive(Debug)]
struct Page {
    block: StorageHandle,
    /// Segments by offset. Two free segments are never adjacent (freeing merges them).
    segments: BTreeMap<u64, Segment>,
    /// Slices carved out of the page and not yet found free.
    used: usize,
    /// The pool's clock when the page was last carved from or found to have a slice freed.
    last_used: u64,
}

/// A slice carved out of a page.
#[derive(Debug)]
struct Slice {
    /// The pool's copy of the handle.
    handle: SliceHandle,
    /// The range handed out (requested size).
    storage: StorageHandle,
    page: StorageId,
    /// Offset of the slice's segment in the page.
    offset: u64,
    /// Size of the slice's segment.
    padded: u64,
}

impl Tracked for Slice {
    fn handle(&self) -> &SliceHandle {
        &self.handle
    }
}

/// A pool of pages of `page_size` bytes, for requests of at most `max_slice_size` bytes.
///
/// Free segments are kept in a set ordered by size, so a request takes the smallest free segment
/// that holds it (best fit, `O(log n)`), splitting off the rest as a new free segment. Slices whose
/// handles were dropped are found by the sweeps of a [`Tracker`]; a slice found free is merged
/// with its free neighbours. A new page is only allocated after a full sweep found no room.
#[derive(Debug)]
pub(super) struct SlicedPool {
    tag: u8,
    page_size: u64,
    max_slice_size: u64,
    cap: Option<u64>,
    policy: DeallocPolicy,
    pages: HashMap<StorageId, Page>,
    slices: Tracker<Slice>,
    /// Free segments as `(size, page, offset)`.
    free: BTreeSet<(u64, StorageId, u64)>,
    reserved: u64,
}

impl SlicedPool {
    pub(super) fn new(
        tag: u8,
        page_size: u64,
        max_slice_size: u64,
        cap: Option<u64>,
        dealloc_period: Option<u64>,
    ) -> Self {
        SlicedPool {
            tag,
            page_size,
            max_slice_size,
            cap,
            policy: DeallocPolicy::new(dealloc_period),
            pages: HashMap::new(),
            slices: Tracker::new(),
            free: BTreeSet::new(),
            reserved: 0,
        }
    }

    /// Carve a slice out of the free segment `(segment_size, page, offset)`, already taken out
    /// of the free set.
    fn carve(
        &mut self,
        page_id: StorageId,
        offset: u64,
        segment_size: u64,
        size: u64,
        padded: u64,
    ) -> SliceHandle {
        let epoch = self.policy.epoch;
        let page = self
            .pages
            .get_mut(&page_id)
            .unwrap_or_else(|| unreachable!("a free segment belongs to a page of the pool"));
        page.segments.insert(
            offset,
            Segment {
                size: padded,
                free: false,
            },
        );
        if segment_size > padded {
            let rest = Segment {
                size: segment_size - padded,
                free: true,
            };
            page.segments.insert(offset + padded, rest);
            self.free.insert((rest.size, page_id, offset + padded));
        }
        page.used += 1;
        page.last_used = epoch;
        let storage = StorageHandle {
            id: page.block.id,
            utilization: StorageUtilization {
                offset: page.block.utilization.offset + offset,
                size,
            },
        };
        let handle = SliceHandle::new(SliceId::fresh(self.tag), size);
        self.slices.insert(
            handle.id(),
            Slice {
                handle: handle.clone(),
                storage,
                page: page_id,
                offset,
                padded,
            },
        );
        self.policy.tick();
        handle
    }

    /// The smallest known free segment that holds `padded` bytes.
    fn find_free(&self, padded: u64) -> Option<(u64, StorageId, u64)> {
        self.free.range((padded, StorageId(0), 0)..).next().copied()
    }

    /// Whether some known free segment holds `padded` bytes.
    fn fits(&self, padded: u64) -> bool {
        self.find_free(padded).is_some()
    }

    /// Serve from the smallest known free segment that holds `padded` bytes.
    fn take_free(&mut self, size: u64, padded: u64) -> Option<SliceHandle> {
        let entry = self.find_free(padded)?;
        self.free.remove(&entry);
        let (segment_size, page, offset) = entry;
        Some(self.carve(page, offset, segment_size, size, padded))
    }

    /// Return the segments of freed slices to the free set. Returns how many there were.
    fn reclaim(&mut self, freed: Vec<Slice>) -> usize {
        for slice in &freed {
            self.free_segment(slice.page, slice.offset, slice.padded);
        }
        freed.len()
    }

    /// Mark the used segment at `offset` free, merging it with free neighbours.
    fn free_segment(&mut self, page_id: StorageId, offset: u64, size: u64) {
        let epoch = self.policy.epoch;
        let page = self
            .pages
            .get_mut(&page_id)
            .unwrap_or_else(|| unreachable!("a slice belongs to a page of the pool"));
        page.used -= 1;
        page.last_used = epoch;
        page.segments.remove(&offset);
        let mut start = offset;
        let mut len = size;
        if let Some((&before, &segment)) = page.segments.range(..offset).next_back()
            && segment.free
            && before + segment.size == offset
        {
            page.segments.remove(&before);
            self.free.remove(&(segment.size, page_id, before));
            start = before;
            len += segment.size;
        }
        if let Some(&segment) = page.segments.get(&(offset + size))
            && segment.free
        {
            page.segments.remove(&(offset + size));
            self.free.remove(&(segment.size, page_id, offset + size));
            len += segment.size;
        }
        page.segments.insert(
            start,
            Segment {
                size: len,
                free: true,
            },
        );
        self.free.insert((len, page_id, start));
    }
}

impl<S: ComputeStorage> Pool<S> for SlicedPool {
    fn describe(&self) -> String {
        format!(
            "sliced pool (pages of {} bytes, slices up to {} bytes)",
            self.page_size, self.max_slice_size
        )
    }

    fn accepts(&self, size: u64, padded: u64) -> bool {
        size <= self.max_slice_size && padded <= self.page_size
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
            && self.reserved + self.page_size > cap
        {
            return Err(AllocError::Cap {
                cap,
                reserved: self.reserved,
                needed: self.page_size,
            });
        }
        let block = storage.alloc(self.page_size).map_err(AllocError::Storage)?;
        self.reserved += self.page_size;
        let mut segments = BTreeMap::new();
        segments.insert(
            0,
            Segment {
                size: self.page_size,
                free: true,
            },
        );
        self.pages.insert(
            block.id,
            Page {
                block,
                segments,
                used: 0,
                last_used: self.policy.epoch,
            },
        );
        Ok(self.carve(block.id, 0, self.page_size, size, padded))
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
        let empty: Vec<StorageId> = self
            .pages
            .iter()
            .filter(|(_, page)| page.used == 0 && policy.releasable(release, page.last_used))
            .map(|(&id, _)| id)
            .collect();
        for id in empty {
            let Some(page) = self.pages.remove(&id) else {
                continue;
            };
            for (&offset, segment) in &page.segments {
                self.free.remove(&(segment.size, id, offset));
            }
            storage.dealloc(page.block.id);
            self.reserved -= self.page_size;
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
            usage.bytes_padding += slice.padded - slice.storage.size();
        }
        usage
    }

    fn has_live(&self) -> bool {
        self.slices.has_live()
    }
}
