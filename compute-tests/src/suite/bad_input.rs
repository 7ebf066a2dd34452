//! Bad input through the public API: every call gives the exact structured error, leaves the
//! client working, and leaves a buffer made before it unchanged. Nothing reads or writes outside
//! a handle's bytes.

use compute_core::error::{LaunchError, LayoutError};
use compute_core::kernel::{KernelBuilder, KernelDefinition, ValidationError};
use compute_core::{
    Bytes, ComputeClient, CopyDescriptor, CubeCount, ElemType, Handle, KernelArguments,
    MemoryAllocationMode, MemoryLayoutDescriptor, Runtime, ServerError, StreamId, block_on,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::suite::ir_util::build;
use crate::util::{f32_bytes, sync};

/// A buffer with a known pattern that the test checks at the end (`Sentinel::check`).
struct Sentinel {
    handle: Handle,
    data: Vec<u8>,
}

impl Sentinel {
    fn new<R: Runtime>(client: &ComputeClient<R>, len: usize, seed: u8) -> Self {
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect();
        let handle = client.create(Bytes::from_slice(&data));
        Sentinel { handle, data }
    }

    /// The client still works (a fresh round trip) and the buffer holds its pattern.
    fn check<R: Runtime>(&self, client: &ComputeClient<R>, what: &str) {
        let probe = client.create(f32_bytes(&[1.0, 2.0]));
        assert_eq!(
            client.read_one(probe).unwrap().to_elems::<f32>(),
            vec![1.0, 2.0],
            "{what}: the client works after the bad call"
        );
        assert_eq!(
            client.read_one(self.handle.clone()).unwrap().to_vec(),
            self.data,
            "{what}: a buffer made before the bad call is unchanged"
        );
    }
}

fn fresh_stream<R: Runtime>(mut client: ComputeClient<R>) -> ComputeClient<R> {
    // SAFETY: the stream is fresh and used by this test's thread only.
    unsafe { client.set_stream(StreamId::fresh()) };
    client
}

/// A handle built from a slice takes the slice's size: it can never claim the neighbours' bytes.
pub fn bad_handle_is_bounded_by_its_slice<R: Runtime>(client: ComputeClient<R>) {
    let before = Sentinel::new(&client, 64, 1);
    let victim = Sentinel::new(&client, 16, 2);
    let after = Sentinel::new(&client, 64, 3);
    let rebuilt = Handle::new(
        victim.handle.memory().clone(),
        victim.handle.owner(),
        victim.handle.stream(),
    );
    assert_eq!(rebuilt.size(), 16, "the handle has its slice's size");
    assert_eq!(
        client.read_one(rebuilt.clone()).unwrap().to_vec(),
        victim.data
    );
    // A write longer than the handle is refused and writes nothing.
    client.write(&rebuilt, Bytes::from_slice(&[0xEE; 64]));
    assert!(
        matches!(
            client.flush(),
            Err(ServerError::Layout(LayoutError::RangeOutOfBounds {
                start: 0,
                len: 64,
                size: 16
            }))
        ),
        "an oversize write is a RangeOutOfBounds error"
    );
    assert!(matches!(
        rebuilt.clone().range(8, 9),
        Err(ServerError::Layout(LayoutError::RangeOutOfBounds { .. }))
    ));
    // Offsets past the end clamp to an empty handle, never past the slice.
    let clamped = rebuilt.clone().offset_start(1000);
    assert_eq!(clamped.size(), 0);
    before.check(&client, "oversize handle");
    victim.check(&client, "oversize handle");
    after.check(&client, "oversize handle");
}

/// Strides whose span wraps `usize` are an error, not a read of memory outside the tensor.
pub fn bad_read_tensor_wrapping_strides<R: Runtime>(client: ComputeClient<R>) {
    let sentinel = Sentinel::new(&client, 256, 7);
    let h = Sentinel::new(&client, 24, 9);
    let wraps = CopyDescriptor::new(h.handle.clone().binding(), [2, 2], [usize::MAX - 2, 1], 4);
    let err = block_on(client.read_one_tensor_async(wraps)).unwrap_err();
    assert!(
        matches!(err, ServerError::Layout(LayoutError::SizeOverflow { .. })),
        "{err:?}"
    );
    let huge = CopyDescriptor::new(h.handle.clone().binding(), [2, 2], [usize::MAX - 2, 1], 1);
    let err = block_on(client.read_one_tensor_async(huge)).unwrap_err();
    assert!(
        matches!(
            err,
            ServerError::Layout(LayoutError::OutOfBounds { size: 24, .. })
        ),
        "{err:?}"
    );
    let elems = CopyDescriptor::new(h.handle.clone().binding(), [1 << 62, 4], [4, 1], 8);
    let err = block_on(client.read_one_tensor_async(elems)).unwrap_err();
    assert!(
        matches!(err, ServerError::Layout(LayoutError::SizeOverflow { .. })),
        "{err:?}"
    );
    sentinel.check(&client, "wrapping strides");
    h.check(&client, "wrapping strides");
}

/// One rule for aliasing strides: copies reject them (a copy never broadcasts), launches take
/// tensor metadata as given (a kernel may broadcast; bounds checks guard its accesses).
pub fn bad_aliasing_strides_one_rule<R: Runtime>(mut client: ComputeClient<R>) {
    let sentinel = Sentinel::new(&client, 64, 11);
    let h = client.create(f32_bytes(&[1.0, 2.0, 3.0, 4.0]));
    let aliasing = CopyDescriptor::new(h.clone().binding(), [2, 2], [0, 0], 4);
    let err = block_on(client.read_one_tensor_async(aliasing.clone())).unwrap_err();
    assert!(
        matches!(err, ServerError::Layout(LayoutError::NotRowMajor { .. })),
        "read_tensor: {err:?}"
    );
    let other = client.clone();
    let copied = client.to_client_tensor(aliasing, &other, ElemType::F32);
    assert_eq!(copied.size(), 0, "the failed copy returns an empty handle");
    assert!(
        matches!(
            other.flush(),
            Err(ServerError::Layout(LayoutError::NotRowMajor { .. }))
        ),
        "to_client_tensor applies the same rule"
    );
    // A launch reads the metadata as given.
    let mut k = KernelBuilder::new("metadata_echo", [1, 1, 1]);
    let t = k.input("t", ElemType::F32, 1);
    let out = k.output("out", ElemType::U32, 1);
    let s0 = k.shape(t, 0u32);
    let st0 = k.stride(t, 0u32);
    let st1 = k.stride(t, 1u32);
    k.store(out, 0u32, s0);
    k.store(out, 1u32, st0);
    k.store(out, 2u32, st1);
    let def = build(k);
    let out = client.create(Bytes::zeroed(12));
    client.launch(
        def.into(),
        CubeCount::Static(1, 1, 1),
        KernelArguments::new()
            .tensor(h.clone().binding(), [2, 2], [0, 0])
            .buffer(out.clone().binding()),
    );
    assert_eq!(
        client.read_one(out).unwrap().to_elems::<u32>(),
        vec![2, 0, 0],
        "broadcast metadata reaches the kernel"
    );
    sentinel.check(&client, "aliasing strides");
}

/// Shapes whose byte size overflows `usize` are refused, never allocated short.
pub fn bad_tensor_size_overflow<R: Runtime>(client: ComputeClient<R>) {
    let sentinel = Sentinel::new(&client, 64, 13);
    for (shape, elem) in [
        (vec![(1usize << 62) + 1, 4], 1),
        (vec![1 << 32, 1 << 32], 4),
    ] {
        let d = MemoryLayoutDescriptor::contiguous(shape.clone(), elem);
        let err = client.try_empty_tensors(vec![d.clone()]).unwrap_err();
        assert!(
            matches!(err, ServerError::Layout(LayoutError::SizeOverflow { .. })),
            "{shape:?}: {err:?}"
        );
        let layouts = client.empty_tensors(vec![d]);
        assert_eq!(
            layouts[0].memory.size(),
            0,
            "the failed layout has no memory"
        );
        assert!(
            matches!(
                client.flush(),
                Err(ServerError::Layout(LayoutError::SizeOverflow { .. }))
            ),
            "{shape:?}: the queued error is the overflow"
        );
        let optimized = MemoryLayoutDescriptor::optimized(shape.clone(), elem);
        assert!(matches!(
            client.try_empty_tensors(vec![optimized]),
            Err(ServerError::Layout(LayoutError::SizeOverflow { .. }))
        ));
    }
    sentinel.check(&client, "size overflow");
}

/// Tensor metadata whose shape and strides ranks differ is refused at launch.
pub fn bad_metadata_rank_mismatch<R: Runtime>(client: ComputeClient<R>) {
    let sentinel = Sentinel::new(&client, 64, 17);
    let h = client.create(f32_bytes(&[0.0; 16]));
    client.launch(
        crate::kernels::fill_f32().into(),
        CubeCount::Static(1, 1, 1),
        KernelArguments::new()
            .tensor(h.clone().binding(), [4, 4], [4])
            .scalar(1.0f32),
    );
    let err = client.flush().unwrap_err();
    assert!(
        matches!(&err, ServerError::Launch(LaunchError::MetadataRank { shape, strides, .. })
            if shape == &[4, 4] && strides == &[4]),
        "{err:?}"
    );
    assert_eq!(
        client.read_one(h).unwrap().to_elems::<f32>(),
        vec![0.0; 16],
        "the refused launch wrote nothing"
    );
    sentinel.check(&client, "metadata ranks");
}

/// `to_client` of a size that is not a whole number of elements is an error, not a short copy.
pub fn bad_to_client_partial_elements<R: Runtime>(mut client: ComputeClient<R>) {
    let sentinel = Sentinel::new(&client, 64, 19);
    let src = client.create(Bytes::from_slice(&[1, 2, 3, 4, 5, 6]));
    let dst = client.clone();
    let copied = client.to_client(src.clone(), &dst, ElemType::F32);
    assert_eq!(copied.size(), 0);
    assert_eq!(
        dst.flush(),
        Err(ServerError::Layout(LayoutError::NotWholeElements {
            len: 6,
            elem_size: 4
        }))
    );
    // Whole elements copy exactly.
    let copied = client.to_client(src, &dst, ElemType::U16);
    assert_eq!(
        dst.read_one(copied).unwrap().to_vec(),
        vec![1, 2, 3, 4, 5, 6]
    );
    sentinel.check(&client, "partial elements");
}

fn two_input_kernel() -> KernelDefinition {
    let mut k = KernelBuilder::new("bad_add", [4, 1, 1]);
    let a = k.input("a", ElemType::F32, 1);
    let out = k.output("out", ElemType::F32, 1);
    let s = k.scalar("s", ElemType::F32);
    let i = k.absolute_pos();
    let n = k.len(out);
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let x = k.load(a, i);
        let y = k.add(x, s);
        k.store(out, i, y);
    });
    build(k)
}

/// A kernel edited as data, the way a kernel arrives from a file or another process.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> KernelDefinition {
    let mut json = serde_json::to_value(two_input_kernel()).unwrap();
    edit(&mut json);
    serde_json::from_value(json).expect("the edited kernel deserialises")
}

fn stmts(json: &mut serde_json::Value) -> &mut Vec<serde_json::Value> {
    json["body"]["stmts"].as_array_mut().unwrap()
}

/// Which error a malformed kernel must give, the same on every backend.
type Expect = fn(&ServerError) -> bool;

/// One malformed kernel per rule of the IR, each launched on this backend: the same
/// `ServerError` variant everywhere, found before any backend compiles it.
pub fn bad_malformed_kernels_one_error_everywhere<R: Runtime>(client: ComputeClient<R>) {
    let sentinel = Sentinel::new(&client, 64, 23);
    let cases: Vec<(&str, KernelDefinition, Expect)> = vec![
        (
            "use before definition",
            edited(|j| {
                let s = stmts(j);
                let cmp = s
                    .iter()
                    .position(|s| s["Let"]["op"].get("Compare").is_some());
                let moved = s.remove(cmp.unwrap());
                s.insert(0, moved);
            }),
            |e| {
                matches!(
                    e,
                    ServerError::InvalidKernel(ValidationError::UseBeforeDefinition { .. })
                )
            },
        ),
        (
            "defined twice",
            edited(|j| {
                let s = stmts(j);
                let dup = s[1].clone();
                s.insert(2, dup);
            }),
            |e| {
                matches!(
                    e,
                    ServerError::InvalidKernel(ValidationError::DefinedTwice { .. })
                )
            },
        ),
        (
            "f32 + f32 typed as u32",
            edited(|j| {
                let values = j["values"].as_array_mut().unwrap();
                let last = values.len() - 1;
                values[last] = serde_json::json!({"elem": "U32", "width": 1});
            }),
            |e| {
                matches!(e, ServerError::InvalidKernel(ValidationError::TypeMismatch { declared, computed, .. })
                    if declared.elem == ElemType::U32 && computed.elem == ElemType::F32)
            },
        ),
        (
            "store to a read-only buffer",
            edited(|j| j["buffers"][1]["access"] = serde_json::json!("ReadOnly")),
            |e| {
                matches!(
                    e,
                    ServerError::InvalidKernel(ValidationError::Rule(
                        compute_core::kernel::BuildError::ReadOnly { .. }
                    ))
                )
            },
        ),
        (
            "undeclared buffer",
            edited(|j| {
                let n = j["values"].as_array().unwrap().len();
                j["values"]
                    .as_array_mut()
                    .unwrap()
                    .push(serde_json::json!({"elem": "F32", "width": 1}));
                stmts(j).push(serde_json::json!({"Let": {"out": n, "op": {"Load": {"mem": {"Global": 7}, "index": 0}}}}));
            }),
            |e| {
                matches!(
                    e,
                    ServerError::InvalidKernel(ValidationError::Rule(
                        compute_core::kernel::BuildError::Unknown { .. }
                    ))
                )
            },
        ),
        (
            "undeclared scalar",
            edited(|j| {
                let s = stmts(j);
                let at = s
                    .iter()
                    .position(|s| s["Let"]["op"].get("Scalar").is_some());
                s[at.unwrap()]["Let"]["op"] = serde_json::json!({"Scalar": 5});
            }),
            |e| {
                matches!(
                    e,
                    ServerError::InvalidKernel(ValidationError::Undeclared {
                        what: "scalar",
                        index: 5,
                        ..
                    })
                )
            },
        ),
        (
            "break outside a loop",
            edited(|j| stmts(j).push(serde_json::json!("Break"))),
            |e| {
                matches!(
                    e,
                    ServerError::InvalidKernel(ValidationError::Rule(
                        compute_core::kernel::BuildError::NotInLoop { .. }
                    ))
                )
            },
        ),
        (
            "zero cube dimension",
            edited(|j| j["cube_dim"] = serde_json::json!([0, 1, 1])),
            |e| matches!(e, ServerError::Launch(LaunchError::CubeDimZero { .. })),
        ),
        (
            "private array of u32::MAX elements",
            edited(|j| {
                j["locals"] = serde_json::json!([{"name": "huge", "item": {"elem": "U32", "width": 1}, "len": u32::MAX}]);
            }),
            |e| {
                matches!(e, ServerError::Launch(LaunchError::PrivateMemory { bytes, .. })
                    if *bytes == 4 * u64::from(u32::MAX))
            },
        ),
    ];
    let input = client.create(f32_bytes(&[1.0, 2.0, 3.0, 4.0]));
    for (what, def, expect) in cases {
        let out = client.create(f32_bytes(&[9.0; 4]));
        client.launch(
            def.into(),
            CubeCount::Static(1, 1, 1),
            KernelArguments::new()
                .buffer(input.clone().binding())
                .buffer(out.clone().binding())
                .scalar(1.0f32),
        );
        let err = client
            .flush()
            .expect_err(&format!("{what}: the malformed kernel must be refused"));
        assert!(expect(&err), "{what}: unexpected error {err:?}");
        assert_eq!(
            client.read_one(out).unwrap().to_elems::<f32>(),
            vec![9.0; 4],
            "{what}: nothing ran"
        );
    }
    // The well-formed twin runs.
    let out = client.create(f32_bytes(&[0.0; 4]));
    client.launch(
        two_input_kernel().into(),
        CubeCount::Static(1, 1, 1),
        KernelArguments::new()
            .buffer(input.binding())
            .buffer(out.clone().binding())
            .scalar(1.0f32),
    );
    assert_eq!(
        client.read_one(out).unwrap().to_elems::<f32>(),
        vec![2.0, 3.0, 4.0, 5.0]
    );
    sentinel.check(&client, "malformed kernels");
}

/// Cube dimensions and counts are checked in core against the device's limits, with the limits
/// in the error, before any driver call.
pub fn bad_launch_limits_checked_in_core<R: Runtime>(client: ComputeClient<R>) {
    let sentinel = Sentinel::new(&client, 64, 29);
    let hw = client.properties().hardware.clone();
    let kernel_with_dim = |dim: [u32; 3]| edited(|j| j["cube_dim"] = serde_json::json!(dim));
    let out = client.create(f32_bytes(&[5.0; 4]));
    let input = client.create(f32_bytes(&[1.0; 4]));
    let launch = |def: KernelDefinition, count: CubeCount| {
        client.launch(
            def.into(),
            count,
            KernelArguments::new()
                .buffer(input.clone().binding())
                .buffer(out.clone().binding())
                .scalar(1.0f32),
        );
        client.flush()
    };
    let one = || CubeCount::Static(1, 1, 1);
    if hw.max_cube_dim[0] < u32::MAX {
        let err = launch(kernel_with_dim([hw.max_cube_dim[0] + 1, 1, 1]), one()).unwrap_err();
        assert!(
            matches!(&err, ServerError::Launch(LaunchError::CubeDimTooLarge { maximum, .. }) if *maximum == hw.max_cube_dim),
            "{err:?}"
        );
    }
    // A unit count that overflows u32 is not wrapped to a small cube.
    let err = launch(kernel_with_dim([(1 << 31) + 1, 2, 1]), one()).unwrap_err();
    assert!(
        matches!(
            err,
            ServerError::Launch(
                LaunchError::CubeDimTooLarge { .. } | LaunchError::TooManyUnits { .. }
            )
        ),
        "{err:?}"
    );
    // Every axis within its limit, the product over max_units_per_cube.
    let x = hw.max_cube_dim[0].min(hw.max_units_per_cube);
    let y = hw.max_cube_dim[1].min(2);
    if u64::from(x) * u64::from(y) > u64::from(hw.max_units_per_cube) {
        let err = launch(kernel_with_dim([x, y, 1]), one()).unwrap_err();
        assert!(
            matches!(&err, ServerError::Launch(LaunchError::TooManyUnits { maximum, .. }) if *maximum == hw.max_units_per_cube),
            "{err:?}"
        );
    }
    if hw.max_cube_count[0] < u32::MAX {
        let err = launch(
            two_input_kernel(),
            CubeCount::Static(hw.max_cube_count[0] + 1, 1, 1),
        )
        .unwrap_err();
        assert!(
            matches!(&err, ServerError::Launch(LaunchError::CubeCountTooLarge { maximum, .. }) if *maximum == hw.max_cube_count),
            "{err:?}"
        );
    }
    // A dynamic count at a byte offset that is not a multiple of 4, and one too short.
    let counts = client.create(Bytes::from_elem_slice(&[1u32, 1, 1, 1, 1]));
    let misaligned = counts.clone().range(2, 12).unwrap();
    let err = launch(two_input_kernel(), CubeCount::Dynamic(misaligned.binding())).unwrap_err();
    assert!(
        matches!(
            err,
            ServerError::Launch(LaunchError::DynamicCount {
                offset: 2,
                size: 12
            })
        ),
        "{err:?}"
    );
    let short = counts.range(0, 8).unwrap();
    let err = launch(two_input_kernel(), CubeCount::Dynamic(short.binding())).unwrap_err();
    assert!(
        matches!(
            err,
            ServerError::Launch(LaunchError::DynamicCount { size: 8, .. })
        ),
        "{err:?}"
    );
    assert_eq!(
        client.read_one(out.clone()).unwrap().to_elems::<f32>(),
        vec![5.0; 4],
        "no refused launch ran"
    );
    sentinel.check(&client, "launch limits");
}

/// A persistent section nested in another restores the mode it found: the outer section's
/// later allocations still go to the persistent pool.
pub fn bad_nested_persistent_sections_restore_the_mode<R: Runtime>(client: ComputeClient<R>) {
    let client = fresh_stream(client);
    let reserved = || client.stream_memory_usage().unwrap().bytes_reserved;
    let start = reserved();
    let (a, b, c, deltas) = client
        .memory_persistent_allocation((), |()| {
            let r0 = reserved();
            let a = client.create(f32_bytes(&[1.0; 3]));
            let r1 = reserved();
            let b = client
                .memory_persistent_allocation((), |()| client.create(f32_bytes(&[2.0; 3])))
                .unwrap();
            let r2 = reserved();
            let c = client.create(f32_bytes(&[3.0; 3]));
            let r3 = reserved();
            (a, b, c, [r1 - r0, r2 - r1, r3 - r2])
        })
        .unwrap();
    assert_eq!(
        deltas[0], deltas[2],
        "after the nested section, the outer one still allocates exact-size persistent blocks ({deltas:?})"
    );
    assert_eq!(deltas[0], deltas[1]);
    assert!(start + deltas.iter().sum::<u64>() <= reserved());
    for (h, v) in [(a, 1.0), (b, 2.0), (c, 3.0)] {
        assert_eq!(client.read_one(h).unwrap().to_elems::<f32>(), vec![v; 3]);
    }
    // Back to the automatic mode after the outer section: a graph_prepare window is a
    // persistent section too, and a nested section inside it leaves it persistent.
    // SAFETY: this test's stream only.
    unsafe { client.allocation_mode(MemoryAllocationMode::Auto) };
    sync(&client);
}

/// A failed section reports its first error once; the errors queued behind it do not fail the
/// next, unrelated call (the contract of `compute_core::error::take_first`).
pub fn bad_failed_section_does_not_poison_the_next<R: Runtime>(client: ComputeClient<R>) {
    let client = fresh_stream(client);
    let discarded = compute_core::error::discarded_errors();
    let h = client.create(f32_bytes(&[0.0; 4]));
    for _ in 0..3 {
        client.launch(
            crate::kernels::fill_f32().into(),
            CubeCount::Static(1, 1, 1),
            KernelArguments::new().buffer(h.clone().binding()),
        );
    }
    let err = block_on(client.sync()).unwrap_err();
    assert!(
        matches!(
            err,
            ServerError::Launch(LaunchError::ArgumentCount {
                what: "scalars",
                ..
            })
        ),
        "{err:?}"
    );
    assert!(
        compute_core::error::discarded_errors() >= discarded + 2,
        "the two errors queued behind the first are counted as discarded"
    );
    block_on(client.sync()).expect("the next section starts clean");
    client.flush().expect("and so does a flush");
    assert_eq!(client.read_one(h).unwrap().to_elems::<f32>(), vec![0.0; 4]);
}

/// One random descriptor case: a sub-range of a patterned buffer, a tensor over it, a write.
#[derive(Debug, Clone)]
struct Case {
    buffer: usize,
    start: u64,
    len: u64,
    shape: Vec<usize>,
    strides: Vec<usize>,
    elem: usize,
    write_at: u64,
    write_len: usize,
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let dims = prop::collection::vec(0usize..5, 0..4);
    (
        16usize..160,
        0u64..48,
        0u64..160,
        dims,
        prop::collection::vec(
            prop_oneof![
                3 => 0usize..40,
                1 => Just(0usize),
                1 => (usize::MAX - 8)..=usize::MAX,
            ],
            0..4,
        ),
        prop_oneof![Just(1usize), Just(2), Just(4), Just(8)],
        0u64..64,
        0usize..48,
        any::<bool>(),
    )
        .prop_map(
            |(buffer, start, len, shape, strides, elem, write_at, write_len, row_major)| {
                // Half the cases use the row-major strides the runtime makes, half the random ones.
                let strides = if row_major {
                    compute_core::layout::contiguous_strides(&shape).0
                } else {
                    strides
                };
                Case {
                    buffer,
                    start,
                    len,
                    shape,
                    strides,
                    elem,
                    write_at,
                    write_len,
                }
            },
        )
}

/// Bytes of `data` a descriptor would gather, or `None` if some element lies outside it.
fn gather(data: &[u8], shape: &[usize], strides: &[usize], elem: usize) -> Option<Vec<u8>> {
    if shape.len() != strides.len() {
        return None;
    }
    let count = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
    let mut out = Vec::new();
    let mut index = vec![0usize; shape.len()];
    for _ in 0..count {
        let mut offset = 0usize;
        for (i, s) in index.iter().zip(strides) {
            offset = offset.checked_add(i.checked_mul(*s)?)?;
        }
        let start = offset.checked_mul(elem)?;
        out.extend_from_slice(data.get(start..start.checked_add(elem)?)?);
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Some(out)
}

/// Property test over random shapes, strides, offsets and sizes for create, read, write and
/// read_tensor: each case gives a structured error or exact data, and never a byte outside the
/// handle (fixed seed, bounded case count).
pub fn bad_descriptors_property<R: Runtime>(client: ComputeClient<R>) {
    let client = fresh_stream(client);
    let config = Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let result = runner.run(&case_strategy(), |case| {
        let neighbour = Sentinel::new(&client, 32, 41);
        let base = Sentinel::new(&client, case.buffer, 43);
        let mut model = base.data.clone();
        let range = base.handle.clone().range(case.start, case.len);
        let in_bounds = case.start + case.len <= case.buffer as u64;
        prop_assert_eq!(range.is_ok(), in_bounds, "range {:?}", &case);
        let Ok(sub) = range else {
            return Ok(());
        };
        let lo = case.start as usize;
        let view = &model[lo..lo + case.len as usize];
        // read_tensor through the descriptor.
        let descriptor = CopyDescriptor::new(
            sub.clone().binding(),
            case.shape.clone(),
            case.strides.clone(),
            case.elem,
        );
        match block_on(client.read_one_tensor_async(descriptor)) {
            Ok(bytes) => {
                let expected = gather(view, &case.shape, &case.strides, case.elem);
                prop_assert!(
                    expected.is_some(),
                    "read outside the handle accepted: {:?}",
                    &case
                );
                prop_assert_eq!(bytes.to_vec(), expected.unwrap(), "{:?}", &case);
            }
            Err(e) => prop_assert!(matches!(e, ServerError::Layout(_)), "{:?}: {:?}", &case, e),
        }
        // A write of `write_len` bytes at `write_at` inside the sub-handle.
        let data: Vec<u8> = (0..case.write_len)
            .map(|i| 200u8.wrapping_add(i as u8))
            .collect();
        let target = sub.clone().range(case.write_at, case.write_len as u64);
        let fits = case.write_at + case.write_len as u64 <= case.len;
        prop_assert_eq!(target.is_ok(), fits);
        if let Ok(target) = target {
            client.write(&target, Bytes::from_slice(&data));
            let at = lo + case.write_at as usize;
            model[at..at + data.len()].copy_from_slice(&data);
        }
        // Writing past the end of the sub-handle through `write` is refused whole.
        client.write(&sub, Bytes::from_slice(&vec![0xAB; case.len as usize + 1]));
        let flushed = client.flush();
        prop_assert!(
            matches!(
                flushed,
                Err(ServerError::Layout(LayoutError::RangeOutOfBounds { .. }))
            ),
            "{:?}",
            flushed
        );
        prop_assert_eq!(
            client.read_one(base.handle.clone()).unwrap().to_vec(),
            model,
            "{:?}",
            &case
        );
        // Creating a tensor of the case's shape: the byte count must match exactly.
        let compact = case
            .shape
            .iter()
            .try_fold(case.elem, |n, &d| n.checked_mul(d));
        if let Some(bytes) = compact.filter(|&n| n <= 4096) {
            let d = MemoryLayoutDescriptor::optimized(case.shape.clone(), case.elem);
            let wrong = client.try_create_tensors(vec![(d.clone(), Bytes::zeroed(bytes + 1))]);
            prop_assert!(
                matches!(
                    wrong,
                    Err(ServerError::Layout(LayoutError::DataLength { .. }))
                ),
                "{:?}",
                wrong.err()
            );
            let payload: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
            let layout = client
                .try_create_tensors(vec![(d, Bytes::from_slice(&payload))])
                .unwrap()
                .remove(0);
            let back = block_on(client.read_one_tensor_async(layout.copy_descriptor()));
            prop_assert_eq!(back.unwrap().to_vec(), payload);
        }
        neighbour.check(&client, "property case");
        Ok(())
    });
    if let Err(e) = result {
        panic!("{}: property failed: {e}", R::name());
    }
}
