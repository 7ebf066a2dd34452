//! Pool layouts: presets, explicit lists of pools, and their validation.

use serde::{Deserialize, Serialize};

use super::MemoryDeviceProperties;

/// Most dynamic pools one layout may have.
pub const MAX_POOLS: usize = 16;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Auto-release period of the exclusive pools of the presets, in allocations.
const PRESET_EXCLUSIVE_DEALLOC_PERIOD: u64 = 1000;

/// What a pool does with the blocks it gets from the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PoolKind {
    /// Pages of `page_size` bytes, each carved into many slices of at most `max_slice_size` bytes.
    Sliced {
        /// Size of each page (one driver block), in bytes.
        page_size: u64,
        /// Largest request this pool serves, in bytes.
        max_slice_size: u64,
    },
    /// One block per slice, for requests of at most `max_alloc_size` bytes.
    ///
    /// A free block is reused by a request it can hold that needs at least half of it.
    Exclusive {
        /// Largest request this pool serves, in bytes.
        max_alloc_size: u64,
    },
}

impl PoolKind {
    /// Largest request the pool serves, in bytes.
    pub fn max_size(&self) -> u64 {
        match *self {
            PoolKind::Sliced { max_slice_size, .. } => max_slice_size,
            PoolKind::Exclusive { max_alloc_size } => max_alloc_size,
        }
    }
}

/// One dynamic pool of a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolSpec {
    /// Sliced or exclusive, and its sizes.
    pub kind: PoolKind,
    /// Most bytes this pool may hold from the driver; `None`: unbounded.
    pub cap: Option<u64>,
    /// Every this many allocations served by the pool, release its pages (or blocks) that stayed
    /// free and unused for at least that many allocations; `None`: only explicit cleanup releases
    /// them. `Some(0)` counts as `Some(1)`.
    pub dealloc_period: Option<u64>,
}

/// Ready-made pool layouts, adapted to the device's limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PoolPreset {
    /// Sliced pages of `min(max_page_size, 8 MiB)` for slices up to 1 MiB, sliced pages of
    /// `min(max_page_size, 128 MiB)` for slices up to 32 MiB, then one exclusive pool up to
    /// `max_page_size` whose idle blocks are released every 1000 allocations. Slice limits shrink
    /// to the page size on devices with small pages; a sliced pool that would serve nothing more
    /// than the one before it is left out. Unavailable only when `max_page_size` is zero.
    #[default]
    Default,
    /// One exclusive pool up to `max_page_size` (one block per allocation, nothing shared), whose
    /// idle blocks are released every 1000 allocations. Unavailable when `max_page_size` is zero.
    ExclusiveOnly,
    /// Sliced 1 MiB pages for slices up to 64 KiB, then one exclusive pool up to `max_page_size`
    /// whose idle blocks are released every 1000 allocations. Unavailable when `max_page_size` is
    /// below 1 MiB.
    SmallPages,
}

/// The layout of the dynamic pools.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemoryPoolsConfig {
    /// A ready-made layout.
    Preset(PoolPreset),
    /// Pools listed by hand. A request goes to the first pool whose largest size
    /// ([`PoolKind::max_size`]) holds it, so list them from the smallest to the largest.
    Explicit(Vec<PoolSpec>),
}

impl Default for MemoryPoolsConfig {
    fn default() -> Self {
        MemoryPoolsConfig::Preset(PoolPreset::Default)
    }
}

/// Why a pool layout is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolConfigError {
    /// The layout has no pool.
    #[error("the memory pool layout is empty: at least one pool is needed")]
    Empty,
    /// The layout has more than [`MAX_POOLS`] pools.
    #[error("the memory pool layout has {count} pools, at most {max} are allowed")]
    TooManyPools {
        /// Pools in the layout.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A sliced pool has pages of zero bytes.
    #[error("memory pool {pool}: the page size is zero")]
    ZeroPageSize {
        /// Index of the pool in the layout.
        pool: usize,
    },
    /// A sliced pool's largest slice does not fit in its page.
    #[error(
        "memory pool {pool}: the max slice size ({max_slice_size} bytes) is larger than the page size ({page_size} bytes)"
    )]
    SliceLargerThanPage {
        /// Index of the pool in the layout.
        pool: usize,
        /// The pool's largest slice.
        max_slice_size: u64,
        /// The pool's page size.
        page_size: u64,
    },
    /// A pool's cap is smaller than one page (sliced) or than its largest allocation (exclusive).
    #[error(
        "memory pool {pool}: the cap ({cap} bytes) is smaller than {required} bytes (its page size, or its max allocation size for an exclusive pool)"
    )]
    CapTooSmall {
        /// Index of the pool in the layout.
        pool: usize,
        /// The pool's cap.
        cap: u64,
        /// The smallest cap the pool can work with.
        required: u64,
    },
    /// A sliced pool's pages are larger than the device's largest block.
    #[error(
        "memory pool {pool}: the page size ({page_size} bytes) exceeds the device's max page size ({max_page_size} bytes)"
    )]
    PageTooLarge {
        /// Index of the pool in the layout.
        pool: usize,
        /// The pool's page size.
        page_size: u64,
        /// The device's largest block.
        max_page_size: u64,
    },
    /// The preset's pages do not fit the device's largest block.
    #[error(
        "memory pool preset {preset:?} is unavailable on this device: its pool {pool} needs pages of {page_size} bytes, the device's max page size is {max_page_size} bytes"
    )]
    PresetUnavailable {
        /// The preset.
        preset: PoolPreset,
        /// Index of the pool of the preset that does not fit.
        pool: usize,
        /// The page size that pool needs.
        page_size: u64,
        /// The device's largest block.
        max_page_size: u64,
    },
}

impl PoolPreset {
    /// The pools of this preset on a device with these limits.
    fn pools(self, props: &MemoryDeviceProperties) -> Result<Vec<PoolSpec>, PoolConfigError> {
        let max_page = props.max_page_size;
        let unavailable = |pool, page_size| PoolConfigError::PresetUnavailable {
            preset: self,
            pool,
            page_size,
            max_page_size: max_page,
        };
        let sliced = |page_size, max_slice_size| PoolSpec {
            kind: PoolKind::Sliced {
                page_size,
                max_slice_size,
            },
            cap: None,
            dealloc_period: None,
        };
        let exclusive = PoolSpec {
            kind: PoolKind::Exclusive {
                max_alloc_size: max_page,
            },
            cap: None,
            dealloc_period: Some(PRESET_EXCLUSIVE_DEALLOC_PERIOD),
        };
        match self {
            PoolPreset::Default => {
                if max_page == 0 {
                    return Err(unavailable(0, 1));
                }
                let mut pools: Vec<PoolSpec> = Vec::new();
                for (page, slice) in [(8 * MIB, MIB), (128 * MIB, 32 * MIB)] {
                    let page = page.min(max_page);
                    let slice = slice.min(page);
                    let covered = pools.last().map_or(0, |p| p.kind.max_size());
                    if slice > covered {
                        pools.push(sliced(page, slice));
                    }
                }
                if max_page > pools.last().map_or(0, |p| p.kind.max_size()) {
                    pools.push(exclusive);
                }
                Ok(pools)
            }
            PoolPreset::ExclusiveOnly => {
                if max_page == 0 {
                    return Err(unavailable(0, 1));
                }
                Ok(vec![exclusive])
            }
            PoolPreset::SmallPages => {
                if max_page < MIB {
                    return Err(unavailable(0, MIB));
                }
                let mut pools = vec![sliced(MIB, 64 * KIB)];
                if max_page > 64 * KIB {
                    pools.push(exclusive);
                }
                Ok(pools)
            }
        }
    }
}

/// Check an explicit list of pools against the rules and the device's limits.
fn validate(pools: &[PoolSpec], props: &MemoryDeviceProperties) -> Result<(), PoolConfigError> {
    if pools.is_empty() {
        return Err(PoolConfigError::Empty);
    }
    if pools.len() > MAX_POOLS {
        return Err(PoolConfigError::TooManyPools {
            count: pools.len(),
            max: MAX_POOLS,
        });
    }
    for (pool, spec) in pools.iter().enumerate() {
        let required = match spec.kind {
            PoolKind::Sliced {
                page_size,
                max_slice_size,
            } => {
                if page_size == 0 {
                    return Err(PoolConfigError::ZeroPageSize { pool });
                }
                if max_slice_size > page_size {
                    return Err(PoolConfigError::SliceLargerThanPage {
                        pool,
                        max_slice_size,
                        page_size,
                    });
                }
                if page_size > props.max_page_size {
                    return Err(PoolConfigError::PageTooLarge {
                        pool,
                        page_size,
                        max_page_size: props.max_page_size,
                    });
                }
                page_size
            }
            PoolKind::Exclusive { max_alloc_size } => max_alloc_size,
        };
        if let Some(cap) = spec.cap
            && cap < required
        {
            return Err(PoolConfigError::CapTooSmall {
                pool,
                cap,
                required,
            });
        }
    }
    Ok(())
}

impl MemoryPoolsConfig {
    /// The validated list of pools of this layout on a device with these limits.
    ///
    /// # Errors
    /// A [`PoolConfigError`] naming the first rule the layout breaks.
    pub fn resolve(
        &self,
        props: &MemoryDeviceProperties,
    ) -> Result<Vec<PoolSpec>, PoolConfigError> {
        let pools = match self {
            MemoryPoolsConfig::Preset(preset) => preset.pools(props)?,
            MemoryPoolsConfig::Explicit(pools) => pools.clone(),
        };
        validate(&pools, props)?;
        Ok(pools)
    }
}
