//! Kept kernels from generic code: the launch of a kept (converted once, cloned per launch)
//! kernel written generic over `R: Runtime` against the same launch written with the backend's
//! concrete types, and the launch that converts the definition every time against the kept one.
//! Each backend's module passes its backend-specific loop; the figures are host cost per launch
//! (the enqueue loop; the sync that drains it is outside the timed region).

use std::time::Instant;

use compute_core::kernel::KernelDefinition;
use compute_core::server::ComputeServer;
use compute_core::{ComputeClient, CubeCount, KernelArguments, Runtime, block_on};

use super::{Better, Row};

/// Launches per timed block.
pub const LAUNCHES: usize = 2000;
/// Timed blocks per variant (the best is kept); variants alternate block by block, in an order
/// that rotates every round so that none always runs first after the drain.
const ROUNDS: usize = 45;

/// The kernel the rows launch: `out[i] = value` on one cube.
pub fn definition() -> KernelDefinition {
    crate::kernels::fill_f32()
}

/// The launch arguments for `out` (at least one cube of f32).
pub fn arguments(out: &compute_core::Handle) -> KernelArguments {
    KernelArguments::new()
        .buffer(out.clone().binding())
        .scalar(1.5f32)
}

/// `n` launches of a kept kernel, written generic over `R`.
#[inline(never)]
fn generic_kept<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &<R::Server as ComputeServer>::Kernel,
    args: &KernelArguments,
    n: usize,
) {
    for _ in 0..n {
        client.launch(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone());
    }
}

/// `n` launches converting the definition each time (what generic code had to do before the
/// kernel type was `Clone`).
#[inline(never)]
fn generic_converting<R: Runtime>(
    client: &ComputeClient<R>,
    definition: &KernelDefinition,
    args: &KernelArguments,
    n: usize,
) {
    for _ in 0..n {
        client.launch(
            definition.clone().into(),
            CubeCount::Static(1, 1, 1),
            args.clone(),
        );
    }
}

/// The rows for one backend. `specific(n)` must make `n` launches of [`definition`]'s kernel,
/// kept and cloned, with [`arguments`] bound to a buffer of the same client, written with the
/// backend's concrete types.
pub fn rows<R: Runtime>(
    backend: &str,
    client: &ComputeClient<R>,
    out: &compute_core::Handle,
    specific: &mut dyn FnMut(usize),
) -> Vec<Row> {
    let definition = definition();
    let kernel: <R::Server as ComputeServer>::Kernel = definition.clone().into();
    let args = arguments(out);
    let drain = || block_on(client.sync()).expect("sync");
    // Warm up: compile once, fill the pools and batches.
    generic_kept(client, &kernel, &args, LAUNCHES);
    specific(LAUNCHES);
    generic_converting(client, &definition, &args, LAUNCHES);
    drain();
    let mut best = [f64::INFINITY; 3];
    for round in 0..ROUNDS {
        for k in 0..best.len() {
            let i = (k + round) % best.len();
            let start = Instant::now();
            match i {
                0 => generic_kept(client, &kernel, &args, LAUNCHES),
                1 => specific(LAUNCHES),
                _ => generic_converting(client, &definition, &args, LAUNCHES),
            }
            best[i] = best[i].min(start.elapsed().as_secs_f64() / LAUNCHES as f64);
            drain();
        }
    }
    let us = 1e6;
    vec![
        Row::new(
            backend,
            "kept kernel launch host cost, generic code",
            best[0] * us,
            "us",
            "the same launch in backend-specific code",
            best[1] * us,
            Better::Lower,
        ),
        Row::new(
            backend,
            "kept kernel launch host cost, generic code (vs converting the definition per launch)",
            best[0] * us,
            "us",
            "generic launch of def.clone().into()",
            best[2] * us,
            Better::Lower,
        ),
    ]
}
