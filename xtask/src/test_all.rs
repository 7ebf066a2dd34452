//! `cargo xtask test-all`: workspace unit tests, then the conformance suite
//! of every built backend that the probe finds available.

use crate::backends::{self, Availability, KNOWN, Selection};
use crate::cargo::{Cargo, feature_args};
use crate::libtest::{Counts, count_listed_tests, parse_run};
use crate::paths::target_dir;
use crate::report::{self, BackendReport, TestAllReport, UnitReport};
use crate::verdict::{Verdict, judge};

/// Env var naming backends that must run (comma-separated).
pub const REQUIRE_ENV: &str = "COMPUTE_REQUIRE_BACKENDS";

/// The CPU backend's second matrix line: its suite again on the interpreter (the first runs
/// the JIT, the default), named so in the report.
pub const CPU_INTERPRETER: &str = "cpu-interpreter";

/// The integration test target holding the conformance suite.
const CONFORMANCE: &str = "conformance";

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

    let unit = unit_tests(&enabled, &mut failures);

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
            Availability::Available if built => run_suite(name, &enabled, &mut failures),
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
            ));
        }
    }

    let required = backends::env_name_list(REQUIRE_ENV).unwrap_or_default();
    let required_failures = check_required(&required, &selection, &reports);

    println!();
    println!("{}", unit.line());
    for report in &reports {
        println!("{}", report.line());
    }
    for message in &required_failures {
        println!("{message}");
    }
    failures.extend(required_failures);

    let report = TestAllReport {
        unit,
        backends: reports,
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
fn run_tests(cargo: &Cargo, what: &str) -> Verdict {
    match cargo.tee() {
        Ok(captured) => judge(
            what,
            &parse_run(&captured.stdout),
            captured.status.success(),
            &captured.failure_detail(),
        ),
        Err(e) => Verdict {
            counts: Counts {
                failed: 1,
                ..Counts::default()
            },
            failures: vec![format!("{what}: could not run `{}`: {e}", cargo.display())],
        },
    }
}

/// The workspace's tests outside the conformance suite: every other
/// crate, plus the lib and doc tests of `compute-tests`.
fn unit_tests(enabled: &[String], failures: &mut Vec<String>) -> UnitReport {
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
fn run_suite(name: &str, enabled: &[String], failures: &mut Vec<String>) -> BackendReport {
    run_suite_with(name, name, &[], enabled, failures)
}

/// Run one backend's conformance tests with extra environment, reported as `label`.
fn run_suite_with(
    name: &str,
    label: &str,
    envs: &[(&str, &str)],
    enabled: &[String],
    failures: &mut Vec<String>,
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
    BackendReport {
        backend: label.to_string(),
        passed: verdict.counts.passed,
        failed: verdict.counts.failed,
        skipped: verdict.counts.skipped,
        reason: None,
    }
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
}
