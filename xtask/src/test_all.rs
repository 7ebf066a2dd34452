//! `cargo xtask test-all`: workspace unit tests, then the conformance suite
//! of every built backend that the probe finds available.

use crate::backends::{self, Availability, KNOWN, Selection};
use crate::cargo::{Cargo, feature_args};
use crate::libtest::{Counts, count_listed_tests, parse_run, passed_names};
use crate::paths::target_dir;
use crate::report::{self, BackendReport, ExampleReport, TestAllReport, UnitReport};
use crate::verdict::{Verdict, apply_reduced, judge};

/// Env var naming backends that must run (comma-separated).
pub const REQUIRE_ENV: &str = "COMPUTE_REQUIRE_BACKENDS";

/// The CPU backend's second matrix line: its suite again on the interpreter (the first runs
/// the JIT, the default), named so in the report.
pub const CPU_INTERPRETER: &str = "cpu-interpreter";

/// The integration test target holding the conformance suite.
const CONFORMANCE: &str = "conformance";

/// The examples of compute-tests, each run on every available backend; each checks its results
/// and exits non-zero on a mismatch.
const EXAMPLES: [&str; 3] = ["saxpy", "matmul", "reduce"];

/// The env var the examples read to pick their backend.
const EXAMPLE_BACKEND_ENV: &str = "COMPUTE_BACKEND";

/// The integration test target of the multi-process collective tests (CPU backend).
const WORLD: &str = "world";

/// The row of the multi-process tests in the matrix.
pub const WORLD_ROW: &str = "cpu-processes";

/// Run test-all; returns the process exit code.
pub fn run() -> i32 {
    let selection = match backends::detect() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            return 1;
        }
    };
    let enabled = selection.enabled.clone();
    let mut failures = Vec::new();

    let mut reduced = Vec::new();
    let unit = unit_tests(&enabled, &mut failures, &mut reduced);

    let probe = backends::probe(&enabled);
    failures.extend(probe.error.clone());

    let built = if enabled.is_empty() {
        true
    } else {
        build_conformance(&enabled, &mut failures)
    };

    let mut reports = Vec::new();
    for (name, availability) in &probe.backends {
        let report = match availability {
            Availability::Available if built => {
                run_suite(name, &enabled, &mut failures, &mut reduced)
            }
            Availability::Available => BackendReport {
                backend: name.clone(),
                passed: 0,
                failed: 1,
                skipped: 0,
                reason: None,
            },
            Availability::Unavailable(reason) => BackendReport {
                backend: name.clone(),
                passed: 0,
                failed: 0,
                skipped: if built { list_tests(name, &enabled) } else { 0 },
                reason: Some(reason.clone()),
            },
        };
        let cpu_ran = name == "cpu" && matches!(availability, Availability::Available) && built;
        reports.push(report);
        if cpu_ran {
            reports.push(run_suite_with(
                "cpu",
                CPU_INTERPRETER,
                &[("COMPUTE_CPU_JIT", "0")],
                &enabled,
                &mut failures,
                &mut reduced,
            ));
        }
    }
    if let Some(report) = world_tests(&probe.backends, &enabled, &mut failures) {
        reports.push(report);
    }

    let available: Vec<String> = probe
        .backends
        .iter()
        .filter(|(_, a)| matches!(a, Availability::Available))
        .map(|(name, _)| name.clone())
        .collect();
    let examples = run_examples(&available, &enabled, &mut failures);

    let required = backends::env_name_list(REQUIRE_ENV).unwrap_or_default();
    let required_failures = check_required(&required, &selection, &reports);

    println!();
    let reduced_in = |prefix: &str| reduced.iter().filter(|r| r.starts_with(prefix)).count();
    let with_reduced = |line: String, n: usize| {
        if n == 0 {
            line
        } else {
            format!("{line} ({n} reduced runs counted as skipped)")
        }
    };
    let unit_reduced = reduced.len()
        - reports
            .iter()
            .map(|r| reduced_in(&format!("{}::", r.backend)))
            .sum::<usize>();
    println!("{}", with_reduced(unit.line(), unit_reduced));
    for report in &reports {
        let n = reduced_in(&format!("{}::", report.backend));
        println!("{}", with_reduced(report.line(), n));
    }
    for r in &reduced {
        println!("  skipped (reduced run): {r}");
    }
    for example in &examples {
        println!("{}", example.line());
    }
    for message in &required_failures {
        println!("{message}");
    }
    failures.extend(required_failures);

    let report = TestAllReport {
        unit,
        backends: reports,
        reduced,
        examples,
        ok: failures.is_empty(),
        failures,
    };
    let path = target_dir().join("test-all.json");
    match report::write(&report, &path) {
        Ok(()) => eprintln!("xtask: wrote {}", path.display()),
        Err(e) => {
            eprintln!("xtask: error: writing {}: {e}", path.display());
            return 1;
        }
    }
    if report.ok {
        eprintln!("xtask: test-all passed");
        0
    } else {
        eprintln!("xtask: test-all FAILED:");
        for message in &report.failures {
            eprintln!("xtask:   - {message}");
        }
        1
    }
}

/// Run a `cargo test` command with tee'd output and judge it.
///
/// Tests that could only run a reduced form say so through `COMPUTE_SKIP_LOG` (a fresh file per
/// run under the target directory); they are counted as skipped, with their reasons.
fn run_tests(cargo: &Cargo, what: &str) -> Verdict {
    let log_dir = target_dir().join("skips");
    let log = log_dir.join(format!(
        "{}.log",
        what.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    ));
    let _ = std::fs::create_dir_all(&log_dir);
    let _ = std::fs::remove_file(&log);
    let cargo = cargo.clone().env("COMPUTE_SKIP_LOG", log.as_os_str());
    match cargo.tee() {
        Ok(captured) => {
            let mut verdict = judge(
                what,
                &parse_run(&captured.stdout),
                captured.status.success(),
                &captured.failure_detail(),
            );
            let reduced = std::fs::read_to_string(&log).unwrap_or_default();
            apply_reduced(&mut verdict, &passed_names(&captured.stdout), &reduced);
            verdict
        }
        Err(e) => Verdict {
            counts: Counts {
                failed: 1,
                ..Counts::default()
            },
            failures: vec![format!("{what}: could not run `{}`: {e}", cargo.display())],
            reduced: Vec::new(),
        },
    }
}

/// The workspace's tests outside the conformance suite: every other
/// crate, plus the lib and doc tests of `compute-tests`.
fn unit_tests(
    enabled: &[String],
    failures: &mut Vec<String>,
    reduced: &mut Vec<String>,
) -> UnitReport {
    let mut commands = vec![(
        "workspace unit tests".to_string(),
        Cargo::new([
            "test",
            "--workspace",
            "--exclude",
            "compute-tests",
            "--no-fail-fast",
        ]),
    )];
    for target in ["--lib", "--doc"] {
        let mut args: Vec<String> = vec!["test".into(), "-p".into(), "compute-tests".into()];
        args.extend(feature_args(enabled));
        args.extend([target.to_string(), "--no-fail-fast".to_string()]);
        commands.push((format!("compute-tests {target} tests"), Cargo::new(args)));
    }
    let mut total = Counts::default();
    for (what, cargo) in commands {
        eprintln!("xtask: running {what}: {} ...", cargo.display());
        let verdict = run_tests(&cargo, &what);
        total += verdict.counts;
        failures.extend(verdict.failures);
        reduced.extend(verdict.reduced);
    }
    total.into()
}

/// Build the conformance test binary once for all enabled backends.
fn build_conformance(enabled: &[String], failures: &mut Vec<String>) -> bool {
    eprintln!(
        "xtask: building test binaries for features {} ...",
        enabled.join(",")
    );
    let mut args: Vec<String> = vec!["test".into(), "-p".into(), "compute-tests".into()];
    args.extend(feature_args(enabled));
    args.extend(["--test".into(), CONFORMANCE.into(), "--no-run".into()]);
    let cargo = Cargo::new(args);
    let message = match cargo.capture_stdout() {
        Ok(c) if c.status.success() => return true,
        Ok(c) => format!(
            "building the conformance suite failed ({}): {}",
            c.status,
            cargo.display()
        ),
        Err(e) => format!("could not run `{}`: {e}", cargo.display()),
    };
    failures.push(message);
    false
}

/// The `cargo test` arguments selecting one backend's conformance tests.
fn suite_args(name: &str, enabled: &[String]) -> Vec<String> {
    let mut args: Vec<String> = vec!["test".into(), "-p".into(), "compute-tests".into()];
    args.extend(feature_args(enabled));
    args.extend([
        "--test".into(),
        CONFORMANCE.into(),
        "--no-fail-fast".into(),
        "--".into(),
        format!("{name}::"),
    ]);
    args
}

/// Run one backend's conformance tests.
fn run_suite(
    name: &str,
    enabled: &[String],
    failures: &mut Vec<String>,
    reduced: &mut Vec<String>,
) -> BackendReport {
    run_suite_with(name, name, &[], enabled, failures, reduced)
}

/// Run one backend's conformance tests with extra environment, reported as `label`.
fn run_suite_with(
    name: &str,
    label: &str,
    envs: &[(&str, &str)],
    enabled: &[String],
    failures: &mut Vec<String>,
    reduced: &mut Vec<String>,
) -> BackendReport {
    eprintln!("xtask: running the conformance suite for {label} ...");
    let mut cargo = Cargo::new(suite_args(name, enabled));
    for (k, v) in envs {
        cargo = cargo.env(k, v);
    }
    let verdict = run_tests(&cargo, &format!("backend {label}"));
    if verdict.counts.is_empty() {
        eprintln!("xtask: warning: no conformance test matched `{name}::`");
    }
    failures.extend(verdict.failures);
    reduced.extend(verdict.reduced);
    BackendReport {
        backend: label.to_string(),
        passed: verdict.counts.passed,
        failed: verdict.counts.failed,
        skipped: verdict.counts.skipped,
        reason: None,
    }
}

/// The `cargo run` arguments of one example, built with the suite's features.
fn example_args(example: &str, enabled: &[String]) -> Vec<String> {
    let mut args: Vec<String> = vec!["run".into(), "-p".into(), "compute-tests".into()];
    args.extend(feature_args(enabled));
    args.extend(["--example".into(), example.into()]);
    args
}

/// Run every example on every available backend; a failed example is a failure of test-all.
fn run_examples(
    available: &[String],
    enabled: &[String],
    failures: &mut Vec<String>,
) -> Vec<ExampleReport> {
    let mut reports = Vec::new();
    for backend in available {
        for example in EXAMPLES {
            let cargo =
                Cargo::new(example_args(example, enabled)).env(EXAMPLE_BACKEND_ENV, backend);
            eprintln!("xtask: running {} ...", cargo.display());
            let ok = match cargo.tee() {
                Ok(c) if c.status.success() => true,
                Ok(c) => {
                    failures.push(format!(
                        "example {example} on {backend} failed ({}): {}",
                        c.status,
                        cargo.display()
                    ));
                    false
                }
                Err(e) => {
                    failures.push(format!("could not run `{}`: {e}", cargo.display()));
                    false
                }
            };
            reports.push(ExampleReport {
                example: example.into(),
                backend: backend.clone(),
                ok,
            });
        }
    }
    reports
}

/// The `cargo test` arguments of the multi-process tests; the tests of a GPU backend the probe
/// did not find (named `BACKEND_...`) are skipped.
fn world_args(enabled: &[String], unavailable: &[String]) -> Vec<String> {
    let mut args: Vec<String> = vec!["test".into(), "-p".into(), "compute-tests".into()];
    args.extend(feature_args(enabled));
    args.extend(["--test".into(), WORLD.into(), "--no-fail-fast".into()]);
    if !unavailable.is_empty() {
        args.push("--".into());
        for name in unavailable {
            args.extend(["--skip".into(), format!("{name}_")]);
        }
    }
    args
}

/// Run the multi-process collective tests (2 and 4 local processes of the CPU backend) when the
/// CPU backend is built and available; `None` when it is not built.
fn world_tests(
    probed: &[(String, Availability)],
    enabled: &[String],
    failures: &mut Vec<String>,
) -> Option<BackendReport> {
    let (_, availability) = probed.iter().find(|(name, _)| name == "cpu")?;
    if let Availability::Unavailable(reason) = availability {
        return Some(BackendReport {
            backend: WORLD_ROW.into(),
            passed: 0,
            failed: 0,
            skipped: 0,
            reason: Some(reason.clone()),
        });
    }
    eprintln!("xtask: running the multi-process collective tests (cpu, 2 and 4 processes) ...");
    let unavailable: Vec<String> = probed
        .iter()
        .filter(|(_, a)| matches!(a, Availability::Unavailable(_)))
        .map(|(name, _)| name.clone())
        .collect();
    let cargo = Cargo::new(world_args(enabled, &unavailable));
    let verdict = run_tests(&cargo, "multi-process collectives (cpu)");
    if verdict.counts.is_empty() {
        failures.push("multi-process collectives (cpu): no test ran".into());
    }
    failures.extend(verdict.failures);
    Some(BackendReport {
        backend: WORLD_ROW.into(),
        passed: verdict.counts.passed,
        failed: verdict.counts.failed,
        skipped: verdict.counts.skipped,
        reason: None,
    })
}

/// How many conformance tests a backend has (for a skipped backend).
fn list_tests(name: &str, enabled: &[String]) -> u64 {
    let mut args = suite_args(name, enabled);
    args.push("--list".into());
    let cargo = Cargo::new(args);
    match cargo.capture_stdout() {
        Ok(c) if c.status.success() => count_listed_tests(&c.stdout),
        Ok(c) => {
            eprintln!(
                "xtask: warning: listing {name}'s tests failed ({})",
                c.status
            );
            0
        }
        Err(e) => {
            eprintln!("xtask: warning: could not run `{}`: {e}", cargo.display());
            0
        }
    }
}

/// The failure messages for required backends that did not run.
fn check_required(
    required: &[String],
    selection: &Selection,
    reports: &[BackendReport],
) -> Vec<String> {
    let mut messages = Vec::new();
    for name in required {
        let reason = if let Some(report) = reports.iter().find(|r| &r.backend == name) {
            match &report.reason {
                Some(reason) => Some(reason.clone()),
                None if report.passed + report.failed == 0 => Some(format!(
                    "no conformance test ran ({} skipped)",
                    report.skipped
                )),
                None => None,
            }
        } else if selection.filtered_out.contains(name) {
            Some(format!("excluded by {}", backends::BACKENDS_ENV))
        } else if KNOWN.contains(&name.as_str()) {
            Some(format!("compute-tests has no feature `{name}`"))
        } else {
            Some(format!("not a known backend (known: {})", KNOWN.join(", ")))
        };
        if let Some(reason) = reason {
            messages.push(format!("required backend {name} did not run: {reason}"));
        }
    }
    messages
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn report(
        name: &str,
        passed: u64,
        failed: u64,
        skipped: u64,
        reason: Option<&str>,
    ) -> BackendReport {
        BackendReport {
            backend: name.into(),
            passed,
            failed,
            skipped,
            reason: reason.map(Into::into),
        }
    }

    #[test]
    fn suite_args_filter_on_module() {
        assert_eq!(
            suite_args("wgpu", &names(&["cpu", "wgpu"])),
            names(&[
                "test",
                "-p",
                "compute-tests",
                "--no-default-features",
                "--features",
                "cpu,wgpu",
                "--test",
                "conformance",
                "--no-fail-fast",
                "--",
                "wgpu::",
            ])
        );
    }

    #[test]
    fn example_args_share_the_suite_features() {
        assert_eq!(
            example_args("matmul", &names(&["cpu", "vulkan"])),
            names(&[
                "run",
                "-p",
                "compute-tests",
                "--no-default-features",
                "--features",
                "cpu,vulkan",
                "--example",
                "matmul",
            ])
        );
        let line = Cargo::new(["run"])
            .env(EXAMPLE_BACKEND_ENV, "wgpu")
            .display();
        assert_eq!(line, "COMPUTE_BACKEND=wgpu cargo run");
    }

    #[test]
    fn required_backends() {
        let selection = Selection {
            enabled: names(&["cpu", "wgpu", "cuda"]),
            filtered_out: names(&["vulkan"]),
            not_declared: vec![],
            unknown_in_filter: vec![],
        };
        let reports = vec![
            report("cpu", 10, 0, 1, None),
            report("wgpu", 0, 0, 11, Some("no adapter found")),
            report("cuda", 0, 0, 4, None),
        ];
        let got = check_required(
            &names(&["cpu", "wgpu", "vulkan", "cuda", "metal"]),
            &selection,
            &reports,
        );
        assert_eq!(
            got,
            names(&[
                "required backend wgpu did not run: no adapter found",
                "required backend vulkan did not run: excluded by COMPUTE_BACKENDS",
                "required backend cuda did not run: no conformance test ran (4 skipped)",
                "required backend metal did not run: not a known backend (known: cpu, wgpu, vulkan, cuda)",
            ])
        );
    }

    #[test]
    fn required_backend_not_declared() {
        let selection = Selection {
            enabled: names(&["cpu"]),
            filtered_out: vec![],
            not_declared: names(&["wgpu", "vulkan", "cuda"]),
            unknown_in_filter: vec![],
        };
        let got = check_required(
            &names(&["cuda"]),
            &selection,
            &[report("cpu", 1, 0, 0, None)],
        );
        assert_eq!(
            got,
            names(&["required backend cuda did not run: compute-tests has no feature `cuda`"])
        );
        assert!(
            check_required(
                &names(&["cpu"]),
                &selection,
                &[report("cpu", 1, 0, 0, None)]
            )
            .is_empty()
        );
        // A backend that ran and failed did run: its failures are reported elsewhere.
        assert!(
            check_required(
                &names(&["cpu"]),
                &selection,
                &[report("cpu", 0, 2, 0, None)]
            )
            .is_empty()
        );
    }

    #[test]
    fn world_args_name_the_target() {
        assert_eq!(
            world_args(&names(&["cpu", "wgpu"]), &names(&["wgpu"]))[9..],
            names(&["--", "--skip", "wgpu_"])
        );
        assert_eq!(
            world_args(&names(&["cpu"]), &[]),
            names(&[
                "test",
                "-p",
                "compute-tests",
                "--no-default-features",
                "--features",
                "cpu",
                "--test",
                "world",
                "--no-fail-fast",
            ])
        );
        // Without the CPU backend built there is no row.
        let mut failures = Vec::new();
        assert_eq!(world_tests(&[], &names(&["wgpu"]), &mut failures), None);
        let unavailable = [("cpu".to_string(), Availability::Unavailable("x".into()))];
        let row = world_tests(&unavailable, &names(&["cpu"]), &mut failures).unwrap();
        assert_eq!(
            (row.backend.as_str(), row.reason.as_deref()),
            (WORLD_ROW, Some("x"))
        );
        assert!(failures.is_empty());
    }
}
