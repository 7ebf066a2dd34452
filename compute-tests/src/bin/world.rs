//! `world [--backend NAME] SCENARIO [LATE_MS]`: one rank of a multi-process collective scenario
//! (see `compute_tests::world`) on a backend built in (default `cpu`), run with the rendezvous
//! variables set by a launcher (`cargo xtask launch -n 4 -- target/debug/world sum_mean`). Exits 0
//! when this rank saw what the scenario expects, 1 otherwise, 2 on a usage error.

fn usage(message: &str) -> ! {
    eprintln!(
        "world: {message}\nusage: world [--backend cpu|wgpu|vulkan|cuda] SCENARIO [LATE_MS]; scenarios: {:?}",
        compute_tests::world::SCENARIOS
    );
    std::process::exit(2);
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut backend = "cpu".to_string();
    if args.first().map(String::as_str) == Some("--backend") {
        if args.len() < 2 {
            usage("--backend needs a name");
        }
        backend = args.remove(1);
        args.remove(0);
    }
    let Some(scenario) = args.first().cloned() else {
        usage("no scenario");
    };
    let late_ms = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(0);
    let rank = std::env::var("RANK").unwrap_or_else(|_| "?".into());
    let outcome = match backend.as_str() {
        #[cfg(feature = "cpu")]
        "cpu" => compute_tests::world::run_scenario::<compute::cpu::CpuRuntime>(&scenario, late_ms),
        #[cfg(feature = "wgpu")]
        "wgpu" => {
            compute_tests::world::run_scenario::<compute::wgpu::WgpuRuntime>(&scenario, late_ms)
        }
        #[cfg(feature = "vulkan")]
        "vulkan" => {
            compute_tests::world::run_scenario::<compute::vulkan::VulkanRuntime>(&scenario, late_ms)
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            compute_tests::world::run_scenario::<compute::cuda::CudaRuntime>(&scenario, late_ms)
        }
        other => usage(&format!(
            "backend {other} is not built in (features of compute-tests)"
        )),
    };
    match outcome {
        Ok(message) => println!("rank {rank}: {scenario}: ok: {message}"),
        Err(message) => {
            eprintln!("rank {rank}: {scenario}: FAILED: {message}");
            std::process::exit(1);
        }
    }
}
