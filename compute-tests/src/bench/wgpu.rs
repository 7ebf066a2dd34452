//! wgpu rows: each against raw wgpu doing the same work in the same run, on its own device of the
//! same adapter.

use compute::wgpu::compiler::{ShaderCapabilities, compile};
use compute::wgpu::{WgpuDevice, WgpuKernel, WgpuRuntime, wgpu};
use compute_core::kernel::{KernelDefinition, kernel};
use compute_core::{Bytes, ComputeClient, CubeCount, KernelArguments, block_on};

use std::time::Instant;

use super::timing::{best_per_call, progress};
use super::{Better, Row};

const BACKEND: &str = "wgpu";

/// Every wgpu row whose name contains `filter` (none when wgpu has no adapter here).
pub fn run(filter: &str) -> Vec<Row> {
    if let Err(reason) = compute::wgpu::availability() {
        eprintln!("bench: wgpu unavailable: {reason}");
        return Vec::new();
    }
    let client = ComputeClient::<WgpuRuntime>::load(&WgpuDevice::default());
    let (device, queue) = match compute::wgpu::raw_device(WgpuDevice::default()) {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("bench: raw wgpu device: {e}");
            return Vec::new();
        }
    };
    let raw = Raw { device, queue };
    let mut rows = Vec::new();
    let wanted = |name: &str| name.contains(filter);
    if wanted("launch") {
        progress("wgpu launch latency and host cost");
        rows.extend(launch(&client, &raw));
    }
    if wanted("tail ablation") {
        progress("wgpu launch+sync tail ablation: raw wgpu with our threads around it");
        rows.extend(tail_ablation(&raw));
    }
    if wanted("kept kernel launch") {
        progress("wgpu kept kernel launch, generic vs backend-specific");
        let out = client.empty(4 * 256);
        let kernel: WgpuKernel = super::kept::definition().into();
        let args = super::kept::arguments(&out);
        let mut specific = |n: usize| {
            for _ in 0..n {
                client.launch(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone());
            }
        };
        rows.extend(super::kept::rows("wgpu", &client, &out, &mut specific));
    }
    if wanted("graph") {
        progress("wgpu graph replay vs plain launches");
        rows.extend(super::graph::rows("wgpu", &client));
    }
    if wanted("bandwidth") {
        progress("wgpu copy kernel, upload and readback bandwidth (64 MiB)");
        rows.extend(bandwidth(&client, &raw));
    }
    if wanted("write") {
        progress("wgpu unaligned partial write + sync");
        rows.push(unaligned_write(&client));
    }
    rows
}

/// A 5-byte write at byte offset 1 (its head and tail words are merged with the buffer's
/// contents: one device round trip) against an aligned 8-byte write (`queue.write_buffer`
/// straight), each followed by a sync.
fn unaligned_write(client: &ComputeClient<WgpuRuntime>) -> Row {
    let handle = client.create(Bytes::from_vec(vec![0u8; 64]));
    let unaligned = handle.clone().range(1, 5).expect("inside the handle");
    let aligned = handle.clone().range(8, 8).expect("inside the handle");
    let sync = || block_on(client.sync()).expect("sync");
    let iters = 200;
    let write = |target: &compute_core::Handle, len: usize| {
        client.write(target, Bytes::from_vec(vec![7u8; len]));
        sync();
    };
    write(&unaligned, 5);
    write(&aligned, 8);
    let (mut ours, mut base) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..5 {
        ours = ours.min(best_per_call(1, iters, || write(&unaligned, 5)));
        base = base.min(best_per_call(1, iters, || write(&aligned, 8)));
    }
    Row::new(
        BACKEND,
        "unaligned write+sync (5 bytes at offset 1, head/tail merged)",
        ours * 1e6,
        "us",
        "ours, aligned write+sync (8 bytes at offset 8), alternating",
        base * 1e6,
        Better::Lower,
    )
}

struct Raw {
    device: wgpu::Device,
    queue: wgpu::Queue,
}

impl Raw {
    fn wait(&self) {
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
    }

    fn buffer(&self, size: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage,
            mapped_at_creation: false,
        })
    }

    /// The pipeline of a portable kernel compiled by the backend's own compiler (same WGSL),
    /// with buffers bound whole and a zeroed info buffer holding `lens`.
    fn pipeline(
        &self,
        kernel: &KernelDefinition,
        buffers: &[&wgpu::Buffer],
        item: u64,
    ) -> (wgpu::ComputePipeline, wgpu::BindGroup) {
        let caps = ShaderCapabilities::from_features(self.device.features());
        let compiled = compile(kernel, caps, false).expect("bench kernel compiles");
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: None,
                source: wgpu::ShaderSource::Wgsl(compiled.source.as_str().into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: None,
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        let mut info = vec![0u32; compiled.info.fixed_words as usize];
        for (k, b) in buffers.iter().enumerate() {
            let h = (compiled.info.header_offset + 4 * k as u32) as usize;
            info[h + 1] = (b.size() / item) as u32;
        }
        let info_buffer = self.buffer(
            (info.len().max(1) * 4) as u64,
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        );
        self.queue
            .write_buffer(&info_buffer, 0, bytemuck::cast_slice(&info));
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        entries.push(wgpu::BindGroupEntry {
            binding: buffers.len() as u32,
            resource: info_buffer.as_entire_binding(),
        });
        let layout = pipeline.get_bind_group_layout(0);
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &entries,
        });
        (pipeline, group)
    }

    fn dispatch(
        &self,
        pipeline: &wgpu::ComputePipeline,
        group: &wgpu::BindGroup,
        count: u32,
        times: usize,
    ) {
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(pipeline);
            for _ in 0..times {
                pass.set_bind_group(0, group, &[]);
                pass.dispatch_workgroups(count, 1, 1);
            }
        }
        self.queue.submit([encoder.finish()]);
    }
}

#[kernel(cube_dim = 64)]
fn bench_store(out: &mut [f32]) {
    out[ABSOLUTE_POS] = 1.0f32;
}

fn store_kernel() -> KernelDefinition {
    bench_store::definition().clone()
}

#[kernel(cube_dim = 256)]
fn bench_copy(input: &[[f32; 4]], out: &mut [[f32; 4]]) {
    let i = ABSOLUTE_POS;
    out[i] = input[i];
}

fn copy_kernel() -> KernelDefinition {
    bench_copy::definition().clone()
}

/// Best of `reps` timings of `timed`, each run on what `setup` made (untimed) and followed by
/// `after` (untimed): seconds.
fn best_of<T>(
    reps: usize,
    mut setup: impl FnMut() -> T,
    mut timed: impl FnMut(T),
    mut after: impl FnMut(),
) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let input = setup();
        let start = Instant::now();
        timed(input);
        best = best.min(start.elapsed().as_secs_f64());
        after();
    }
    best
}

/// The tail of raw wgpu launch+sync with each of our threads added around it, to find which one
/// our p99 comes from: a poll thread that also waits for every submission (ours drives map
/// callbacks that way), and a submit thread that encodes and submits while the caller waits
/// for the index (ours moves `finish` and `submit` off the caller's thread). 1,000 samples of
/// each variant, interleaved; rows give each variant's p50 and p99 against plain raw wgpu's.
fn tail_ablation(raw: &Raw) -> Vec<Row> {
    use std::sync::mpsc;
    let definition = store_kernel();
    let buffer = raw.buffer(64 * 4, wgpu::BufferUsages::STORAGE);
    let (pipeline, group) = raw.pipeline(&definition, &[&buffer], 4);
    let encode = |device: &wgpu::Device| {
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        encoder.finish()
    };
    let wait = |index: wgpu::SubmissionIndex| {
        raw.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .expect("poll");
    };
    let samples = 1000;
    let mut times: [Vec<f64>; 4] = Default::default();
    std::thread::scope(|scope| {
        // The poll thread: waits for each submission it is given, as ours does.
        let (poll_tx, poll_rx) = mpsc::channel::<wgpu::SubmissionIndex>();
        let poll_device = raw.device.clone();
        scope.spawn(move || {
            while let Ok(index) = poll_rx.recv() {
                let _ = poll_device.poll(wgpu::PollType::Wait {
                    submission_index: Some(index),
                    timeout: None,
                });
            }
        });
        // The submit thread: encodes and submits on request, replies with the index.
        let (submit_tx, submit_rx) = mpsc::channel::<mpsc::SyncSender<wgpu::SubmissionIndex>>();
        let (device, queue) = (raw.device.clone(), raw.queue.clone());
        let encode_on_thread = encode;
        scope.spawn(move || {
            while let Ok(reply) = submit_rx.recv() {
                let index = queue.submit([encode_on_thread(&device)]);
                let _ = reply.send(index);
            }
        });
        let submit_there = || {
            let (tx, rx) = mpsc::sync_channel(1);
            submit_tx.send(tx).expect("submit thread");
            rx.recv().expect("submit thread")
        };
        for _ in 0..samples {
            let s = Instant::now();
            wait(raw.queue.submit([encode(&raw.device)]));
            times[0].push(s.elapsed().as_secs_f64());
            let s = Instant::now();
            let index = raw.queue.submit([encode(&raw.device)]);
            poll_tx.send(index.clone()).expect("poll thread");
            wait(index);
            times[1].push(s.elapsed().as_secs_f64());
            let s = Instant::now();
            wait(submit_there());
            times[2].push(s.elapsed().as_secs_f64());
            let s = Instant::now();
            let index = submit_there();
            poll_tx.send(index.clone()).expect("poll thread");
            wait(index);
            times[3].push(s.elapsed().as_secs_f64());
        }
        drop(poll_tx);
        drop(submit_tx);
    });
    let quantile = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q).round() as usize] * 1e6
    };
    let (raw_p50, raw_p99) = (quantile(&mut times[0], 0.5), quantile(&mut times[0], 0.99));
    let mut rows = Vec::new();
    for (variant, t) in [
        "a poll thread also waiting",
        "a submit thread",
        "a submit thread and a poll thread",
    ]
    .into_iter()
    .zip(times.iter_mut().skip(1))
    {
        let (p50, p99) = (quantile(t, 0.5), quantile(t, 0.99));
        rows.push(Row::new(
            BACKEND,
            &format!("tail ablation: raw launch+sync with {variant}, p50"),
            p50,
            "us",
            "plain raw wgpu p50, samples interleaved",
            raw_p50,
            Better::Lower,
        ));
        rows.push(Row::new(
            BACKEND,
            &format!("tail ablation: raw launch+sync with {variant}, p99"),
            p99,
            "us",
            "plain raw wgpu p99, samples interleaved",
            raw_p99,
            Better::Lower,
        ));
    }
    rows
}

fn launch(client: &ComputeClient<WgpuRuntime>, raw: &Raw) -> Vec<Row> {
    let definition = store_kernel();
    let kernel: WgpuKernel = definition.clone().into();
    let out = client.empty(64 * 4);
    let args = KernelArguments::new().buffer(out.binding());
    // SAFETY: one cube of 64 units stores into a buffer of exactly 64 f32.
    let launch_once = || unsafe {
        client.launch_unchecked(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone())
    };
    let sync = || block_on(client.sync()).expect("sync");
    launch_once();
    sync();
    let iters = 200;
    let latency = best_per_call(5, iters, || {
        launch_once();
        sync();
    });
    let host_iters = 2_000;
    let throughput = best_per_call(3, 1, || {
        for _ in 0..host_iters {
            launch_once();
        }
        sync();
    }) / host_iters as f64;

    let buffer = raw.buffer(64 * 4, wgpu::BufferUsages::STORAGE);
    let (pipeline, group) = raw.pipeline(&definition, &[&buffer], 4);
    raw.dispatch(&pipeline, &group, 1, 1);
    raw.wait();
    let raw_latency = best_per_call(5, iters, || {
        raw.dispatch(&pipeline, &group, 1, 1);
        raw.wait();
    });
    // Host cost: issuing the launches and submitting them; the device's work is waited for
    // outside the timing. Ours and raw alternate, best of 15 each, so that load from elsewhere
    // on the machine falls on both alike.
    let (mut host, mut raw_host) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..15 {
        host = host.min(best_of(
            1,
            || {},
            |()| {
                for _ in 0..host_iters {
                    launch_once();
                }
                client.flush().expect("flush");
            },
            sync,
        ));
        raw_host = raw_host.min(best_of(
            1,
            || {},
            |()| raw.dispatch(&pipeline, &group, 1, host_iters),
            || raw.wait(),
        ));
    }
    let (host, raw_host) = (host / host_iters as f64, raw_host / host_iters as f64);
    let raw_throughput = best_per_call(3, 1, || {
        raw.dispatch(&pipeline, &group, 1, host_iters);
        raw.wait();
    }) / host_iters as f64;
    // The tail: 1,000 single launch+sync samples each, ours and raw interleaved; the median
    // and the 99th percentile (a stall of the poll or map path shows in p99, not in a mean).
    let samples = 1000;
    let (mut ours_t, mut raw_t) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for _ in 0..samples {
        let s = Instant::now();
        launch_once();
        sync();
        ours_t.push(s.elapsed().as_secs_f64());
        let s = Instant::now();
        raw.dispatch(&pipeline, &group, 1, 1);
        raw.wait();
        raw_t.push(s.elapsed().as_secs_f64());
    }
    let quantile = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q).round() as usize]
    };
    let (p50, p99) = (quantile(&mut ours_t, 0.5), quantile(&mut ours_t, 0.99));
    let (raw_p50, raw_p99) = (quantile(&mut raw_t, 0.5), quantile(&mut raw_t, 0.99));
    let us = 1e6;
    vec![
        Row::new(
            BACKEND,
            "launch+sync latency p50 (1,000 samples)",
            p50 * us,
            "us",
            "raw wgpu p50, same WGSL, samples interleaved",
            raw_p50 * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch+sync latency p99 (1,000 samples)",
            p99 * us,
            "us",
            "raw wgpu p99, same WGSL, samples interleaved",
            raw_p99 * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch+sync latency p99 against our own p50 (tail, target <= 3x)",
            p99 * us,
            "us",
            "our p50 x 3",
            p50 * 3.0 * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch+sync latency (bench_store, 1 cube of 64)",
            latency * us,
            "us",
            "raw wgpu, same WGSL: encoder + 1 dispatch + submit + poll",
            raw_latency * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch host cost (bench_store, 2000 launches + flush, wait untimed, best of 15)",
            host * us,
            "us",
            "raw wgpu, same WGSL: 2000 dispatches in one pass + submit, wait untimed, alternating",
            raw_host * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch throughput (bench_store, 2000 launches + sync)",
            throughput * us,
            "us",
            "raw wgpu, same WGSL: 2000 dispatches in one pass + submit + poll",
            raw_throughput * us,
            Better::Lower,
        ),
    ]
}

/// Copy kernels (and raw copies) per timed wait in the bandwidth rows.
const COPY_REPS: usize = 20;

fn bandwidth(client: &ComputeClient<WgpuRuntime>, raw: &Raw) -> Vec<Row> {
    let size: usize = 64 << 20;
    let gb = |secs: f64, bytes: usize| bytes as f64 / secs / 1e9;
    let src: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();

    // Copy kernel against copy_buffer_to_buffer.
    let kernel: WgpuKernel = copy_kernel().into();
    let ours_copy =
        super::timing::copy_kernel_time(client, kernel, Bytes::from_slice(&src), COPY_REPS);
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let a = raw.buffer(size as u64, usage);
    let b = raw.buffer(size as u64, usage);
    let raw_count = (size / 16).div_ceil(256) as u32;
    let (copy_pipeline, copy_group) = raw.pipeline(&copy_kernel(), &[&a, &b], 16);
    let raw_kernel = best_per_call(5, 1, || {
        raw.dispatch(&copy_pipeline, &copy_group, raw_count, COPY_REPS);
        raw.wait();
    }) / COPY_REPS as f64;
    let raw_copy = best_per_call(5, 1, || {
        let mut encoder = raw.device.create_command_encoder(&Default::default());
        for _ in 0..COPY_REPS {
            encoder.copy_buffer_to_buffer(&a, 0, &b, 0, Some(size as u64));
        }
        raw.queue.submit([encoder.finish()]);
        raw.wait();
    }) / COPY_REPS as f64;

    // Upload: create (write_buffer + sync) against write_buffer + submit + poll.
    let handle = client.empty(size);
    // The host bytes are built outside the timing (a user with a `Vec` hands it over uncopied).
    let upload = best_of(
        5,
        || Bytes::from_vec(src.clone()),
        |bytes| {
            client.write(&handle, bytes);
            block_on(client.sync()).expect("sync");
        },
        || {},
    );
    let raw_upload = best_per_call(5, 1, || {
        raw.queue.write_buffer(&a, 0, &src);
        raw.queue.submit([]);
        raw.wait();
    });

    // Readback: read_one against copy to a mapped buffer.
    let readback = best_per_call(5, 1, || {
        let bytes = client.read_one(handle.clone()).expect("read");
        assert_eq!(bytes.len(), size);
    });
    let raw_readback = best_per_call(5, 1, || {
        let staging = raw.buffer(
            size as u64,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        let mut encoder = raw.device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(&a, 0, &staging, 0, Some(size as u64));
        raw.queue.submit([encoder.finish()]);
        staging.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        raw.wait();
        let view = staging.slice(..).get_mapped_range().expect("mapped");
        let copy = view.to_vec();
        drop(view);
        staging.unmap();
        assert_eq!(copy.len(), size);
    });
    vec![
        Row::new(
            BACKEND,
            "copy kernel 64 MiB (read+write)",
            gb(ours_copy, 2 * size),
            "GB/s",
            "raw wgpu 20 x copy_buffer_to_buffer 64 MiB + submit + poll",
            gb(raw_copy, 2 * size),
            Better::Higher,
        ),
        Row::new(
            BACKEND,
            "copy kernel 64 MiB (read+write), same kernel raw",
            gb(ours_copy, 2 * size),
            "GB/s",
            "raw wgpu, same WGSL: 20 dispatches of 64 MiB in one pass + submit + poll",
            gb(raw_kernel, 2 * size),
            Better::Higher,
        ),
        Row::new(
            BACKEND,
            "upload 64 MiB (write + sync)",
            gb(upload, size),
            "GB/s",
            "raw wgpu write_buffer 64 MiB + submit + poll",
            gb(raw_upload, size),
            Better::Higher,
        ),
        Row::new(
            BACKEND,
            "readback 64 MiB (read_one)",
            gb(readback, size),
            "GB/s",
            "raw wgpu 64 MiB copy to a fresh staging buffer + map_async + copy out",
            gb(raw_readback, size),
            Better::Higher,
        ),
    ]
}
