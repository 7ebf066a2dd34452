//! Which backends exist: the features of `compute-tests`, narrowed by
//! `COMPUTE_BACKENDS`, and what the probe binary says about each.

use std::fs;
use std::io;

use crate::cargo::{Cargo, feature_args};
use crate::paths::workspace_root;

/// Backend names known to xtask, in reporting order.
pub const KNOWN: [&str; 4] = ["cpu", "wgpu", "vulkan", "cuda"];

/// Env var narrowing the backends to build and run (comma-separated).
pub const BACKENDS_ENV: &str = "COMPUTE_BACKENDS";

/// The names of all features declared in the `[features]` table of a
/// Cargo manifest. Simple line parsing: keys at the top level of the
/// section, skipping the continuation lines of multi-line arrays.
pub fn parse_features(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_features = false;
    let mut depth: i32 = 0;
    for raw in manifest.lines() {
        let line = strip_comment(raw).trim();
        if line.is_empty() {
            continue;
        }
        if depth <= 0 {
            depth = 0;
            if line.starts_with('[') {
                in_features = line == "[features]";
                continue;
            }
            if in_features && let Some((key, _)) = line.split_once('=') {
                let key = key.trim().trim_matches('"').trim_matches('\'');
                if !key.is_empty() {
                    names.push(key.to_string());
                }
            }
            if let Some((_, value)) = line.split_once('=') {
                depth += bracket_balance(value);
            }
        } else {
            depth += bracket_balance(line);
        }
    }
    names
}

/// The line without a trailing `# comment` (a `#` inside a string stays).
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// Opening minus closing brackets outside strings.
fn bracket_balance(text: &str) -> i32 {
    let mut quote = None;
    let mut balance = 0;
    for c in text.chars() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '[' | '{') => balance += 1,
            (None, ']' | '}') => balance -= 1,
            _ => {}
        }
    }
    balance
}

/// Split a comma (or whitespace) separated list, dropping empty items.
pub fn parse_name_list(value: &str) -> Vec<String> {
    value
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// A comma-separated env var as a list; `None` when unset or empty.
pub fn env_name_list(var: &str) -> Option<Vec<String>> {
    let value = std::env::var(var).ok()?;
    let names = parse_name_list(&value);
    (!names.is_empty()).then_some(names)
}

/// The backends selected for this run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// Known backends declared as features and kept by the filter, in
    /// [`KNOWN`] order.
    pub enabled: Vec<String>,
    /// Known backends declared as features but removed by the filter.
    pub filtered_out: Vec<String>,
    /// Known backends not declared as features of `compute-tests`.
    pub not_declared: Vec<String>,
    /// Names in the filter that are not known backends.
    pub unknown_in_filter: Vec<String>,
}

/// Pure backend selection from the declared features and an optional
/// filter.
pub fn select(declared: &[String], filter: Option<&[String]>) -> Selection {
    let mut selection = Selection {
        enabled: Vec::new(),
        filtered_out: Vec::new(),
        not_declared: Vec::new(),
        unknown_in_filter: Vec::new(),
    };
    for name in KNOWN {
        if !declared.iter().any(|d| d == name) {
            selection.not_declared.push(name.to_string());
        } else if filter.is_some_and(|f| !f.iter().any(|n| n == name)) {
            selection.filtered_out.push(name.to_string());
        } else {
            selection.enabled.push(name.to_string());
        }
    }
    if let Some(filter) = filter {
        for name in filter {
            if !KNOWN.contains(&name.as_str()) && !selection.unknown_in_filter.contains(name) {
                selection.unknown_in_filter.push(name.clone());
            }
        }
    }
    selection
}

/// Read `compute-tests/Cargo.toml` and select backends, honouring
/// `COMPUTE_BACKENDS`. Prints a warning for unknown filter names.
pub fn detect() -> io::Result<Selection> {
    let path = workspace_root().join("compute-tests").join("Cargo.toml");
    let manifest = fs::read_to_string(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", path.display())))?;
    let declared = parse_features(&manifest);
    let filter = env_name_list(BACKENDS_ENV);
    let selection = select(&declared, filter.as_deref());
    for name in &selection.unknown_in_filter {
        eprintln!(
            "xtask: warning: {BACKENDS_ENV} names `{name}`, which is not a known backend ({})",
            KNOWN.join(", ")
        );
    }
    if filter.is_some() {
        for name in &selection.not_declared {
            if filter.as_deref().is_some_and(|f| f.contains(name)) {
                eprintln!(
                    "xtask: warning: {BACKENDS_ENV} names `{name}`, but compute-tests has no such feature"
                );
            }
        }
    }
    eprintln!(
        "xtask: backends built: {}",
        if selection.enabled.is_empty() {
            "(none)".to_string()
        } else {
            selection.enabled.join(",")
        }
    );
    Ok(selection)
}

/// What the probe said about one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// `NAME available`
    Available,
    /// `NAME unavailable: REASON`
    Unavailable(String),
}

/// Parse one probe line: `NAME available` or `NAME unavailable: REASON`.
pub fn parse_probe_line(line: &str) -> Option<(String, Availability)> {
    let line = line.trim();
    let (name, rest) = line.split_once(char::is_whitespace)?;
    let rest = rest.trim();
    if rest == "available" {
        return Some((name.to_string(), Availability::Available));
    }
    let reason = rest.strip_prefix("unavailable")?;
    let reason = match reason.strip_prefix(':') {
        Some(reason) => reason.trim(),
        None if reason.is_empty() => "",
        None => return None,
    };
    let reason = if reason.is_empty() {
        "no reason given".to_string()
    } else {
        reason.to_string()
    };
    Some((name.to_string(), Availability::Unavailable(reason)))
}

/// The probe's verdict for each enabled backend, in `enabled` order. A
/// backend the probe did not mention is unavailable, with `missing_reason`.
pub fn parse_probe(
    output: &str,
    enabled: &[String],
    missing_reason: &str,
) -> Vec<(String, Availability)> {
    let lines: Vec<(String, Availability)> = output.lines().filter_map(parse_probe_line).collect();
    enabled
        .iter()
        .map(|name| {
            let found = lines.iter().rev().find(|(n, _)| n == name);
            let availability = match found {
                Some((_, a)) => a.clone(),
                None => Availability::Unavailable(missing_reason.to_string()),
            };
            (name.clone(), availability)
        })
        .collect()
}

/// The probe's result for the enabled backends.
#[derive(Debug, Clone)]
pub struct ProbeResult {
    /// One entry per enabled backend.
    pub backends: Vec<(String, Availability)>,
    /// Set when the probe could not be run or exited unsuccessfully.
    pub error: Option<String>,
}

impl ProbeResult {
    /// The available backends, in order.
    pub fn available(&self) -> Vec<String> {
        self.backends
            .iter()
            .filter(|(_, a)| *a == Availability::Available)
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// Build and run the probe binary of `compute-tests` with the enabled
/// backends (debug profile).
pub fn probe(enabled: &[String]) -> ProbeResult {
    if enabled.is_empty() {
        return ProbeResult {
            backends: Vec::new(),
            error: None,
        };
    }
    eprintln!(
        "xtask: building and running the probe for features {} ...",
        enabled.join(",")
    );
    let mut args = vec!["run".to_string(), "-p".into(), "compute-tests".into()];
    args.extend(feature_args(enabled));
    args.extend(["--bin".to_string(), "probe".to_string()]);
    let cargo = Cargo::new(args);
    let (output, error) = match cargo.capture_stdout() {
        Ok(c) if c.status.success() => (c.stdout, None),
        Ok(c) => {
            let detail = c.status.to_string();
            (
                c.stdout,
                Some(format!("probe failed ({detail}): {}", cargo.display())),
            )
        }
        Err(e) => (
            String::new(),
            Some(format!("could not run {}: {e}", cargo.display())),
        ),
    };
    let missing = match &error {
        Some(e) => e.clone(),
        None => "the probe printed no line for it".to_string(),
    };
    let backends = parse_probe(&output, enabled, &missing);
    for (name, availability) in &backends {
        match availability {
            Availability::Available => eprintln!("xtask: probe: {name} available"),
            Availability::Unavailable(r) => eprintln!("xtask: probe: {name} unavailable: {r}"),
        }
    }
    ProbeResult { backends, error }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn features_table_simple() {
        let manifest = r#"
[package]
name = "compute-tests"
default-run = "x"

[features]
default = ["cpu"]
cpu = ["dep:compute-cpu"]
wgpu = ["dep:compute-wgpu"] # the portable one

[dependencies]
compute-core.workspace = true
"#;
        assert_eq!(parse_features(manifest), names(&["default", "cpu", "wgpu"]));
    }

    #[test]
    fn features_table_multiline_and_quoted() {
        let manifest = r#"
[features]
default = [
    "cpu",
    "wgpu",
]
"vulkan" = ["dep:compute-vulkan", "compute-core/std"]
cuda = [
  # comment ] with a bracket
  "dep:compute-cuda",
]
[dev-dependencies]
cpu2 = "1"
"#;
        assert_eq!(
            parse_features(manifest),
            names(&["default", "vulkan", "cuda"])
        );
    }

    #[test]
    fn features_table_absent() {
        assert!(parse_features("[package]\nname = \"x\"\n").is_empty());
        assert!(parse_features("").is_empty());
    }

    #[test]
    fn features_table_of_the_real_crate_has_cpu() {
        let path = workspace_root().join("compute-tests").join("Cargo.toml");
        let manifest = fs::read_to_string(path).unwrap();
        assert!(parse_features(&manifest).contains(&"cpu".to_string()));
    }

    #[test]
    fn selection_without_filter() {
        let s = select(&names(&["default", "cpu", "cuda", "extra"]), None);
        assert_eq!(s.enabled, names(&["cpu", "cuda"]));
        assert_eq!(s.not_declared, names(&["wgpu", "vulkan"]));
        assert!(s.filtered_out.is_empty());
        assert!(s.unknown_in_filter.is_empty());
    }

    #[test]
    fn selection_with_filter() {
        let filter = names(&["cuda", "bogus", "wgpu"]);
        let s = select(&names(&["cpu", "wgpu", "cuda"]), Some(&filter));
        assert_eq!(s.enabled, names(&["wgpu", "cuda"]));
        assert_eq!(s.filtered_out, names(&["cpu"]));
        assert_eq!(s.not_declared, names(&["vulkan"]));
        assert_eq!(s.unknown_in_filter, names(&["bogus"]));
    }

    #[test]
    fn name_lists() {
        assert_eq!(parse_name_list("cpu,wgpu"), names(&["cpu", "wgpu"]));
        assert_eq!(parse_name_list(" cpu , ,cuda "), names(&["cpu", "cuda"]));
        assert!(parse_name_list(" , ").is_empty());
    }

    #[test]
    fn probe_lines() {
        assert_eq!(
            parse_probe_line("cpu available"),
            Some(("cpu".into(), Availability::Available))
        );
        assert_eq!(
            parse_probe_line("cuda unavailable: libcuda.so.1 not found"),
            Some((
                "cuda".into(),
                Availability::Unavailable("libcuda.so.1 not found".into())
            ))
        );
        assert_eq!(
            parse_probe_line("vulkan unavailable: no adapter: llvmpipe only\r"),
            Some((
                "vulkan".into(),
                Availability::Unavailable("no adapter: llvmpipe only".into())
            ))
        );
        assert_eq!(
            parse_probe_line("wgpu unavailable"),
            Some((
                "wgpu".into(),
                Availability::Unavailable("no reason given".into())
            ))
        );
        assert_eq!(parse_probe_line("wgpu unavailablefoo"), None);
        assert_eq!(parse_probe_line("hello"), None);
        assert_eq!(parse_probe_line("cpu is fine"), None);
        assert_eq!(parse_probe_line(""), None);
    }

    #[test]
    fn probe_output_in_enabled_order_with_missing() {
        let out = "probe v1\ncuda unavailable: no driver\ncpu available\nwgpu available\n";
        let got = parse_probe(out, &names(&["cpu", "vulkan", "cuda"]), "not reported");
        assert_eq!(
            got,
            vec![
                ("cpu".to_string(), Availability::Available),
                (
                    "vulkan".to_string(),
                    Availability::Unavailable("not reported".into())
                ),
                (
                    "cuda".to_string(),
                    Availability::Unavailable("no driver".into())
                ),
            ]
        );
        let result = ProbeResult {
            backends: got,
            error: None,
        };
        assert_eq!(result.available(), names(&["cpu"]));
    }
}
