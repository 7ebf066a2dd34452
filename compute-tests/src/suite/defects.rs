//! Backend defects found by the bad-input and honest-suite issues: partial writes at any offset,
//! an indirect cube count over the device's limit, graphs replayed after their inputs were
//! dropped, and the largest single buffer a device reports.

use compute_core::error::LaunchError;
use compute_core::{
    Bytes, ComputeClient, CubeCount, KernelArguments, Runtime, ServerError, StreamId, block_on,
};

use crate::kernels;
use crate::util::{f32_bytes, ramp, sync};

/// A byte pattern with no two equal neighbours, so that a shifted or dropped byte shows.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| seed.wrapping_add((i as u8).wrapping_mul(37)))
        .collect()
}

/// A write of any length at any byte offset changes exactly the bytes given: every length of
/// 1..=7 bytes at every offset 0..=7 into a patterned buffer, the same into `range(60, 4)` of a
/// 64-byte buffer, and an odd-length write into a whole handle; every byte is checked, and a
/// buffer made before reads back unchanged.
pub fn writes_change_exactly_their_bytes<R: Runtime>(client: ComputeClient<R>) {
    let before_data = pattern(40, 0x11);
    let before = client.create(Bytes::from_vec(before_data.clone()));
    let size = 16usize;
    let base = pattern(size, 0xA0);
    let handle = client.create(Bytes::from_vec(base.clone()));
    for len in 1..=7usize {
        for offset in 0..=7usize {
            client.write(&handle, Bytes::from_vec(base.clone()));
            let data = pattern(len, 0x05 + (len * 8 + offset) as u8);
            let sub = handle.clone().range(offset as u64, len as u64).unwrap();
            client.write(&sub, Bytes::from_vec(data.clone()));
            let got = client.read_one(handle.clone()).unwrap().to_vec();
            let mut want = base.clone();
            want[offset..offset + len].copy_from_slice(&data);
            assert_eq!(got, want, "{len} bytes at offset {offset}");
        }
    }
    // Two bytes into the last four of a 64-byte buffer: bytes 62 and 63 keep their values.
    let wide = pattern(64, 0x30);
    let big = client.create(Bytes::from_vec(wide.clone()));
    let tail = big.clone().range(60, 4).unwrap();
    client.write(&tail, Bytes::from_vec(vec![0xEE, 0xEF]));
    let mut want = wide.clone();
    want[60] = 0xEE;
    want[61] = 0xEF;
    assert_eq!(client.read_one(big.clone()).unwrap().to_vec(), want);
    // One byte at the very end of the buffer, then at an odd offset in the middle.
    client.write(
        &big.clone().range(63, 1).unwrap(),
        Bytes::from_vec(vec![0x01]),
    );
    want[63] = 0x01;
    client.write(
        &big.clone().range(33, 3).unwrap(),
        Bytes::from_vec(vec![0x02, 0x03, 0x04]),
    );
    want[33..36].copy_from_slice(&[0x02, 0x03, 0x04]);
    assert_eq!(client.read_one(big).unwrap().to_vec(), want);
    // Five bytes into an 8-byte handle: bytes 5..8 keep their values.
    let eight = pattern(8, 0x70);
    let h8 = client.create(Bytes::from_vec(eight.clone()));
    client.write(&h8, Bytes::from_vec(vec![1, 2, 3, 4, 5]));
    let mut want = eight;
    want[..5].copy_from_slice(&[1, 2, 3, 4, 5]);
    assert_eq!(client.read_one(h8).unwrap().to_vec(), want);
    assert_eq!(client.read_one(before).unwrap().to_vec(), before_data);
    client.flush().unwrap();
}

/// A dynamic cube count over `max_cube_count` runs nothing and queues
/// `LaunchError::CubeCountTooLarge` with the count read and the limit; the client goes on
/// working, and the buffers read back unchanged.
///
/// On a server of its own, so that nothing else on the device shares its error queue (before
/// the guard's errors were kept per stream, a sync of another test on the shared wgpu server
/// took this test's over-limit second axis on an H100).
pub fn over_limit_dynamic_count_is_an_error<R: Runtime>(client: ComputeClient<R>) {
    drop(client);
    let client = ComputeClient::<R>::isolated(&R::Device::default()).unwrap();
    let maximum = client.properties().hardware.max_cube_count;
    if maximum[0] == u32::MAX {
        // Nothing over the limit can be written in a u32 count: the error path cannot be
        // reached, so the test is counted as skipped (with this reason), not as passed. What
        // can still be checked here: a dynamic count is read (a zero count dispatches nothing).
        compute_core::env::report_reduced(&format!(
            "{}: no u32 count exceeds max_cube_count {maximum:?} on {}; the over-limit error could not be provoked",
            R::name(),
            client.properties().name
        ));
        let count = client.create(Bytes::from_elems(vec![0u32, 1, 1]));
        let out = client.create(f32_bytes(&[7.0; 4]));
        client.launch(
            kernels::fill_f32().into(),
            CubeCount::Dynamic(count.binding()),
            KernelArguments::new()
                .buffer(out.clone().binding())
                .scalar(3.0f32),
        );
        assert_eq!(
            client.read_one(out).unwrap().to_elems::<f32>(),
            vec![7.0; 4],
            "a zero dynamic count dispatches nothing"
        );
        return;
    }
    let before_data = ramp(64, 1.0);
    let before = client.create(f32_bytes(&before_data));
    let n = kernels::CUBE_DIM as usize * 2;
    let out = client.create(f32_bytes(&vec![0.0; n]));
    let over = [u32::MAX, 1, 1];
    let count = client.create(Bytes::from_elems(over.to_vec()));
    client.launch(
        kernels::fill_f32().into(),
        CubeCount::Dynamic(count.binding()),
        KernelArguments::new()
            .buffer(out.clone().binding())
            .scalar(3.0f32),
    );
    let err = block_on(client.sync()).unwrap_err();
    assert_eq!(
        err,
        ServerError::Launch(LaunchError::CubeCountTooLarge {
            count: over,
            maximum
        })
    );
    assert_eq!(
        client.read_one(out.clone()).unwrap().to_elems::<f32>(),
        vec![0.0; n],
        "an over-limit dynamic count dispatches nothing"
    );
    assert_eq!(
        client.read_one(before).unwrap().to_elems::<f32>(),
        before_data
    );
    // A read reports it too (here an over-limit second axis).
    if maximum[1] == u32::MAX {
        compute_core::env::report_reduced(&format!(
            "{}: max_cube_count[1] is u32::MAX on {}; the over-limit second axis was not checked",
            R::name(),
            client.properties().name
        ));
    } else {
        let over = [1, maximum[1] + 1, 1];
        let count = client.create(Bytes::from_elems(over.to_vec()));
        client.launch(
            kernels::fill_f32().into(),
            CubeCount::Dynamic(count.binding()),
            KernelArguments::new()
                .buffer(out.clone().binding())
                .scalar(4.0f32),
        );
        assert_eq!(
            client.read_one(out.clone()).unwrap_err(),
            ServerError::Launch(LaunchError::CubeCountTooLarge {
                count: over,
                maximum
            })
        );
        assert_eq!(
            client.read_one(out.clone()).unwrap().to_elems::<f32>(),
            vec![0.0; n]
        );
    }
    // Each error was reported once; a count within the limit then runs.
    let count = client.create(Bytes::from_elems(vec![1u32, 1, 1]));
    client.launch(
        kernels::fill_f32().into(),
        CubeCount::Dynamic(count.binding()),
        KernelArguments::new()
            .buffer(out.clone().binding())
            .scalar(5.0f32),
    );
    let got = client.read_one(out).unwrap().to_elems::<f32>();
    let covered = kernels::CUBE_DIM as usize;
    assert!(got[..covered].iter().all(|&v| v == 5.0), "{:?}", &got[..4]);
    assert!(got[covered..].iter().all(|&v| v == 0.0));
    sync(&client);
}

/// An over-limit dynamic count's error reaches the stream that launched it, once: a sync and a
/// read of another stream of the same server in between succeed. (wgpu reads its guard status,
/// one buffer per server, from whichever stream syncs first: the error went to that stream.)
pub fn dynamic_count_error_reaches_its_own_stream<R: Runtime>(client: ComputeClient<R>) {
    drop(client);
    let own = ComputeClient::<R>::isolated(&R::Device::default()).unwrap();
    let maximum = own.properties().hardware.max_cube_count;
    if maximum[0] == u32::MAX {
        compute_core::env::report_reduced(&format!(
            "{}: no u32 count exceeds max_cube_count {maximum:?} on {}; the over-limit error could not be provoked",
            R::name(),
            own.properties().name
        ));
        return;
    }
    let (mut a, mut b) = (own.clone(), own);
    // SAFETY: two fresh streams, each used by this thread only.
    unsafe {
        a.set_stream(StreamId::fresh());
        b.set_stream(StreamId::fresh());
    }
    let out_b = b.create(f32_bytes(&[1.0; 4]));
    sync(&b);
    let over = [maximum[0] + 1, 1, 1];
    let count = a.create(Bytes::from_elems(over.to_vec()));
    let out_a = a.create(f32_bytes(&[7.0; 64]));
    a.launch(
        kernels::fill_f32().into(),
        CubeCount::Dynamic(count.binding()),
        KernelArguments::new()
            .buffer(out_a.clone().binding())
            .scalar(3.0f32),
    );
    // A backend that reads the count on the host (CUDA) has the error at the launch, and this
    // flush reports it; one that checks it on the device reports it from the sync below.
    let flushed = a.flush();
    assert_eq!(block_on(b.sync()), Ok(()), "another stream's sync");
    assert_eq!(
        b.read_one(out_b).unwrap().to_elems::<f32>(),
        vec![1.0; 4],
        "another stream's read"
    );
    let synced = block_on(a.sync());
    assert_eq!(
        [flushed.err(), synced.err()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>(),
        vec![ServerError::Launch(LaunchError::CubeCountTooLarge {
            count: over,
            maximum
        })],
        "the launching stream's flush and sync: the error, once"
    );
    assert_eq!(
        a.read_one(out_a).unwrap().to_elems::<f32>(),
        vec![7.0; 64],
        "nothing ran, and the error was reported once"
    );
}

/// A graph keeps the buffers it recorded: replayed after its input's handle was dropped and new
/// buffers of the same size (with other data) were made, it computes from the recorded input.
pub fn graph_keeps_recorded_buffers_alive<R: Runtime>(mut client: ComputeClient<R>) {
    if !client.features().graphs {
        compute_core::env::report_reduced(&format!(
            "{} has no graphs ({}): a recorded graph's buffers could not be checked",
            R::name(),
            client.properties().name
        ));
        let err = client.start_capture().unwrap_err();
        assert!(
            crate::suite::ir_util::is_unsupported_error(&err),
            "no graphs, yet start_capture gave {err:?}"
        );
        return;
    }
    // SAFETY: a dedicated capture stream used by this thread only.
    unsafe { client.set_stream(StreamId::fresh()) };
    let n = 512;
    let kernel = kernels::add_f32(1);
    client.graph_prepare().unwrap();
    let input = client.create(f32_bytes(&ramp(n, 1.0)));
    let ones = client.create(f32_bytes(&vec![1.0; n]));
    let out = client.empty(n * 4);
    kernels::launch_binary(&client, &kernel, &input, &ones, &out, n, 1);
    block_on(client.sync()).unwrap();
    client.start_capture().unwrap();
    kernels::launch_binary(&client, &kernel, &input, &ones, &out, n, 1);
    let graph = client.stop_capture().unwrap();
    drop(input);
    block_on(client.sync()).unwrap();
    // New buffers of the input's size, in the pool the input came from (a freed slice would be
    // handed to the first of them) and in the default one.
    client.graph_prepare().unwrap();
    let others: Vec<_> = (0..4)
        .map(|_| client.create(f32_bytes(&vec![-100.0; n])))
        .collect();
    block_on(client.sync()).unwrap();
    for round in 0..2 {
        graph.replay().unwrap();
        let got = client.read_one(out.clone()).unwrap().to_elems::<f32>();
        let want: Vec<f32> = ramp(n, 1.0).iter().map(|v| v + 1.0).collect();
        assert_eq!(got, want, "round {round}: the graph read another buffer");
    }
    for other in others {
        assert_eq!(
            client.read_one(other).unwrap().to_elems::<f32>(),
            vec![-100.0; n]
        );
    }
    drop(graph);
    block_on(client.sync()).unwrap();
}

/// The reported largest single buffer (`max_page_size`) allocates, and one byte more is
/// `BufferTooLarge` (not `OutOfMemory`), with the client still working.
pub fn largest_buffer_allocates<R: Runtime>(client: ComputeClient<R>) {
    let props = client.properties().clone();
    let max = props.memory.max_page_size;
    let before = client.create(f32_bytes(&[1.0, 2.0, 3.0]));
    match usize::try_from(max + 1).map(|size| client.try_empty(size)) {
        Ok(Err(ServerError::BufferTooLarge { requested, maximum })) => {
            assert_eq!(maximum, max);
            assert!(requested > max, "{requested} <= {max}");
        }
        Ok(other) => panic!("{} bytes (max_page_size + 1): {other:?}", max + 1),
        Err(_) => compute_core::env::report_reduced(&format!(
            "{}: max_page_size + 1 = {} bytes does not fit a usize; the BufferTooLarge case was not checked",
            R::name(),
            max + 1
        )),
    }
    // A buffer of the whole memory cannot be had beside everything else the device holds.
    let fits = props.memory_total.is_none_or(|total| max <= total / 4 * 3);
    if !fits {
        compute_core::env::report_reduced(&format!(
            "{}: max_page_size ({max} bytes) is more than 3/4 of memory_total ({:?} bytes) on {}; the allocation at max_page_size was not tried",
            R::name(),
            props.memory_total,
            props.name
        ));
    } else {
        let handle = client
            .try_empty(max as usize)
            .unwrap_or_else(|e| panic!("max_page_size = {max} bytes: {e:?}"));
        eprintln!("allocated max_page_size = {max} bytes on {}", props.name);
        assert_eq!(handle.size(), max);
        let end = handle.clone().range(max - 7, 7).unwrap();
        let data = pattern(7, 0x42);
        client.write(&end, Bytes::from_vec(data.clone()));
        assert_eq!(client.read_one(end).unwrap().to_vec(), data);
        drop(handle);
        client.memory_cleanup();
    }
    assert_eq!(
        client.read_one(before).unwrap().to_elems::<f32>(),
        vec![1.0, 2.0, 3.0]
    );
    client.flush().unwrap();
}
