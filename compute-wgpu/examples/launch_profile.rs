//! Where the host time of a launch goes: the backend's enqueue loop and flush against raw wgpu's
//! pass recording, `finish` and `submit` of the same shader, 2000 launches of one cube each.
//!
//! `cargo run --release -p compute-wgpu --example launch_profile` (set `REPS` to repeat longer,
//! e.g. under `perf record`, with `OURS_ONLY` or `RAW_ONLY` set to run one side). Each figure is the best of `REPS` runs, in microseconds per launch.

use std::time::Instant;

use compute_core::kernel::{KernelBuilder, KernelDefinition};
use compute_core::{ComputeClient, CubeCount, ElemType, KernelArguments, block_on};
use compute_wgpu::compiler::{ShaderCapabilities, compile};
use compute_wgpu::{WgpuDevice, WgpuKernel, WgpuRuntime, wgpu};

const LAUNCHES: usize = 2000;

fn store_kernel() -> KernelDefinition {
    let mut k = KernelBuilder::new("bench_store", [64, 1, 1]);
    let out = k.output("out", ElemType::F32, 1);
    let i = k.absolute_pos();
    k.store(out, i, 1.0f32);
    k.build().expect("store kernel")
}

fn ours(reps: usize) {
    let client = ComputeClient::<WgpuRuntime>::load(&WgpuDevice::default());
    let kernel: WgpuKernel = store_kernel().into();
    let out = client.empty(64 * 4);
    let args = KernelArguments::new().buffer(out.binding());
    let (mut enqueue, mut flush) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps {
        let start = Instant::now();
        for _ in 0..LAUNCHES {
            // SAFETY: one cube of 64 units stores into a buffer of exactly 64 f32.
            unsafe {
                client.launch_unchecked(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone())
            };
        }
        let enqueued = start.elapsed().as_secs_f64();
        client.flush().expect("flush");
        let flushed = start.elapsed().as_secs_f64();
        enqueue = enqueue.min(enqueued);
        flush = flush.min(flushed - enqueued);
        block_on(client.sync()).expect("sync");
    }
    let us = 1e6 / LAUNCHES as f64;
    println!(
        "compute-wgpu: enqueue {:.3}  flush {:.3}  total {:.3} us/launch",
        enqueue * us,
        flush * us,
        (enqueue + flush) * us
    );
}

fn raw(reps: usize) {
    let (device, queue) = compute_wgpu::raw_device(WgpuDevice::default()).expect("raw device");
    let caps = ShaderCapabilities::from_features(device.features());
    let compiled = compile(&store_kernel(), caps, false).expect("compiles");
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: None,
        source: wgpu::ShaderSource::Wgsl(compiled.source.as_str().into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let buffer = |size, usage| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage,
            mapped_at_creation: false,
        })
    };
    let out = buffer(256, wgpu::BufferUsages::STORAGE);
    let info = buffer(64, wgpu::BufferUsages::STORAGE);
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: out.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: info.as_entire_binding(),
            },
        ],
    });
    let (mut record, mut finish, mut submit) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    for _ in 0..reps {
        let start = Instant::now();
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            for _ in 0..LAUNCHES {
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(1, 1, 1);
            }
        }
        let recorded = start.elapsed().as_secs_f64();
        let commands = encoder.finish();
        let finished = start.elapsed().as_secs_f64();
        queue.submit([commands]);
        let submitted = start.elapsed().as_secs_f64();
        record = record.min(recorded);
        finish = finish.min(finished - recorded);
        submit = submit.min(submitted - finished);
        let _ = device.poll(wgpu::PollType::wait_indefinitely());
    }
    let us = 1e6 / LAUNCHES as f64;
    println!(
        "raw wgpu:     record  {:.3}  finish {:.3}  submit {:.3}  total {:.3} us/launch",
        record * us,
        finish * us,
        submit * us,
        (record + finish + submit) * us
    );
}

fn main() {
    if let Err(reason) = compute_wgpu::availability() {
        eprintln!("launch_profile: wgpu unavailable: {reason}");
        return;
    }
    let reps = std::env::var("REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    // `OURS_ONLY` / `RAW_ONLY` run one side (for a profiler).
    if std::env::var_os("RAW_ONLY").is_none() {
        ours(reps);
    }
    if std::env::var_os("OURS_ONLY").is_none() {
        raw(reps);
    }
}
