//! Probes of device throughput.

use core::time::Duration;

use serde::{Deserialize, Serialize};

use crate::elem::ElemType;
use crate::profile::TimingMethod;

/// What throughput to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ThroughputKey {
    /// Fused multiply-adds of the given type, counted as two operations each.
    Arithmetic(ElemType),
    /// Device memory bandwidth of a copy kernel over elements of the given type.
    MemoryCopy(ElemType),
}

/// How big the probe is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KernelConfig {
    /// Units per cube (x).
    pub cube_dim: u32,
    /// Cubes (x).
    pub cube_count: u32,
    /// Work per unit: FMAs for arithmetic, elements for copies.
    pub work_per_unit: u32,
}

impl Default for KernelConfig {
    fn default() -> Self {
        Self {
            cube_dim: 256,
            cube_count: 256,
            work_per_unit: 256,
        }
    }
}

/// A measured throughput.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ThroughputValue {
    /// Operations (or bytes, for copies) per second.
    pub per_second: f64,
    /// Operations (or bytes) the probe performed.
    pub work: u64,
    /// The measured time of the probe.
    pub elapsed: Duration,
    /// How the time was measured.
    pub timing: TimingMethod,
}
