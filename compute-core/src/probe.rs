//! The probes behind `measure_throughput`: portable kernels timed with `profile`.

use core::time::Duration;

use crate::client::ComputeClient;
use crate::elem::ElemType;
use crate::handle::{CubeCount, KernelArguments};
use crate::kernel::{KernelBuilder, KernelDefinition, ScalarValue};
use crate::profile::TimingMethod;
use crate::runtime::Runtime;
use crate::throughput::{KernelConfig, ThroughputKey, ThroughputValue};

fn one(elem: ElemType) -> ScalarValue {
    match elem {
        ElemType::F16 => ScalarValue::F16(half::f16::ONE),
        ElemType::BF16 => ScalarValue::BF16(half::bf16::ONE),
        ElemType::F64 => ScalarValue::F64(1.0),
        ElemType::I32 => ScalarValue::I32(1),
        ElemType::U32 => ScalarValue::U32(1),
        ElemType::I64 => ScalarValue::I64(1),
        ElemType::U64 => ScalarValue::U64(1),
        _ => ScalarValue::F32(1.0),
    }
}

/// `acc = acc * a + b`, `iterations` times per unit; the result is stored so nothing is elided.
fn fma_kernel(elem: ElemType, cube_dim: u32) -> KernelDefinition {
    let mut k = KernelBuilder::new(&format!("probe_fma_{elem}"), [cube_dim, 1, 1]);
    let out = k.output("out", elem, 1);
    let a = k.scalar("a", elem);
    let b = k.scalar("b", elem);
    let iterations = k.scalar("iterations", ElemType::U32);
    let i = k.absolute_pos();
    let acc = k.var(b);
    k.range(0u32, iterations, 1u32, |k, _| {
        let v = k.get(acc);
        let v = k.fma(v, a, b);
        k.assign(acc, v);
    });
    let v = k.get(acc);
    k.store(out, i, v);
    k.build()
        .unwrap_or_else(|e| unreachable!("the fma probe is a valid kernel: {e}"))
}

/// `out[i] = input[i]` over every element.
fn copy_kernel(elem: ElemType, cube_dim: u32) -> KernelDefinition {
    let mut k = KernelBuilder::new(&format!("probe_copy_{elem}"), [cube_dim, 1, 1]);
    let input = k.input("input", elem, 1);
    let out = k.output("out", elem, 1);
    let i = k.absolute_pos();
    let v = k.load(input, i);
    k.store(out, i, v);
    k.build()
        .unwrap_or_else(|e| unreachable!("the copy probe is a valid kernel: {e}"))
}

/// Run the probe for `key` and time it (device time where the backend has it).
pub(crate) fn measure_throughput<R: Runtime>(
    client: &ComputeClient<R>,
    key: ThroughputKey,
    config: KernelConfig,
) -> ThroughputValue {
    let units = config.cube_dim as u64 * config.cube_count as u64;
    let count = CubeCount::Static(config.cube_count, 1, 1);
    let (work, result) = match key {
        ThroughputKey::Arithmetic(elem) => {
            let out = client.empty(units as usize * elem.size());
            let kernel = fma_kernel(elem, config.cube_dim);
            let args = KernelArguments::new()
                .buffer(out.binding())
                .scalar(one(elem))
                .scalar(one(elem))
                .scalar(config.work_per_unit);
            let launch = || client.launch(kernel.clone().into(), count.clone(), args.clone());
            launch();
            let result = client.profile(launch, "measure_throughput");
            (2 * units * config.work_per_unit as u64, result)
        }
        ThroughputKey::MemoryCopy(elem) => {
            let elems = units as usize * config.work_per_unit as usize;
            // Written, not just reserved: a never-touched host allocation reads from the
            // kernel's shared zero page and would time a cache, not memory.
            let input = client.create(crate::bytes::Bytes::zeroed(elems * elem.size()));
            let out = client.empty(elems * elem.size());
            let kernel = copy_kernel(elem, config.cube_dim);
            let copy_count = CubeCount::cover(elems, config.cube_dim);
            let args = KernelArguments::new()
                .buffer(input.binding())
                .buffer(out.binding());
            let launch = || client.launch(kernel.clone().into(), copy_count.clone(), args.clone());
            launch();
            let result = client.profile(launch, "measure_throughput");
            (2 * (elems * elem.size()) as u64, result)
        }
    };
    match result {
        Ok(((), duration)) => {
            let secs = duration.duration.as_secs_f64().max(1e-9);
            ThroughputValue {
                per_second: work as f64 / secs,
                work,
                elapsed: duration.duration,
                timing: duration.timing,
            }
        }
        Err(_) => ThroughputValue {
            per_second: 0.0,
            work: 0,
            elapsed: Duration::ZERO,
            timing: TimingMethod::Host,
        },
    }
}
