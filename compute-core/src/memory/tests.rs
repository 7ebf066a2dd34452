//! Unit tests of the memory manager over a fake storage.

use hashbrown::HashMap;

use crate::error::ServerError;
use crate::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};

use super::*;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// A storage that only does the bookkeeping, and fails on demand.
#[derive(Debug, Default)]
struct FakeStorage {
    blocks: HashMap<StorageId, u64>,
    allocs: usize,
    deallocs: usize,
    alignment: u64,
    /// Refuse blocks that would take the live total over this many bytes.
    capacity: Option<u64>,
    /// Refuse every block.
    fail_always: bool,
}

impl FakeStorage {
    fn new(alignment: u64) -> Self {
        FakeStorage {
            alignment,
            ..FakeStorage::default()
        }
    }

    fn live_bytes(&self) -> u64 {
        self.blocks.values().sum()
    }
}

impl ComputeStorage for FakeStorage {
    type Resource = StorageHandle;

    fn alignment(&self) -> u64 {
        self.alignment
    }

    fn get(&mut self, handle: &StorageHandle) -> Option<StorageHandle> {
        let size = *self.blocks.get(&handle.id)?;
        (handle.offset() + handle.size() <= size).then_some(*handle)
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, ServerError> {
        let over = self
            .capacity
            .is_some_and(|cap| self.live_bytes() + size > cap);
        if self.fail_always || over {
            return Err(ServerError::OutOfMemory {
                requested: size,
                reason: "fake storage is full".into(),
            });
        }
        let id = StorageId::new();
        self.blocks.insert(id, size);
        self.allocs += 1;
        Ok(StorageHandle {
            id,
            utilization: StorageUtilization { offset: 0, size },
        })
    }

    fn dealloc(&mut self, id: StorageId) {
        assert!(self.blocks.remove(&id).is_some(), "double free of {id:?}");
        self.deallocs += 1;
    }

    fn block_count(&self) -> usize {
        self.blocks.len()
    }
}

fn props() -> MemoryDeviceProperties {
    MemoryDeviceProperties {
        max_page_size: 64 * MIB,
        alignment: 256,
    }
}

fn sliced(page_size: u64, max_slice_size: u64) -> PoolSpec {
    PoolSpec {
        kind: PoolKind::Sliced {
            page_size,
            max_slice_size,
        },
        cap: None,
        dealloc_period: None,
    }
}

fn exclusive(max_alloc_size: u64) -> PoolSpec {
    PoolSpec {
        kind: PoolKind::Exclusive { max_alloc_size },
        cap: None,
        dealloc_period: None,
    }
}

/// Sliced 64 KiB pages up to 16 KiB, then exclusive up to 4 MiB.
fn small_layout() -> MemoryPoolsConfig {
    MemoryPoolsConfig::Explicit(vec![sliced(64 * KIB, 16 * KIB), exclusive(4 * MIB)])
}

fn manager(config: &MemoryPoolsConfig) -> MemoryManagement<FakeStorage> {
    MemoryManagement::new(FakeStorage::new(64), config, props()).expect("valid layout")
}

fn allocs(mm: &mut MemoryManagement<FakeStorage>) -> usize {
    mm.storage().allocs
}

#[test]
fn offsets_are_aligned_and_slices_share_pages() {
    let mut mm = manager(&small_layout());
    let handles: Vec<_> = (1..=8).map(|i| mm.reserve(i * 100).unwrap()).collect();
    assert_eq!(allocs(&mut mm), 1, "all eight fit in one page");
    let mut ranges = Vec::new();
    for (i, h) in handles.iter().enumerate() {
        let s = mm.get(h.id()).unwrap();
        assert_eq!(s.offset() % 256, 0);
        assert_eq!(s.size(), (i as u64 + 1) * 100);
        ranges.push((s.offset(), s.offset() + s.size()));
    }
    ranges.sort();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{ranges:?}");
    let usage = mm.memory_usage();
    assert_eq!(usage.number_allocs, 8);
    assert_eq!(usage.bytes_in_use, 3600);
    assert_eq!(usage.bytes_reserved, 64 * KIB);
    // 100..800 rounded to 256: 256, 256, 512, 512, 512, 768, 768, 1024 = 4608.
    assert_eq!(usage.bytes_padding, 4608 - 3600);
}

#[test]
fn reuse_after_free() {
    let mut mm = manager(&small_layout());
    let a = mm.reserve(1000).unwrap();
    let range = mm.get(a.id()).unwrap();
    drop(a);
    let b = mm.reserve(1000).unwrap();
    assert_eq!(allocs(&mut mm), 1);
    let range_b = mm.get(b.id()).unwrap();
    assert_eq!(range_b.id, range.id);
    let big = mm.reserve(MIB).unwrap();
    drop(big);
    let big = mm.reserve(MIB - 1000).unwrap();
    assert_eq!(allocs(&mut mm), 2, "the exclusive block is reused");
    assert_eq!(mm.memory_usage().bytes_padding, 24 + 1000);
    drop(big);
    let other = mm.reserve(MIB / 2 - 1000).unwrap();
    assert_eq!(
        allocs(&mut mm),
        3,
        "a block more than twice the request is not reused"
    );
    drop(other);
}

#[test]
fn free_neighbours_merge() {
    let mut mm = manager(&small_layout());
    let handles: Vec<_> = (0..16).map(|_| mm.reserve(4 * KIB).unwrap()).collect();
    assert_eq!(
        allocs(&mut mm),
        1,
        "sixteen 4 KiB slices fill one 64 KiB page"
    );
    drop(handles);
    let whole = mm.reserve(16 * KIB).unwrap();
    assert_eq!(allocs(&mut mm), 1, "freed slices merged into a 16 KiB run");
    assert_eq!(mm.get(whole.id()).unwrap().size(), 16 * KIB);
}

#[test]
fn steady_state_makes_no_storage_call() {
    let mut mm = manager(&MemoryPoolsConfig::default());
    let keep = mm.reserve(123).unwrap();
    let sizes = [4000, 4000, 100_000, 3 * MIB, 40 * MIB, 0];
    for _ in 0..3 {
        let live: Vec<_> = sizes.iter().map(|&s| mm.reserve(s).unwrap()).collect();
        drop(live);
    }
    let warm = allocs(&mut mm);
    let reserved = mm.memory_usage().bytes_reserved;
    for _ in 0..1000 {
        let live: Vec<_> = sizes.iter().map(|&s| mm.reserve(s).unwrap()).collect();
        drop(live);
    }
    assert_eq!(allocs(&mut mm), warm);
    assert_eq!(mm.storage().deallocs, 0);
    assert_eq!(mm.memory_usage().bytes_reserved, reserved);
    let usage = mm.memory_usage();
    assert_eq!(usage.number_allocs, 1);
    assert_eq!(usage.bytes_in_use, 123);
    drop(keep);
}

#[test]
fn steady_state_with_in_flight_copies() {
    let mut mm = manager(&MemoryPoolsConfig::default());
    let weights: Vec<_> = (0..2000)
        .map(|i| mm.reserve(64 + i % 700).unwrap())
        .collect();
    // Each step's slices stay alive (in flight) while the next step allocates.
    let mut in_flight: Vec<SliceHandle> = Vec::new();
    let mut step = |mm: &mut MemoryManagement<FakeStorage>| {
        let next: Vec<_> = [4000, 12_000, 4000, 300_000]
            .iter()
            .map(|&s| mm.reserve(s).unwrap())
            .collect();
        in_flight = next;
    };
    for _ in 0..100 {
        step(&mut mm);
    }
    let warm = allocs(&mut mm);
    for _ in 0..5000 {
        step(&mut mm);
    }
    assert_eq!(allocs(&mut mm), warm);
    assert_eq!(mm.memory_usage().number_allocs, 2004);
    drop(weights);
}

#[test]
fn cleanup_releases_free_pages() {
    let mut mm = manager(&small_layout());
    let keep = mm.reserve(100).unwrap();
    let handles: Vec<_> = (0..40)
        .map(|i| mm.reserve(1000 + i * 700).unwrap())
        .collect();
    let big = mm.reserve(2 * MIB).unwrap();
    let huge = mm.reserve(10 * MIB).unwrap();
    let full = mm.memory_usage().bytes_reserved;
    assert!(mm.storage().block_count() > 3);
    drop((handles, big, huge));
    mm.cleanup(false);
    assert_eq!(
        mm.memory_usage().bytes_reserved,
        full,
        "no dealloc period: only explicit cleanup releases"
    );
    mm.cleanup(true);
    let usage = mm.memory_usage();
    assert_eq!(
        usage.bytes_reserved,
        64 * KIB,
        "only the page of `keep` is left"
    );
    assert_eq!(mm.storage().live_bytes(), 64 * KIB);
    assert_eq!(mm.storage().block_count(), 1);
    assert_eq!(usage.number_allocs, 1);
    assert!(mm.get(keep.id()).is_some());
    drop(keep);
    mm.cleanup(true);
    assert_eq!(mm.memory_usage(), MemoryUsage::default());
    assert_eq!(mm.storage().block_count(), 0);
}

#[test]
fn dealloc_period_releases_idle_pages_only() {
    let config = MemoryPoolsConfig::Explicit(vec![PoolSpec {
        dealloc_period: Some(10),
        ..sliced(64 * KIB, 16 * KIB)
    }]);
    let mut mm = manager(&config);
    // Two pages, then free one of them.
    let a = mm.reserve(16 * KIB).unwrap();
    let first: Vec<_> = (0..3).map(|_| mm.reserve(16 * KIB).unwrap()).collect();
    let b = mm.reserve(16 * KIB).unwrap();
    assert_eq!(mm.storage().block_count(), 2);
    drop((a, first));
    // Steady use of the second page: the first stays free and idle, and is released.
    for _ in 0..30 {
        let x = mm.reserve(100).unwrap();
        drop(x);
    }
    assert_eq!(mm.storage().block_count(), 1, "the idle page was released");
    let before = allocs(&mut mm);
    for _ in 0..30 {
        let x = mm.reserve(100).unwrap();
        drop(x);
    }
    assert_eq!(allocs(&mut mm), before, "the page in use is never released");
    drop(b);
    for _ in 0..30 {
        let x = mm.reserve(100).unwrap();
        drop(x);
    }
    assert_eq!(mm.storage().block_count(), 1, "one page is enough");
    mm.cleanup(false);
    assert_eq!(
        mm.storage().block_count(),
        1,
        "used within the period: kept"
    );
}

#[test]
fn oom_cleans_up_and_retries() {
    let mut storage = FakeStorage::new(64);
    storage.capacity = Some(4 * MIB);
    let mut mm = MemoryManagement::new(storage, &small_layout(), props()).unwrap();
    let a = mm.reserve(3 * MIB).unwrap();
    drop(a);
    // 3 MiB held free by the exclusive pool; 2 MiB does not reuse it (more than twice) and the
    // storage refuses a fresh block until the free one is released.
    let b = mm.reserve(MIB + 1).unwrap();
    assert_eq!(mm.storage().deallocs, 1, "the free block was released");
    assert_eq!(mm.memory_usage().bytes_reserved, MIB + 256);
    drop(b);
}

#[test]
fn oom_is_an_error_and_the_manager_keeps_working() {
    let mut mm = manager(&small_layout());
    let keep = mm.reserve(100).unwrap();
    mm.storage().fail_always = true;
    let err = mm.reserve(MIB).unwrap_err();
    assert!(
        matches!(&err, ServerError::OutOfMemory { requested, .. } if *requested == MIB),
        "{err:?}"
    );
    assert!(mm.reserve_no_alloc(MIB).is_none());
    // Served from the page already held: no storage call needed.
    let small = mm.reserve(200).unwrap();
    mm.storage().fail_always = false;
    let big = mm.reserve(MIB).unwrap();
    assert_eq!(mm.memory_usage().number_allocs, 3);
    assert!(mm.get(keep.id()).is_some());
    drop((small, big));
}

#[test]
fn too_large_is_buffer_too_large_without_storage_call() {
    let mut mm = manager(&small_layout());
    let err = mm.reserve(1 << 60).unwrap_err();
    assert_eq!(
        err,
        ServerError::BufferTooLarge {
            requested: 1 << 60,
            maximum: 64 * MIB
        }
    );
    // The reported maximum itself allocates; one byte more is refused.
    assert_eq!(
        mm.reserve(64 * MIB + 1).unwrap_err(),
        ServerError::BufferTooLarge {
            requested: 64 * MIB + 1,
            maximum: 64 * MIB
        }
    );
    assert!(mm.reserve(u64::MAX).is_err());
    assert_eq!(allocs(&mut mm), 0);
    // Larger than every pool but within the device limit: the implicit exclusive pool.
    let h = mm.reserve(10 * MIB).unwrap();
    assert_eq!(mm.get(h.id()).unwrap().size(), 10 * MIB);
}

#[test]
fn cap_is_enforced() {
    let config = MemoryPoolsConfig::Explicit(vec![PoolSpec {
        cap: Some(128 * KIB),
        ..sliced(64 * KIB, 64 * KIB)
    }]);
    let mut mm = manager(&config);
    let a = mm.reserve(64 * KIB).unwrap();
    let b = mm.reserve(64 * KIB).unwrap();
    let err = mm.reserve(64 * KIB).unwrap_err();
    match &err {
        ServerError::OutOfMemory { reason, .. } => assert!(reason.contains("cap"), "{reason}"),
        other => panic!("{other:?}"),
    }
    drop(a);
    let c = mm.reserve(64 * KIB).unwrap();
    assert_eq!(allocs(&mut mm), 2);
    drop((b, c));
}

#[test]
fn zero_size_reservations() {
    let mut mm = manager(&small_layout());
    let a = mm.reserve(0).unwrap();
    let b = mm.reserve(0).unwrap();
    assert_ne!(a.id(), b.id());
    let ra = mm.get(a.id()).unwrap();
    let rb = mm.get(b.id()).unwrap();
    assert_eq!((ra.size(), rb.size()), (0, 0));
    assert_ne!((ra.id, ra.offset()), (rb.id, rb.offset()));
    assert!(mm.get_resource(a.id(), 0, 0).is_some());
    assert_eq!(mm.memory_usage().bytes_in_use, 0);
    assert_eq!(mm.memory_usage().number_allocs, 2);
    mm.mode(MemoryAllocationMode::Persistent);
    let p = mm.reserve(0).unwrap();
    assert_eq!(mm.get(p.id()).unwrap().size(), 0);
    let exclusive_only = MemoryPoolsConfig::Explicit(vec![exclusive(MIB)]);
    let mut mm = manager(&exclusive_only);
    let z = mm.reserve(0).unwrap();
    assert_eq!(mm.get(z.id()).unwrap().size(), 0);
}

#[test]
fn get_and_get_resource() {
    let mut mm = manager(&small_layout());
    let h = mm.reserve(1000).unwrap();
    let range = mm.get(h.id()).unwrap();
    let sub = mm.get_resource(h.id(), 100, 200).unwrap();
    assert_eq!(sub.id, range.id);
    assert_eq!(sub.offset(), range.offset() + 100);
    assert_eq!(sub.size(), 700);
    assert!(mm.get(SliceHandle::detached().id()).is_none());
    let id = h.id();
    drop(h);
    assert!(mm.get(id).is_none(), "a free slice does not resolve");
    assert!(mm.get_resource(id, 0, 0).is_none());
}

#[test]
fn handles_are_reference_counted() {
    let mut mm = manager(&small_layout());
    let h = mm.reserve(1000).unwrap();
    assert!(!h.is_free());
    let in_flight = h.clone();
    drop(h);
    assert_eq!(
        mm.memory_usage().number_allocs,
        1,
        "the in-flight copy keeps it live"
    );
    let other = mm.reserve(1000).unwrap();
    assert_ne!(
        mm.get(other.id()).unwrap().offset(),
        mm.get(in_flight.id()).unwrap().offset()
    );
    drop(in_flight);
    assert_eq!(mm.memory_usage().number_allocs, 1);
    assert!(SliceHandle::detached().is_free());
}

#[test]
fn persistent_mode_is_exact_size_and_reused() {
    let mut mm = manager(&small_layout());
    assert_eq!(mm.current_mode(), MemoryAllocationMode::Auto);
    mm.mode(MemoryAllocationMode::Persistent);
    assert_eq!(mm.current_mode(), MemoryAllocationMode::Persistent);
    let w = mm.reserve(1000).unwrap();
    let usage = mm.memory_usage();
    assert_eq!(usage.bytes_reserved, 1024, "one block of the aligned size");
    assert_eq!(usage.bytes_in_use, 1000);
    assert_eq!(usage.bytes_padding, 24);
    drop(w);
    let smaller = mm.reserve(600).unwrap();
    assert_eq!(
        allocs(&mut mm),
        2,
        "a bigger free block is not reused in persistent mode"
    );
    let again = mm.reserve(1000).unwrap();
    assert_eq!(allocs(&mut mm), 2, "the exact-size block is reused");
    assert!(mm.reserve_no_alloc(1000).is_none());
    drop(again);
    assert!(mm.reserve_no_alloc(1000).is_some());
    mm.mode(MemoryAllocationMode::Auto);
    let auto = mm.reserve(1000).unwrap();
    assert_eq!(allocs(&mut mm), 3, "auto mode uses the dynamic pools");
    drop((smaller, auto));
    mm.cleanup(false);
    assert_eq!(
        mm.storage().block_count(),
        3,
        "only explicit cleanup touches persistent blocks"
    );
    mm.cleanup(true);
    assert_eq!(mm.storage().block_count(), 0);
    assert_eq!(mm.memory_usage().bytes_reserved, 0);
}

#[test]
fn reserve_no_alloc_never_allocates() {
    let mut mm = manager(&small_layout());
    assert!(mm.reserve_no_alloc(100).is_none());
    assert!(mm.reserve_no_alloc(0).is_none());
    let a = mm.reserve(100).unwrap();
    let b = mm.reserve_no_alloc(100).expect("room left in the page");
    assert!(mm.reserve_no_alloc(2 * MIB).is_none());
    let big = mm.reserve(2 * MIB).unwrap();
    drop(big);
    let big = mm.reserve_no_alloc(2 * MIB).expect("the free block");
    assert!(mm.reserve_no_alloc(1 << 62).is_none());
    assert_eq!(allocs(&mut mm), 2);
    drop((a, b, big));
}

#[test]
fn reconfigure_rebuilds_only_when_nothing_is_live() {
    let mut mm = manager(&MemoryPoolsConfig::default());
    assert_eq!(mm.pools_len(), 3);
    let h = mm.reserve(1000).unwrap();
    assert_eq!(mm.reconfigure(&small_layout()), Ok(false));
    assert_eq!(mm.pools_len(), 3);
    assert!(mm.get(h.id()).is_some());
    assert_eq!(
        mm.reconfigure(&MemoryPoolsConfig::Explicit(vec![])),
        Err(PoolConfigError::Empty)
    );
    mm.mode(MemoryAllocationMode::Persistent);
    let weights = mm.reserve(5000).unwrap();
    mm.mode(MemoryAllocationMode::Auto);
    drop(h);
    assert_eq!(mm.reconfigure(&small_layout()), Ok(true));
    assert_eq!(mm.pools_len(), 2);
    let usage = mm.memory_usage();
    assert_eq!(
        usage.bytes_reserved, 5120,
        "dynamic pages released, persistent kept"
    );
    assert_eq!(usage.number_allocs, 1);
    assert!(mm.get(weights.id()).is_some());
    let x = mm.reserve(100).unwrap();
    assert_eq!(mm.memory_usage().bytes_reserved, 5120 + 64 * KIB);
    drop(x);
    let big = mm.reserve(10 * MIB).unwrap();
    assert_eq!(mm.reconfigure(&MemoryPoolsConfig::default()), Ok(false));
    drop(big);
    assert_eq!(mm.reconfigure(&MemoryPoolsConfig::default()), Ok(true));
    assert_eq!(mm.memory_usage().bytes_reserved, 5120);
}

#[test]
fn presets_resolve() {
    let props = MemoryDeviceProperties {
        max_page_size: 16 << 30,
        alignment: 256,
    };
    let default = MemoryPoolsConfig::default().resolve(&props).unwrap();
    assert_eq!(default.len(), 3);
    assert_eq!(
        default[0].kind,
        PoolKind::Sliced {
            page_size: 8 * MIB,
            max_slice_size: MIB
        }
    );
    assert_eq!(
        default[1].kind,
        PoolKind::Sliced {
            page_size: 128 * MIB,
            max_slice_size: 32 * MIB
        }
    );
    assert_eq!(
        default[2].kind,
        PoolKind::Exclusive {
            max_alloc_size: 16 << 30
        }
    );
    let exclusive = MemoryPoolsConfig::Preset(PoolPreset::ExclusiveOnly)
        .resolve(&props)
        .unwrap();
    assert!(
        exclusive
            .iter()
            .all(|p| matches!(p.kind, PoolKind::Exclusive { .. }))
    );
    let small = MemoryPoolsConfig::Preset(PoolPreset::SmallPages)
        .resolve(&props)
        .unwrap();
    assert_eq!(
        small[0].kind,
        PoolKind::Sliced {
            page_size: MIB,
            max_slice_size: 64 * KIB
        }
    );
    // A device with small pages: page sizes capped.
    let tiny = MemoryDeviceProperties {
        max_page_size: 4 * MIB,
        alignment: 256,
    };
    let pools = MemoryPoolsConfig::default().resolve(&tiny).unwrap();
    for pool in &pools {
        if let PoolKind::Sliced { page_size, .. } = pool.kind {
            assert!(page_size <= 4 * MIB);
        }
    }
    let mut mm =
        MemoryManagement::new(FakeStorage::new(64), &MemoryPoolsConfig::default(), tiny).unwrap();
    let h = mm.reserve(4 * MIB).unwrap();
    assert!(mm.reserve(4 * MIB + 1).is_err());
    drop(h);
}

#[test]
fn config_errors() {
    let p = props();
    let explicit = |pools: Vec<PoolSpec>| MemoryPoolsConfig::Explicit(pools).resolve(&p);
    assert_eq!(explicit(vec![]), Err(PoolConfigError::Empty));
    assert_eq!(
        explicit(vec![exclusive(MIB); MAX_POOLS + 1]),
        Err(PoolConfigError::TooManyPools {
            count: MAX_POOLS + 1,
            max: MAX_POOLS
        })
    );
    assert!(explicit(vec![exclusive(MIB); MAX_POOLS]).is_ok());
    assert_eq!(
        explicit(vec![exclusive(MIB), sliced(0, 0)]),
        Err(PoolConfigError::ZeroPageSize { pool: 1 })
    );
    assert_eq!(
        explicit(vec![sliced(1024, 4096)]),
        Err(PoolConfigError::SliceLargerThanPage {
            pool: 0,
            max_slice_size: 4096,
            page_size: 1024
        })
    );
    assert_eq!(
        explicit(vec![PoolSpec {
            cap: Some(1000),
            ..sliced(1024, 512)
        }]),
        Err(PoolConfigError::CapTooSmall {
            pool: 0,
            cap: 1000,
            required: 1024
        })
    );
    assert_eq!(
        explicit(vec![
            sliced(1024, 512),
            PoolSpec {
                cap: Some(MIB - 1),
                ..exclusive(MIB)
            }
        ]),
        Err(PoolConfigError::CapTooSmall {
            pool: 1,
            cap: MIB - 1,
            required: MIB
        })
    );
    assert_eq!(
        explicit(vec![sliced(128 * MIB, MIB)]),
        Err(PoolConfigError::PageTooLarge {
            pool: 0,
            page_size: 128 * MIB,
            max_page_size: 64 * MIB
        })
    );
    let small_device = MemoryDeviceProperties {
        max_page_size: 512 * KIB,
        alignment: 256,
    };
    let err = MemoryPoolsConfig::Preset(PoolPreset::SmallPages)
        .resolve(&small_device)
        .unwrap_err();
    assert_eq!(
        err,
        PoolConfigError::PresetUnavailable {
            preset: PoolPreset::SmallPages,
            pool: 0,
            page_size: MIB,
            max_page_size: 512 * KIB
        }
    );
    assert!(MemoryPoolsConfig::default().resolve(&small_device).is_ok());
    let no_memory = MemoryDeviceProperties {
        max_page_size: 0,
        alignment: 256,
    };
    for preset in [PoolPreset::Default, PoolPreset::ExclusiveOnly] {
        assert!(matches!(
            MemoryPoolsConfig::Preset(preset).resolve(&no_memory),
            Err(PoolConfigError::PresetUnavailable { .. })
        ));
    }
    // Messages name the pool and the numbers.
    let message = explicit(vec![exclusive(MIB), sliced(1024, 4096)])
        .unwrap_err()
        .to_string();
    assert!(message.contains("pool 1") && message.contains("4096") && message.contains("1024"));
    assert!(
        MemoryManagement::new(
            FakeStorage::new(64),
            &MemoryPoolsConfig::Explicit(vec![]),
            p
        )
        .is_err()
    );
}

#[test]
fn usage_combines_and_displays() {
    let a = MemoryUsage {
        number_allocs: 1,
        bytes_in_use: 1000,
        bytes_padding: 24,
        bytes_reserved: 2 * MIB,
    };
    let sum = a.combine(a);
    assert_eq!(
        sum,
        MemoryUsage {
            number_allocs: 2,
            bytes_in_use: 2000,
            bytes_padding: 48,
            bytes_reserved: 4 * MIB
        }
    );
    let text = sum.to_string();
    assert!(
        text.contains("2 allocations") && text.contains("4.00 MiB"),
        "{text}"
    );
    assert!(!MemoryUsage::default().to_string().is_empty());
}

#[test]
fn config_types_are_serde() {
    fn assert_serde<T: serde::Serialize + serde::de::DeserializeOwned>() {}
    assert_serde::<MemoryPoolsConfig>();
    assert_serde::<PoolSpec>();
    assert_serde::<PoolKind>();
    assert_serde::<PoolPreset>();
    assert_serde::<MemoryDeviceProperties>();
    assert_serde::<MemoryAllocationMode>();
}
