//! `bench --out FILE --backends a,b [FILTER]`: runs the benchmarks of the named backends and writes
//! the rows as JSON (see `compute_tests::bench::Row`). Driven by `cargo xtask bench`.

use compute_tests::bench::Row;

fn main() {
    #[cfg(feature = "cpu")]
    world_rank();
    let mut out = String::from("target/bench.json");
    let mut backends: Vec<String> = Vec::new();
    let mut filter = String::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--out" => out = args.next().unwrap_or_else(|| usage("--out needs a path")),
            "--backends" => {
                let list = args
                    .next()
                    .unwrap_or_else(|| usage("--backends needs a list"));
                backends = list.split(',').map(|s| s.trim().to_string()).collect();
            }
            "--bench" => {}
            other if other.starts_with('-') => usage(&format!("unknown option {other}")),
            other => filter = other.to_string(),
        }
    }
    let mut rows: Vec<Row> = Vec::new();
    for backend in &backends {
        match backend.as_str() {
            #[cfg(feature = "cpu")]
            "cpu" => rows.extend(compute_tests::bench::cpu::run(&filter)),
            #[cfg(feature = "wgpu")]
            "wgpu" => rows.extend(compute_tests::bench::wgpu::run(&filter)),
            #[cfg(feature = "vulkan")]
            "vulkan" => rows.extend(compute_tests::bench::vulkan::run(&filter)),
            #[cfg(feature = "cuda")]
            "cuda" => rows.extend(compute_tests::bench::cuda::run(&filter)),
            other => eprintln!("bench: no benchmarks for backend {other} in this build"),
        }
    }
    let cross = compute_tests::bench::cross_backend_rows(&rows);
    rows.extend(cross);
    let json = serde_json::to_string_pretty(&rows).unwrap_or_else(|e| fail(&e.to_string()));
    if let Err(e) = std::fs::write(&out, json) {
        fail(&format!("cannot write {out}: {e}"));
    }
    eprintln!("bench: wrote {} rows to {out}", rows.len());
}

/// When started by the all_reduce row's launcher: run one rank, print its time, and exit.
#[cfg(feature = "cpu")]
fn world_rank() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some(compute_tests::bench::cpu::WORLD_RANK_OPTION) {
        return;
    }
    let number = |i: usize| {
        args.get(i)
            .and_then(|a| a.parse::<usize>().ok())
            .unwrap_or_else(|| usage("--world-all-reduce BYTES ITERS"))
    };
    match compute_tests::world::bench_rank::<compute::cpu::CpuRuntime>(number(1), number(2)) {
        Ok(seconds) => {
            println!("all_reduce_seconds={seconds}");
            std::process::exit(0)
        }
        Err(e) => fail(&format!("all_reduce rank: {e}")),
    }
}

fn usage(message: &str) -> ! {
    eprintln!("bench: {message}\nusage: bench --out FILE --backends a,b [FILTER]");
    std::process::exit(2)
}

fn fail(message: &str) -> ! {
    eprintln!("bench: {message}");
    std::process::exit(1)
}
