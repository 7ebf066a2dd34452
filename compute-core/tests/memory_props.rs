//! Property tests of the memory manager: random sequences of reservations, drops and cleanups
//! over a fake storage that records its blocks, checking the manager's invariants after each step.

use std::collections::HashMap;

use compute_core::ServerError;
use compute_core::memory::{
    MemoryAllocationMode, MemoryDeviceProperties, MemoryManagement, MemoryPoolsConfig, PoolKind,
    PoolPreset, PoolSpec, SliceHandle,
};
use compute_core::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use proptest::prelude::*;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;
const MAX_PAGE: u64 = 8 * MIB;

/// A storage that records its live blocks and counts calls.
#[derive(Debug, Default)]
struct RecordingStorage {
    blocks: HashMap<StorageId, u64>,
    allocs: usize,
    alignment: u64,
}

impl ComputeStorage for RecordingStorage {
    type Resource = StorageHandle;

    fn alignment(&self) -> u64 {
        self.alignment
    }

    fn get(&mut self, handle: &StorageHandle) -> Option<StorageHandle> {
        let size = *self.blocks.get(&handle.id)?;
        (handle.offset() + handle.size() <= size).then_some(*handle)
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, ServerError> {
        assert!(
            size <= MAX_PAGE,
            "a block of {size} bytes exceeds the device limit"
        );
        let id = StorageId::new();
        self.blocks.insert(id, size);
        self.allocs += 1;
        Ok(StorageHandle {
            id,
            utilization: StorageUtilization { offset: 0, size },
        })
    }

    fn dealloc(&mut self, id: StorageId) {
        assert!(
            self.blocks.remove(&id).is_some(),
            "dealloc of unknown block {id:?}"
        );
    }

    fn block_count(&self) -> usize {
        self.blocks.len()
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Reserve this many bytes.
    Reserve(u64),
    /// Reserve without allocating.
    ReserveNoAlloc(u64),
    /// Drop the live slice at this index (modulo the live count).
    Drop(usize),
    /// Drop a live slice and reserve its size again in its mode: no new block may be needed.
    DropAndReuse(usize),
    /// Run a cleanup.
    Cleanup(bool),
    /// Switch the allocation mode (`true`: persistent).
    Persistent(bool),
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0..=64u64,
        6 => 0..=5_000u64,
        4 => 0..=100_000u64,
        2 => 0..=3 * MIB,
        1 => MAX_PAGE - 1000..=MAX_PAGE + 1000,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => size().prop_map(Op::Reserve),
        2 => size().prop_map(Op::ReserveNoAlloc),
        6 => any::<usize>().prop_map(Op::Drop),
        3 => any::<usize>().prop_map(Op::DropAndReuse),
        1 => any::<bool>().prop_map(Op::Cleanup),
        1 => any::<bool>().prop_map(Op::Persistent),
    ]
}

fn sliced(page_size: u64, max_slice_size: u64, dealloc_period: Option<u64>) -> PoolSpec {
    PoolSpec {
        kind: PoolKind::Sliced {
            page_size,
            max_slice_size,
        },
        cap: None,
        dealloc_period,
    }
}

fn layouts() -> Vec<MemoryPoolsConfig> {
    vec![
        MemoryPoolsConfig::default(),
        MemoryPoolsConfig::Preset(PoolPreset::ExclusiveOnly),
        MemoryPoolsConfig::Preset(PoolPreset::SmallPages),
        MemoryPoolsConfig::Explicit(vec![
            sliced(4 * KIB, KIB, None),
            sliced(64 * KIB, 64 * KIB, Some(7)),
            PoolSpec {
                kind: PoolKind::Exclusive {
                    max_alloc_size: 512 * KIB,
                },
                cap: None,
                dealloc_period: Some(5),
            },
        ]),
        // Pages that are not a multiple of the alignment; larger requests go to the implicit pool.
        MemoryPoolsConfig::Explicit(vec![sliced(10_000, 3_000, Some(1))]),
    ]
}

/// Layouts whose pools never release on their own within a test (presets release idle blocks only
/// after 1000 allocations).
fn steady_layouts() -> Vec<MemoryPoolsConfig> {
    vec![
        MemoryPoolsConfig::default(),
        MemoryPoolsConfig::Preset(PoolPreset::ExclusiveOnly),
        MemoryPoolsConfig::Preset(PoolPreset::SmallPages),
        MemoryPoolsConfig::Explicit(vec![
            sliced(4 * KIB, KIB, None),
            sliced(64 * KIB, 64 * KIB, None),
            PoolSpec {
                kind: PoolKind::Exclusive {
                    max_alloc_size: 512 * KIB,
                },
                cap: None,
                dealloc_period: None,
            },
        ]),
        MemoryPoolsConfig::Explicit(vec![sliced(10_000, 3_000, None)]),
    ]
}

/// A slice the test holds, with what it asked for.
struct Live {
    handle: SliceHandle,
    size: u64,
    mode: MemoryAllocationMode,
}

fn check(mm: &mut MemoryManagement<RecordingStorage>, live: &[Live], alignment: u64) {
    let mut ranges: Vec<(StorageId, u64, u64)> = Vec::new();
    for slice in live {
        let handle = mm
            .get(slice.handle.id())
            .unwrap_or_else(|| panic!("live slice {:?} does not resolve", slice.handle.id()));
        assert_eq!(handle.size(), slice.size, "size of {:?}", slice.handle.id());
        assert_eq!(
            handle.offset() % alignment,
            0,
            "offset {} not aligned",
            handle.offset()
        );
        let block = *mm
            .storage()
            .blocks
            .get(&handle.id)
            .expect("a live slice lies in a live block");
        assert!(
            handle.offset() + handle.size() <= block,
            "slice outside its block"
        );
        assert!(mm.get_resource(slice.handle.id(), 0, 0).is_some());
        if handle.size() > 0 {
            ranges.push((handle.id, handle.offset(), handle.offset() + handle.size()));
        }
    }
    ranges.sort();
    for pair in ranges.windows(2) {
        if pair[0].0 == pair[1].0 {
            assert!(pair[0].2 <= pair[1].1, "overlapping slices: {pair:?}");
        }
    }
    let usage = mm.memory_usage();
    assert_eq!(usage.number_allocs, live.len() as u64);
    assert_eq!(usage.bytes_in_use, live.iter().map(|s| s.size).sum::<u64>());
    let storage_bytes: u64 = mm.storage().blocks.values().sum();
    assert_eq!(usage.bytes_reserved, storage_bytes);
    assert!(usage.bytes_reserved >= usage.bytes_in_use + usage.bytes_padding);
}

fn run(ops: Vec<Op>, layout: usize, storage_alignment: u64, device_alignment: u64) {
    let config = &layouts()[layout];
    let props = MemoryDeviceProperties {
        max_page_size: MAX_PAGE,
        alignment: device_alignment,
    };
    let storage = RecordingStorage {
        alignment: storage_alignment,
        ..RecordingStorage::default()
    };
    let alignment = storage_alignment.max(device_alignment);
    let mut mm = MemoryManagement::new(storage, config, props).expect("valid layout");
    let mut live: Vec<Live> = Vec::new();
    for op in ops {
        match op {
            Op::Reserve(size) => match mm.reserve(size) {
                Ok(handle) => live.push(Live {
                    handle,
                    size,
                    mode: mm.current_mode(),
                }),
                Err(ServerError::BufferTooLarge { requested, .. }) => {
                    assert_eq!(requested, size);
                    assert!(
                        size.next_multiple_of(alignment) > MAX_PAGE,
                        "{size} refused"
                    );
                }
                Err(other) => panic!("unexpected error {other:?}"),
            },
            Op::ReserveNoAlloc(size) => {
                let before = mm.storage().allocs;
                if let Some(handle) = mm.reserve_no_alloc(size) {
                    live.push(Live {
                        handle,
                        size,
                        mode: mm.current_mode(),
                    });
                }
                assert_eq!(mm.storage().allocs, before, "reserve_no_alloc allocated");
            }
            Op::Drop(index) => {
                if !live.is_empty() {
                    live.swap_remove(index % live.len());
                }
            }
            Op::DropAndReuse(index) => {
                if !live.is_empty() {
                    let slice = live.swap_remove(index % live.len());
                    let (size, mode) = (slice.size, slice.mode);
                    drop(slice);
                    let current = mm.current_mode();
                    mm.mode(mode);
                    let before = mm.storage().allocs;
                    let handle = mm.reserve(size).expect("the freed memory fits");
                    assert_eq!(mm.storage().allocs, before, "freed memory was not reused");
                    mm.mode(current);
                    live.push(Live { handle, size, mode });
                }
            }
            Op::Cleanup(explicit) => mm.cleanup(explicit),
            Op::Persistent(on) => {
                mm.mode(if on {
                    MemoryAllocationMode::Persistent
                } else {
                    MemoryAllocationMode::Auto
                });
            }
        }
        check(&mut mm, &live, alignment);
    }
    drop(live);
    mm.cleanup(true);
    assert_eq!(mm.memory_usage().bytes_reserved, 0);
    assert_eq!(
        mm.storage().block_count(),
        0,
        "explicit cleanup releases everything free"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn invariants_hold(
        ops in prop::collection::vec(op(), 1..80),
        layout in 0..5usize,
        storage_alignment in prop::sample::select(vec![1u64, 4, 64, 256]),
        device_alignment in prop::sample::select(vec![1u64, 128, 512]),
    ) {
        run(ops, layout, storage_alignment, device_alignment);
    }

    /// Repeating one round of reservations, then dropping them all, needs no new block after
    /// the first round.
    #[test]
    fn steady_state_is_flat(
        sizes in prop::collection::vec(size(), 1..40),
        layout in 0..5usize,
    ) {
        let props = MemoryDeviceProperties { max_page_size: MAX_PAGE, alignment: 256 };
        let storage = RecordingStorage { alignment: 64, ..RecordingStorage::default() };
        let mut mm = MemoryManagement::new(storage, &steady_layouts()[layout], props).unwrap();
        let round = |mm: &mut MemoryManagement<RecordingStorage>| {
            let handles: Vec<_> = sizes.iter().filter_map(|&s| mm.reserve(s).ok()).collect();
            drop(handles);
        };
        round(&mut mm);
        let allocs = mm.storage().allocs;
        let reserved = mm.memory_usage().bytes_reserved;
        for _ in 0..20 {
            round(&mut mm);
        }
        prop_assert_eq!(mm.storage().allocs, allocs);
        prop_assert_eq!(mm.memory_usage().bytes_reserved, reserved);
    }
}
