//! The JSON report of `cargo xtask test-all` (`target/test-all.json`).

use std::fs;
use std::io;
use std::path::Path;

use serde::Serialize;

use crate::libtest::Counts;
use crate::verdict::Reduced;

/// Counts of the workspace's non-conformance tests.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct UnitReport {
    /// Tests that passed.
    pub passed: u64,
    /// Tests that failed (a crashed or unbuildable run counts as one).
    pub failed: u64,
    /// Ignored tests, and the reduced runs.
    pub skipped: u64,
    /// How many of `skipped` are tests that ran a reduced form only (`reduced_runs`).
    pub reduced: u64,
    /// The tests that ran a reduced form only, with their reasons.
    pub reduced_runs: Vec<Reduced>,
}

impl UnitReport {
    /// The counts of the unit runs and their reduced runs.
    pub fn new(c: Counts, reduced_runs: Vec<Reduced>) -> Self {
        Self {
            passed: c.passed,
            failed: c.failed,
            skipped: c.skipped,
            reduced: reduced_runs.len() as u64,
            reduced_runs,
        }
    }
}

/// ` (N reduced runs counted as skipped)`, or nothing for none.
fn reduced_note(n: u64) -> String {
    match n {
        0 => String::new(),
        1 => " (1 reduced run counted as skipped)".into(),
        n => format!(" ({n} reduced runs counted as skipped)"),
    }
}

/// The result of one backend's conformance suite.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BackendReport {
    /// The backend name (`cpu`, `wgpu`, ...).
    pub backend: String,
    /// Tests that passed.
    pub passed: u64,
    /// Tests that failed (a crashed run counts one more).
    pub failed: u64,
    /// Ignored tests, reduced runs, or all tests of a skipped backend.
    pub skipped: u64,
    /// How many of `skipped` are tests of this row that ran a reduced form only.
    pub reduced: u64,
    /// The tests of this row that ran a reduced form only, with their reasons.
    pub reduced_runs: Vec<Reduced>,
    /// Why the backend was skipped; `null` when its suite ran.
    pub reason: Option<String>,
}

impl BackendReport {
    /// A row whose suite ran: its counts and its reduced runs.
    pub fn ran(backend: &str, counts: Counts, reduced_runs: Vec<Reduced>) -> Self {
        Self {
            backend: backend.to_string(),
            passed: counts.passed,
            failed: counts.failed,
            skipped: counts.skipped,
            reduced: reduced_runs.len() as u64,
            reduced_runs,
            reason: None,
        }
    }

    /// A row whose suite did not run (`reason`), with `skipped` tests.
    pub fn not_run(backend: &str, failed: u64, skipped: u64, reason: Option<String>) -> Self {
        Self {
            backend: backend.to_string(),
            passed: 0,
            failed,
            skipped,
            reduced: 0,
            reduced_runs: Vec::new(),
            reason,
        }
    }

    /// The human-readable line: `backend NAME: N passed, N failed, N skipped[ (N reduced runs
    /// counted as skipped)][ (skipped: REASON)]`.
    pub fn line(&self) -> String {
        let mut line = format!(
            "backend {}: {} passed, {} failed, {} skipped{}",
            self.backend,
            self.passed,
            self.failed,
            self.skipped,
            reduced_note(self.reduced)
        );
        if let Some(reason) = &self.reason {
            line.push_str(&format!(" (skipped: {reason})"));
        }
        line
    }
}

/// One example run on one backend (`cargo run --example NAME` with `COMPUTE_BACKEND=BACKEND`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ExampleReport {
    /// The example.
    pub example: String,
    /// The backend it ran on.
    pub backend: String,
    /// Whether it exited 0 (built, ran, and verified its results).
    pub ok: bool,
}

impl ExampleReport {
    /// The human-readable line: `example NAME on BACKEND: verified|FAILED`.
    pub fn line(&self) -> String {
        let verdict = if self.ok { "verified" } else { "FAILED" };
        format!("example {} on {}: {verdict}", self.example, self.backend)
    }
}

/// The whole `test-all.json`.
#[derive(Debug, Clone, Serialize)]
pub struct TestAllReport {
    /// Workspace unit tests (everything outside the conformance suite).
    pub unit: UnitReport,
    /// One entry per built backend, in order.
    pub backends: Vec<BackendReport>,
    /// Every row's tests that passed a reduced form only (`ROW: TEST: REASON`, the row `unit`
    /// for the unit tests); their counts are in the rows' `skipped` and `reduced`.
    pub reduced: Vec<String>,
    /// Each example on each available backend.
    pub examples: Vec<ExampleReport>,
    /// Every failure message, also printed on stderr.
    pub failures: Vec<String>,
    /// `true` when `failures` is empty (the exit code is 0).
    pub ok: bool,
}

impl UnitReport {
    /// `workspace unit tests: N passed, N failed, N skipped[ (N reduced runs counted as
    /// skipped)]`.
    pub fn line(&self) -> String {
        format!(
            "workspace unit tests: {} passed, {} failed, {} skipped{}",
            self.passed,
            self.failed,
            self.skipped,
            reduced_note(self.reduced)
        )
    }
}

/// Write the report as pretty JSON, creating the directory if needed.
pub fn write(report: &TestAllReport, path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut json = serde_json::to_string_pretty(report).map_err(io::Error::other)?;
    json.push('\n');
    fs::write(path, json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines() {
        let ran = BackendReport {
            backend: "cpu".into(),
            passed: 12,
            failed: 1,
            skipped: 3,
            reduced: 0,
            reduced_runs: Vec::new(),
            reason: None,
        };
        assert_eq!(ran.line(), "backend cpu: 12 passed, 1 failed, 3 skipped");
        let skipped = BackendReport {
            backend: "cuda".into(),
            passed: 0,
            failed: 0,
            skipped: 15,
            reduced: 0,
            reduced_runs: Vec::new(),
            reason: Some("libcuda.so.1 not found".into()),
        };
        assert_eq!(
            skipped.line(),
            "backend cuda: 0 passed, 0 failed, 15 skipped (skipped: libcuda.so.1 not found)"
        );
        let unit = UnitReport::new(
            Counts {
                passed: 40,
                failed: 0,
                skipped: 2,
            },
            Vec::new(),
        );
        assert_eq!(
            unit.line(),
            "workspace unit tests: 40 passed, 0 failed, 2 skipped"
        );
    }

    #[test]
    fn json_shape() {
        let report = TestAllReport {
            unit: UnitReport::new(
                Counts {
                    passed: 5,
                    failed: 0,
                    skipped: 1,
                },
                Vec::new(),
            ),
            backends: vec![
                BackendReport::ran(
                    "cpu",
                    Counts {
                        passed: 3,
                        failed: 0,
                        skipped: 1,
                    },
                    vec![Reduced {
                        test: "cpu::a".into(),
                        reason: "too few devices: 1".into(),
                    }],
                ),
                BackendReport::not_run("wgpu", 0, 3, Some("no adapter".into())),
            ],
            reduced: vec!["cpu: cpu::a: too few devices: 1".into()],
            examples: vec![ExampleReport {
                example: "matmul".into(),
                backend: "cpu".into(),
                ok: true,
            }],
            failures: vec![],
            ok: true,
        };
        let value = serde_json::to_value(&report).unwrap();
        assert_eq!(
            value,
            json!({
                "unit": {"passed": 5, "failed": 0, "skipped": 1, "reduced": 0, "reduced_runs": []},
                "backends": [
                    {"backend": "cpu", "passed": 3, "failed": 0, "skipped": 1, "reduced": 1,
                     "reduced_runs": [{"test": "cpu::a", "reason": "too few devices: 1"}],
                     "reason": null},
                    {"backend": "wgpu", "passed": 0, "failed": 0, "skipped": 3, "reduced": 0,
                     "reduced_runs": [], "reason": "no adapter"}
                ],
                "reduced": ["cpu: cpu::a: too few devices: 1"],
                "examples": [{"example": "matmul", "backend": "cpu", "ok": true}],
                "failures": [],
                "ok": true
            })
        );
    }

    #[test]
    fn write_creates_dir() {
        let dir = std::env::temp_dir().join(format!("xtask-report-test-{}", std::process::id()));
        let path = dir.join("sub").join("test-all.json");
        let report = TestAllReport {
            unit: UnitReport::new(
                Counts {
                    passed: 1,
                    failed: 0,
                    skipped: 0,
                },
                Vec::new(),
            ),
            backends: vec![],
            reduced: Vec::new(),
            examples: vec![],
            failures: vec!["x".into()],
            ok: false,
        };
        write(&report, &path).unwrap();
        let back: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back["unit"]["passed"], 1);
        assert_eq!(back["ok"], false);
        assert_eq!(back["failures"][0], "x");
        fs::remove_dir_all(&dir).unwrap();
    }
}
