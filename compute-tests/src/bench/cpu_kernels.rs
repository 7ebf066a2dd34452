//! CPU kernel rows (issue 3): IR kernels against hand-written rayon code in the same run.

use compute_core::ComputeClient;
use compute_cpu::CpuRuntime;

use super::Row;

/// Every kernel row whose name contains `filter`.
pub fn run(_client: &ComputeClient<CpuRuntime>, _filter: &str) -> Vec<Row> {
    Vec::new()
}
