//! Graph capture and replay.

use compute_core::{Bytes, CaptureError, ComputeClient, Runtime, ServerError, StreamId, block_on};

use crate::kernels;
use crate::util::{f32_bytes, ramp};

/// Capture two launches, refresh the input with `write` between replays, read each result.
pub fn graph_replay_with_refreshed_inputs<R: Runtime>(mut client: ComputeClient<R>) {
    // SAFETY: a dedicated capture stream used by this thread only.
    unsafe { client.set_stream(StreamId::fresh()) };
    let n = 512;
    let kernel = kernels::add_f32(1);
    client.graph_prepare().unwrap();
    let input = client.create(f32_bytes(&ramp(n, 1.0)));
    let ones = client.create(f32_bytes(&vec![1.0; n]));
    let mid = client.empty(n * 4);
    let out = client.empty(n * 4);
    // Warm-up run, outside the capture.
    kernels::launch_binary(&client, &kernel, &input, &ones, &mid, n, 1);
    kernels::launch_binary(&client, &kernel, &mid, &mid, &out, n, 1);
    block_on(client.sync()).unwrap();
    client.start_capture().unwrap();
    kernels::launch_binary(&client, &kernel, &input, &ones, &mid, n, 1);
    kernels::launch_binary(&client, &kernel, &mid, &mid, &out, n, 1);
    let graph = client.stop_capture().unwrap();
    for round in 0..3 {
        let base = round as f32 * 10.0;
        client.write(&input, f32_bytes(&vec![base; n]));
        graph.replay().unwrap();
        let got = client.read_one(out.clone()).unwrap().to_elems::<f32>();
        assert!(
            got.iter().all(|&v| v == (base + 1.0) * 2.0),
            "round {round}: {:?}",
            &got[..4]
        );
    }
    drop(graph);
    block_on(client.sync()).unwrap();
}

/// During a capture, a sync and a fresh allocation are errors; the stream works afterwards.
pub fn capture_rejects_sync_and_fresh_allocation<R: Runtime>(mut client: ComputeClient<R>) {
    // SAFETY: a dedicated capture stream used by this thread only.
    unsafe { client.set_stream(StreamId::fresh()) };
    client.graph_prepare().unwrap();
    let out = client.create(f32_bytes(&[0.0; 4]));
    let err = client.stop_capture().map(drop).unwrap_err();
    let here = client.stream_id();
    assert!(
        matches!(err, ServerError::Capture(CaptureError::NotStarted { stream }) if stream == here),
        "{err:?}"
    );
    client.start_capture().unwrap();
    let err = block_on(client.sync()).unwrap_err();
    assert!(
        matches!(&err, ServerError::Capture(CaptureError::Running { stream, .. }) if *stream == here),
        "{err:?}"
    );
    let err = client.try_empty(123_456).unwrap_err();
    assert!(
        matches!(
            err,
            ServerError::Capture(CaptureError::NeedsAllocation { requested }) if requested >= 123_456
        ),
        "{err:?}"
    );
    assert!(matches!(
        client.read_one(out.clone()),
        Err(ServerError::Capture(CaptureError::Running { .. }))
    ));
    client.launch(
        kernels::fill_f32().into(),
        compute_core::CubeCount::Static(1, 1, 1),
        compute_core::KernelArguments::new()
            .buffer(out.clone().binding())
            .scalar(4.0f32),
    );
    let graph = client.stop_capture().unwrap();
    assert_eq!(
        client.read_one(out.clone()).unwrap().to_elems::<f32>(),
        vec![0.0; 4],
        "captured, not run"
    );
    graph.replay().unwrap();
    assert_eq!(
        client.read_one(out).unwrap().to_elems::<f32>(),
        vec![4.0; 4]
    );
}

/// Writes, reads and a memory cleanup on another stream while a capture runs, right after the
/// capturing stream's own writes: both streams' bytes land exact and the capture is not
/// disturbed (a backend that shares staging memory between streams must not record anything
/// on the capturing stream).
pub fn capture_beside_writes_on_other_streams<R: Runtime>(mut client: ComputeClient<R>) {
    // SAFETY: dedicated streams used by this thread only.
    unsafe { client.set_stream(StreamId::fresh()) };
    let mut other = client.clone();
    // SAFETY: as above.
    unsafe { other.set_stream(StreamId::fresh()) };
    let n = 1024;
    let kernel = kernels::add_f32(1);
    client.graph_prepare().unwrap();
    let input = client.create(f32_bytes(&ramp(n, 1.0)));
    let ones = client.create(f32_bytes(&vec![1.0; n]));
    let out = client.empty(n * 4);
    kernels::launch_binary(&client, &kernel, &input, &ones, &out, n, 1);
    block_on(client.sync()).unwrap();
    // The capturing stream's last command before the capture is a pageable write.
    client.write(&ones, f32_bytes(&vec![2.0; n]));
    client.start_capture().unwrap();
    kernels::launch_binary(&client, &kernel, &input, &ones, &out, n, 1);
    // Small writes and larger ones (a backend may stage those differently).
    for (len, rounds) in [(60_000usize, 40usize), (300_000, 12)] {
        let side = other.empty(len);
        for round in 0..rounds {
            let bytes: Vec<u8> = (0..len).map(|i| ((i + round * 7) % 251) as u8).collect();
            other.write(&side, Bytes::from_vec(bytes.clone()));
            if round % 10 == 9 {
                other.memory_cleanup();
            }
            let got = other.read_one(side.clone()).unwrap();
            assert!(
                got[..] == bytes[..],
                "write {round} of {len} bytes on the other stream differs"
            );
        }
    }
    let graph = client.stop_capture().unwrap();
    graph.replay().unwrap();
    let expected: Vec<f32> = ramp(n, 1.0).iter().map(|v| v + 2.0).collect();
    assert_eq!(client.read_one(out).unwrap().to_elems::<f32>(), expected);
    drop(graph);
    block_on(client.sync()).unwrap();
}

/// Capture, replay, drop every handle and then the graph, sync: the stream's memory in use is
/// back to the figure before the capture at once (no later launch needed to release the
/// buffers the graph bound).
pub fn dropped_graph_frees_its_buffers_at_the_next_sync<R: Runtime>(client: ComputeClient<R>) {
    let client = client.fork_stream();
    let n = 64 * 1024;
    let kernel = kernels::add_f32(1);
    let before = client.stream_memory_usage().unwrap();
    client.graph_prepare().unwrap();
    let input = client.create(f32_bytes(&ramp(n, 1.0)));
    let ones = client.create(f32_bytes(&vec![1.0; n]));
    let mid = client.empty(n * 4);
    let out = client.empty(n * 4);
    kernels::launch_binary(&client, &kernel, &input, &ones, &mid, n, 1);
    kernels::launch_binary(&client, &kernel, &mid, &mid, &out, n, 1);
    block_on(client.sync()).unwrap();
    client.start_capture().unwrap();
    kernels::launch_binary(&client, &kernel, &input, &ones, &mid, n, 1);
    kernels::launch_binary(&client, &kernel, &mid, &mid, &out, n, 1);
    let graph = client.stop_capture().unwrap();
    graph.replay().unwrap();
    let expected: Vec<f32> = ramp(n, 1.0).iter().map(|v| (v + 1.0) * 2.0).collect();
    assert_eq!(
        client.read_one(out.clone()).unwrap().to_elems::<f32>(),
        expected
    );
    let during = client.stream_memory_usage().unwrap();
    assert_eq!(during.bytes_in_use, before.bytes_in_use + 4 * n as u64 * 4);
    // A replay still queued when the graph goes.
    graph.replay().unwrap();
    drop((input, ones, mid, out));
    drop(graph);
    block_on(client.sync()).unwrap();
    let after = client.stream_memory_usage().unwrap();
    assert_eq!(
        (after.number_allocs, after.bytes_in_use),
        (before.number_allocs, before.bytes_in_use),
        "after the sync, the graph's buffers are free: {after:?} (before the capture: {before:?})"
    );
}

/// A graph replayed after every handle it bound but the output was dropped reads the right
/// values: the graph keeps its buffers alive.
pub fn graph_replays_after_its_handles_dropped<R: Runtime>(client: ComputeClient<R>) {
    let forked = client.fork_stream();
    let n = 2048;
    let kernel = kernels::add_f32(1);
    forked.graph_prepare().unwrap();
    let input = forked.create(f32_bytes(&ramp(n, 3.0)));
    let ones = forked.create(f32_bytes(&vec![1.0; n]));
    let mid = forked.empty(n * 4);
    let out = forked.empty(n * 4);
    kernels::launch_binary(&forked, &kernel, &input, &ones, &mid, n, 1);
    kernels::launch_binary(&forked, &kernel, &mid, &mid, &out, n, 1);
    block_on(forked.sync()).unwrap();
    forked.start_capture().unwrap();
    kernels::launch_binary(&forked, &kernel, &input, &ones, &mid, n, 1);
    kernels::launch_binary(&forked, &kernel, &mid, &mid, &out, n, 1);
    let graph = forked.stop_capture().unwrap();
    drop((input, ones, mid));
    let expected: Vec<f32> = ramp(n, 3.0).iter().map(|v| (v + 1.0) * 2.0).collect();
    for round in 0..3 {
        forked.write(&out, f32_bytes(&vec![-1.0; n]));
        graph.replay().unwrap();
        let got = forked.read_one(out.clone()).unwrap().to_elems::<f32>();
        assert_eq!(got, expected, "replay {round}");
    }
}

/// A graph whose kernels depend on each other through whole buffers, through sub-ranges of one
/// buffer and through an in-place update after a read (write-after-read), interleaved with
/// independent kernels: each replay gives exactly the values of the same launches run one by
/// one. (A backend that leaves out barriers between the independent commands of a graph must
/// keep every one that a dependency needs.)
pub fn graph_keeps_every_dependency<R: Runtime>(client: ComputeClient<R>) {
    let client = client.fork_stream();
    let n = 256;
    let kernel = kernels::add_f32(1);
    client.graph_prepare().unwrap();
    let input = client.create(f32_bytes(&ramp(n, 1.0)));
    let ones = client.create(f32_bytes(&vec![1.0; n]));
    let chains: Vec<Vec<_>> = (0..3)
        .map(|_| (0..3).map(|_| client.empty(n * 4)).collect())
        .collect();
    let halves = client.empty(2 * n * 4);
    let lo = halves.clone().range(0, n as u64 * 4).unwrap();
    let hi = halves.clone().range(n as u64 * 4, n as u64 * 4).unwrap();
    let total = client.empty(2 * n * 4);
    let run = || {
        for step in 0..3 {
            for chain in &chains {
                let src = if step == 0 { &input } else { &chain[step - 1] };
                kernels::launch_binary(&client, &kernel, src, &ones, &chain[step], n, 1);
            }
        }
        kernels::launch_binary(&client, &kernel, &chains[0][2], &chains[1][2], &lo, n, 1);
        kernels::launch_binary(&client, &kernel, &chains[2][2], &ones, &hi, n, 1);
        kernels::launch_binary(&client, &kernel, &halves, &halves, &total, 2 * n, 1);
        // In place, after chain 0's second step read it.
        kernels::launch_binary(&client, &kernel, &chains[0][0], &ones, &chains[0][0], n, 1);
    };
    let check = |base: f32, when: &str| {
        let x = |i: usize| base + i as f32;
        let read = client.read(vec![
            chains[0][0].clone(),
            chains[0][1].clone(),
            chains[2][2].clone(),
            total.clone(),
        ]);
        let got: Vec<Vec<f32>> = read.iter().map(|b| b.to_elems::<f32>()).collect();
        for i in 0..n {
            assert_eq!(
                got[0][i],
                x(i) + 2.0,
                "{when}: in-place update, element {i}"
            );
            assert_eq!(
                got[1][i],
                x(i) + 2.0,
                "{when}: read before the in-place update, {i}"
            );
            assert_eq!(got[2][i], x(i) + 3.0, "{when}: third chain, element {i}");
            assert_eq!(
                got[3][i],
                4.0 * x(i) + 12.0,
                "{when}: total of the low half, {i}"
            );
            assert_eq!(
                got[3][n + i],
                2.0 * x(i) + 8.0,
                "{when}: total of the high half, {i}"
            );
        }
    };
    run();
    check(0.0, "plain launches");
    client.start_capture().unwrap();
    run();
    let graph = client.stop_capture().unwrap();
    for round in 1..4 {
        let base = round as f32 * 100.0;
        client.write(
            &input,
            f32_bytes(&ramp(n, 1.0).iter().map(|v| v + base).collect::<Vec<_>>()),
        );
        graph.replay().unwrap();
        if round == 3 {
            // Two replays back to back: the second starts after the first.
            graph.replay().unwrap();
        }
        check(base, &format!("replay {round}"));
    }
    drop(graph);
    block_on(client.sync()).unwrap();
}
