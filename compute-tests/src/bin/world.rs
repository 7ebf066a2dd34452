//! `world SCENARIO [LATE_MS]`: one rank of a multi-process collective scenario on the CPU backend
//! (see `compute_tests::world`), run with the rendezvous variables set by a launcher
//! (`cargo xtask launch -n 4 -- target/debug/world sum_mean`). Exits 0 when this rank saw what the
//! scenario expects, 1 otherwise.

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(scenario) = args.next() else {
        eprintln!(
            "usage: world SCENARIO [LATE_MS]; scenarios: {:?}",
            compute_tests::world::SCENARIOS
        );
        std::process::exit(2);
    };
    let late_ms = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let rank = std::env::var("RANK").unwrap_or_else(|_| "?".into());
    match compute_tests::world::run_scenario(&scenario, late_ms) {
        Ok(message) => println!("rank {rank}: {scenario}: ok: {message}"),
        Err(message) => {
            eprintln!("rank {rank}: {scenario}: FAILED: {message}");
            std::process::exit(1);
        }
    }
}
