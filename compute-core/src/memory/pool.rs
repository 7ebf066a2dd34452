//! What every pool can do, as the manager sees it.

use core::fmt;

use hashbrown::HashMap;

use crate::error::ServerError;
use crate::storage::{ComputeStorage, StorageHandle};

use super::{MemoryUsage, SliceHandle, SliceId};

/// Below this many tracked slices, no full sweep is run just because of their number.
const MIN_SWEEP: usize = 32;

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
    fn alloc(&mut self, storage: &mut S, size: u64, padded: u64)
    -> Result<SliceHandle, AllocError>;

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

/// The shortest period, in reservations, of the periodic window sweeps; each longer period is
/// [`WINDOW_GROWTH`] times the one before.
const FIRST_PERIOD: u64 = 16;

/// Ratio between the periods (and the windows) of successive window sweeps.
const WINDOW_GROWTH: u64 = 8;

/// The slices of a pool, and how the freed ones are found.
///
/// Nothing tells a pool that a handle was dropped, so freed slices are found by checking the
/// handles' reference counts. The slices are logged in the order they were handed out, and the
/// recent end of the log, where temporaries die, is checked most often:
/// - before each reservation, freed slices at the end of the log are popped (this costs one check
///   plus one per slice found). A round of work whose slices were all dropped is thus reclaimed
///   whole before the next round places anything, so a repeated round reuses the same memory;
/// - every 16 reservations the last 32 entries are checked, every 128 the last 256, and so on
///   (each level 8 times the one before): slices kept in flight a little while are found after a
///   delay proportional to their lifetime, at an amortised cost of two checks per level per
///   reservation;
/// - when no known free memory fits a request, windows of growing size are checked until a fit
///   appears, ending with the whole pool before any new block is asked for;
/// - the whole pool is also checked by a release, and when the number of tracked slices doubled
///   since the last full check.
#[derive(Debug)]
pub(super) struct Tracker<T> {
    slices: HashMap<SliceId, T>,
    /// Ids in the order they were handed out; ids no longer in `slices` are tombstones.
    log: Vec<SliceId>,
    /// Reservations attempted so far (the clock of the window sweeps).
    tick: u64,
    /// Run a full sweep before serving once this many slices are tracked.
    sweep_at: usize,
}

impl<T: Tracked> Tracker<T> {
    pub(super) fn new() -> Self {
        Tracker {
            slices: HashMap::new(),
            log: Vec::new(),
            tick: 0,
            sweep_at: MIN_SWEEP,
        }
    }

    /// Track a slice just handed out.
    pub(super) fn insert(&mut self, id: SliceId, slice: T) {
        self.slices.insert(id, slice);
        self.log.push(id);
        if self.log.len() > 2 * self.slices.len() + MIN_SWEEP {
            let slices = &self.slices;
            self.log.retain(|id| slices.contains_key(id));
        }
    }

    /// A live slice.
    pub(super) fn get(&self, id: SliceId) -> Option<&T> {
        self.slices
            .get(&id)
            .filter(|slice| !slice.handle().is_free())
    }

    /// The live slices.
    pub(super) fn live(&self) -> impl Iterator<Item = &T> {
        self.slices
            .values()
            .filter(|slice| !slice.handle().is_free())
    }

    /// Whether some slice is live.
    pub(super) fn has_live(&self) -> bool {
        self.live().next().is_some()
    }

    /// Untrack `id` if its slice is free.
    fn take_if_free(&mut self, id: SliceId, freed: &mut Vec<T>) {
        if self
            .slices
            .get(&id)
            .is_some_and(|slice| slice.handle().is_free())
        {
            freed.extend(self.slices.remove(&id));
        }
    }

    /// The sweep run before each reservation: the freed slices it found, untracked.
    pub(super) fn sweep_cheap(&mut self) -> Vec<T> {
        if self.slices.len() >= self.sweep_at {
            return self.sweep_all();
        }
        let mut freed = Vec::new();
        while let Some(&id) = self.log.last() {
            match self.slices.get(&id) {
                Some(slice) if !slice.handle().is_free() => break,
                _ => {
                    self.log.pop();
                    self.take_if_free(id, &mut freed);
                }
            }
        }
        self.tick += 1;
        let mut period = FIRST_PERIOD;
        while self.tick.is_multiple_of(period) {
            self.sweep_window(2 * period as usize, &mut freed);
            if 2 * period as usize >= self.log.len() {
                break;
            }
            period *= WINDOW_GROWTH;
        }
        freed
    }

    /// Check the last `window` entries of the log.
    fn sweep_window(&mut self, window: usize, freed: &mut Vec<T>) {
        let start = self.log.len().saturating_sub(window);
        for index in start..self.log.len() {
            let id = self.log[index];
            self.take_if_free(id, freed);
        }
    }

    /// The sweeps run when nothing known fits: check growing windows of the log, then everything,
    /// calling `fits` after each step that found something; stops as soon as it returns `true`.
    pub(super) fn sweep_until(&mut self, mut fits: impl FnMut(Vec<T>) -> bool) {
        let mut window = 4 * FIRST_PERIOD as usize;
        while window < self.log.len() {
            let mut freed = Vec::new();
            self.sweep_window(window, &mut freed);
            if !freed.is_empty() && fits(freed) {
                return;
            }
            window *= WINDOW_GROWTH as usize;
        }
        let freed = self.sweep_all();
        if !freed.is_empty() {
            fits(freed);
        }
    }

    /// Untrack and return every freed slice.
    pub(super) fn sweep_all(&mut self) -> Vec<T> {
        let freed: Vec<T> = self
            .slices
            .extract_if(|_, slice| slice.handle().is_free())
            .map(|(_, slice)| slice)
            .collect();
        let slices = &self.slices;
        self.log.retain(|id| slices.contains_key(id));
        self.sweep_at = (2 * self.slices.len()).max(MIN_SWEEP);
        freed
    }
}
