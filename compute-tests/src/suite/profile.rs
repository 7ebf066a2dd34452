//! Profiling and probes.

use std::time::{Duration, Instant};

use compute_core::{ComputeClient, ElemType, KernelConfig, Runtime, ThroughputKey, block_on};

use crate::kernels;
use crate::util::{f32_bytes, ramp};

/// `profile` returns the closure's value and a positive duration measured as the device says.
pub fn profile_measures_work<R: Runtime>(client: ComputeClient<R>) {
    let n = 1 << 16;
    let input = client.create(f32_bytes(&ramp(n, 1.0)));
    let out = client.empty(n * 4);
    let (value, duration) = client
        .profile(
            || {
                kernels::launch_slow_add(&client, &input, &out, n, 200);
                42
            },
            "slow_add",
        )
        .unwrap();
    assert_eq!(value, 42);
    assert!(duration.duration > Duration::ZERO);
    assert_eq!(duration.timing, client.properties().timing);
    let got = client.read_one(out).unwrap().to_elems::<f32>();
    assert_eq!(got[n - 1], (n - 1) as f32 + 200.0);
}

/// `measure_throughput` runs a real probe and reports what it measured.
pub fn measure_throughput_reports<R: Runtime>(client: ComputeClient<R>) {
    let config = KernelConfig {
        cube_dim: kernels::CUBE_DIM,
        cube_count: 8,
        work_per_unit: 64,
    };
    let arith = client.measure_throughput(ThroughputKey::Arithmetic(ElemType::F32), config);
    assert_eq!(arith.work, 2 * 64 * 8 * kernels::CUBE_DIM as u64);
    assert!(arith.per_second > 0.0 && arith.per_second.is_finite());
    assert!(arith.elapsed > Duration::ZERO);
    let copy = client.measure_throughput(ThroughputKey::MemoryCopy(ElemType::F32), config);
    assert_eq!(copy.work, 2 * 4 * 64 * 8 * kernels::CUBE_DIM as u64);
    assert!(copy.per_second > 0.0);
}

/// `measure_launch_overhead` returns the median of the samples.
pub fn measure_launch_overhead_samples<R: Runtime>(client: ComputeClient<R>) {
    let out = client.empty(4 * kernels::CUBE_DIM as usize);
    let kernel = kernels::fill_f32();
    let max = std::sync::Mutex::new(Duration::ZERO);
    let overhead = client.measure_launch_overhead(|| {
        let start = Instant::now();
        client.launch(
            kernel.clone().into(),
            compute_core::CubeCount::Static(1, 1, 1),
            compute_core::KernelArguments::new()
                .buffer(out.clone().binding())
                .scalar(1.0f32),
        );
        block_on(client.sync()).unwrap();
        let d = start.elapsed();
        let mut m = max.lock().unwrap();
        *m = (*m).max(d);
        d
    });
    assert!(overhead > Duration::ZERO);
    assert!(overhead <= *max.lock().unwrap());
}
