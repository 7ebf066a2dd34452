//! What every pool can do, as the manager sees it.

use core::fmt;

use hashbrown::HashMap;

use crate::error::ServerError;
use crate::storage::{ComputeStorage, StorageHandle};

use super::{MemoryUsage, SliceHandle, SliceId};

/// Below this many tracked slices, no full sweep is run just because of their number.
const MIN_SWEEP: usize = 32;

/// A young generation this long is swept before the next reservation.
const YOUNG_MAX: usize = 64;

/// Which free pages (or blocks) a release returns to the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Release {
    /// Every free one.
    All,
    /// Those that stayed free and unused for the pool's dealloc period (nothing without a period).
    Idle,
}

/// Why a pool could not get a new block.
#[derive(Debug)]
pub(super) enum AllocError {
    /// The block would take the pool over its cap.
    Cap {
        /// The pool's cap.
        cap: u64,
        /// Bytes the pool holds now.
        reserved: u64,
        /// Size of the block it needs.
        needed: u64,
    },
    /// The storage refused the block.
    Storage(ServerError),
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::Cap {
                cap,
                reserved,
                needed,
            } => write!(
                f,
                "a new block of {needed} bytes would exceed the pool's cap of {cap} bytes ({reserved} bytes held)"
            ),
            AllocError::Storage(e) => write!(f, "the storage refused the block: {e}"),
        }
    }
}

/// A pool of slices, as the manager drives it.
///
/// `size` is always the requested size and `padded` the size rounded up to the manager's alignment
/// (at least one alignment unit, so a zero-size slice still owns a distinct range).
pub(super) trait Pool<S: ComputeStorage> {
    /// What the pool is, for error messages.
    fn describe(&self) -> String;

    /// Whether a request of this size belongs to this pool.
    fn accepts(&self, size: u64, padded: u64) -> bool;

    /// Serve a request from memory the pool already holds; never calls the storage.
    fn try_reserve(&mut self, size: u64, padded: u64) -> Option<SliceHandle>;

    /// Get a new block from the storage and serve the request from it.
    fn alloc(&mut self, storage: &mut S, size: u64, padded: u64) -> Result<SliceHandle, AllocError>;

    /// Called after each reservation the pool served: applies the dealloc period.
    fn after_reserve(&mut self, storage: &mut S);

    /// Return free pages (or blocks) to the storage.
    fn release(&mut self, storage: &mut S, release: Release);

    /// The storage range of a live slice of this pool.
    fn get(&self, id: SliceId) -> Option<StorageHandle>;

    /// The pool's share of the memory usage.
    fn usage(&self) -> MemoryUsage;

    /// Whether some slice of the pool is still used.
    fn has_live(&self) -> bool;
}

/// When the pool should release idle memory, and what counts as idle.
#[derive(Debug, Clone, Copy)]
pub(super) struct DeallocPolicy {
    /// The period, at least 1; `None`: only explicit releases.
    period: Option<u64>,
    /// Allocations served so far (the pool's clock).
    pub(super) epoch: u64,
    /// The clock at the last periodic release.
    last_release: u64,
}

impl DeallocPolicy {
    pub(super) fn new(period: Option<u64>) -> Self {
        DeallocPolicy {
            period: period.map(|p| p.max(1)),
            epoch: 0,
            last_release: 0,
        }
    }

    /// Count one served allocation.
    pub(super) fn tick(&mut self) {
        self.epoch += 1;
    }

    /// Whether a periodic release is due now (and mark it done).
    pub(super) fn release_due(&mut self) -> bool {
        match self.period {
            Some(period) if self.epoch - self.last_release >= period => {
                self.last_release = self.epoch;
                true
            }
            _ => false,
        }
    }

    /// Whether memory last used at clock `last_used` may be released by `release`.
    pub(super) fn releasable(&self, release: Release, last_used: u64) -> bool {
        match release {
            Release::All => true,
            Release::Idle => self
                .period
                .is_some_and(|period| self.epoch - last_used >= period),
        }
    }
}

/// A slice record that knows its pool's copy of the handle.
pub(super) trait Tracked {
    /// The pool's copy of the slice's handle.
    fn handle(&self) -> &SliceHandle;
}

/// The slices of a pool, and how the freed ones are found.
///
/// Nothing tells a pool that a handle was dropped, so freed slices are found by sweeps that check
/// the handles' reference counts. Two generations keep the sweeps cheap:
/// - the *young* slices (handed out since the last sweep) are swept when the latest of them is
///   already free (the usual case for temporaries: a round of work whose slices were all dropped
///   is reclaimed whole before the next round places anything, so a repeated round reuses the
///   same memory) or when there are [`YOUNG_MAX`] of them; amortised `O(1)` per reservation;
/// - all slices are swept when no known free memory fits a request (before any new block is
///   asked for), when a release runs, and when the number of tracked slices doubled since the
///   last full sweep.
#[derive(Debug)]
pub(super) struct Tracker<T> {
    slices: HashMap<SliceId, T>,
    young: Vec<SliceId>,
    sweep_at: usize,
}

impl<T: Tracked> Tracker<T> {
    pub(super) fn new() -> Self {
        Tracker {
            slices: HashMap::new(),
            young: Vec::new(),
            sweep_at: MIN_SWEEP,
        }
    }

    /// Track a slice just handed out.
    pub(super) fn insert(&mut self, id: SliceId, slice: T) {
        self.slices.insert(id, slice);
        self.young.push(id);
    }

    /// A live slice.
    pub(super) fn get(&self, id: SliceId) -> Option<&T> {
        self.slices.get(&id).filter(|slice| !slice.handle().is_free())
    }

    /// The live slices.
    pub(super) fn live(&self) -> impl Iterator<Item = &T> {
        self.slices.values().filter(|slice| !slice.handle().is_free())
    }

    /// Whether some slice is live.
    pub(super) fn has_live(&self) -> bool {
        self.live().next().is_some()
    }

    /// The cheap sweep run before each reservation: the freed slices it found, untracked.
    pub(super) fn sweep_cheap(&mut self) -> Vec<T> {
        if self.slices.len() >= self.sweep_at {
            return self.sweep_all();
        }
        let latest_free = self
            .young
            .last()
            .and_then(|id| self.slices.get(id))
            .is_some_and(|slice| slice.handle().is_free());
        if latest_free || self.young.len() >= YOUNG_MAX {
            return self.sweep_young();
        }
        Vec::new()
    }

    /// Untrack and return the freed young slices; the others become old.
    fn sweep_young(&mut self) -> Vec<T> {
        let mut freed = Vec::new();
        for id in self.young.drain(..) {
            if self
                .slices
                .get(&id)
                .is_some_and(|slice| slice.handle().is_free())
                && let Some(slice) = self.slices.remove(&id)
            {
                freed.push(slice);
            }
        }
        freed
    }

    /// Untrack and return every freed slice. The young generation is kept as it is (the ids
    /// swept away are skipped later), so the next young sweep still sees every slice handed out
    /// since the last one.
    pub(super) fn sweep_all(&mut self) -> Vec<T> {
        let freed: Vec<T> = self
            .slices
            .extract_if(|_, slice| slice.handle().is_free())
            .map(|(_, slice)| slice)
            .collect();
        self.sweep_at = (2 * self.slices.len()).max(MIN_SWEEP);
        freed
    }
}
