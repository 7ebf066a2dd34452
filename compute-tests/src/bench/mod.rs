//! Benchmarks behind `cargo xtask bench`: every figure beside a baseline measured in the same run.

pub mod timing;

#[cfg(feature = "cpu")]
pub mod cpu;
#[cfg(feature = "cpu")]
pub mod cpu_kernels;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod graph;
pub mod kept;
#[cfg(feature = "vulkan")]
pub mod vulkan;
#[cfg(feature = "wgpu")]
pub mod wgpu;

use serde::Serialize;

/// One benchmark figure and its baseline.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Backend name.
    pub backend: String,
    /// What was measured.
    pub name: String,
    /// Our figure.
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// What the baseline is.
    pub baseline_name: String,
    /// The baseline's figure, same unit.
    pub baseline_value: f64,
    /// `value / baseline_value` for throughputs, `baseline_value / value` for latencies: above 1
    /// means faster than the baseline either way.
    pub ratio: f64,
}

/// Whether bigger numbers are better for a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Throughput-like (GB/s, ops/s).
    Higher,
    /// Latency-like (us, ns).
    Lower,
}

impl Row {
    /// A row, computing the ratio so that above 1 always means "faster than the baseline".
    pub fn new(
        backend: &str,
        name: &str,
        value: f64,
        unit: &str,
        baseline_name: &str,
        baseline_value: f64,
        better: Better,
    ) -> Self {
        let ratio = match better {
            Better::Higher => value / baseline_value,
            Better::Lower => baseline_value / value,
        };
        Self {
            backend: backend.into(),
            name: name.into(),
            value,
            unit: unit.into(),
            baseline_name: baseline_name.into(),
            baseline_value,
            ratio,
        }
    }
}

/// Rows that compare two backends of the same run: the Vulkan copy kernel at its largest size
/// against compute-cuda's 1 GiB copy kernel (same GPU), when both ran.
pub fn cross_backend_rows(rows: &[Row]) -> Vec<Row> {
    let gbs = |r: &Row| match r.unit.as_str() {
        "TB/s" => r.value * 1e3,
        _ => r.value,
    };
    let cuda = rows.iter().find(|r| {
        r.backend == "cuda" && r.name == "copy kernel bandwidth 1 GiB f32x4 (read+write)"
    });
    let vulkan = rows
        .iter()
        .filter(|r| r.backend == "vulkan" && r.name.starts_with("copy kernel ") && r.unit == "GB/s")
        .max_by_key(|r| {
            r.name
                .split_whitespace()
                .nth(2)
                .and_then(|mib| mib.parse::<u64>().ok())
                .unwrap_or(0)
        });
    match (cuda, vulkan) {
        (Some(c), Some(v)) => vec![Row::new(
            "vulkan",
            &format!("{} vs compute-cuda", v.name),
            gbs(v),
            "GB/s",
            "compute-cuda copy kernel 1 GiB f32x4, same run",
            gbs(c),
            Better::Higher,
        )],
        _ => Vec::new(),
    }
}
