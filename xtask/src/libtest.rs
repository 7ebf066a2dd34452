//! Parsing the text output of libtest (the standard Rust test harness).

use std::ops::AddAssign;

/// Test counts. libtest's "ignored" is reported as skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Tests that passed.
    pub passed: u64,
    /// Tests that failed.
    pub failed: u64,
    /// Tests that were ignored.
    pub skipped: u64,
}

impl Counts {
    /// Whether no test was counted at all.
    pub fn is_empty(&self) -> bool {
        self.passed == 0 && self.failed == 0 && self.skipped == 0
    }
}

impl AddAssign for Counts {
    fn add_assign(&mut self, other: Self) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.skipped += other.skipped;
    }
}

/// One `test result: ...` summary line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// `true` for `ok.`, `false` for `FAILED.`.
    pub ok: bool,
    /// The counts on the line.
    pub counts: Counts,
}

/// Parse a summary line such as
/// `test result: ok. 12 passed; 0 failed; 3 ignored; 0 measured; 5 filtered out; finished in 0.5s`.
pub fn parse_summary_line(line: &str) -> Option<Summary> {
    let line = strip_ansi(line);
    let rest = line.trim().strip_prefix("test result:")?.trim_start();
    let (verdict, fields) = rest.split_once('.')?;
    let ok = match verdict.trim() {
        "ok" => true,
        "FAILED" => false,
        _ => return None,
    };
    let mut passed = None;
    let mut failed = None;
    let mut ignored = None;
    for field in fields.split(';') {
        let field = field.trim();
        let Some((number, word)) = field.split_once(' ') else {
            continue;
        };
        let Ok(number) = number.parse::<u64>() else {
            continue;
        };
        match word.trim() {
            "passed" => passed = Some(number),
            "failed" => failed = Some(number),
            "ignored" => ignored = Some(number),
            _ => {}
        }
    }
    Some(Summary {
        ok,
        counts: Counts {
            passed: passed?,
            failed: failed?,
            skipped: ignored.unwrap_or(0),
        },
    })
}

/// The outcome of one `test NAME ... RESULT` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestOutcome {
    /// `ok`
    Passed,
    /// `FAILED`
    Failed,
    /// `ignored` or `ignored, reason`
    Ignored,
}

/// Parse a per-test result line such as `test cpu::add ... ok`.
pub fn parse_test_line(line: &str) -> Option<TestOutcome> {
    let line = strip_ansi(line);
    let line = line.trim_end();
    let rest = line.strip_prefix("test ")?;
    let (_name, result) = rest.rsplit_once(" ... ")?;
    let result = result.trim();
    if result == "ok" {
        Some(TestOutcome::Passed)
    } else if result == "FAILED" {
        Some(TestOutcome::Failed)
    } else if result == "ignored" || result.starts_with("ignored,") {
        Some(TestOutcome::Ignored)
    } else {
        None
    }
}

/// The names of the tests a run's output shows as passed (`test NAME ... ok`).
pub fn passed_names(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|line| {
            let line = strip_ansi(line);
            let rest = line.trim_end().strip_prefix("test ")?;
            let (name, result) = rest.rsplit_once(" ... ")?;
            (result.trim() == "ok").then(|| name.trim().to_owned())
        })
        .collect()
}

/// Everything learnt from the output of one `cargo test` run, which may
/// hold the output of several test binaries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParsedRun {
    /// Sum over all summary lines.
    pub counts: Counts,
    /// How many summary lines were found.
    pub summaries: usize,
    /// Whether any summary said `FAILED.`.
    pub any_failed_summary: bool,
    /// Per-test result lines after the last summary line: when the run
    /// failed, the last test binary stopped (crashed) before summing up.
    pub trailing: Counts,
}

/// Parse the whole stdout of a `cargo test` run: sum every summary line,
/// and count the per-test lines that no summary followed.
pub fn parse_run(output: &str) -> ParsedRun {
    let mut run = ParsedRun::default();
    for line in output.lines() {
        if let Some(summary) = parse_summary_line(line) {
            run.counts += summary.counts;
            run.summaries += 1;
            run.any_failed_summary |= !summary.ok;
            run.trailing = Counts::default();
        } else if let Some(outcome) = parse_test_line(line) {
            match outcome {
                TestOutcome::Passed => run.trailing.passed += 1,
                TestOutcome::Failed => run.trailing.failed += 1,
                TestOutcome::Ignored => run.trailing.skipped += 1,
            }
        }
    }
    run
}

/// Count the tests in the output of `--list`: lines ending in `: test`.
pub fn count_listed_tests(output: &str) -> u64 {
    output
        .lines()
        .filter(|line| strip_ansi(line).trim_end().ends_with(": test"))
        .count() as u64
}

/// Remove ANSI escape sequences (`ESC [ ... letter`) from a line.
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.clone().next() == Some('[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(passed: u64, failed: u64, skipped: u64) -> Counts {
        Counts {
            passed,
            failed,
            skipped,
        }
    }

    #[test]
    fn summary_ok_line() {
        let s = parse_summary_line(
            "test result: ok. 12 passed; 0 failed; 3 ignored; 0 measured; 5 filtered out; finished in 0.5s",
        )
        .unwrap();
        assert!(s.ok);
        assert_eq!(s.counts, counts(12, 0, 3));
    }

    #[test]
    fn summary_failed_line() {
        let s = parse_summary_line(
            "test result: FAILED. 7 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out; finished in 1.25s",
        )
        .unwrap();
        assert!(!s.ok);
        assert_eq!(s.counts, counts(7, 2, 1));
    }

    #[test]
    fn summary_with_colour_and_indent() {
        let s = parse_summary_line(
            "  test result: \u{1b}[32mok\u{1b}[0m. 4 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\r",
        )
        .unwrap();
        assert!(s.ok);
        assert_eq!(s.counts, counts(4, 0, 0));
    }

    #[test]
    fn not_a_summary() {
        assert_eq!(parse_summary_line("running 3 tests"), None);
        assert_eq!(parse_summary_line("test cpu::add ... ok"), None);
        assert_eq!(
            parse_summary_line("test result: maybe. 1 passed; 0 failed"),
            None
        );
        assert_eq!(parse_summary_line("test result: ok. nothing here"), None);
    }

    #[test]
    fn test_lines() {
        assert_eq!(
            parse_test_line("test cpu::add ... ok"),
            Some(TestOutcome::Passed)
        );
        assert_eq!(
            parse_test_line("test cpu::sub ... FAILED"),
            Some(TestOutcome::Failed)
        );
        assert_eq!(
            parse_test_line("test cpu::big ... ignored"),
            Some(TestOutcome::Ignored)
        );
        assert_eq!(
            parse_test_line("test cpu::big ... ignored, needs 8 GiB"),
            Some(TestOutcome::Ignored)
        );
        assert_eq!(
            parse_test_line("test src/lib.rs - Foo::bar (line 12) ... ok"),
            Some(TestOutcome::Passed)
        );
        assert_eq!(
            parse_test_line("test result: ok. 1 passed; 0 failed;"),
            None
        );
        assert_eq!(parse_test_line("running 1 test"), None);
    }

    #[test]
    fn run_sums_several_summaries() {
        let out = "\
running 2 tests
test a::x ... ok
test a::y ... ok

test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s

running 3 tests
test b::x ... ok
test b::y ... FAILED
test b::z ... ignored

failures:
    b::y

test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s

   Doc-tests core

running 1 test
test src/lib.rs - f (line 3) ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.2s
";
        let run = parse_run(out);
        assert_eq!(run.counts, counts(4, 1, 1));
        assert_eq!(run.summaries, 3);
        assert!(run.any_failed_summary);
        assert!(run.trailing.is_empty());
    }

    #[test]
    fn run_counts_tests_of_a_crashed_binary() {
        let out = "\
running 5 tests
test cpu::a ... ok
test cpu::b ... ok
test cpu::c ... ignored
";
        let run = parse_run(out);
        assert_eq!(run.counts, counts(0, 0, 0));
        assert_eq!(run.trailing, counts(2, 0, 1));
        assert_eq!(run.summaries, 0);
        assert!(!run.any_failed_summary);
    }

    #[test]
    fn run_crash_in_second_binary_keeps_first_summary() {
        let out = "\
running 1 test
test a::x ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s

running 2 tests
test b::x ... FAILED
";
        let run = parse_run(out);
        assert_eq!(run.counts, counts(1, 0, 0));
        assert_eq!(run.trailing, counts(0, 1, 0));
        assert_eq!(run.summaries, 1);
    }

    #[test]
    fn run_with_nothing() {
        let run = parse_run("error: could not compile `x`\n");
        assert_eq!(run, ParsedRun::default());
    }

    #[test]
    fn list_counting() {
        let out = "\
cpu::add: test
cpu::sub: test
cpu::speed: bench

3 tests, 1 benchmark
";
        assert_eq!(count_listed_tests(out), 2);
        assert_eq!(count_listed_tests(""), 0);
    }

    #[test]
    fn ansi_stripping() {
        assert_eq!(strip_ansi("\u{1b}[1;31mFAILED\u{1b}[0m."), "FAILED.");
        assert_eq!(strip_ansi("plain"), "plain");
    }
}
