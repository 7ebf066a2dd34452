//! CPU rows: each against hand-written Rust doing the same work in the same run.

use std::sync::mpsc;
use std::time::Duration;

use compute::cpu::{CpuDevice, CpuKernel, CpuRuntime, CpuStorage};
use compute_core::kernel::{KernelBuilder, kernel};
use compute_core::storage::ComputeStorage;
use compute_core::{Bytes, ComputeClient, CubeCount, KernelArguments, block_on};

use super::timing::{best_per_call, calibrate, progress};
use super::{Better, Row};

const BACKEND: &str = "cpu";

/// Every CPU row whose name contains `filter`.
pub fn run(filter: &str) -> Vec<Row> {
    let client = ComputeClient::<CpuRuntime>::load(&CpuDevice::default());
    let mut rows = Vec::new();
    let wanted = |name: &str| name.contains(filter);
    if wanted("alloc") {
        progress("cpu allocation fast path");
        rows.push(allocation(&client));
    }
    if wanted("bandwidth") {
        progress("cpu create+read bandwidth (64 MiB)");
        rows.push(create_read_bandwidth(&client));
    }
    if wanted("launch") {
        progress("cpu launch latency");
        rows.extend(launch(&client));
    }
    if wanted("contention") {
        progress("cpu server lock under 16 threads");
        rows.push(contended_launches(&client));
    }
    if wanted("kept kernel launch") {
        progress("cpu kept kernel launch, generic vs backend-specific");
        let out = client.empty(4 * 256);
        let kernel: CpuKernel = super::kept::definition().into();
        let args = super::kept::arguments(&out);
        let mut specific = |n: usize| {
            for _ in 0..n {
                client.launch(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone());
            }
        };
        rows.extend(super::kept::rows(BACKEND, &client, &out, &mut specific));
    }
    if wanted("graph") {
        progress("cpu graph replay vs plain launches");
        rows.extend(super::graph::rows(BACKEND, &client));
    }
    if wanted("all_reduce") {
        progress("cpu all_reduce over 2 processes vs 2 devices of one process (4 MiB)");
        rows.push(all_reduce_processes());
    }
    rows.extend(super::cpu_kernels::run(&client, filter));
    rows
}

/// The option that makes the bench binary run one rank of [`all_reduce_processes`].
pub const WORLD_RANK_OPTION: &str = "--world-all-reduce";

const ALL_REDUCE_BYTES: usize = 4 << 20;
const ALL_REDUCE_ITERS: usize = 10;

/// All-reduce (Sum, f32) of 4 MiB across 2 processes (host-staged over loopback TCP, through
/// rank 0), against the same data reduced by 2 CPU devices of one process (host memory).
fn all_reduce_processes() -> Row {
    use compute_core::collective::launch::{Launch, launch};
    let exe = std::env::current_exe().expect("the bench binary's path");
    let (bytes, iters) = (ALL_REDUCE_BYTES.to_string(), ALL_REDUCE_ITERS.to_string());
    let mut spec = Launch::new(2, exe, &[WORLD_RANK_OPTION, &bytes, &iters]);
    spec.rendezvous_timeout = Duration::from_secs(30);
    spec.deadline = Duration::from_secs(120);
    spec.env.push(("COMPUTE_CPU_DEVICES".into(), "1".into()));
    let out = launch(&spec).expect("starting the bench ranks");
    assert!(
        out.success(),
        "all_reduce bench ranks failed:\n{}",
        out.summary()
    );
    let ours: f64 = out.ranks[0]
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("all_reduce_seconds="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("rank 0 printed no time: {:?}", out.ranks[0].stdout));

    // Baseline: two devices of this process, each driven by its own thread.
    let ids = vec![
        compute_core::DeviceId::new(compute::cpu::CPU_DEVICE_TYPE, 0),
        compute_core::DeviceId::new(compute::cpu::CPU_DEVICE_TYPE, 1),
    ];
    let threads: Vec<_> = (0..2u32)
        .map(|d| {
            let ids = ids.clone();
            std::thread::spawn(move || {
                let mut c = ComputeClient::<CpuRuntime>::load(&CpuDevice::new(d));
                c.ensure_init_collective(ids.clone());
                let src = c.create(Bytes::from_elems(vec![1.0f32; ALL_REDUCE_BYTES / 4]));
                let dst = c.empty(ALL_REDUCE_BYTES);
                let mut round = || {
                    c.all_reduce(
                        src.clone(),
                        dst.clone(),
                        compute_core::ElemType::F32,
                        ids.clone(),
                        compute_core::ReduceOperation::Sum,
                    );
                    c.sync_collective();
                    c.flush().expect("in-process all_reduce");
                };
                round();
                let mut best = f64::INFINITY;
                for _ in 0..3 {
                    let start = std::time::Instant::now();
                    for _ in 0..ALL_REDUCE_ITERS {
                        round();
                    }
                    best = best.min(start.elapsed().as_secs_f64() / ALL_REDUCE_ITERS as f64);
                }
                let got = c.read_one(dst).expect("read").to_elems::<f32>();
                assert!(got.iter().all(|&v| v == 2.0), "in-process sum wrong");
                best
            })
        })
        .collect();
    let times: Vec<f64> = threads
        .into_iter()
        .map(|t| t.join().expect("baseline thread"))
        .collect();
    let baseline = times[0];
    let ms = 1e3;
    Row::new(
        BACKEND,
        "all_reduce 4 MiB f32, 2 processes (TCP via rank 0)",
        ours * ms,
        "ms",
        "same data, 2 devices of one process",
        baseline * ms,
        Better::Lower,
    )
}

fn allocation(client: &ComputeClient<CpuRuntime>) -> Row {
    let size = 4096;
    let iters = 20_000;
    // Warm the pool so the loop measures the steady state.
    drop(client.empty(size));
    block_on(client.sync()).expect("sync");
    let ours = best_per_call(5, iters, || drop(client.empty(size)));
    let mut storage = CpuStorage::new();
    let raw = best_per_call(5, iters, || {
        let h = storage.alloc(size as u64).expect("host allocation");
        storage.dealloc(h.id);
    });
    Row::new(
        BACKEND,
        "alloc fast path (4 KiB reserve+free)",
        1.0 / ours,
        "pairs/s",
        "raw storage alloc+dealloc",
        1.0 / raw,
        Better::Higher,
    )
}

fn create_read_bandwidth(client: &ComputeClient<CpuRuntime>) -> Row {
    let size = 64 << 20;
    let reps = 5;
    let src: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let mut inputs: Vec<Bytes> = (0..reps + 1).map(|_| Bytes::from_slice(&src)).collect();
    // Warm-up: the pool holds a 64 MiB slice afterwards.
    let h = client.create(inputs.pop().expect("input"));
    let check = client.read_one(h).expect("read");
    assert_eq!(&check[..1024], &src[..1024]);
    drop(check);
    let ours = best_per_call(reps, 1, || {
        let h = client.create(inputs.pop().expect("input"));
        let out = client.read_one(h).expect("read");
        assert_eq!(out.len(), size);
    });
    let mut dst = vec![0u8; size];
    let raw = best_per_call(reps, 1, || {
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
    });
    let gb = |secs: f64, bytes: usize| bytes as f64 / secs / 1e9;
    Row::new(
        BACKEND,
        "create+read 64 MiB (2 copies)",
        gb(ours, 2 * size),
        "GB/s",
        "memcpy 64 MiB",
        gb(raw, size),
        Better::Higher,
    )
}

/// Does nothing: the launch-overhead probe.
#[kernel(cube_dim = 1)]
fn empty(out: &mut [f32]) {}

fn launch(client: &ComputeClient<CpuRuntime>) -> Vec<Row> {
    let kernel: CpuKernel = empty::definition().clone().into();
    let buffer = client.empty(4);
    let args = KernelArguments::new().buffer(buffer.binding());
    let launch_once = || client.launch(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone());
    launch_once();
    block_on(client.sync()).expect("sync");

    let iters = calibrate(Duration::from_millis(100), || {
        launch_once();
        block_on(client.sync()).expect("sync");
    });
    let latency = best_per_call(5, iters, || {
        launch_once();
        block_on(client.sync()).expect("sync");
    });
    // Host cost: the enqueue loop alone; the sync that drains it is outside the timed region.
    let host_iters = 10_000;
    let mut host = f64::INFINITY;
    for _ in 0..5 {
        let start = std::time::Instant::now();
        for _ in 0..host_iters {
            launch_once();
        }
        host = host.min(start.elapsed().as_secs_f64() / host_iters as f64);
        block_on(client.sync()).expect("sync");
    }

    // Baseline: the same worker-thread round trip written by hand with std channels.
    let (tx, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
    let worker = std::thread::spawn(move || {
        while let Ok(job) = rx.recv() {
            job();
        }
    });
    let round_trip = || {
        let (done_tx, done_rx) = mpsc::channel::<()>();
        tx.send(Box::new(move || {
            let _ = done_tx.send(());
        }))
        .expect("worker alive");
        done_rx.recv().expect("worker replied");
    };
    let raw_latency = best_per_call(5, iters, round_trip);
    let mut raw_host = f64::INFINITY;
    for _ in 0..5 {
        let start = std::time::Instant::now();
        for _ in 0..host_iters {
            tx.send(Box::new(|| {})).expect("worker alive");
        }
        raw_host = raw_host.min(start.elapsed().as_secs_f64() / host_iters as f64);
        round_trip();
    }
    drop(tx);
    worker.join().expect("baseline worker");
    let us = 1e6;
    vec![
        Row::new(
            BACKEND,
            "empty kernel launch+sync latency",
            latency * us,
            "us",
            "raw worker-thread round trip",
            raw_latency * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch host cost",
            host * us,
            "us",
            "raw channel send of a boxed job",
            raw_host * us,
            Better::Lower,
        ),
    ]
}

/// The server lock under contention: 16 threads launching through one shared client (each on its
/// own stream), against the same number of launches issued from one thread. A lock that spins
/// while its holder is descheduled makes the 16-thread figure collapse on a machine with fewer
/// cores than threads; a lock that parks keeps it near the one-thread rate.
fn contended_launches(client: &ComputeClient<CpuRuntime>) -> Row {
    const THREADS: usize = 16;
    const PER_THREAD: usize = 2_000;
    let mut k = KernelBuilder::new("empty_contended", [1, 1, 1]);
    let _ = k.output("out", compute_core::ElemType::F32, 1);
    let kernel: CpuKernel = k.build().expect("empty kernel").into();
    let buffer = client.empty(4);
    let args = KernelArguments::new().buffer(buffer.binding());
    let launch_once = |c: &ComputeClient<CpuRuntime>| {
        c.launch(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone())
    };
    launch_once(client);
    block_on(client.sync()).expect("sync");
    let mut one = f64::INFINITY;
    let mut many = f64::INFINITY;
    for _ in 0..3 {
        let start = std::time::Instant::now();
        for _ in 0..THREADS * PER_THREAD {
            launch_once(client);
        }
        block_on(client.sync()).expect("sync");
        one = one.min(start.elapsed().as_secs_f64());
        let start = std::time::Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    let c = client.clone();
                    for _ in 0..PER_THREAD {
                        launch_once(&c);
                    }
                    block_on(c.sync()).expect("sync");
                });
            }
        });
        many = many.min(start.elapsed().as_secs_f64());
    }
    let per_s = |secs: f64| (THREADS * PER_THREAD) as f64 / secs;
    Row::new(
        BACKEND,
        "16 threads x 2000 launches on one client (server lock contention)",
        per_s(many),
        "launches/s",
        "the same 32000 launches from one thread",
        per_s(one),
        Better::Higher,
    )
}
