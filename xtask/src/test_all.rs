//! `cargo xtask test-all`: workspace unit tests, then the conformance suite
//! of every built backend that the probe finds available.

use crate::backends::{self, Availability, KNOWN, Selection};
use crate::cargo::{Cargo, feature_args};
use crate::libtest::{Counts, count_listed_tests, parse_run, passed_names};
use crate::paths::target_dir;
use crate::report::{self, BackendReport, ExampleReport, TestAllReport, UnitReport};
use crate::verdict::{Reduced, Verdict, apply_reduced, judge};

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

/// How the reason of a multi-device test's reduced run begins: the text of
/// `compute_tests::util::MULTI_DEVICE_REDUCED` (a test checks the two agree).
pub const MULTI_DEVICE_REDUCED: &str = "too few devices";

/// The backends whose device count is a setting (logical devices on one adapter or host), and
/// that setting. A required one of these must run its multi-device tests in their real form: CI
/// sets 3 devices each, so a reduced run there is a regression. CUDA's devices are the machine's
/// GPUs: its multi-device tests may run reduced (on one GPU) and are then skipped, not failed.
pub const LOGICAL_DEVICES: [(&str, &str); 3] = [
    ("cpu", "COMPUTE_CPU_DEVICES"),
    ("wgpu", "COMPUTE_WGPU_DEVICES"),
    ("vulkan", "COMPUTE_VULKAN_DEVICES"),
];

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
            Availability::Available => BackendReport::not_run(name, 1, 0, None),
            Availability::Unavailable(reason) => BackendReport::not_run(
                name,
                0,
                if built { list_tests(name, &enabled) } else { 0 },
                Some(reason.clone()),
            ),
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
    let mut required_failures = check_required(&required, &selection, &reports);
    required_failures.extend(check_required_reduced(&required, &reports));

    println!();
    let reduced = reduced_lines(&unit, &reports);
    println!("{}", unit.line());
    for report in &reports {
        println!("{}", report.line());
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
    let log = skip_log(what);
    if let Some(dir) = log.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
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

/// The skip log of the run `what` (`target/skips/NAME.log`): one per run, so each row's
/// reduced runs are its own (`backend cpu` and `backend cpu-interpreter` run the same tests).
fn skip_log(what: &str) -> std::path::PathBuf {
    target_dir().join("skips").join(format!(
        "{}.log",
        what.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    ))
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
    let mut reduced = Vec::new();
    for (what, cargo) in commands {
        eprintln!("xtask: running {what}: {} ...", cargo.display());
        let verdict = run_tests(&cargo, &what);
        total += verdict.counts;
        failures.extend(verdict.failures);
        reduced.extend(verdict.reduced);
    }
    UnitReport::new(total, reduced)
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

/// Run one backend's conformance tests with extra environment, reported as `label`. The run has
/// a skip log of its own (named after `label`), so its reduced runs are this row's only.
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
    BackendReport::ran(label, verdict.counts, verdict.reduced)
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
        return Some(BackendReport::not_run(
            WORLD_ROW,
            0,
            0,
            Some(reason.clone()),
        ));
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
    Some(BackendReport::ran(
        WORLD_ROW,
        verdict.counts,
        verdict.reduced,
    ))
}

/// Every reduced run of the unit tests and of each row, as `ROW: TEST: REASON` (the row `unit`
/// for the unit tests), for the report's flat list and the lines under the matrix.
fn reduced_lines(unit: &UnitReport, reports: &[BackendReport]) -> Vec<String> {
    let row = |name: &str, runs: &[Reduced]| -> Vec<String> {
        runs.iter()
            .map(|r| format!("{name}: {}", r.line()))
            .collect()
    };
    let mut lines = row("unit", &unit.reduced_runs);
    for report in reports {
        lines.extend(row(&report.backend, &report.reduced_runs));
    }
    lines
}

/// The backend a matrix row runs: `cpu-interpreter` and the multi-process row are the CPU
/// backend's; the others are named after their backend.
fn row_backend(row: &str) -> &str {
    if row == CPU_INTERPRETER || row == WORLD_ROW {
        "cpu"
    } else {
        row
    }
}

/// The gate on reduced runs: a failure message for each multi-device test (reason beginning
/// with [`MULTI_DEVICE_REDUCED`]) that ran a reduced form on a row of a required backend whose
/// device count is a setting ([`LOGICAL_DEVICES`]). Other reduced runs (a missing feature, a
/// driver's bare disk-cache header, a device limit no input can exceed, the backend crates'
/// tests without a driver) stay skipped with their reason: they do not depend on the device
/// count CI sets.
fn check_required_reduced(required: &[String], reports: &[BackendReport]) -> Vec<String> {
    let mut messages = Vec::new();
    for report in reports {
        let backend = row_backend(&report.backend);
        if !required.iter().any(|r| r == backend) {
            continue;
        }
        let Some((_, setting)) = LOGICAL_DEVICES.iter().find(|(b, _)| *b == backend) else {
            continue;
        };
        for run in &report.reduced_runs {
            if run.reason.starts_with(MULTI_DEVICE_REDUCED) {
                messages.push(format!(
                    "required backend {backend} ran a multi-device test in a reduced form \
                     (row {}; set {setting}=3 as CI does): {}",
                    report.backend,
                    run.line()
                ));
            }
        }
    }
    messages
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
            reduced: 0,
            reduced_runs: Vec::new(),
            reason: reason.map(Into::into),
        }
    }

    fn reduced(test: &str, reason: &str) -> Reduced {
        Reduced {
            test: test.into(),
            reason: reason.into(),
        }
    }

    fn row_with(name: &str, runs: Vec<Reduced>) -> BackendReport {
        let counts = Counts {
            passed: 10,
            failed: 0,
            skipped: runs.len() as u64,
        };
        BackendReport::ran(name, counts, runs)
    }

    const FEW: &str = "too few devices: cpu::init_replaces_the_server needs 2 devices, this machine has 1; only the clean error for a missing device was checked";

    #[test]
    fn reduced_runs_belong_to_the_row_that_ran_them() {
        // Each row has its own skip log, so the same test reduced on the interpreter row only
        // is that row's.
        assert_ne!(skip_log("backend cpu"), skip_log("backend cpu-interpreter"));
        assert_ne!(
            skip_log("backend cpu"),
            skip_log("multi-process collectives (cpu)")
        );
        let unit = UnitReport::new(
            Counts {
                passed: 5,
                failed: 0,
                skipped: 1,
            },
            vec![reduced("runtime::device", "Vulkan unavailable (no loader)")],
        );
        let reports = vec![
            row_with("cpu", vec![reduced("cpu::a", "x")]),
            row_with(
                CPU_INTERPRETER,
                vec![reduced("cpu::a", "x"), reduced("cpu::b", FEW)],
            ),
            row_with(WORLD_ROW, vec![reduced("cuda_world", "no GPU")]),
            row_with("wgpu", vec![]),
        ];
        assert_eq!(
            unit.line(),
            "workspace unit tests: 5 passed, 0 failed, 1 skipped (1 reduced run counted as skipped)"
        );
        let lines: Vec<String> = reports.iter().map(BackendReport::line).collect();
        assert_eq!(
            lines,
            names(&[
                "backend cpu: 10 passed, 0 failed, 1 skipped (1 reduced run counted as skipped)",
                "backend cpu-interpreter: 10 passed, 0 failed, 2 skipped (2 reduced runs counted as skipped)",
                "backend cpu-processes: 10 passed, 0 failed, 1 skipped (1 reduced run counted as skipped)",
                "backend wgpu: 10 passed, 0 failed, 0 skipped",
            ])
        );
        assert_eq!(
            reports.iter().map(|r| r.reduced).collect::<Vec<_>>(),
            vec![1, 2, 1, 0]
        );
        assert_eq!(
            reduced_lines(&unit, &reports),
            vec![
                "unit: runtime::device: Vulkan unavailable (no loader)".to_string(),
                "cpu: cpu::a: x".to_string(),
                "cpu-interpreter: cpu::a: x".to_string(),
                format!("cpu-interpreter: cpu::b: {FEW}"),
                "cpu-processes: cuda_world: no GPU".to_string(),
            ]
        );
    }

    #[test]
    fn required_backends_fail_on_reduced_multi_device_runs() {
        let few = |backend: &str, test: &str| {
            reduced(
                &format!("{backend}::{test}"),
                &format!(
                    "{MULTI_DEVICE_REDUCED}: {backend}::{test} needs 3 devices, this machine has 1"
                ),
            )
        };
        let reports = vec![
            row_with(
                "cpu",
                vec![
                    few("cpu", "all_reduce_sum_and_mean"),
                    reduced(
                        "cpu::over_limit_dynamic_count_is_an_error",
                        "cpu: no u32 count exceeds max_cube_count",
                    ),
                ],
            ),
            row_with(
                CPU_INTERPRETER,
                vec![few("cpu", "init_replaces_the_server")],
            ),
            row_with(WORLD_ROW, vec![]),
            // A missing feature and a driver's bare disk-cache header do not depend on the
            // device count: skipped, never failed.
            row_with("wgpu", vec![reduced("wgpu::ir_math_f64", "wgpu lacks f64")]),
            row_with(
                "vulkan",
                vec![
                    reduced(
                        "vulkan::disk_cache",
                        "the driver returned a bare pipeline cache header",
                    ),
                    few("vulkan", "foreign_handle_is_rejected"),
                ],
            ),
            // CUDA's devices are the machine's GPUs: one GPU reduces its multi-device tests.
            row_with(
                "cuda",
                vec![few("cuda", "to_client_copies_between_devices")],
            ),
        ];
        let got = check_required_reduced(&names(&["cpu", "wgpu", "cuda"]), &reports);
        assert_eq!(
            got,
            vec![
                format!(
                    "required backend cpu ran a multi-device test in a reduced form (row cpu; \
                     set COMPUTE_CPU_DEVICES=3 as CI does): cpu::all_reduce_sum_and_mean: \
                     {MULTI_DEVICE_REDUCED}: cpu::all_reduce_sum_and_mean needs 3 devices, this machine has 1"
                ),
                format!(
                    "required backend cpu ran a multi-device test in a reduced form (row \
                     cpu-interpreter; set COMPUTE_CPU_DEVICES=3 as CI does): \
                     cpu::init_replaces_the_server: {MULTI_DEVICE_REDUCED}: \
                     cpu::init_replaces_the_server needs 3 devices, this machine has 1"
                ),
            ]
        );
        // Vulkan is not required here: its reduced run is a skip. Required, it fails.
        let vulkan = check_required_reduced(&names(&["vulkan"]), &reports);
        assert_eq!(vulkan.len(), 1, "{vulkan:?}");
        assert!(
            vulkan[0].contains("COMPUTE_VULKAN_DEVICES=3")
                && vulkan[0].contains("vulkan::foreign_handle_is_rejected: too few devices"),
            "{}",
            vulkan[0]
        );
        // Nothing required: no gate.
        assert!(check_required_reduced(&[], &reports).is_empty());
    }

    #[test]
    fn multi_device_marker_matches_the_suite() {
        let util = include_str!("../../compute-tests/src/util.rs");
        let line = format!("pub const MULTI_DEVICE_REDUCED: &str = \"{MULTI_DEVICE_REDUCED}\";");
        assert!(
            util.contains(&line),
            "compute-tests/src/util.rs must define `{line}`"
        );
        assert!(util.contains("\"{MULTI_DEVICE_REDUCED}: {}::{test} needs {n} devices"));
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
