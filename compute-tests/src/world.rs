//! One rank of the multi-process collective scenarios, on any backend (`R`): the `world` binary
//! runs [`run_scenario`] in each process that `cargo xtask launch` (or the `world` integration
//! tests, on the CPU backend, through compute-core's launcher) starts with the rendezvous
//! variables set. Each rank uses the device `LOCAL_RANK` (modulo the device count).
//!
//! Each scenario knows what every rank must see (exact results, or the exact error variant) and
//! returns `Err` when a rank saw something else; the caller exits non-zero then.

use std::time::{Duration, Instant};

use compute_core::collective::{CollectiveError, MismatchKind, World, WorldConfig, init_world};
use compute_core::{
    Bytes, ComputeClient, Device, DeviceId, ElemType, ReduceOperation, Runtime, ServerError,
};

/// The scenarios [`run_scenario`] knows.
pub const SCENARIOS: [&str; 6] = [
    "sum_mean",
    "killed",
    "late_ok",
    "late_timeout",
    "wrong_world_size",
    "mismatch",
];

fn client_for<R: Runtime>(world: &World) -> ComputeClient<R> {
    let first = ComputeClient::<R>::load(&R::Device::default());
    let type_id = first.device_id().type_id;
    let count = first.enumerate_devices(type_id).len().max(1);
    let index = (world.config().local_rank % count) as u32;
    let device = <R::Device as Device>::from_id(DeviceId::new(type_id, index));
    let mut client = ComputeClient::<R>::load(&device);
    client.ensure_init_collective(vec![client.device_id()]);
    client
}

/// One all-reduce through the client: the reduced bytes, or the error the round raised.
pub fn reduce<R: Runtime>(
    client: &mut ComputeClient<R>,
    data: Bytes,
    dtype: ElemType,
    op: ReduceOperation,
) -> Result<Vec<u8>, ServerError> {
    let len = data.len();
    let src = client.create(data);
    let dst = client.empty(len);
    let me = vec![client.device_id()];
    client.all_reduce(src, dst.clone(), dtype, me, op);
    client.sync_collective();
    client.flush()?;
    Ok(client.read_one(dst)?.to_vec())
}

fn f32s(v: &[f32]) -> Bytes {
    Bytes::from_elem_slice(v)
}

fn expect_eq<T: PartialEq + core::fmt::Debug>(what: &str, got: T, want: T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, expected {want:?}"))
    }
}

/// Sum, mean (f32, exact) and sum (i32) over every rank.
fn sum_mean<R: Runtime>(world: &World) -> Result<String, String> {
    let mut client = client_for::<R>(world);
    let (r, n) = (world.rank(), world.size());
    let len = 1000;
    let data: Vec<f32> = (0..len).map(|i| i as f32 * (r + 1) as f32).collect();
    let fail = |e: ServerError| e.to_string();
    let sum = reduce(
        &mut client,
        f32s(&data),
        ElemType::F32,
        ReduceOperation::Sum,
    )
    .map_err(fail)?;
    let mean = reduce(
        &mut client,
        f32s(&data),
        ElemType::F32,
        ReduceOperation::Mean,
    )
    .map_err(fail)?;
    let ints = Bytes::from_elems(vec![r as i32 * 3 - 1; 5]);
    let isum = reduce(&mut client, ints, ElemType::I32, ReduceOperation::Sum).map_err(fail)?;
    let scale = (n * (n + 1) / 2) as f32;
    let want_sum: Vec<f32> = (0..len).map(|i| i as f32 * scale).collect();
    let want_mean: Vec<f32> = (0..len).map(|i| i as f32 * scale / n as f32).collect();
    expect_eq(
        "sum",
        bytemuck::pod_collect_to_vec::<u8, f32>(&sum),
        want_sum,
    )?;
    expect_eq(
        "mean",
        bytemuck::pod_collect_to_vec::<u8, f32>(&mean),
        want_mean,
    )?;
    let want_i = (0..n as i32).map(|r| r * 3 - 1).sum::<i32>();
    expect_eq(
        "i32 sum",
        bytemuck::pod_collect_to_vec::<u8, i32>(&isum),
        vec![want_i; 5],
    )?;
    Ok(format!("sum, mean and i32 sum exact over {n} processes"))
}

/// The last rank aborts after the first round; every other rank's second round fails with
/// `PeerLost` naming it, well within the timeout (on cuda, in NCCL's checked mode, with the
/// timeout or NCCL's asynchronous error).
fn killed<R: Runtime>(world: &World) -> Result<String, String> {
    let mut client = client_for::<R>(world);
    let (r, n) = (world.rank(), world.size());
    let one = || f32s(&[1.0; 64]);
    let first = reduce(&mut client, one(), ElemType::F32, ReduceOperation::Sum)
        .map_err(|e| format!("first round: {e}"))?;
    expect_eq(
        "first round",
        bytemuck::pod_collect_to_vec::<u8, f32>(&first),
        vec![n as f32; 64],
    )?;
    if r == n - 1 {
        eprintln!("rank {r}: aborting before the second round");
        std::process::abort();
    }
    let start = Instant::now();
    let second = reduce(&mut client, one(), ElemType::F32, ReduceOperation::Sum);
    let took = start.elapsed();
    match second {
        // NCCL (the checked mode) sees the lost rank as a timeout or an asynchronous error.
        Err(ServerError::Collective(
            CollectiveError::PeerLost { .. }
            | CollectiveError::Timeout { .. }
            | CollectiveError::Io { .. },
        )) if R::name() == "cuda" => Ok(format!("second round failed in {took:?}")),
        Err(ServerError::Collective(CollectiveError::PeerLost { rank, .. }))
            if rank == n - 1 || rank == 0 =>
        {
            if took >= world.config().timeout * 2 {
                return Err(format!("the error took {took:?}"));
            }
            // The client still works for everything but the broken communicator.
            let h = client.create(f32s(&[5.0, 6.0]));
            let back = client.read_one(h).map_err(|e| e.to_string())?;
            expect_eq(
                "read after the failure",
                back.to_elems::<f32>(),
                vec![5.0, 6.0],
            )?;
            Ok(format!("second round failed as expected in {took:?}"))
        }
        other => Err(format!("second round: expected PeerLost, got {other:?}")),
    }
}

/// The last rank arrives `late` after the others.
fn late<R: Runtime>(
    world: Result<&'static World, CollectiveError>,
    expect_timeout: bool,
) -> Result<String, String> {
    match (world, expect_timeout) {
        (Ok(world), false) => {
            sum_mean::<R>(world).map(|s| format!("late rank joined in time; {s}"))
        }
        (Err(CollectiveError::Timeout { waiting_for, .. }), true) => Ok(format!(
            "join timed out as expected (waiting for {waiting_for})"
        )),
        (Ok(_), true) => Err("joined although a rank came after the timeout".into()),
        (Err(e), _) => Err(format!("join: {e:?}")),
    }
}

/// Rank 1 reduces i32 with Max while the others reduce f32 with Sum: every rank gets the
/// element type mismatch; a buffer made before reads back unchanged; the client still works.
fn mismatch<R: Runtime>(world: &World) -> Result<String, String> {
    let mut client = client_for::<R>(world);
    let before = client.create(f32s(&[1.5, 2.5, 3.5]));
    let (dtype, op) = match world.rank() {
        1 => (ElemType::I32, ReduceOperation::Max),
        _ => (ElemType::F32, ReduceOperation::Sum),
    };
    let got = reduce(&mut client, f32s(&[1.0; 16]), dtype, op);
    match got {
        Err(ServerError::Collective(CollectiveError::Mismatch {
            kind: MismatchKind::DType,
            round: 1,
            ..
        })) => {}
        other => return Err(format!("expected a dtype mismatch, got {other:?}")),
    }
    let back = client.read_one(before).map_err(|e| e.to_string())?;
    expect_eq(
        "buffer made before",
        back.to_elems::<f32>(),
        vec![1.5, 2.5, 3.5],
    )?;
    let h = client.create(f32s(&[7.0]));
    expect_eq(
        "a new buffer",
        client
            .read_one(h)
            .map_err(|e| e.to_string())?
            .to_elems::<f32>(),
        vec![7.0],
    )?;
    Ok("every rank got the dtype mismatch".into())
}

/// Run `scenario` as one rank of the world the environment describes. `late_ms` delays the
/// last rank's join (the late scenarios).
pub fn run_scenario<R: Runtime>(scenario: &str, late_ms: u64) -> Result<String, String> {
    let config = WorldConfig::from_env().map_err(|e| format!("rendezvous variables: {e}"))?;
    let last = config.rank + 1 == config.world_size;
    match scenario {
        "late_ok" | "late_timeout" => {
            if last {
                std::thread::sleep(Duration::from_millis(late_ms));
            }
            late::<R>(init_world(config), scenario == "late_timeout")
        }
        "wrong_world_size" => match init_world(config) {
            Err(CollectiveError::WorldSize { .. }) => {
                Ok("every rank got the WORLD_SIZE mismatch".into())
            }
            other => Err(format!("expected a WorldSize error, got {other:?}")),
        },
        _ => {
            let world = init_world(config).map_err(|e| format!("join: {e}"))?;
            match scenario {
                // The barrier is a safe last call: rank 0 (and its store) stays until every rank
                // has left it.
                "sum_mean" => sum_mean::<R>(world).and_then(|m| {
                    world.barrier("end").map_err(|e| e.to_string())?;
                    Ok(m)
                }),
                "killed" => killed::<R>(world),
                "mismatch" => mismatch::<R>(world),
                other => Err(format!("unknown scenario {other} (known: {SCENARIOS:?})")),
            }
        }
    }
}

/// The bench's rank: `iters` all-reduces (Sum) of `bytes` bytes of f32 through a CPU client;
/// returns the best per-call time over 3 batches, in seconds.
pub fn bench_rank<R: Runtime>(bytes: usize, iters: usize) -> Result<f64, String> {
    let world = compute_core::collective::init_world_from_env().map_err(|e| e.to_string())?;
    let mut client = client_for::<R>(world);
    let data = vec![1.0f32; bytes / 4];
    let src = client.create(f32s(&data));
    let dst = client.empty(bytes);
    let me = vec![client.device_id()];
    let round = |client: &mut ComputeClient<R>| -> Result<(), String> {
        client.all_reduce(
            src.clone(),
            dst.clone(),
            ElemType::F32,
            me.clone(),
            ReduceOperation::Sum,
        );
        client.sync_collective();
        client.flush().map_err(|e| e.to_string())
    };
    round(&mut client)?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        for _ in 0..iters {
            round(&mut client)?;
        }
        best = best.min(start.elapsed().as_secs_f64() / iters as f64);
    }
    let out = client
        .read_one(dst)
        .map_err(|e| e.to_string())?
        .to_elems::<f32>();
    if out.iter().any(|&v| v != world.size() as f32) {
        return Err(format!("wrong sum {:?}", &out[..4.min(out.len())]));
    }
    world.barrier("bench-done").map_err(|e| e.to_string())?;
    Ok(best)
}
