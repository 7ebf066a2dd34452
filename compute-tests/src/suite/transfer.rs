//! Creation, writes and reads.

use compute_core::{
    Bytes, BytesKind, ComputeClient, CopyDescriptor, MemoryLayoutDescriptor, Runtime, StreamId,
    block_on,
};

use crate::util::{f32_bytes, ramp, sync};

/// `create`, `create_from_slice`, `read`, `read_one`, `read_async`, `read_one_unchecked`.
pub fn create_and_read_back<R: Runtime>(client: ComputeClient<R>) {
    let a = client.create(f32_bytes(&[1.0, 2.0, 3.5]));
    let b = client.create_from_slice(&[9u8, 8, 7]);
    let both = client.read(vec![a.clone(), b.clone()]);
    assert_eq!(both[0].to_elems::<f32>(), vec![1.0, 2.0, 3.5]);
    assert_eq!(&*both[1], &[9, 8, 7]);
    assert_eq!(client.read_one(a.clone()).unwrap().len(), 12);
    assert_eq!(&*client.read_one_unchecked(b.clone()), &[9, 8, 7]);
    let fut = client.read_async(vec![b]);
    assert_eq!(&*block_on(fut).unwrap()[0], &[9, 8, 7]);
}

/// A zero-size buffer can be created, read (0 bytes) and written.
pub fn zero_size_buffer<R: Runtime>(client: ComputeClient<R>) {
    let empty = client.create(Bytes::from_vec(Vec::new()));
    let reserved = client.empty(0);
    assert_eq!(empty.size(), 0);
    assert_eq!(reserved.size(), 0);
    client.write(&reserved, Bytes::from_vec(Vec::new()));
    let read = client.read(vec![empty, reserved]);
    assert_eq!(read[0].len(), 0);
    assert_eq!(read[1].len(), 0);
    client.flush().unwrap();
}

/// `write` replaces data in place; a shorter write only touches the start.
pub fn write_in_place<R: Runtime>(client: ComputeClient<R>) {
    let handle = client.create(f32_bytes(&[1.0, 2.0, 3.0, 4.0]));
    client.write(&handle, f32_bytes(&[10.0, 20.0]));
    let out = client.read_one(handle.clone()).unwrap().to_elems::<f32>();
    assert_eq!(out, vec![10.0, 20.0, 3.0, 4.0]);
    client.write(&handle, f32_bytes(&[5.0, 6.0, 7.0, 8.0]));
    let out = client.read_one(handle).unwrap().to_elems::<f32>();
    assert_eq!(out, vec![5.0, 6.0, 7.0, 8.0]);
}

/// A write longer than its handle is an error returned by the next flush, and writes nothing.
pub fn write_too_long_is_an_error<R: Runtime>(client: ComputeClient<R>) {
    let handle = client.create(f32_bytes(&[1.0]));
    client.write(&handle, f32_bytes(&[1.0, 2.0]));
    let err = client.flush().unwrap_err();
    assert!(
        matches!(
            err,
            compute_core::ServerError::Layout(compute_core::error::LayoutError::RangeOutOfBounds {
                start: 0,
                len: 8,
                size: 4
            })
        ),
        "{err:?}"
    );
    assert_eq!(
        client.read_one(handle).unwrap().to_elems::<f32>(),
        vec![1.0]
    );
}

/// `create_tensor` may pitch rows; `read_tensor` returns compact data either way, and the raw
/// memory has every row at its stride.
pub fn pitched_tensor_reads<R: Runtime>(client: ComputeClient<R>) {
    let (rows, cols) = (3usize, 5usize);
    let data = ramp(rows * cols, 1.0);
    let layout = client.create_tensor(f32_bytes(&data), [rows, cols].into(), 4);
    assert_eq!(layout.strides[1], 1);
    assert!(layout.strides[0] >= cols);
    if let Some(align) = client.properties().pitch_alignment {
        // The pitch scales with the row: the alignment, or the row's own size rounded up to a
        // power of two when that is smaller (compute_core::layout::pitched_strides).
        let align = align.min((cols * 4).next_power_of_two());
        assert_eq!(
            (layout.strides[0] * 4) % align,
            0,
            "rows must be aligned to {align}"
        );
        assert!(
            layout.strides[0] * 4 < cols * 4 + align,
            "no more padding than the alignment"
        );
    } else {
        assert!(layout.is_contiguous());
    }
    let compact = client.read_tensor(vec![layout.copy_descriptor()]);
    assert_eq!(compact[0].to_elems::<f32>(), data);
    let raw = client
        .read_one(layout.memory.clone())
        .unwrap()
        .to_elems::<f32>();
    assert_eq!(raw.len(), rows * layout.strides[0]);
    for r in 0..rows {
        let stride = layout.strides[0];
        assert_eq!(
            &raw[r * stride..r * stride + cols],
            &data[r * cols..(r + 1) * cols]
        );
    }
    let one = client.read_one_unchecked_tensor(layout.copy_descriptor());
    assert_eq!(one.to_elems::<f32>(), data);
    let fut = client.read_one_tensor_async(layout.copy_descriptor());
    assert_eq!(block_on(fut).unwrap().to_elems::<f32>(), data);
    let fut = client.read_tensor_async(vec![layout.copy_descriptor()]);
    assert_eq!(block_on(fut).unwrap()[0].to_elems::<f32>(), data);
    let from_slice =
        client.create_tensor_from_slice(bytemuck::cast_slice(&data), [rows, cols].into(), 4);
    assert_eq!(
        client
            .read_one_unchecked_tensor(from_slice.copy_descriptor())
            .to_elems::<f32>(),
        data
    );
}

/// A descriptor whose strides are not row-major is rejected with an error.
pub fn read_tensor_rejects_bad_strides<R: Runtime>(client: ComputeClient<R>) {
    let handle = client.create(f32_bytes(&ramp(6, 1.0)));
    let transposed = CopyDescriptor::new(handle.clone().binding(), [2, 3], [1, 2], 4);
    let err = block_on(client.read_one_tensor_async(transposed)).unwrap_err();
    assert!(
        matches!(
            err,
            compute_core::ServerError::Layout(compute_core::error::LayoutError::NotRowMajor { .. })
        ),
        "{err:?}"
    );
    let too_big = CopyDescriptor::new(handle.binding(), [4, 3], [3, 1], 4);
    let err = block_on(client.read_one_tensor_async(too_big)).unwrap_err();
    assert!(
        matches!(
            err,
            compute_core::ServerError::Layout(compute_core::error::LayoutError::OutOfBounds {
                span: 48,
                size: 24,
                ..
            })
        ),
        "{err:?}"
    );
}

/// `read_tensor` of views that are not contiguous (rows with gaps between them, a 3-D view with
/// gaps at two levels, and a view into a sub-range of its handle) returns exactly the view's
/// elements, in row-major order, on every backend (wgpu and Vulkan lay tensors out contiguously
/// themselves, so only a descriptor like these exercises their strided read path).
pub fn read_tensor_of_strided_views<R: Runtime>(client: ComputeClient<R>) {
    let data = ramp(64, 1.0);
    let handle = client.create(f32_bytes(&data));
    let view = |shape: &[usize], strides: &[usize], offset: usize| -> Vec<f32> {
        let mut out = Vec::new();
        let mut index = vec![0usize; shape.len()];
        if shape.contains(&0) {
            return out;
        }
        loop {
            let at: usize = index.iter().zip(strides).map(|(i, s)| i * s).sum();
            out.push(data[offset + at]);
            let mut d = shape.len();
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
    };
    let cases: [(&[usize], &[usize], usize); 5] = [
        (&[3, 4], &[6, 1], 0),
        (&[5, 3], &[7, 1], 0),
        (&[2, 2, 3], &[20, 5, 1], 0),
        (&[3, 5], &[9, 1], 3),
        (&[4, 1], &[13, 1], 5),
    ];
    for (shape, strides, offset) in cases {
        let base = handle
            .clone()
            .range(offset as u64 * 4, (64 - offset) as u64 * 4)
            .unwrap();
        let descriptor = CopyDescriptor::new(base.binding(), shape.to_vec(), strides.to_vec(), 4);
        let got = block_on(client.read_one_tensor_async(descriptor))
            .unwrap_or_else(|e| panic!("{shape:?} / {strides:?} at {offset}: {e:?}"))
            .to_elems::<f32>();
        assert_eq!(
            got,
            view(shape, strides, offset),
            "{shape:?} / {strides:?} at element {offset}"
        );
    }
}

/// One strided write case: shape, strides, element offset into the buffer, element size,
/// buffer size in bytes.
type StridedWrite = (&'static [usize], &'static [usize], usize, usize, usize);

/// A write through a non-contiguous descriptor (rows with gaps between them) lands each row at
/// its stride and leaves the gaps as they were, byte for byte: f32 rows `[3, 4]` at a row
/// stride of 8 in a 24-element buffer, a 3-D view with gaps at two levels, a view at an element
/// offset, byte rows of odd length at an odd offset, and two strided writes in one call.
///
/// `ComputeClient::write` only takes contiguous data, so this goes through the server's own
/// `ServerTransfer::write`, on a server the test builds with `Runtime::create_server` (wgpu and
/// Vulkan lay tensors out contiguously, so no client path reaches their strided write).
pub fn strided_writes_keep_the_gaps<R: Runtime>(client: ComputeClient<R>) {
    use compute_core::{ComputeServer, Device, ServerMemory, ServerTransfer};
    let device = <R::Device as Device>::from_id(client.device_id());
    let mut server = R::create_server(&device).expect("a second server of the device");
    let stream = StreamId::fresh();
    let elements = |shape: &[usize], strides: &[usize]| -> Vec<usize> {
        let mut at = vec![0usize];
        for (&n, &s) in shape.iter().zip(strides) {
            at = at
                .iter()
                .flat_map(|&a| (0..n).map(move |i| a + i * s))
                .collect();
        }
        at
    };
    let cases: [StridedWrite; 5] = [
        (&[3, 4], &[8, 1], 0, 4, 96),
        (&[2, 2, 3], &[16, 5, 1], 0, 4, 128),
        (&[3, 2], &[5, 1], 3, 4, 80),
        (&[3, 3], &[5, 1], 1, 1, 20),
        (&[4, 1], &[3, 1], 0, 2, 26),
    ];
    for (case, (shape, strides, offset, elem, size)) in cases.into_iter().enumerate() {
        let old: Vec<u8> = (0..size)
            .map(|i| 0xC0 ^ (i as u8).wrapping_mul(29))
            .collect();
        let handle = server.create_buffer(size as u64, stream).unwrap();
        server
            .write(
                vec![(
                    handle.clone().copy_descriptor_bytes(),
                    Bytes::from_vec(old.clone()),
                )],
                stream,
            )
            .unwrap();
        let count: usize = shape.iter().product();
        let data: Vec<u8> = (0..count * elem)
            .map(|i| (case as u8 * 50).wrapping_add(i as u8).wrapping_mul(7) | 1)
            .collect();
        let view = handle
            .clone()
            .range((offset * elem) as u64, (size - offset * elem) as u64)
            .unwrap();
        let descriptor =
            CopyDescriptor::new(view.binding(), shape.to_vec(), strides.to_vec(), elem);
        server
            .write(vec![(descriptor, Bytes::from_vec(data.clone()))], stream)
            .unwrap_or_else(|e| panic!("{shape:?} / {strides:?}: {e:?}"));
        let mut want = old.clone();
        for (k, at) in elements(shape, strides).into_iter().enumerate() {
            let byte = (offset + at) * elem;
            want[byte..byte + elem].copy_from_slice(&data[k * elem..(k + 1) * elem]);
        }
        let got = block_on(server.read(vec![handle.copy_descriptor_bytes()], stream))
            .unwrap()
            .remove(0)
            .to_vec();
        assert_eq!(
            got, want,
            "{shape:?} / {strides:?} at element {offset} ({elem}-byte elements): rows at their \
             strides, the gaps unchanged"
        );
    }
    // Two strided writes in one call, interleaved rows of one buffer: each keeps the other's.
    let handle = server.create_buffer(64, stream).unwrap();
    server
        .write(
            vec![(
                handle.clone().copy_descriptor_bytes(),
                Bytes::from_vec(vec![0xAA; 64]),
            )],
            stream,
        )
        .unwrap();
    let even = CopyDescriptor::new(handle.clone().binding(), [4, 2], [4, 1], 4);
    let odd = CopyDescriptor::new(
        handle.clone().range(8, 56).unwrap().binding(),
        [3, 1],
        [4, 1],
        4,
    );
    server
        .write(
            vec![
                (even, f32_bytes(&ramp(8, 1.0))),
                (odd, f32_bytes(&[-1.0, -2.0, -3.0])),
            ],
            stream,
        )
        .unwrap();
    let got = block_on(server.read(vec![handle.copy_descriptor_bytes()], stream))
        .unwrap()
        .remove(0);
    let mut want = vec![0xAAu8; 64];
    for (i, v) in ramp(8, 1.0).into_iter().enumerate() {
        let at = (i / 2) * 16 + (i % 2) * 4;
        want[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }
    for (i, v) in [-1.0f32, -2.0, -3.0].into_iter().enumerate() {
        let at = 8 + i * 16;
        want[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }
    assert_eq!(got.to_vec(), want, "two strided writes in one call");
    block_on(server.sync(stream)).unwrap();
}

/// `create_tensors` packs every tensor into one allocation, without overlap.
pub fn create_tensors_packs_one_allocation<R: Runtime>(client: ComputeClient<R>) {
    let a = ramp(7, 1.0);
    let b = ramp(12, -2.0);
    let c: Vec<f32> = vec![42.0];
    let before = client.stream_memory_usage().unwrap();
    let layouts = client.create_tensors(vec![
        (MemoryLayoutDescriptor::optimized([7], 4), f32_bytes(&a)),
        (MemoryLayoutDescriptor::optimized([3, 4], 4), f32_bytes(&b)),
        (MemoryLayoutDescriptor::contiguous([1], 4), f32_bytes(&c)),
    ]);
    let after = client.stream_memory_usage().unwrap();
    assert_eq!(
        after.number_allocs,
        before.number_allocs + 1,
        "one slice for all tensors"
    );
    assert!(layouts[0].memory.same_memory(&layouts[1].memory));
    assert!(layouts[1].memory.same_memory(&layouts[2].memory));
    let ranges: Vec<(u64, u64)> = layouts
        .iter()
        .map(|l| {
            (
                l.memory.slice_offset_start(),
                l.memory.slice_offset_start() + l.memory.size(),
            )
        })
        .collect();
    for i in 0..ranges.len() {
        for j in i + 1..ranges.len() {
            assert!(
                ranges[i].1 <= ranges[j].0 || ranges[j].1 <= ranges[i].0,
                "{ranges:?}"
            );
        }
    }
    let read = client.read_tensor(layouts.iter().map(|l| l.copy_descriptor()).collect());
    assert_eq!(read[0].to_elems::<f32>(), a);
    assert_eq!(read[1].to_elems::<f32>(), b);
    assert_eq!(read[2].to_elems::<f32>(), c);
    let from_slices = client.create_tensors_from_slices(vec![
        (
            MemoryLayoutDescriptor::contiguous([2], 4),
            bytemuck::cast_slice(&[1.0f32, 2.0]),
        ),
        (
            MemoryLayoutDescriptor::contiguous([1], 4),
            bytemuck::cast_slice(&[3.0f32]),
        ),
    ]);
    let read = client.read_tensor(from_slices.iter().map(|l| l.copy_descriptor()).collect());
    assert_eq!(read[0].to_elems::<f32>(), vec![1.0, 2.0]);
    assert_eq!(read[1].to_elems::<f32>(), vec![3.0]);
}

/// `empty`, `empty_tensor` and `empty_tensors` reserve memory of the right size and layout.
pub fn empty_allocations<R: Runtime>(client: ComputeClient<R>) {
    let raw = client.empty(100);
    assert_eq!(raw.size(), 100);
    let tensor = client.empty_tensor([4, 3].into(), 2);
    assert_eq!(tensor.strides[1], 1);
    assert_eq!(tensor.memory.size() as usize, 4 * tensor.strides[0] * 2);
    let many = client.empty_tensors(vec![
        MemoryLayoutDescriptor::contiguous([5], 8),
        MemoryLayoutDescriptor::contiguous([2, 2], 4),
    ]);
    assert_eq!(many[0].memory.size(), 40);
    assert_eq!(many[1].memory.size(), 16);
    assert_eq!(many[1].strides.0, vec![2, 1]);
    assert!(many[0].memory.same_memory(&many[1].memory));
    client.write(&raw, Bytes::from_vec(vec![3; 100]));
    assert_eq!(client.read_one(raw).unwrap().to_vec(), vec![3; 100]);
}

/// `read_lazy` copies on first access, and sees the device state of that moment.
pub fn read_lazy_reflects_first_access<R: Runtime>(client: ComputeClient<R>) {
    let handle = client.create(f32_bytes(&[1.0, 2.0]));
    let lazy = client.read_lazy(handle.clone().copy_descriptor_bytes());
    assert_eq!(lazy.len(), 8);
    assert!(!lazy.is_materialized());
    client.write(&handle, f32_bytes(&[3.0, 4.0]));
    sync(&client);
    assert_eq!(lazy.to_elems::<f32>(), vec![3.0, 4.0]);
    assert!(lazy.is_materialized());
    drop(handle);
    let handle = client.create(f32_bytes(&[5.0]));
    let lazy = block_on(client.read_lazy_async(handle.clone().copy_descriptor_bytes())).unwrap();
    drop(handle);
    assert_eq!(
        lazy.to_elems::<f32>(),
        vec![5.0],
        "the lazy bytes keep their source alive"
    );
}

/// `staging` reads file-backed bytes now; `file_only` leaves other deferred bytes alone.
pub fn staging_materializes<R: Runtime>(client: ComputeClient<R>) {
    let path = std::env::temp_dir().join(format!(
        "compute-staging-{}-{}",
        R::name(),
        std::process::id()
    ));
    std::fs::write(&path, [1u8, 2, 3, 4]).unwrap();
    let mut file = Bytes::from_file(&path, 1, 3);
    let mut lazy = Bytes::lazy(2, || Ok(Bytes::from_slice(&[5, 6])));
    client.staging([&mut file, &mut lazy].into_iter(), true);
    client.flush().unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(file.is_materialized());
    assert_ne!(file.kind(), BytesKind::File);
    assert!(!lazy.is_materialized());
    client.staging([&mut lazy].into_iter(), false);
    assert!(lazy.is_materialized());
    let handle = client.create(file);
    assert_eq!(&*client.read_one(handle).unwrap(), &[2, 3, 4]);
    assert_eq!(&*lazy, &[5, 6]);
}

/// `get_resource` returns the storage behind that very handle (its length, and a sub-range's
/// start as far from the whole's as the sub-handle's offset), and keeps the allocation alive.
pub fn get_resource_of_own_handle<R: Runtime>(mut client: ComputeClient<R>) {
    use compute_core::storage::ResourceRange;
    // SAFETY: a fresh stream used by this test's thread only.
    unsafe { client.set_stream(compute_core::StreamId::fresh()) };
    let whole = client.create(f32_bytes(&(0..16).map(|i| i as f32).collect::<Vec<_>>()));
    let part = whole.clone().range(16, 8).unwrap();
    let (of_whole, of_part) = (
        client.get_resource(whole.clone()).unwrap(),
        client.get_resource(part.clone()).unwrap(),
    );
    assert_eq!(
        of_whole.resource().range_len(),
        64,
        "the whole handle's length"
    );
    assert_eq!(of_part.resource().range_len(), 8, "the sub-handle's length");
    assert_eq!(
        of_part.resource().range_start() - of_whole.resource().range_start(),
        16,
        "the sub-handle's range starts 16 bytes into the whole's"
    );
    let other = client.create(f32_bytes(&[9.0; 16]));
    let of_other = client.get_resource(other).unwrap();
    assert!(
        of_other.resource().range_start() != of_whole.resource().range_start()
            || format!("{:?}", of_other.resource()) != format!("{:?}", of_whole.resource()),
        "another handle resolves to another range"
    );
    drop((of_whole, of_part, of_other, whole, part));
    sync(&client);
    let handle = client.create(f32_bytes(&[1.0, 2.0]));
    let live = client.stream_memory_usage().unwrap().number_allocs;
    let resource = client.get_resource(handle.clone()).unwrap();
    assert_eq!(resource.resource().range_len(), 8);
    drop(handle);
    sync(&client);
    assert_eq!(
        client.stream_memory_usage().unwrap().number_allocs,
        live,
        "the resource keeps its allocation alive"
    );
    drop(resource);
    assert_eq!(
        client.stream_memory_usage().unwrap().number_allocs,
        live - 1
    );
}

/// `create_from_slice` reads the slice before it returns: large slices (staged in pieces on the
/// backends that stage host writes) are overwritten right after the call, and every handle still
/// reads back the bytes it was created from.
pub fn create_from_slice_copies_before_returning<R: Runtime>(client: ComputeClient<R>) {
    let sizes = [(64 << 10) + 1, (3 << 20) + 5, (17 << 20) + 3];
    let pattern = |size: usize, seed: usize| -> Vec<u8> {
        (0..size)
            .map(|j| (j * 13 + j / 4093 + seed) as u8)
            .collect()
    };
    let mut source = Vec::new();
    let mut handles = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        source.clear();
        source.extend(pattern(size, i));
        handles.push(client.create_from_slice(&source));
        source.iter_mut().for_each(|b| *b = !*b);
    }
    let read = client.read(handles.clone());
    for (i, (got, &size)) in read.iter().zip(&sizes).enumerate() {
        assert_eq!(got.len(), size, "slice {i}: length");
        assert!(
            got[..] == pattern(size, i)[..],
            "slice {i} ({size} B): bytes differ"
        );
    }
    client.flush().unwrap();
}

/// 1,000 tensors created in a row, then all read back: every byte exact.
pub fn burst_of_tensors_reads_back_exact<R: Runtime>(client: ComputeClient<R>) {
    let count = 1000usize;
    let data: Vec<Vec<u8>> = (0..count)
        .map(|i| {
            let len = 1 + (i * 37) % 1500;
            (0..len).map(|j| (i * 31 + j * 7 + j / 256) as u8).collect()
        })
        .collect();
    let handles: Vec<_> = data.iter().map(|d| client.create_from_slice(d)).collect();
    let read = client.read(handles.clone());
    assert_eq!(read.len(), count);
    for (i, (got, want)) in read.iter().zip(&data).enumerate() {
        assert_eq!(got.len(), want.len(), "tensor {i}: length");
        assert!(got[..] == want[..], "tensor {i}: bytes differ");
    }
    for (i, handle) in handles.into_iter().enumerate().step_by(97) {
        assert_eq!(
            &*client.read_one(handle).unwrap(),
            &data[i][..],
            "tensor {i} read alone"
        );
    }
}

/// Pageable writes from 200 KiB to 40 MiB (the sizes where a backend stages through pinned memory,
/// in pieces, with whatever stores it picks by size) land exactly: back-to-back writes into one buffer (the later wins), writes from a second stream,
/// and a write after `memory_cleanup` (which may release staging memory).
pub fn large_pageable_writes_land_exact<R: Runtime>(client: ComputeClient<R>) {
    let pattern = |len: usize, seed: usize| -> Vec<u8> {
        (0..len).map(|i| ((i * 131 + seed) % 251) as u8).collect()
    };
    let mut other = client.clone();
    // SAFETY: the stream is fresh and only used from this thread.
    unsafe { other.set_stream(StreamId::fresh()) };
    for (k, len) in [
        (200usize << 10) + 3,
        (1 << 20) + 17,
        3 << 20,
        (17 << 20) + 5,
        40 << 20,
    ]
    .into_iter()
    .enumerate()
    {
        let first = pattern(len, k);
        let second = pattern(len, k + 100);
        let third = pattern(len, k + 200);
        let shared = client.empty(len);
        let mine = other.empty(len);
        client.write(&shared, Bytes::from_vec(first));
        client.write(&shared, Bytes::from_vec(second.clone()));
        other.write(&mine, Bytes::from_vec(third.clone()));
        let got = client.read_one(shared.clone()).unwrap();
        assert_eq!(got.len(), len);
        assert!(
            got[..] == second[..],
            "{len} bytes: the second write must win"
        );
        let got = other.read_one(mine).unwrap();
        assert!(
            got[..] == third[..],
            "{len} bytes written on a second stream differ"
        );
        client.memory_cleanup();
        client.write(&shared, Bytes::from_vec(third.clone()));
        let got = client.read_one(shared).unwrap();
        assert!(
            got[..] == third[..],
            "{len} bytes written after memory_cleanup differ"
        );
    }
}

/// Many small pageable writes back to back, into sub-ranges of one buffer, alternating between
/// two streams now and then: every write lands exact (a backend that stages them through reused
/// host memory must not overwrite bytes still in flight).
pub fn many_small_writes_land_exact<R: Runtime>(client: ComputeClient<R>) {
    const PIECE: usize = 3000;
    const PIECES: usize = 1500;
    let mut other = client.clone();
    // SAFETY: the stream is fresh and only used from this thread.
    unsafe { other.set_stream(StreamId::fresh()) };
    let piece =
        |i: usize| -> Vec<u8> { (0..PIECE).map(|j| ((i * 7 + j * 13) % 253) as u8).collect() };
    let shared = client.empty(PIECE * PIECES);
    let mine = other.empty(PIECE * PIECES);
    for i in 0..PIECES {
        let at = (i * PIECE) as u64;
        let target = shared.clone().range(at, PIECE as u64).unwrap();
        client.write(&target, Bytes::from_vec(piece(i)));
        if i % 97 == 0 {
            let target = mine.clone().range(at, PIECE as u64).unwrap();
            other.write(&target, Bytes::from_vec(piece(i + 1)));
        }
    }
    let got = client.read_one(shared).unwrap();
    assert_eq!(got.len(), PIECE * PIECES);
    for i in 0..PIECES {
        assert!(
            got[i * PIECE..(i + 1) * PIECE] == piece(i)[..],
            "small write {i} differs"
        );
    }
    let got = other.read_one(mine).unwrap();
    for i in (0..PIECES).step_by(97) {
        assert!(
            got[i * PIECE..(i + 1) * PIECE] == piece(i + 1)[..],
            "small write {i} on the second stream differs"
        );
    }
}

/// A burst of pageable writes from 130 KiB to 1 MiB, issued back to back without waiting (a
/// backend may still be copying one on the host while the next is issued), alternating between
/// two streams now and then; some are read back at once from the other stream and then
/// overwritten from it. Every byte lands where it was last written.
pub fn back_to_back_pageable_writes_land_exact<R: Runtime>(client: ComputeClient<R>) {
    const SIZES: [usize; 4] = [(130 << 10) + 5, 300 << 10, (1 << 20) + 1, 520 << 10];
    const WRITES: usize = 48;
    let pattern = |i: usize, len: usize| -> Vec<u8> {
        (0..len).map(|j| ((i * 29 + j * 7) % 249) as u8).collect()
    };
    let mut other = client.clone();
    // SAFETY: the stream is fresh and only used from this thread.
    unsafe { other.set_stream(StreamId::fresh()) };
    let slot = 1 << 20 | 4096;
    let shared = client.empty(slot * WRITES);
    let mut early = Vec::new();
    for i in 0..WRITES {
        let len = SIZES[i % SIZES.len()];
        let target = shared.clone().range((i * slot) as u64, len as u64).unwrap();
        let writer = if i % 5 == 3 { &other } else { &client };
        writer.write(&target, Bytes::from_vec(pattern(i, len)));
        if i % 7 == 0 {
            // Read on the other stream at once: it must wait for the write.
            let reader = if i % 5 == 3 { &client } else { &other };
            early.push((i, reader.read_one(target.clone()).unwrap()));
            // Then overwrite the range from the stream that read it.
            reader.write(&target, Bytes::from_vec(pattern(i + 1000, len)));
        }
    }
    for (i, got) in early {
        let len = SIZES[i % SIZES.len()];
        assert!(
            got[..] == pattern(i, len)[..],
            "write {i} ({len} bytes) read at once from the other stream differs"
        );
    }
    block_on(other.sync()).unwrap();
    let got = client.read_one(shared).unwrap();
    for i in 0..WRITES {
        let len = SIZES[i % SIZES.len()];
        let want = pattern(if i % 7 == 0 { i + 1000 } else { i }, len);
        assert!(
            got[i * slot..i * slot + len] == want[..],
            "write {i} ({len} bytes) differs"
        );
    }
}

/// Large pageable writes each followed at once by a kernel that reads the written buffer, and by
/// allocations and a drop of the previous target: every launch sees its own write's bytes (a
/// backend that finishes a write's transfer after returning must still order it before the
/// launch, and must not give the dropped buffer's memory away under a transfer).
pub fn pageable_writes_feed_launches_in_order<R: Runtime>(client: ComputeClient<R>) {
    const LEN: usize = (1 << 20) / 4 + 3;
    const ROUNDS: usize = 12;
    let x_of =
        |k: usize| -> Vec<f32> { (0..LEN).map(|i| ((i * 7 + k * 13) % 101) as f32).collect() };
    let kernel = crate::kernels::saxpy();
    let y = client.create(Bytes::from_elem_slice(&vec![0f32; LEN]));
    let mut previous = None;
    for k in 0..ROUNDS {
        let x = client.empty(LEN * 4);
        client.write(&x, Bytes::from_elem_slice(&x_of(k)));
        client.launch(
            kernel.clone().into(),
            compute_core::CubeCount::cover(LEN, 256),
            compute_core::KernelArguments::new()
                .buffer(x.clone().binding())
                .buffer(y.clone().binding())
                .scalar(1.0f32),
        );
        // The previous target goes while this round's work may still be queued.
        drop(previous.replace(x));
        let _scratch = client.empty(LEN * 4);
    }
    let got = client.read_one(y).unwrap().to_elems::<f32>();
    for i in [0, 1, 2, LEN / 3, LEN / 2, LEN - 2, LEN - 1] {
        let want: f32 = (0..ROUNDS).map(|k| ((i * 7 + k * 13) % 101) as f32).sum();
        assert_eq!(got[i], want, "y[{i}] after {ROUNDS} writes and launches");
    }
    let total: f64 = got.iter().map(|&v| f64::from(v)).sum();
    let want: f64 = (0..LEN)
        .map(|i| {
            (0..ROUNDS)
                .map(|k| ((i * 7 + k * 13) % 101) as f64)
                .sum::<f64>()
        })
        .sum();
    assert_eq!(total, want, "sum of y");
}
