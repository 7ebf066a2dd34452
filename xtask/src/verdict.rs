//! Turning a finished `cargo test` run (exit status + parsed output) into
//! counts and failure messages.

use serde::Serialize;

use crate::libtest::{Counts, ParsedRun};

/// A test that passed, but only in a reduced form (reported through
/// `compute_core::env::report_reduced`): counted as skipped, with its reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reduced {
    /// The libtest name (`cpu::foreign_handle_is_rejected`).
    pub test: String,
    /// Why only the reduced form ran.
    pub reason: String,
}

impl Reduced {
    /// `TEST: REASON`.
    pub fn line(&self) -> String {
        format!("{}: {}", self.test, self.reason)
    }
}

/// The judged outcome of one `cargo test` run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Test counts, with one extra failure for a run that crashed or
    /// failed without a failing test to show for it.
    pub counts: Counts,
    /// Why the run failed; empty when it passed.
    pub failures: Vec<String>,
    /// Tests that passed but could only run a reduced form: counted as skipped, not passed.
    pub reduced: Vec<Reduced>,
}

/// Judge one run. `what` names it in messages, `success` is whether cargo
/// exited with 0, `detail` describes the exit (see
/// [`crate::cargo::Captured::failure_detail`]).
pub fn judge(what: &str, parsed: &ParsedRun, success: bool, detail: &str) -> Verdict {
    let mut counts = parsed.counts;
    let mut failures = Vec::new();
    if success {
        if counts.failed > 0 {
            // Cannot happen with libtest, but never let failures pass.
            failures.push(format!(
                "{what}: {} test(s) failed although cargo exited successfully",
                counts.failed
            ));
        }
        return Verdict {
            counts,
            failures,
            reduced: Vec::new(),
        };
    }
    if !parsed.trailing.is_empty() {
        counts += parsed.trailing;
        counts.failed += 1;
        failures.push(format!(
            "{what}: the test binary stopped before printing its summary ({detail}); \
             counted as 1 more failed test"
        ));
    } else if counts.failed == 0 {
        counts.failed += 1;
        let how = if parsed.summaries == 0 {
            "printed no libtest summary line"
        } else {
            "showed no failing test in its summaries"
        };
        failures.push(format!(
            "{what}: cargo failed ({detail}) but {how}: a crash such as a segfault, \
             or a build failure; counted as 1 failed test"
        ));
    }
    if counts.failed > 0 && failures.is_empty() {
        failures.push(format!("{what}: {} test(s) failed", counts.failed));
    }
    Verdict {
        counts,
        failures,
        reduced: Vec::new(),
    }
}

/// Move the tests a run reported as reduced (`reduced_log`: lines `NAME<TAB>REASON`, written
/// through `compute_core::env::report_reduced`) from passed to skipped. Only tests that passed
/// move: a reduced test that failed stays a failure.
pub fn apply_reduced(verdict: &mut Verdict, passed: &[String], reduced_log: &str) {
    // Each test once, with its distinct reasons in the order reported.
    let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for line in reduced_log.lines() {
        if let Some((name, reason)) = line.split_once('\t') {
            let reasons = seen.entry(name.to_owned()).or_default();
            if !reasons.iter().any(|r| r == reason) {
                reasons.push(reason.to_owned());
            }
        }
    }
    for (name, reasons) in seen {
        if passed.iter().any(|p| p == &name) && verdict.counts.passed > 0 {
            verdict.counts.passed -= 1;
            verdict.counts.skipped += 1;
            verdict.reduced.push(Reduced {
                test: name,
                reason: reasons.join("; "),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::libtest::parse_run;

    const OK: &str = "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.1s\n";
    const FAILED: &str = "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s\n";

    #[test]
    fn passing_run() {
        let v = judge("cpu", &parse_run(OK), true, "exit status: 0");
        assert_eq!(
            v.counts,
            Counts {
                passed: 3,
                failed: 0,
                skipped: 1
            }
        );
        assert!(v.failures.is_empty());
    }

    #[test]
    fn failing_tests() {
        let v = judge("cpu", &parse_run(FAILED), false, "exit status: 101");
        assert_eq!(v.counts.failed, 1);
        assert_eq!(v.counts.passed, 2);
        assert_eq!(v.failures, vec!["cpu: 1 test(s) failed".to_string()]);
    }

    #[test]
    fn crash_without_summary() {
        let out = "running 4 tests\ntest cpu::a ... ok\ntest cpu::b ... ok\n";
        let v = judge(
            "cpu",
            &parse_run(out),
            false,
            "exit status: 101; signal: 11",
        );
        assert_eq!(
            v.counts,
            Counts {
                passed: 2,
                failed: 1,
                skipped: 0
            }
        );
        assert_eq!(v.failures.len(), 1);
        assert!(v.failures[0].contains("signal: 11"), "{}", v.failures[0]);
    }

    #[test]
    fn nothing_printed_and_failed() {
        let v = judge("unit", &parse_run(""), false, "exit status: 101");
        assert_eq!(v.counts.failed, 1);
        assert!(v.failures[0].contains("printed no libtest summary line"));
    }

    #[test]
    fn summaries_ok_but_nonzero_exit() {
        let v = judge("unit", &parse_run(OK), false, "exit status: 101");
        assert_eq!(v.counts.passed, 3);
        assert_eq!(v.counts.failed, 1);
        assert!(v.failures[0].contains("no failing test in its summaries"));
    }

    #[test]
    fn trailing_lines_ignored_on_success() {
        let out = format!("{OK}test stray ... ok\n");
        let v = judge("unit", &parse_run(&out), true, "exit status: 0");
        assert_eq!(v.counts.passed, 3);
        assert!(v.failures.is_empty());
    }

    #[test]
    fn reduced_runs_move_from_passed_to_skipped() {
        let output = "test cpu::a ... ok\ntest cpu::b ... ok\ntest cpu::c ... FAILED\n\
                      test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n";
        let mut verdict = judge("backend cpu", &parse_run(output), false, "exit status: 101");
        let log = "cpu::b\tneeds 3 devices\ncpu::b\tneeds 3 devices\ncpu::c\tno driver\n";
        apply_reduced(&mut verdict, &crate::libtest::passed_names(output), log);
        assert_eq!(verdict.counts.passed, 1);
        assert_eq!(verdict.counts.skipped, 1, "a reduced test counts once");
        assert_eq!(
            verdict.counts.failed, 1,
            "a reduced test that failed stays failed"
        );
        assert_eq!(
            verdict.reduced,
            vec![Reduced {
                test: "cpu::b".into(),
                reason: "needs 3 devices".into()
            }]
        );
        assert_eq!(verdict.reduced[0].line(), "cpu::b: needs 3 devices");
    }

    #[test]
    fn a_test_reduced_for_two_reasons_names_both() {
        let output = "test wgpu::x ... ok\ntest wgpu::y ... ok\n\
                      test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n";
        let mut verdict = judge("backend wgpu", &parse_run(output), true, "exit status: 0");
        let log =
            "wgpu::x\tlacks f64\nwgpu::x\tlacks f16\nwgpu::x\tlacks f64\nunknown\tnot run here\n";
        apply_reduced(&mut verdict, &crate::libtest::passed_names(output), log);
        assert_eq!(
            verdict.counts,
            Counts {
                passed: 1,
                failed: 0,
                skipped: 1
            }
        );
        assert_eq!(
            verdict.reduced.len(),
            1,
            "a name that did not pass is ignored"
        );
        assert_eq!(verdict.reduced[0].line(), "wgpu::x: lacks f64; lacks f16");
    }
}
