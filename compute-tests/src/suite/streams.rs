//! Ordering on one stream and across streams, many threads, `exclusive`.

use std::sync::{Arc, Barrier};

use compute_core::{ComputeClient, Runtime, StreamId};

use crate::kernels;
use crate::util::{f32_bytes, ramp, sync};

/// Work on one stream runs in issue order: write, launch, write, launch, read.
pub fn read_after_write_one_stream<R: Runtime>(client: ComputeClient<R>) {
    let n = 4096;
    let a = client.create(f32_bytes(&ramp(n, 1.0)));
    let b = client.create(f32_bytes(&vec![1.0; n]));
    let out = client.empty(n * 4);
    kernels::launch_binary(&client, &kernels::add_f32(1), &a, &b, &out, n, 1);
    client.write(&b, f32_bytes(&vec![10.0; n]));
    kernels::launch_binary(&client, &kernels::add_f32(1), &out, &b, &a, n, 1);
    let result = client.read_one(a).unwrap().to_elems::<f32>();
    let expected: Vec<f32> = (0..n).map(|i| i as f32 + 11.0).collect();
    assert_eq!(result, expected);
}

/// A buffer written on one stream and read on another is ordered by the runtime.
pub fn read_after_write_across_streams<R: Runtime>(client: ComputeClient<R>) {
    let mut producer = client.clone();
    let mut consumer = client;
    // SAFETY: both streams are fresh and only used from this thread.
    unsafe {
        producer.set_stream(StreamId::fresh());
        consumer.set_stream(StreamId::fresh());
    }
    let n = 1 << 14;
    let input = producer.create(f32_bytes(&ramp(n, 1.0)));
    let out = producer.empty(n * 4);
    kernels::launch_slow_add(&producer, &input, &out, n, 2000);
    // No sync: the consumer's read must wait for the producer's kernel.
    let result = consumer.read_one(out.clone()).unwrap().to_elems::<f32>();
    let expected: Vec<f32> = (0..n).map(|i| i as f32 + 2000.0).collect();
    assert_eq!(result, expected);
    // And the other way round: the consumer writes, the producer launches on it.
    consumer.write(&input, f32_bytes(&vec![1.0; n]));
    kernels::launch_slow_add(&producer, &input, &out, n, 3);
    let result = producer.read_one(out).unwrap().to_elems::<f32>();
    assert!(result.iter().all(|&v| v == 4.0));
}

/// Eight threads, each on its own stream, hammer one device; every result is exact.
pub fn eight_threads_hammer_one_device<R: Runtime>(client: ComputeClient<R>) {
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let client = client.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let kernel = kernels::add_f32(1);
                for round in 0..50 {
                    let n = 257 + t * 31 + round;
                    let a = client.create(f32_bytes(&ramp(n, t as f32 + 1.0)));
                    let b = client.create(f32_bytes(&vec![round as f32; n]));
                    let out = client.empty(n * 4);
                    kernels::launch_binary(&client, &kernel, &a, &b, &out, n, 1);
                    let got = client.read_one(out).unwrap().to_elems::<f32>();
                    for (i, v) in got.iter().enumerate() {
                        assert_eq!(*v, i as f32 * (t as f32 + 1.0) + round as f32);
                    }
                }
                client.flush().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a hammering thread failed");
    }
}

/// `exclusive` keeps other threads' work out while its task runs.
pub fn exclusive_keeps_others_out<R: Runtime>(client: ComputeClient<R>) {
    let shared = client.create(f32_bytes(&[0.0]));
    let started = Arc::new(Barrier::new(2));
    let intruder = {
        let client = client.clone();
        let shared = shared.clone();
        let started = started.clone();
        std::thread::spawn(move || {
            started.wait();
            client.write(&shared, f32_bytes(&[2.0]));
            sync(&client);
        })
    };
    let seen = client
        .exclusive(|| {
            client.write(&shared, f32_bytes(&[1.0]));
            started.wait();
            std::thread::sleep(std::time::Duration::from_millis(100));
            client.read_one(shared.clone()).unwrap().to_elems::<f32>()[0]
        })
        .unwrap();
    assert_eq!(
        seen, 1.0,
        "another thread's write landed inside the exclusive task"
    );
    intruder.join().unwrap();
    assert_eq!(
        client.read_one(shared).unwrap().to_elems::<f32>(),
        vec![2.0]
    );
}

/// 100 graph capture rounds, each on a forked stream (sizes varying), every handle, graph and
/// forked client dropped: the device's reserved memory (on a server of its own, so that no other
/// test's streams count) is back to the starting figure — each forked stream was retired.
pub fn forked_capture_rounds_return_reserved_memory<R: Runtime>(client: ComputeClient<R>) {
    let iso = ComputeClient::<R>::isolated(&R::Device::default()).unwrap();
    drop(client);
    let start = iso.memory_usage().unwrap();
    let kernel = kernels::add_f32(1);
    for round in 0..100 {
        let n = 1024 * (1 + round % 4);
        let forked = iso.fork_stream();
        forked.graph_prepare().unwrap();
        let input = forked.create(f32_bytes(&ramp(n, round as f32)));
        let ones = forked.create(f32_bytes(&vec![1.0; n]));
        let out = forked.empty(n * 4);
        kernels::launch_binary(&forked, &kernel, &input, &ones, &out, n, 1);
        sync(&forked);
        forked.start_capture().unwrap();
        kernels::launch_binary(&forked, &kernel, &input, &ones, &out, n, 1);
        let graph = forked.stop_capture().unwrap();
        forked.write(&out, f32_bytes(&vec![0.0; n]));
        graph.replay().unwrap();
        let got = forked.read_one(out.clone()).unwrap().to_elems::<f32>();
        let expected: Vec<f32> = ramp(n, round as f32).iter().map(|v| v + 1.0).collect();
        assert_eq!(got, expected, "round {round}");
        drop((input, ones, out));
        drop(graph);
        drop(forked);
    }
    let end = iso.memory_usage().unwrap();
    assert_eq!(
        (end.number_allocs, end.bytes_in_use, end.bytes_reserved),
        (
            start.number_allocs,
            start.bytes_in_use,
            start.bytes_reserved
        ),
        "after 100 forked capture rounds: {end:?}, at the start: {start:?}"
    );
}

/// 64 short-lived threads, each making a 1 KiB buffer on its default stream, reading it back
/// and exiting: the device's reserved memory does not grow with the thread count (each thread's
/// stream is retired when it exits).
pub fn short_lived_threads_do_not_grow_reserved_memory<R: Runtime>(client: ComputeClient<R>) {
    let iso = ComputeClient::<R>::isolated(&R::Device::default()).unwrap();
    drop(client);
    let one_thread = |i: usize| {
        let c = iso.clone();
        std::thread::spawn(move || {
            let data: Vec<u8> = (0..1024).map(|j| ((i + j) % 251) as u8).collect();
            let h = c.create(compute_core::Bytes::from_slice(&data));
            assert_eq!(c.read_one(h).unwrap().to_vec(), data, "thread {i}");
        })
        .join()
        .unwrap();
    };
    one_thread(0);
    let after_one = iso.memory_usage().unwrap();
    for batch in 0..8 {
        let threads: Vec<_> = (0..8)
            .map(|k| {
                let c = iso.clone();
                let i = 1 + batch * 8 + k;
                std::thread::spawn(move || {
                    let data: Vec<u8> = (0..1024).map(|j| ((i + j) % 251) as u8).collect();
                    let h = c.create(compute_core::Bytes::from_slice(&data));
                    assert_eq!(c.read_one(h).unwrap().to_vec(), data, "thread {i}");
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
    let after_all = iso.memory_usage().unwrap();
    assert_eq!(
        (after_all.number_allocs, after_all.bytes_reserved),
        (after_one.number_allocs, after_one.bytes_reserved),
        "after 64 more threads: {after_all:?}; after one: {after_one:?}"
    );
}

/// `memory_cleanup` from one stream frees the free pages of every stream of the device.
pub fn memory_cleanup_reaches_every_stream<R: Runtime>(client: ComputeClient<R>) {
    let iso = ComputeClient::<R>::isolated(&R::Device::default()).unwrap();
    drop(client);
    let other = iso.fork_stream();
    let handles: Vec<_> = (0..8).map(|i| other.empty(4096 * (i + 1))).collect();
    drop(other.create(f32_bytes(&vec![2.0; 1 << 18])));
    drop(handles);
    sync(&other);
    let before = other.stream_memory_usage().unwrap();
    assert_eq!(before.number_allocs, 0);
    assert!(before.bytes_reserved > 0);
    // From the isolated client's (this thread's) stream, not `other`'s.
    iso.memory_cleanup();
    let after = other.stream_memory_usage().unwrap();
    assert_eq!(
        after.bytes_reserved, 0,
        "cleanup from another stream left {} of {} bytes reserved",
        after.bytes_reserved, before.bytes_reserved
    );
    let h = other.create(f32_bytes(&[1.0; 256]));
    assert_eq!(other.read_one(h).unwrap().to_elems::<f32>(), vec![1.0; 256]);
}
