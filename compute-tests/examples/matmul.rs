//! `cargo run --example matmul`: a tiled shared-memory matmul written with `#[kernel]`, checked
//! against a host matmul; exits non-zero on a mismatch. `COMPUTE_BACKEND` picks the backend.

use compute_core::kernel::{KernelFloat, kernel};
use compute_core::{Bytes, ComputeClient, CubeCount, Runtime};
use compute_tests::example::{Program, inputs, run_example};

/// Side of the square tile each cube computes (and of its units).
const TILE: u32 = 16;

/// `c = a b` for row-major `a: m x k`, `b: k x n`. Each cube stages a `TILE x TILE` tile of `a`
/// and of `b` in shared memory per step along `k`; each unit accumulates one entry of `c`.
/// Tiles past the matrix edges are padded with zeros, so any `m`, `n`, `k` works.
#[kernel(cube_dim = [TILE, TILE, 1])]
fn matmul<F: KernelFloat>(a: &[F], b: &[F], c: &mut [F], m: u32, n: u32, k: u32) {
    let a_tile = SharedMemory::<F>::new(TILE * TILE);
    let b_tile = SharedMemory::<F>::new(TILE * TILE);
    let tx = UNIT_POS_X;
    let ty = UNIT_POS_Y;
    let row = CUBE_POS_Y * TILE + ty;
    let col = CUBE_POS_X * TILE + tx;
    let mut acc = 0.0 as F;
    for t in (0..k).step_by(TILE) {
        let ak = t + tx;
        let bk = t + ty;
        let mut av = 0.0 as F;
        if row < m && ak < k {
            av = a[row * k + ak];
        }
        a_tile[ty * TILE + tx] = av;
        let mut bv = 0.0 as F;
        if bk < k && col < n {
            bv = b[bk * n + col];
        }
        b_tile[ty * TILE + tx] = bv;
        sync_units();
        #[unroll]
        for i in 0..TILE {
            acc = a_tile[ty * TILE + i].mul_add(b_tile[i * TILE + tx], acc);
        }
        sync_units();
    }
    if row < m && col < n {
        c[row * n + col] = acc;
    }
}

fn host_matmul(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p] as f64;
            for j in 0..n {
                c[i * n + j] += x * b[p * n + j] as f64;
            }
        }
    }
    c
}

struct Matmul;

impl Program for Matmul {
    fn run<R: Runtime>(&self) -> Result<(), String> {
        let client = ComputeClient::<R>::load(&R::Device::default());
        // Not multiples of the tile, so the edge handling is checked too.
        let (m, n, k) = (200usize, 152usize, 184usize);
        let a = inputs(m * k, 1);
        let b = inputs(k * n, 2);
        let ha = client.create(Bytes::from_elem_slice(&a));
        let hb = client.create(Bytes::from_elem_slice(&b));
        let hc = client.empty(m * n * 4);
        let count = CubeCount::Static((n as u32).div_ceil(TILE), (m as u32).div_ceil(TILE), 1);
        let start = std::time::Instant::now();
        matmul::launch::<f32>(&client, count, &ha, &hb, &hc, m as u32, n as u32, k as u32);
        let got = client
            .read_one(hc)
            .map_err(|e| format!("reading c: {e}"))?
            .to_elems::<f32>();
        let elapsed = start.elapsed();
        let want = host_matmul(&a, &b, m, n, k);
        let bad: Vec<usize> = (0..m * n)
            .filter(|&i| (got[i] as f64 - want[i]).abs() > 1e-4 * (1.0 + want[i].abs()))
            .collect();
        println!(
            "matmul {m}x{k} * {k}x{n} on {} ({}): {:.2} ms, c[0] = {}",
            R::name(),
            client.properties().name,
            elapsed.as_secs_f64() * 1e3,
            got[0]
        );
        if let Some(&i) = bad.first() {
            return Err(format!(
                "{} of {} entries differ from the host matmul; first c[{}][{}] = {} (host {})",
                bad.len(),
                m * n,
                i / n,
                i % n,
                got[i],
                want[i]
            ));
        }
        println!(
            "verified: all {} entries match the host matmul (tolerance 1e-4)",
            m * n
        );
        Ok(())
    }
}

fn main() {
    std::process::exit(run_example(&Matmul));
}
