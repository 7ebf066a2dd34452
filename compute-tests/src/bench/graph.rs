//! Graph replay against plain launches of the same kernels, written once for every backend: a
//! graph of [`KERNELS`] small launches captured on a forked stream, replayed and synced, against
//! the same launches issued one by one and synced. Figures are per kernel (us), best of the
//! rounds, the two variants alternating.

use std::time::Instant;

use compute_core::server::ComputeServer;
use compute_core::{ComputeClient, CubeCount, Runtime, block_on};

use super::{Better, Row};

/// Launches in the graph.
pub const KERNELS: usize = 64;
/// Replays (and plain batches) per timed block.
const REPLAYS: usize = 50;
/// Timed blocks per variant.
const ROUNDS: usize = 9;

/// The row for one backend.
pub fn rows<R: Runtime>(backend: &str, client: &ComputeClient<R>) -> Vec<Row> {
    let client = client.fork_stream();
    let definition = super::kept::definition();
    let kernel: <R::Server as ComputeServer>::Kernel = definition.into();
    if let Err(e) = client.graph_prepare() {
        eprintln!("bench: {backend} graph rows skipped: graph_prepare: {e}");
        return Vec::new();
    }
    let outs: Vec<_> = (0..KERNELS).map(|_| client.empty(256 * 4)).collect();
    let args: Vec<_> = outs.iter().map(super::kept::arguments).collect();
    let launch_all = || {
        for a in &args {
            client.launch(kernel.clone(), CubeCount::Static(1, 1, 1), a.clone());
        }
    };
    let sync = || block_on(client.sync()).expect("sync");
    launch_all();
    sync();
    if let Err(e) = client.start_capture() {
        eprintln!("bench: {backend} graph rows skipped: start_capture: {e}");
        return Vec::new();
    }
    launch_all();
    let graph = match client.stop_capture() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("bench: {backend} graph rows skipped: stop_capture: {e}");
            return Vec::new();
        }
    };
    let replay = || {
        for _ in 0..REPLAYS {
            graph.replay().expect("replay");
        }
        sync();
    };
    let plain = || {
        for _ in 0..REPLAYS {
            launch_all();
        }
        sync();
    };
    replay();
    plain();
    let (mut best_replay, mut best_plain) = (f64::INFINITY, f64::INFINITY);
    let per_kernel =
        |start: Instant| start.elapsed().as_secs_f64() * 1e6 / (REPLAYS * KERNELS) as f64;
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            let s = Instant::now();
            replay();
            best_replay = best_replay.min(per_kernel(s));
            let s = Instant::now();
            plain();
            best_plain = best_plain.min(per_kernel(s));
        } else {
            let s = Instant::now();
            plain();
            best_plain = best_plain.min(per_kernel(s));
            let s = Instant::now();
            replay();
            best_replay = best_replay.min(per_kernel(s));
        }
    }
    drop(graph);
    sync();
    vec![Row::new(
        backend,
        &format!("graph replay + sync per kernel ({KERNELS}-kernel graph, {REPLAYS} replays)"),
        best_replay,
        "us",
        "the same kernels launched one by one + sync",
        best_plain,
        Better::Lower,
    )]
}
