//! CPU kernel rows (issue 3): IR kernels against hand-written rayon code in the same run.
//!
//! Each kernel is checked against a host reference before it is timed; the figures are
//! throughputs (elements or FLOP per second) beside the same work written as a rayon loop.

use std::time::{Duration, Instant};

use compute::cpu::{CpuKernel, CpuRuntime};
use compute_core::kernel::{KernelBuilder, KernelDefinition, kernel};
use compute_core::{ComputeClient, CubeCount, ElemType, Handle, KernelArguments, block_on};
use rayon::prelude::*;

use super::timing::{best_per_call, calibrate, progress};
use super::{Better, Row};

const BACKEND: &str = "cpu";

/// Elements of the elementwise and reduction inputs (16 Mi f32).
const ELEMS: usize = 16 << 20;
/// Units per cube of the one-dimensional kernels.
const CUBE: u32 = 256;
/// Side of the square matmul.
const N: usize = 1024;

/// Every kernel row whose name contains `filter`.
pub fn run(client: &ComputeClient<CpuRuntime>, filter: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let wanted = |name: &str| name.contains(filter);
    if wanted(ELEMENTWISE) {
        progress("cpu kernel elementwise a + b (16 Mi f32)");
        rows.push(elementwise(client));
    }
    if wanted(REDUCE) {
        progress("cpu kernel sum reduction (16 Mi f32)");
        rows.push(reduction(client));
    }
    if wanted(MATMUL) {
        progress("cpu kernel tiled matmul (1024^3 f32)");
        rows.push(matmul(client));
    }
    if wanted(COMPILE) {
        progress("cpu kernel plan compile time");
        rows.push(compile_time());
    }
    if wanted(JIT_COMPILE) {
        progress("cpu kernel JIT compile time");
        rows.push(jit_compile_time());
    }
    rows
}

const ELEMENTWISE: &str = "kernel elementwise f32 a+b 16Mi (vec4)";
const REDUCE: &str = "kernel sum reduction f32 16Mi (shared + barrier)";
const MATMUL: &str = "kernel tiled matmul f32 1024x1024 (shared tiles)";
const COMPILE: &str = "kernel plan compile time (mean of distinct kernels)";
const JIT_COMPILE: &str = "kernel JIT compile time, cold (mean of the kernels it covers)";

/// Deterministic inputs in [-1, 1).
fn inputs(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

fn read_f32(client: &ComputeClient<CpuRuntime>, h: &Handle) -> Vec<f32> {
    let bytes = client.read_one(h.clone()).expect("read back");
    bytemuck::pod_collect_to_vec(&bytes)
}

fn upload(client: &ComputeClient<CpuRuntime>, data: &[f32]) -> Handle {
    client.create_from_slice(bytemuck::cast_slice(data))
}

/// Seconds per call, the best of five repetitions of about 200 ms each.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let iters = calibrate(Duration::from_millis(200), &mut f);
    best_per_call(5, iters, f)
}

// ----- elementwise -----

/// `c[i] = a[i] + b[i]` over vectors of `width`, guarded by the buffer length.
#[kernel(cube_dim = CUBE, name = "bench_add")]
fn bench_add(
    a: &[[f32; width]],
    b: &[[f32; width]],
    c: &mut [[f32; width]],
    #[comptime] width: u8,
) {
    let i = ABSOLUTE_POS;
    if i < c.len() {
        c[i] = a[i] + b[i];
    }
}

fn add_kernel(width: u8) -> KernelDefinition {
    bench_add::definition(width).clone()
}

fn elementwise(client: &ComputeClient<CpuRuntime>) -> Row {
    let width = 4;
    let a = inputs(ELEMS, 1);
    let b = inputs(ELEMS, 2);
    let kernel: CpuKernel = add_kernel(width as u8).into();
    let (ha, hb) = (upload(client, &a), upload(client, &b));
    let hc = client.empty(ELEMS * 4);
    let cubes = (ELEMS / width).div_ceil(CUBE as usize) as u32;
    let args = KernelArguments::new()
        .buffer(ha.binding())
        .buffer(hb.binding())
        .buffer(hc.clone().binding());
    let launch = || {
        client.launch(kernel.clone(), CubeCount::Static(cubes, 1, 1), args.clone());
        block_on(client.sync()).expect("sync");
    };
    launch();
    let got = read_f32(client, &hc);
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert!(got == want, "elementwise kernel disagrees with the host");
    let ours = time(launch);

    let mut c = vec![0.0f32; ELEMS];
    let chunk = 1 << 14;
    let rayon_add = |c: &mut [f32]| {
        c.par_chunks_mut(chunk)
            .zip(a.par_chunks(chunk).zip(b.par_chunks(chunk)))
            .for_each(|(c, (a, b))| {
                for ((c, &a), &b) in c.iter_mut().zip(a).zip(b) {
                    *c = a + b;
                }
            });
    };
    rayon_add(&mut c);
    assert!(c == want, "rayon baseline disagrees with the host");
    let raw = time(|| {
        rayon_add(&mut c);
        std::hint::black_box(&c);
    });
    Row::new(
        BACKEND,
        ELEMENTWISE,
        ELEMS as f64 / ours,
        "elem/s",
        "rayon par_chunks a + b",
        ELEMS as f64 / raw,
        Better::Higher,
    )
}

// ----- reduction -----

/// Entries each unit sums before the tree (consecutive units read consecutive entries).
const ITEMS: u32 = 16;

/// Per-cube sums of `width`-vectors: each unit adds `ITEMS` entries, strided by the cube size so
/// every load of the cube is one contiguous run, then a tree over shared memory with barriers;
/// unit 0 writes the cube's partial.
#[kernel(cube_dim = CUBE, name = "bench_reduce")]
fn bench_reduce(input: &[[f32; width]], partials: &mut [f32], #[comptime] width: u8) {
    let tree = SharedMemory::<f32>::new(CUBE);
    let unit = UNIT_POS;
    let cube = CUBE_POS;
    let n = input.len();
    let mut acc = [0.0f32; width];
    let base = cube * (CUBE * ITEMS) + unit;
    for j in 0..ITEMS {
        let i = base + j * CUBE;
        if i < n {
            acc += input[i];
        }
    }
    let v = acc;
    #[comptime]
    let mut s = v[0];
    #[unroll]
    for c in 1..width {
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
        partials[cube] = tree[0];
    }
}

fn reduce_kernel(width: u8) -> KernelDefinition {
    bench_reduce::definition(width).clone()
}

fn reduction(client: &ComputeClient<CpuRuntime>) -> Row {
    let width = 4;
    let data = inputs(ELEMS, 3);
    let per_cube = (CUBE * ITEMS) as usize;
    let first: CpuKernel = reduce_kernel(width as u8).into();
    let second: CpuKernel = reduce_kernel(1).into();
    let cubes1 = (ELEMS / width).div_ceil(per_cube);
    let cubes2 = cubes1.div_ceil(per_cube);
    assert_eq!(cubes2, 1, "the second pass fits one cube");
    let h = upload(client, &data);
    let partials = client.empty(cubes1 * 4);
    let total = client.empty(4);
    let pass1 = KernelArguments::new()
        .buffer(h.binding())
        .buffer(partials.clone().binding());
    let pass2 = KernelArguments::new()
        .buffer(partials.binding())
        .buffer(total.clone().binding());
    let launch = || {
        client.launch(
            first.clone(),
            CubeCount::Static(cubes1 as u32, 1, 1),
            pass1.clone(),
        );
        client.launch(second.clone(), CubeCount::Static(1, 1, 1), pass2.clone());
        block_on(client.sync()).expect("sync");
    };
    launch();
    let want: f64 = data.iter().map(|&x| x as f64).sum();
    let abs_sum: f64 = data.iter().map(|&x| x.abs() as f64).sum();
    let got = read_f32(client, &total)[0] as f64;
    let tol = 1e-5 * abs_sum;
    assert!(
        (got - want).abs() <= tol,
        "reduction kernel: {got} vs host {want}"
    );
    let ours = time(launch);

    let rayon_sum = || data.par_iter().sum::<f32>();
    let r = rayon_sum() as f64;
    assert!((r - want).abs() <= tol, "rayon sum: {r} vs host {want}");
    let raw = time(|| {
        std::hint::black_box(rayon_sum());
    });
    Row::new(
        BACKEND,
        REDUCE,
        ELEMS as f64 / ours,
        "elem/s",
        "rayon par_iter().sum()",
        ELEMS as f64 / raw,
        Better::Higher,
    )
}

// ----- matmul -----

/// Depth of one shared tile.
const TK: u32 = 16;
/// Output rows per unit (scalars of the `a` tile, in vectors of 4 rows) and columns per unit
/// (one vector of `b`).
const ROWS_PER_UNIT: u32 = 8;
const COLS_PER_UNIT: u32 = 16;
/// Units per cube in x (columns) and y (rows).
const MX: u32 = 8;
const MY: u32 = 8;
/// Output tile of one cube.
const TILE_M: u32 = MY * ROWS_PER_UNIT;
const TILE_N: u32 = MX * COLS_PER_UNIT;

/// `c = a b` for square row-major `n x n` matrices. Each cube computes a `TILE_M x TILE_N` tile
/// of `c`, stepping through `k` by `TK`: the cube stages an `a` tile (transposed, as vectors of
/// 4 consecutive rows) and a `b` tile in shared memory, barriers, and each unit accumulates a
/// `ROWS_PER_UNIT x COLS_PER_UNIT` block in registers: per `k`, one vector of `b` times a
/// scalar of `a` for each row.
fn matmul_kernel(n: u32) -> KernelDefinition {
    let w = COLS_PER_UNIT as u8;
    let row_vecs = n / COLS_PER_UNIT;
    let groups = TILE_M / 4;
    let units = MX * MY;
    let mut k = KernelBuilder::new("bench_matmul", [MX, MY, 1]);
    let a = k.input("a", ElemType::F32, 1);
    let b = k.input("b", ElemType::F32, w);
    let c = k.output("c", ElemType::F32, w);
    // `a_t[kk * groups + g]`: rows `4g..4g + 4` of column `kk` of the `a` tile.
    let a_t = k.shared("a_t", ElemType::F32, 4, TK * groups);
    // `b_s[kk * MX + v]`: vector `v` of row `kk` of the `b` tile.
    let b_s = k.shared("b_s", ElemType::F32, w, TK * MX);
    let tx = k.unit_pos_x();
    let ty = k.unit_pos_y();
    let unit = k.unit_pos();
    let row0 = k.cube_pos_y();
    let row0 = k.mul(row0, TILE_M);
    let vec0 = k.cube_pos_x();
    let vec0 = k.mul(vec0, MX);
    let zero = k.splat(0.0f32, w);
    let acc: Vec<_> = (0..ROWS_PER_UNIT).map(|_| k.var(zero)).collect();
    let my_group = k.mul(ty, ROWS_PER_UNIT / 4);
    k.range(0u32, n, TK, |k, t| {
        // Stage the `a` tile: TK x groups vectors, one per unit per step.
        for step in 0..(TK * groups) / units {
            let flat = k.add(unit, step * units);
            let kk = k.div(flat, groups);
            let g = k.rem(flat, groups);
            let col = k.add(t, kk);
            let grow = k.mul(g, 4u32);
            let grow = k.add(row0, grow);
            let parts: Vec<_> = (0..4u32)
                .map(|r| {
                    let row = k.add(grow, r);
                    let src = k.mul(row, n);
                    let src = k.add(src, col);
                    k.load(a, src)
                })
                .collect();
            let v = k.vector(&parts);
            k.store(a_t, flat, v);
        }
        // Stage the `b` tile: TK rows of MX vectors.
        for step in 0..(TK * MX) / units {
            let flat = k.add(unit, step * units);
            let kk = k.div(flat, MX);
            let v = k.rem(flat, MX);
            let grow = k.add(t, kk);
            let src = k.mul(grow, row_vecs);
            let col = k.add(vec0, v);
            let src = k.add(src, col);
            let x = k.load(b, src);
            k.store(b_s, flat, x);
        }
        k.barrier();
        k.range(0u32, TK, 1u32, |k, kk| {
            let bi = k.mul(kk, MX);
            let bi = k.add(bi, tx);
            let bv = k.load(b_s, bi);
            let ai = k.mul(kk, groups);
            let ai = k.add(ai, my_group);
            let mut av = k.load(a_t, ai);
            for (r, acc) in acc.iter().enumerate() {
                let r = r as u32;
                if r.is_multiple_of(4) && r > 0 {
                    let next = k.add(ai, r / 4);
                    av = k.load(a_t, next);
                }
                let x = k.extract(av, (r % 4) as u8);
                let s = k.get(*acc);
                let s = k.fma(x, bv, s);
                k.assign(*acc, s);
            }
        });
        k.barrier();
    });
    let my_row = k.mul(ty, ROWS_PER_UNIT);
    for (r, acc) in acc.iter().enumerate() {
        let row = k.add(row0, my_row);
        let row = k.add(row, r as u32);
        let dst = k.mul(row, row_vecs);
        let dst = k.add(dst, vec0);
        let dst = k.add(dst, tx);
        let v = k.get(*acc);
        k.store(c, dst, v);
    }
    k.build().expect("matmul kernel")
}

/// The baseline: rows of `c` in parallel, `k` blocked so a block of `b` stays in cache, the
/// inner loop over a row of `b` (vectorised by the compiler).
fn rayon_matmul(a: &[f32], b: &[f32], c: &mut [f32], n: usize) {
    const ROWS: usize = 16;
    const KB: usize = 128;
    c.par_chunks_mut(ROWS * n).enumerate().for_each(|(blk, c)| {
        c.fill(0.0);
        for k0 in (0..n).step_by(KB) {
            for (r, crow) in c.chunks_exact_mut(n).enumerate() {
                let arow = &a[(blk * ROWS + r) * n..][..n];
                for k in k0..(k0 + KB).min(n) {
                    let x = arow[k];
                    for (c, &y) in crow.iter_mut().zip(&b[k * n..(k + 1) * n]) {
                        *c += x * y;
                    }
                }
            }
        }
    });
}

fn matmul(client: &ComputeClient<CpuRuntime>) -> Row {
    let a = inputs(N * N, 4);
    let b = inputs(N * N, 5);
    let kernel: CpuKernel = matmul_kernel(N as u32).into();
    let (ha, hb) = (upload(client, &a), upload(client, &b));
    let hc = client.empty(N * N * 4);
    let args = KernelArguments::new()
        .buffer(ha.binding())
        .buffer(hb.binding())
        .buffer(hc.clone().binding());
    let count = CubeCount::Static(N as u32 / TILE_N, N as u32 / TILE_M, 1);
    let launch = || {
        client.launch(kernel.clone(), count.clone(), args.clone());
        block_on(client.sync()).expect("sync");
    };
    launch();
    let got = read_f32(client, &hc);
    let mut want = vec![0.0f32; N * N];
    rayon_matmul(&a, &b, &mut want, N);
    // Spot-check the baseline in f64 on a few entries, then the kernel against it everywhere.
    for &(i, j) in &[(0, 0), (1, 1023), (517, 3), (1023, 1023), (300, 700)] {
        let exact: f64 = (0..N)
            .map(|k| a[i * N + k] as f64 * b[k * N + j] as f64)
            .sum();
        assert!(
            (want[i * N + j] as f64 - exact).abs() < 1e-3,
            "rayon matmul at ({i}, {j})"
        );
    }
    let worst = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst < 1e-3,
        "matmul kernel differs from the host by {worst}"
    );
    let ours = time(launch);
    let mut c = vec![0.0f32; N * N];
    let raw = time(|| {
        rayon_matmul(&a, &b, &mut c, N);
        std::hint::black_box(&c);
    });
    let flop = 2.0 * (N * N * N) as f64;
    Row::new(
        BACKEND,
        MATMUL,
        flop / ours / 1e9,
        "GFLOP/s",
        "rayon blocked matmul (i-k-j, 16-row blocks, k blocks of 128)",
        flop / raw / 1e9,
        Better::Higher,
    )
}

// ----- compile time -----

/// Kernels of different shapes: the three above, axpy, and one with loops, breaks, atomics and
/// plane ops.
fn compile_kernels() -> Vec<KernelDefinition> {
    vec![
        add_kernel(4),
        reduce_kernel(4),
        reduce_kernel(1),
        matmul_kernel(N as u32),
        bench_axpy::definition().clone(),
        bench_control::definition().clone(),
    ]
}

#[kernel(cube_dim = 256)]
fn bench_axpy(x: &[[f32; 4]], y: &mut [[f32; 4]], a: f32) {
    let i = ABSOLUTE_POS;
    if i < y.len() {
        y[i] = a.mul_add(x[i], y[i]);
    }
}

#[kernel(cube_dim = 64)]
fn bench_control(data: &mut [i32], hist: &mut [u32]) {
    let i = ABSOLUTE_POS;
    let v = data[i];
    let mut count = 0i32;
    loop {
        if count >= v {
            break;
        }
        if (count & 1) == 1 {
            count += 3;
            continue;
        }
        count += 1;
    }
    let c = count;
    let bin = plane_sum(c) as u32 % 16;
    hist.atomic_add(bin, 1);
    data[i] = (c as f32).sqrt() as i32;
}

fn compile_time() -> Row {
    let kernels = compile_kernels();
    let rounds = 200;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..rounds {
            for def in &kernels {
                std::hint::black_box(
                    compute::cpu::compiler::compile_interpreted(def).expect("compiles"),
                );
            }
        }
        let per = start.elapsed().as_secs_f64() / (rounds * kernels.len()) as f64;
        best = best.min(per);
    }
    Row::new(
        BACKEND,
        COMPILE,
        best * 1e6,
        "us",
        "target: 1 ms per kernel",
        1000.0,
        Better::Lower,
    )
}

/// Machine-code compile time of each kernel the JIT covers (a new module per kernel, as the
/// server's first launch of a kernel does; the target ISA is built once per process).
fn jit_compile_time() -> Row {
    let kernels = compile_kernels();
    let rounds = 10;
    let mut best = f64::INFINITY;
    let mut covered = 0;
    for _ in 0..5 {
        let mut total_us = 0.0;
        covered = 0;
        for _ in 0..rounds {
            for def in &kernels {
                let plan = compute::cpu::compiler::compile_jit(def).expect("compiles");
                if let Some(us) = plan.jit_compile_us() {
                    total_us += us;
                    covered += 1;
                }
            }
        }
        if covered > 0 {
            best = best.min(total_us / covered as f64);
        }
    }
    assert!(covered > 0, "the JIT covers none of the bench kernels");
    Row::new(
        BACKEND,
        JIT_COMPILE,
        best,
        "us",
        "target: 5 ms per kernel",
        5000.0,
        Better::Lower,
    )
}

#[cfg(test)]
mod tests {
    //! The measured kernels against the builder code they replaced: the same IR, the same id
    //! (so the bench rows measure the same kernels).

    use compute_core::ElemType;
    use compute_core::kernel::KernelBuilder;

    use super::{CUBE, ITEMS};

    #[test]
    fn bench_add_matches_the_builder() {
        let width = 4;
        let mut k = KernelBuilder::new("bench_add", [CUBE, 1, 1]);
        let a = k.input("a", ElemType::F32, width);
        let b = k.input("b", ElemType::F32, width);
        let c = k.output("c", ElemType::F32, width);
        let i = k.absolute_pos();
        let n = k.len(c);
        let inside = k.lt(i, n);
        k.if_(inside, |k| {
            let x = k.load(a, i);
            let y = k.load(b, i);
            let s = k.add(x, y);
            k.store(c, i, s);
        });
        let twin = k.build().unwrap();
        assert_eq!(super::add_kernel(width), twin);
        assert_eq!(super::add_kernel(width).id(), twin.id());
    }

    #[test]
    fn bench_reduce_matches_the_builder() {
        for width in [1u8, 4] {
            let mut k = KernelBuilder::new("bench_reduce", [CUBE, 1, 1]);
            let input = k.input("input", ElemType::F32, width);
            let partials = k.output("partials", ElemType::F32, 1);
            let tree = k.shared("tree", ElemType::F32, 1, CUBE);
            let unit = k.unit_pos();
            let cube = k.cube_pos();
            let n = k.len(input);
            let zero = k.splat(0.0f32, width);
            let acc = k.var_named("acc", zero);
            let base = k.mul(cube, CUBE * ITEMS);
            let base = k.add(base, unit);
            k.range(0u32, ITEMS, 1u32, |k, j| {
                let off = k.mul(j, CUBE);
                let i = k.add(base, off);
                let inside = k.lt(i, n);
                k.if_(inside, |k| {
                    let x = k.load(input, i);
                    let s = k.get(acc);
                    let s = k.add(s, x);
                    k.assign(acc, s);
                });
            });
            let v = k.get(acc);
            let mut s = k.extract(v, 0);
            for c in 1..width {
                let x = k.extract(v, c);
                s = k.add(s, x);
            }
            k.store(tree, unit, s);
            k.barrier();
            let mut stride = CUBE / 2;
            while stride > 0 {
                let active = k.lt(unit, stride);
                k.if_(active, |k| {
                    let other = k.add(unit, stride);
                    let x = k.load(tree, unit);
                    let y = k.load(tree, other);
                    let s = k.add(x, y);
                    k.store(tree, unit, s);
                });
                k.barrier();
                stride /= 2;
            }
            let first = k.eq(unit, 0u32);
            k.if_(first, |k| {
                let total = k.load(tree, 0u32);
                k.store(partials, cube, total);
            });
            let twin = k.build().unwrap();
            assert_eq!(super::reduce_kernel(width), twin, "width {width}");
            assert_eq!(super::reduce_kernel(width).id(), twin.id());
        }
    }
}
