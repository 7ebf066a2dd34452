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
