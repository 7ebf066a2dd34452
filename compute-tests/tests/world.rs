//! Collectives across processes on the CPU backend: 2 and 4 local processes of the `world`
//! binary, started by compute-core's launcher with the rendezvous variables set (loopback, a free
//! port). Each rank checks its own results or its exact error; the launch checks every rank's exit
//! status. `cargo xtask test-all` runs this target as its own row (`cpu-processes`); the
//! `wgpu_` and `vulkan_` tests run the same ranks on those backends when they are built in (and
//! test-all skips them when the probe does not find the backend). `cuda_` runs a world of one
//! process through the rendezvous (rank 0's store, `ncclGetUniqueId` through it,
//! `ncclCommInitRank`): one GPU cannot hold two NCCL ranks of different processes, so the
//! multi-process NCCL run needs a machine with several GPUs.
#![cfg(feature = "cpu")]

use std::time::{Duration, Instant};

use compute_core::collective::launch::{Launch, LaunchOutcome, launch};

/// Long enough for ranks started one after the other on a loaded 2-core machine.
const TIMEOUT: Duration = Duration::from_millis(4000);

fn run(n: usize, scenario: &str, extra: &[&str], edit: impl FnOnce(&mut Launch)) -> LaunchOutcome {
    let mut args = vec![scenario];
    args.extend_from_slice(extra);
    let mut spec = Launch::new(n, env!("CARGO_BIN_EXE_world"), &args);
    spec.rendezvous_timeout = TIMEOUT;
    spec.deadline = Duration::from_secs(60);
    // One CPU device per process is enough; keep the executors small on a shared machine.
    spec.env.push(("COMPUTE_CPU_DEVICES".into(), "1".into()));
    edit(&mut spec);
    launch(&spec).expect("starting the ranks")
}

fn assert_all_ok(out: &LaunchOutcome, scenario: &str) {
    assert!(
        out.success(),
        "{scenario} on port {}:\n{}",
        out.port,
        out.summary()
    );
    for r in &out.ranks {
        assert!(
            r.stdout.contains(&format!("{scenario}: ok")),
            "rank {} did not report: {:?}",
            r.rank,
            r.stdout
        );
    }
}

#[test]
fn one_process_world_through_the_rendezvous() {
    assert_all_ok(&run(1, "sum_mean", &[], |_| {}), "sum_mean");
}

#[test]
fn two_processes_sum_and_mean_exact() {
    assert_all_ok(&run(2, "sum_mean", &[], |_| {}), "sum_mean");
}

#[test]
fn four_processes_sum_and_mean_exact() {
    assert_all_ok(&run(4, "sum_mean", &[], |_| {}), "sum_mean");
}

fn killed(n: usize) {
    let start = Instant::now();
    let out = run(n, "killed", &[], |_| {});
    let (dead, alive) = out.ranks.split_last().expect("ranks");
    assert!(
        !dead.success(),
        "the aborted rank exited cleanly:\n{}",
        out.summary()
    );
    assert!(!dead.killed_at_deadline, "{}", out.summary());
    for r in alive {
        assert!(r.success(), "{}", out.summary());
        assert!(r.stdout.contains("killed: ok"), "{:?}", r.stdout);
    }
    assert!(start.elapsed() < 2 * TIMEOUT + Duration::from_secs(10));
}

#[test]
fn two_processes_a_rank_killed_mid_collective() {
    killed(2);
}

#[test]
fn four_processes_a_rank_killed_mid_collective() {
    killed(4);
}

#[test]
fn four_processes_a_late_rank_within_the_timeout_joins() {
    let late = (TIMEOUT.as_millis() / 8).to_string();
    assert_all_ok(&run(4, "late_ok", &[&late], |_| {}), "late_ok");
}

#[test]
fn two_processes_a_rank_later_than_the_timeout_fails_every_rank() {
    let late = (TIMEOUT.as_millis() * 2 + 500).to_string();
    let start = Instant::now();
    let out = run(2, "late_timeout", &[&late], |_| {});
    assert_all_ok(&out, "late_timeout");
    assert!(start.elapsed() < 4 * TIMEOUT + Duration::from_secs(10));
}

#[test]
fn four_processes_a_late_rank_fails_every_rank() {
    let late = (TIMEOUT.as_millis() * 2 + 500).to_string();
    assert_all_ok(&run(4, "late_timeout", &[&late], |_| {}), "late_timeout");
}

#[test]
fn two_processes_a_wrong_world_size_fails_every_rank() {
    let out = run(2, "wrong_world_size", &[], |spec| {
        spec.rank_env.push((1, "WORLD_SIZE".into(), "3".into()));
    });
    assert_all_ok(&out, "wrong_world_size");
}

#[test]
fn four_processes_a_wrong_world_size_fails_every_rank() {
    let out = run(4, "wrong_world_size", &[], |spec| {
        spec.rank_env.push((3, "WORLD_SIZE".into(), "5".into()));
    });
    assert_all_ok(&out, "wrong_world_size");
}

#[test]
fn two_processes_dtype_and_op_mismatch_fails_every_rank() {
    assert_all_ok(&run(2, "mismatch", &[], |_| {}), "mismatch");
}

#[test]
fn four_processes_dtype_and_op_mismatch_fails_every_rank() {
    assert_all_ok(&run(4, "mismatch", &[], |_| {}), "mismatch");
}

#[test]
fn a_missing_variable_is_a_clean_error() {
    let out = run(2, "sum_mean", &[], |spec| {
        spec.rank_env
            .push((1, "MASTER_PORT".into(), "not-a-port".into()));
    });
    let bad = &out.ranks[1];
    assert!(!bad.success());
    assert!(
        bad.stderr.contains("MASTER_PORT") && bad.stderr.contains("not-a-port"),
        "{:?}",
        bad.stderr
    );
    // Rank 0 does not wait for ever: it times out.
    assert!(!out.ranks[0].success());
    assert!(
        out.ranks[0].stderr.contains("timed out"),
        "{:?}",
        out.ranks[0].stderr
    );
}

/// The same ranks on a GPU backend: the host-staged path is compute-core's, shared with the CPU.
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
fn gpu_backend(backend: &str, n: usize, scenario: &str) {
    let out = run(n, "--backend", &[backend, scenario], |spec| {
        spec.env.retain(|(k, _)| k != "COMPUTE_CPU_DEVICES");
    });
    assert!(out.success(), "{backend} {scenario}:\n{}", out.summary());
    for r in &out.ranks {
        assert!(
            r.stdout.contains(&format!("{scenario}: ok")),
            "{:?}",
            r.stdout
        );
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_two_processes_sum_and_mean_exact() {
    gpu_backend("wgpu", 2, "sum_mean");
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_two_processes_mismatch_fails_every_rank() {
    gpu_backend("wgpu", 2, "mismatch");
}

#[cfg(feature = "vulkan")]
#[test]
fn vulkan_two_processes_sum_and_mean_exact() {
    gpu_backend("vulkan", 2, "sum_mean");
}

#[cfg(feature = "vulkan")]
#[test]
fn vulkan_two_processes_mismatch_fails_every_rank() {
    gpu_backend("vulkan", 2, "mismatch");
}

/// A world of one process on CUDA: the NCCL communicator comes from `ncclCommInitRank` with the
/// unique id exchanged through rank 0's store, and every collective of the scenario is exact.
#[cfg(feature = "cuda")]
#[test]
fn cuda_one_process_world_through_the_rendezvous() {
    gpu_backend("cuda", 1, "sum_mean");
}
