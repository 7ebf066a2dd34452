//! `cargo run --example saxpy`: y = a * x + y on the best backend available, checked on the host.
//!
//! The backend is chosen at run time by `compute::Backend::best()`: the first available of cuda,
//! vulkan, wgpu, cpu, or the one `COMPUTE_BACKEND` names (`COMPUTE_BACKEND=cpu` forces the CPU).

use compute::{Backend, RunOn};
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

/// The example's work, generic over the backend: [`Backend::run`] calls it with a client of the
/// chosen backend's default device.
struct Saxpy {
    n: usize,
    a: f32,
}

/// What a run reports: the runtime's and device's names, timing, a sample and the mismatches.
struct Report {
    runtime: &'static str,
    device: String,
    millis: f64,
    sample: f32,
    wrong: usize,
}

impl RunOn for Saxpy {
    type Output = Report;

    fn run<R: Runtime>(self, client: ComputeClient<R>) -> Report {
        let Saxpy { n, a } = self;
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
        Report {
            runtime: R::name(),
            device: client.properties().name.clone(),
            millis: elapsed.as_secs_f64() * 1e3,
            sample: out[12345],
            wrong,
        }
    }
}

fn main() {
    let choice = Backend::best().unwrap_or_else(|e| {
        eprintln!("no backend to run on: {e}");
        std::process::exit(1);
    });
    println!("backend: {choice}");
    let n = 1 << 20;
    let report = choice.run(Saxpy { n, a: 2.5 }).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1);
    });
    println!(
        "saxpy on {} ({}): {n} elements in {:.2} ms, y[12345] = {}",
        report.runtime, report.device, report.millis, report.sample
    );
    if report.wrong == 0 {
        println!("verified: all {n} results match the host computation (tolerance 1e-6)");
    } else {
        eprintln!(
            "FAILED: {} of {n} results differ from the host computation",
            report.wrong
        );
        std::process::exit(1);
    }
}
