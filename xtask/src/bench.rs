//! `cargo xtask bench`: run the bench binary of `compute-tests` (release)
//! on every available backend and print its results as a table.

use std::fs;
use std::io;
use std::path::Path;

use serde::Deserialize;

use crate::backends;
use crate::cargo::{Cargo, feature_args};
use crate::paths::target_dir;
use crate::table::{self, Align};

/// One row of `bench.json`. Numbers may be `null` (a NaN or infinity
/// written by serde_json); they show as `-`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BenchRow {
    /// The backend measured.
    pub backend: String,
    /// The benchmark name.
    pub name: String,
    /// The measured value.
    pub value: Option<f64>,
    /// The unit of `value` (and of `baseline_value`).
    pub unit: String,
    /// What the value is compared with.
    pub baseline_name: String,
    /// The baseline's value.
    pub baseline_value: Option<f64>,
    /// `value` relative to the baseline.
    pub ratio: Option<f64>,
}

/// Run bench; `extra` goes to the bench binary (a leading `--` is dropped).
/// Returns the process exit code.
pub fn run(extra: &[String]) -> i32 {
    match bench(extra) {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("xtask: bench FAILED: {message}");
            1
        }
    }
}

fn bench(extra: &[String]) -> Result<(), String> {
    let selection = backends::detect().map_err(|e| e.to_string())?;
    let probe = backends::probe(&selection.enabled);
    if let Some(error) = &probe.error {
        eprintln!("xtask: warning: {error}");
    }
    let available = probe.available();
    if available.is_empty() {
        return Err("no backend is available to benchmark".to_string());
    }
    let list = available.join(",");
    let out = target_dir().join("bench.json");
    match fs::remove_file(&out) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing stale {}: {e}", out.display())),
    }

    let extra = match extra.first().map(String::as_str) {
        Some("--") => &extra[1..],
        _ => extra,
    };
    let mut args: Vec<String> = vec![
        "run".into(),
        "--release".into(),
        "-p".into(),
        "compute-tests".into(),
    ];
    args.extend(feature_args(&available));
    args.extend(["--bin".into(), "bench".into(), "--".into(), "--out".into()]);
    args.push(out.display().to_string());
    args.extend(["--backends".into(), list.clone()]);
    args.extend(extra.iter().cloned());
    let cargo = Cargo::new(args);
    eprintln!("xtask: building (release) and running the bench for {list} ...");
    let captured = cargo
        .tee()
        .map_err(|e| format!("could not run `{}`: {e}", cargo.display()))?;
    if !captured.status.success() {
        return Err(format!(
            "`{}` exited with {}",
            cargo.display(),
            captured.failure_detail()
        ));
    }

    let rows = read_rows(&out)?;
    if rows.is_empty() {
        return Err(format!("{} holds no rows", out.display()));
    }
    println!();
    print!("{}", render_rows(&rows));
    eprintln!("xtask: {} bench rows from {}", rows.len(), out.display());
    Ok(())
}

/// Read and decode `bench.json`.
fn read_rows(path: &Path) -> Result<Vec<BenchRow>, String> {
    let text = fs::read_to_string(path)
        .map_err(|e| format!("the bench wrote no readable {}: {e}", path.display()))?;
    parse_rows(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Decode the JSON array of bench rows.
pub fn parse_rows(text: &str) -> Result<Vec<BenchRow>, serde_json::Error> {
    serde_json::from_str(text)
}

/// Format a measured value: 3 decimals in [1e-3, 1e6), else scientific.
pub fn format_value(value: Option<f64>) -> String {
    match value {
        None => "-".to_string(),
        Some(v) if !v.is_finite() => v.to_string(),
        Some(0.0) => "0.000".to_string(),
        Some(v) if (1e-3..1e6).contains(&v.abs()) => format!("{v:.3}"),
        Some(v) => format!("{v:.3e}"),
    }
}

/// The bench table: backend | name | value unit | baseline_name |
/// baseline value | ratio (3 decimals).
pub fn render_rows(rows: &[BenchRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.backend.clone(),
                r.name.clone(),
                format!("{} {}", format_value(r.value), r.unit),
                r.baseline_name.clone(),
                format_value(r.baseline_value),
                match r.ratio {
                    Some(ratio) => format!("{ratio:.3}"),
                    None => "-".to_string(),
                },
            ]
        })
        .collect();
    table::render(
        &[
            "backend",
            "name",
            "value",
            "baseline",
            "baseline value",
            "ratio",
        ],
        &[
            Align::Left,
            Align::Left,
            Align::Right,
            Align::Left,
            Align::Right,
            Align::Right,
        ],
        &cells,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &str = r#"[
        {"backend": "cpu", "name": "saxpy_1m", "value": 12.5, "unit": "GB/s",
         "baseline_name": "memcpy", "baseline_value": 25.0, "ratio": 0.5},
        {"backend": "cuda", "name": "matmul_f16_4096", "value": 1234567.0, "unit": "GFLOP/s",
         "baseline_name": "cublas", "baseline_value": 1500000.0, "ratio": 0.823044667,
         "extra": "ignored"},
        {"backend": "wgpu", "name": "launch", "value": null, "unit": "us",
         "baseline_name": "none", "baseline_value": 0.0, "ratio": null}
    ]"#;

    #[test]
    fn rows_decode() {
        let rows = parse_rows(JSON).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].backend, "cpu");
        assert_eq!(rows[0].value, Some(12.5));
        assert_eq!(rows[1].ratio, Some(0.823044667));
        assert_eq!(rows[2].value, None);
        assert!(parse_rows("[]").unwrap().is_empty());
        assert!(parse_rows(r#"[{"backend": "cpu"}]"#).is_err());
        assert!(parse_rows("{}").is_err());
    }

    #[test]
    fn values_format() {
        assert_eq!(format_value(Some(12.5)), "12.500");
        assert_eq!(format_value(Some(0.0)), "0.000");
        assert_eq!(format_value(Some(1234567.0)), "1.235e6");
        assert_eq!(format_value(Some(0.0000123)), "1.230e-5");
        assert_eq!(format_value(None), "-");
    }

    #[test]
    fn table_layout() {
        let text = render_rows(&parse_rows(JSON).unwrap());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(
            lines[0],
            "backend | name            |           value | baseline | baseline value | ratio"
        );
        assert_eq!(
            lines[1],
            "--------+-----------------+-----------------+----------+----------------+------"
        );
        assert_eq!(
            lines[2],
            "cpu     | saxpy_1m        |     12.500 GB/s | memcpy   |         25.000 | 0.500"
        );
        assert!(lines[3].starts_with("cuda    | matmul_f16_4096 | 1.235e6 GFLOP/s | cublas   |"));
        assert!(lines[3].ends_with("| 0.823"));
        assert_eq!(
            lines[4],
            "wgpu    | launch          |            - us | none     |          0.000 |     -"
        );
    }
}
