//! Workspace automation for the compute runtime, run as `cargo xtask ...`.
//!
//! * `cargo xtask test-all`: workspace unit tests, then the conformance
//!   suite of each backend the probe finds available; writes
//!   `target/test-all.json`.
//! * `cargo xtask bench [-- ARGS]`: the release bench binary on every
//!   available backend, printed as a table; writes `target/bench.json`.
//! * `cargo xtask launch -n N -- PROGRAM [ARGS]`: N local processes of a
//!   program as one world (the rendezvous variables set).

mod backends;
mod bench;
mod cargo;
mod launch;
mod libtest;
mod paths;
mod report;
mod table;
mod test_all;
mod verdict;

use std::process::ExitCode;

/// The usage text.
const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  test-all            run the workspace unit tests, then the conformance suite
                      of every compute-tests backend feature that the probe
                      finds available, then (with cpu) the multi-process
                      collective tests (2 and 4 processes, row cpu-processes);
                      prints one line per backend and writes
                      <target>/test-all.json; exits non-zero on any failure
  bench [-- ARGS]     run the compute-tests bench binary (release) on every
                      available backend; ARGS go to the bench binary (e.g. a
                      filter); prints a table from <target>/bench.json
  launch -n N [--timeout-ms MS] [--deadline-s S] -- PROGRAM [ARGS]
                      start N local processes of PROGRAM as one world: RANK,
                      WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free
                      MASTER_PORT, COMPUTE_RENDEZVOUS_TIMEOUT_MS (default
                      30000); output prefixed by rank; exits 0 when every
                      rank exited 0 (ranks still running after S seconds,
                      default 600, are killed)
  help                print this text

environment:
  COMPUTE_BACKENDS=cpu,wgpu          build and run only these backends
  COMPUTE_REQUIRE_BACKENDS=cpu,wgpu  fail test-all when one of these did not run
  CARGO_TARGET_DIR                   where test-all.json and bench.json go
                                     (default: <workspace>/target)

backends: cpu, wgpu, vulkan, cuda (those declared as features of compute-tests)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = dispatch(&args);
    ExitCode::from(code)
}

/// Run the command named by `args`; returns the exit code.
fn dispatch(args: &[String]) -> u8 {
    let Some(command) = args.first() else {
        print!("{USAGE}");
        return 0;
    };
    let rest = &args[1..];
    match command.as_str() {
        "help" | "-h" | "--help" => {
            print!("{USAGE}");
            0
        }
        "test-all" => {
            if !rest.is_empty() {
                eprintln!(
                    "xtask: test-all takes no arguments (got: {})",
                    rest.join(" ")
                );
                eprint!("{USAGE}");
                return 2;
            }
            exit_code(test_all::run())
        }
        "bench" => exit_code(bench::run(rest)),
        "launch" => exit_code(launch::run(rest)),
        other => {
            eprintln!("xtask: unknown command `{other}`");
            eprint!("{USAGE}");
            2
        }
    }
}

fn exit_code(code: i32) -> u8 {
    u8::try_from(code).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn help_and_errors() {
        assert_eq!(dispatch(&[]), 0);
        assert_eq!(dispatch(&args(&["help"])), 0);
        assert_eq!(dispatch(&args(&["--help"])), 0);
        assert_eq!(dispatch(&args(&["frobnicate"])), 2);
        assert_eq!(dispatch(&args(&["test-all", "extra"])), 2);
    }

    #[test]
    fn usage_mentions_every_command_and_env_var() {
        for word in [
            "test-all",
            "bench",
            "launch",
            "help",
            "COMPUTE_BACKENDS",
            test_all::REQUIRE_ENV,
            "CARGO_TARGET_DIR",
        ] {
            assert!(USAGE.contains(word), "usage lacks {word}");
        }
    }
}
