//! `cargo run --example saxpy`: y = a * x + y on the best backend available, checked on the host.

use compute_core::kernel::kernel;
use compute_core::{Bytes, ComputeClient, CubeCount, Runtime};

/// `y = a * x + y`: every unit of the launch handles one element.
#[kernel(cube_dim = 256)]
fn saxpy(x: &[f32], y: &mut [f32], a: f32) {
    let i = ABSOLUTE_POS;
    if i < x.len() {
        y[i] = a.mul_add(x[i], y[i]);
    }
}

fn saxpy<R: Runtime>(client: &ComputeClient<R>, a: f32, x: &[f32], y: &[f32]) -> Vec<f32> {
    let hx = client.create(Bytes::from_elem_slice(x));
    let hy = client.create(Bytes::from_elem_slice(y));
    saxpy::launch(client, CubeCount::cover(x.len(), 256), &hx, &hy, a);
    client
        .read_one(hy)
        .expect("reading y back")
        .to_elems::<f32>()
}

fn run<R: Runtime>() {
    let client = ComputeClient::<R>::load(&R::Device::default());
    let n = 1 << 20;
    let a = 2.5f32;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.001).collect();
    let y: Vec<f32> = (0..n).map(|i| 1.0 - (i % 7) as f32).collect();
    let start = std::time::Instant::now();
    let out = saxpy(&client, a, &x, &y);
    let elapsed = start.elapsed();
    let wrong = out
        .iter()
        .enumerate()
        .filter(|&(i, &v)| (v - a.mul_add(x[i], y[i])).abs() > 1e-6 * (1.0 + v.abs()))
        .count();
    println!(
        "saxpy on {} ({}): {n} elements in {:.2} ms, y[12345] = {}",
        R::name(),
        client.properties().name,
        elapsed.as_secs_f64() * 1e3,
        out[12345]
    );
    if wrong == 0 {
        println!("verified: all {n} results match the host computation (tolerance 1e-6)");
    } else {
        eprintln!("FAILED: {wrong} of {n} results differ from the host computation");
        std::process::exit(1);
    }
}

fn main() {
    let mut tried: Vec<String> = Vec::new();
    macro_rules! try_backend {
        ($feature:literal, $runtime:ty) => {
            #[cfg(feature = $feature)]
            {
                match <$runtime as Runtime>::availability() {
                    Ok(()) => return run::<$runtime>(),
                    Err(reason) => tried.push(format!("{}: {reason}", $feature)),
                }
            }
        };
    }
    try_backend!("vulkan", compute_vulkan::VulkanRuntime);
    try_backend!("cpu", compute_cpu::CpuRuntime);
    eprintln!("no backend available ({})", tried.join("; "));
    std::process::exit(1);
}
