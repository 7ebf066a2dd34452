//! Collectives: reduction operations and a host-staged rendezvous for backends without a
//! collective library (CPU, wgpu, Vulkan).

use core::time::Duration;
use std::sync::{Arc, Condvar, Mutex};

use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

use crate::device::DeviceId;
use crate::elem::ElemType;
use crate::error::ServerError;

/// How `all_reduce` combines the contributions of the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOperation {
    /// Element-wise sum.
    Sum,
    /// Element-wise mean (sum divided by the number of devices; integer division for integers).
    Mean,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

/// Reduce `inputs` (one byte buffer per device, same length) into one buffer of `dtype` elements.
pub fn reduce_host(
    inputs: &[Vec<u8>],
    dtype: ElemType,
    op: ReduceOperation,
) -> Result<Vec<u8>, ServerError> {
    let Some(first) = inputs.first() else {
        return Err(ServerError::InvalidArgument(
            "all_reduce over no device".into(),
        ));
    };
    if let Some(bad) = inputs.iter().find(|i| i.len() != first.len()) {
        return Err(ServerError::InvalidArgument(format!(
            "all_reduce contributions differ in size: {} and {} bytes",
            first.len(),
            bad.len()
        )));
    }
    if first.len() % dtype.size() != 0 {
        return Err(ServerError::InvalidArgument(format!(
            "all_reduce buffer of {} bytes is not a whole number of {dtype} elements",
            first.len()
        )));
    }
    let n = inputs.len();
    // Accumulate floats in f64 and integers in i128, then convert back (integers wrap, as the
    // IR's integer arithmetic does).
    macro_rules! reduce_as {
        ($t:ty, $acc:ty, $to:expr, $from:expr) => {{
            let views: Vec<Vec<$t>> = inputs
                .iter()
                .map(|i| bytemuck::pod_collect_to_vec(i))
                .collect();
            let out: Vec<$t> = (0..views[0].len())
                .map(|e| {
                    let mut acc: $acc = $to(views[0][e]);
                    for v in &views[1..] {
                        let x: $acc = $to(v[e]);
                        acc = match op {
                            ReduceOperation::Sum | ReduceOperation::Mean => acc + x,
                            ReduceOperation::Max if x > acc => x,
                            ReduceOperation::Min if x < acc => x,
                            ReduceOperation::Max | ReduceOperation::Min => acc,
                        };
                    }
                    if op == ReduceOperation::Mean {
                        acc /= n as $acc;
                    }
                    $from(acc)
                })
                .collect();
            Ok(bytemuck::cast_slice(&out).to_vec())
        }};
    }
    macro_rules! int {
        ($t:ty) => {
            reduce_as!($t, i128, |x: $t| x as i128, |a: i128| a as $t)
        };
    }
    macro_rules! float {
        ($t:ty, $to:expr, $from:expr) => {
            reduce_as!($t, f64, $to, $from)
        };
    }
    match dtype {
        ElemType::F32 => float!(f32, |x: f32| x as f64, |a: f64| a as f32),
        ElemType::F64 => float!(f64, |x: f64| x, |a: f64| a),
        ElemType::F16 => float!(half::f16, |x: half::f16| x.to_f64(), half::f16::from_f64),
        ElemType::BF16 => float!(half::bf16, |x: half::bf16| x.to_f64(), half::bf16::from_f64),
        ElemType::I8 => int!(i8),
        ElemType::I16 => int!(i16),
        ElemType::I32 => int!(i32),
        ElemType::I64 => int!(i64),
        ElemType::U8 => int!(u8),
        ElemType::U16 => int!(u16),
        ElemType::U32 => int!(u32),
        ElemType::U64 => int!(u64),
        ElemType::Bool => Err(ServerError::Unsupported("all_reduce over bool".into())),
    }
}

struct Round {
    contributions: HashMap<DeviceId, Vec<u8>>,
    result: Option<Result<Arc<Vec<u8>>, ServerError>>,
    collected: usize,
}

/// A process-wide meeting point where the devices of a group exchange buffers through host memory.
///
/// Every device of the group calls [`HostRendezvous::all_reduce`] with its rank's data and a
/// per-device sequence number; the call blocks until every device of the group has contributed to
/// the same round, then returns the reduced buffer to each.
pub struct HostRendezvous {
    rounds: Mutex<HashMap<(Vec<DeviceId>, u64), Round>>,
    arrived: Condvar,
}

/// How long a device waits for the rest of its group before the collective fails.
pub const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(60);

impl HostRendezvous {
    /// The rendezvous shared by every runtime of this process.
    pub fn global() -> &'static HostRendezvous {
        static GLOBAL: std::sync::OnceLock<HostRendezvous> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(|| HostRendezvous {
            rounds: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
        })
    }

    /// Contribute `data` for `device` to round `seq` of `group`, and wait for the reduced result.
    pub fn all_reduce(
        &self,
        group: &[DeviceId],
        seq: u64,
        device: DeviceId,
        data: Vec<u8>,
        dtype: ElemType,
        op: ReduceOperation,
    ) -> Result<Arc<Vec<u8>>, ServerError> {
        let mut group = group.to_vec();
        group.sort();
        group.dedup();
        if !group.contains(&device) {
            return Err(ServerError::InvalidArgument(format!(
                "device {device} is not part of the collective group {group:?}"
            )));
        }
        let key = (group.clone(), seq);
        let mut rounds = self.rounds.lock().unwrap_or_else(|p| p.into_inner());
        let round = rounds.entry(key.clone()).or_insert_with(|| Round {
            contributions: HashMap::new(),
            result: None,
            collected: 0,
        });
        round.contributions.insert(device, data);
        if round.contributions.len() == group.len() {
            let inputs: Vec<Vec<u8>> = group
                .iter()
                .map(|d| round.contributions.get(d).cloned().unwrap_or_default())
                .collect();
            round.result = Some(reduce_host(&inputs, dtype, op).map(Arc::new));
            self.arrived.notify_all();
        }
        let deadline = std::time::Instant::now() + RENDEZVOUS_TIMEOUT;
        loop {
            let round = rounds
                .get_mut(&key)
                .unwrap_or_else(|| unreachable!("a round lives until every member collected it"));
            if let Some(result) = round.result.clone() {
                round.collected += 1;
                if round.collected == group.len() {
                    rounds.remove(&key);
                }
                return result;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                let arrived = round.contributions.len();
                round.contributions.remove(&device);
                if round.contributions.is_empty() {
                    rounds.remove(&key);
                }
                return Err(ServerError::Driver(format!(
                    "all_reduce round {seq}: only {arrived} of {} devices of {group:?} arrived within {:?}",
                    group.len(),
                    RENDEZVOUS_TIMEOUT
                )));
            }
            rounds = self
                .arrived
                .wait_timeout(rounds, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    #[test]
    fn reduce_ops() {
        let a = f32s(&[1.0, 2.0]);
        let b = f32s(&[3.0, -6.0]);
        let sum =
            reduce_host(&[a.clone(), b.clone()], ElemType::F32, ReduceOperation::Sum).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&sum), &[4.0, -4.0]);
        let mean = reduce_host(
            &[a.clone(), b.clone()],
            ElemType::F32,
            ReduceOperation::Mean,
        )
        .unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&mean), &[2.0, -2.0]);
        let max = reduce_host(&[a, b], ElemType::F32, ReduceOperation::Max).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&max), &[3.0, 2.0]);
        let ints = reduce_host(
            &[
                bytemuck::cast_slice(&[7i32]).to_vec(),
                bytemuck::cast_slice(&[2i32]).to_vec(),
            ],
            ElemType::I32,
            ReduceOperation::Mean,
        )
        .unwrap();
        assert_eq!(bytemuck::pod_collect_to_vec::<u8, i32>(&ints), vec![4]);
        assert!(
            reduce_host(
                &[vec![0; 4], vec![0; 8]],
                ElemType::F32,
                ReduceOperation::Sum
            )
            .is_err()
        );
    }

    #[test]
    fn rendezvous_across_threads() {
        let group = vec![
            DeviceId::new(9, 0),
            DeviceId::new(9, 1),
            DeviceId::new(9, 2),
        ];
        let handles: Vec<_> = group
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let group = group.clone();
                std::thread::spawn(move || {
                    HostRendezvous::global()
                        .all_reduce(
                            &group,
                            0,
                            d,
                            f32s(&[i as f32]),
                            ElemType::F32,
                            ReduceOperation::Sum,
                        )
                        .unwrap()
                })
            })
            .collect();
        for h in handles {
            let out = h.join().unwrap();
            assert_eq!(bytemuck::pod_collect_to_vec::<u8, f32>(&out), vec![3.0]);
        }
    }
}
