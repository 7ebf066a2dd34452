//! `cargo run --example reduce`: a block sum reduction written with `#[kernel]` (shared memory
//! tree, barriers, one partial per cube, then one atomic add of the partials' sum), checked
//! against the host; exits non-zero on a mismatch. `COMPUTE_BACKEND` picks the backend.

use compute_core::kernel::kernel;
use compute_core::{Bytes, ComputeClient, CubeCount, Runtime};
use compute_tests::example::{Program, inputs, run_example};

/// Units per cube.
const CUBE: u32 = 256;

/// `partials[cube] = sum of the cube's slice of input`; `W`-wide vector loads, each unit summing a
/// strided run of entries before the tree.
#[kernel(cube_dim = CUBE)]
fn block_sum<const W: u32>(input: &[[f32; W]], partials: &mut [f32], per_unit: u32) {
    let tree = SharedMemory::<f32>::new(CUBE);
    let unit = UNIT_POS;
    let n = input.len();
    let base = CUBE_POS * CUBE * per_unit + unit;
    let mut acc = [0.0f32; W];
    for j in 0..per_unit {
        let i = base + j * CUBE;
        if i < n {
            acc += input[i];
        }
    }
    let v = acc;
    #[comptime]
    let mut s = v[0];
    #[unroll]
    for c in 1..W {
        s = s + v[c];
    }
    tree[unit] = s;
    sync_units();
    #[comptime]
    let mut stride = CUBE / 2;
    while stride > 0 {
        if unit < stride {
            let other = unit + stride;
            tree[unit] = tree[unit] + tree[other];
        }
        sync_units();
        stride /= 2;
    }
    if unit == 0 {
        partials[CUBE_POS] = tree[0];
    }
}

/// `total[0] += partials[i]` for every `i`, one integer atomic per unit on a fixed-point copy (the
/// check that atomics work; float atomics are not everywhere).
#[kernel(cube_dim = CUBE)]
fn fixed_total(partials: &[f32], total: &mut [i32], scale: f32) {
    let i = ABSOLUTE_POS;
    if i < partials.len() {
        let fixed = (partials[i] * scale).round_ties_even() as i32;
        total.atomic_add(0, fixed);
    }
}

struct Reduce;

impl Program for Reduce {
    fn run<R: Runtime>(&self) -> Result<(), String> {
        let client = ComputeClient::<R>::load(&R::Device::default());
        let n = (1usize << 20) + 12;
        let per_unit = 8u32;
        let data = inputs(n, 3);
        let h = client.create(Bytes::from_elem_slice(&data));
        let per_cube = (CUBE * per_unit) as usize;
        let cubes = (n / 4).div_ceil(per_cube);
        let partials = client.empty(cubes * 4);
        let start = std::time::Instant::now();
        block_sum::launch::<4>(
            &client,
            CubeCount::new_1d(cubes as u32),
            &h,
            &partials,
            per_unit,
        );
        let scale = 1024.0f32;
        let total = client.create(Bytes::from_elem_slice(&[0i32]));
        fixed_total::launch(
            &client,
            CubeCount::cover(cubes, CUBE),
            &partials,
            &total,
            scale,
        );
        let parts = client
            .read_one(partials)
            .map_err(|e| format!("reading partials: {e}"))?
            .to_elems::<f32>();
        let fixed = client
            .read_one(total)
            .map_err(|e| format!("reading total: {e}"))?
            .to_elems::<i32>()[0];
        let elapsed = start.elapsed();
        // Each partial against the host sum of its cube's slice (f64).
        let mut worst = 0.0f64;
        let mut want_fixed = 0i64;
        for (c, &p) in parts.iter().enumerate() {
            let lo = c * per_cube * 4;
            let hi = ((c + 1) * per_cube * 4).min(n / 4 * 4);
            let want: f64 = data[lo..hi].iter().map(|&x| x as f64).sum();
            let abs: f64 = data[lo..hi].iter().map(|&x| x.abs() as f64).sum();
            worst = worst.max((p as f64 - want).abs() / (1.0 + abs));
            want_fixed += (p * scale).round_ties_even() as i64;
        }
        println!(
            "reduce {n} f32 (vec4) on {} ({}): {cubes} partials, {:.2} ms, sum = {}",
            R::name(),
            client.properties().name,
            elapsed.as_secs_f64() * 1e3,
            fixed as f64 / scale as f64
        );
        if worst > 1e-5 {
            return Err(format!(
                "a partial differs from the host sum by {worst} (relative to its absolute sum)"
            ));
        }
        if fixed as i64 != want_fixed {
            return Err(format!(
                "atomic total {fixed} != host total of the partials {want_fixed}"
            ));
        }
        println!("verified: {cubes} partials within 1e-5 of the host sums, atomic total exact");
        Ok(())
    }
}

fn main() {
    std::process::exit(run_example(&Reduce));
}
