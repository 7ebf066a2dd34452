//! Kernels written with `#[kernel]` run on every backend: control flow, shared memory and
//! barriers, local arrays, atomics, plane sums, generic element types and vector widths, tensor
//! metadata, unchecked launches. (The IR itself is tested at the builder level by the `ir_*`
//! groups; these check that the Rust-syntax front end lowers to kernels that compute the same.)

use compute_core::kernel::{KernelElem, kernel};
use compute_core::{BufferArgument, ComputeClient, CubeCount, Elem, Runtime};

use super::ir_util::{assert_same, download, feature_gate, upload, zeros};

/// Nested divergent `if`/`else` assigning a variable declared outside, a `while` with a per-unit
/// trip count, `loop` with `break`/`continue`, and an early `return`.
#[kernel(cube_dim = 64)]
fn control(out: &mut [u32], n: u32) {
    let i = ABSOLUTE_POS;
    if i >= n {
        return;
    }
    let mut v = 0u32;
    if i % 3 == 0 {
        if (i & 1) == 0 {
            v = i * 10;
        } else {
            v = i + 1000;
        }
    } else {
        if i > 100 {
            v = i - 100;
        }
        v += 7;
    }
    // `while` with a per-unit trip count: adds i % 5.
    let mut j = 0u32;
    while j < i % 5 {
        v += 1;
        j += 1;
    }
    // `loop`: counts the odd numbers below i % 8, skipping evens with `continue`.
    let mut k = 0u32;
    let mut odd = 0u32;
    loop {
        k += 1;
        if k >= i % 8 {
            break;
        }
        if k % 2 == 0 {
            continue;
        }
        odd += 1;
    }
    out[i] = v * 100 + odd;
}

/// The host model of [`control`].
fn control_host(i: u32) -> u32 {
    let mut v = if i.is_multiple_of(3) {
        if i.is_multiple_of(2) {
            i * 10
        } else {
            i + 1000
        }
    } else {
        i.saturating_sub(100) + 7
    };
    v += i % 5;
    let odd = (1..(i % 8).max(1)).filter(|k| k % 2 == 1).count() as u32;
    v * 100 + odd
}

/// Control flow of a `#[kernel]` against its host model, per unit.
pub fn kernel_macro_control<R: Runtime>(client: ComputeClient<R>) {
    let n = 200u32;
    let h = zeros::<R, u32>(&client, 256);
    control::launch(&client, CubeCount::new_1d(4), &h, n);
    let expected: Vec<u32> = (0..256)
        .map(|i| if i < n { control_host(i) } else { 0 })
        .collect();
    assert_same(
        &download::<R, u32>(&client, &h),
        &expected,
        "#[kernel] control flow",
    );
}

const CUBE: u32 = 64;

/// Each cube reverses its slice through shared memory (barrier between the write and the read),
/// then each unit sums a reversed run of 4 entries of a local array.
#[kernel(cube_dim = CUBE)]
fn reverse(input: &[f32], out: &mut [f32], sums: &mut [f32]) {
    let tile = SharedMemory::<f32>::new(CUBE);
    let local = LocalArray::<f32>::new(4);
    let unit = UNIT_POS;
    let base = CUBE_POS * CUBE;
    tile[unit] = input[base + unit];
    sync_units();
    let r = tile[CUBE - 1 - unit];
    out[base + unit] = r;
    for j in 0..4 {
        local[3 - j] = r * (j + 1) as f32;
    }
    let mut s = 0.0f32;
    #[unroll]
    for j in 0..4 {
        s += local[j];
    }
    sums[base + unit] = s;
}

/// Shared memory with a barrier, and a local array, from `#[kernel]`.
pub fn kernel_macro_shared_and_local<R: Runtime>(client: ComputeClient<R>) {
    let cubes = 3usize;
    let n = cubes * CUBE as usize;
    let input: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
    let out = zeros::<R, f32>(&client, n);
    let sums = zeros::<R, f32>(&client, n);
    reverse::launch(
        &client,
        CubeCount::new_1d(cubes as u32),
        upload(&client, &input),
        &out,
        &sums,
    );
    let c = CUBE as usize;
    let expected: Vec<f32> = (0..n).map(|i| input[i / c * c + c - 1 - i % c]).collect();
    assert_same(
        &download::<R, f32>(&client, &out),
        &expected,
        "shared reverse",
    );
    let expected: Vec<f32> = expected.iter().map(|r| r * 10.0).collect();
    assert_same(
        &download::<R, f32>(&client, &sums),
        &expected,
        "local array sums",
    );
}

/// A histogram with `atomic_add`, and a counter with `atomic_compare_exchange` (one winner).
#[kernel(cube_dim = 256)]
fn histogram(input: &[u32], hist: &mut [u32], winner: &mut [u32], bins: u32) {
    let i = ABSOLUTE_POS;
    hist.atomic_add(input[i] % bins, 1);
    let old = winner.atomic_compare_exchange(0, 0, i + 1);
    if old == 0 {
        winner[1] = i + 1;
    }
}

/// `atomic_add` and `atomic_compare_exchange` from `#[kernel]`.
pub fn kernel_macro_atomics<R: Runtime>(client: ComputeClient<R>) {
    let bins = 37u32;
    let n = 16 * 256usize;
    let input: Vec<u32> = (0..n as u32)
        .map(|v| v.wrapping_mul(2_654_435_761).rotate_left(7) % 1000)
        .collect();
    let hist = zeros::<R, u32>(&client, bins as usize);
    let winner = zeros::<R, u32>(&client, 2);
    histogram::launch(
        &client,
        CubeCount::new_1d(16),
        upload(&client, &input),
        &hist,
        &winner,
        bins,
    );
    if !feature_gate(&client, client.features().atomics, "atomics") {
        return;
    }
    let mut expected = vec![0u32; bins as usize];
    for v in &input {
        expected[(v % bins) as usize] += 1;
    }
    assert_same(&download::<R, u32>(&client, &hist), &expected, "histogram");
    let w = download::<R, u32>(&client, &winner);
    assert!(w[0] >= 1 && w[0] as usize <= n, "a unit won: {w:?}");
    assert_eq!(w[0], w[1], "exactly the winner saw 0 and recorded itself");
}

/// `out = a * x + b` over vectors of `W`, generic over the element type.
#[kernel(cube_dim = 64, name = format!("axpb_{}x{W}", <F as KernelElem>::ELEM))]
fn axpb<F: KernelElem, const W: u32>(x: &[[F; W]], out: &mut [[F; W]], a: F, b: F) {
    let i = ABSOLUTE_POS;
    if i < x.len() {
        out[i] = x[i] * a + b;
    }
}

fn run_axpb<R: Runtime, T: Elem + KernelElem, const W: u32>(
    client: &ComputeClient<R>,
    x: &[T],
    a: T,
    b: T,
) -> Vec<T> {
    let out = zeros::<R, T>(client, x.len());
    let entries = x.len() / W as usize;
    axpb::launch::<T, W>(
        client,
        CubeCount::cover(entries, 64),
        upload(client, x),
        &out,
        a,
        b,
    );
    download::<R, T>(client, &out)
}

/// One generic `#[kernel]` at f32x4, f32x1 and i32x2.
pub fn kernel_macro_generic_types_and_widths<R: Runtime>(client: ComputeClient<R>) {
    let xf: Vec<f32> = (0..300).map(|i| i as f32 * 0.25).collect();
    let want: Vec<f32> = xf.iter().map(|x| x * 3.0 + 0.5).collect();
    assert_same(
        &run_axpb::<R, f32, 4>(&client, &xf, 3.0, 0.5),
        &want,
        "f32x4",
    );
    assert_same(
        &run_axpb::<R, f32, 1>(&client, &xf, 3.0, 0.5),
        &want,
        "f32x1",
    );
    let xi: Vec<i32> = (0..256).map(|i| i - 100).collect();
    let want: Vec<i32> = xi.iter().map(|x| x * -7 + 3).collect();
    assert_same(&run_axpb::<R, i32, 2>(&client, &xi, -7, 3), &want, "i32x2");
    assert_ne!(
        axpb::definition::<f32, 4>().id(),
        axpb::definition::<f32, 1>().id()
    );
}

/// `out[r * cols + c] = t[r, c]` of a strided 2-d view: shape and strides from the launch.
#[kernel(cube_dim = [8, 8, 1])]
fn gather2d(t: &[f32], out: &mut [f32], meta: &mut [u32]) {
    let r = ABSOLUTE_POS_Y;
    let c = ABSOLUTE_POS_X;
    let rows = t.shape(0);
    let cols = t.shape(1);
    if r < rows && c < cols {
        out[r * cols + c] = t[r * t.stride(0) + c * t.stride(1)];
    }
    if ABSOLUTE_POS == 0 {
        meta[0] = t.rank();
        meta[1] = t.stride(0);
        meta[2] = t.shape(5);
    }
}

/// `shape`, `stride` and `rank` of a tensor argument in `#[kernel]`.
pub fn kernel_macro_tensor_metadata<R: Runtime>(client: ComputeClient<R>) {
    // A 5 x 6 transposed view of a row-major 6 x 5 matrix.
    let (rows, cols) = (5usize, 6usize);
    let data: Vec<f32> = (0..30).map(|i| i as f32).collect();
    let arg = BufferArgument {
        binding: upload(&client, &data).binding(),
        shape: vec![rows, cols].into(),
        strides: vec![1, rows].into(),
    };
    let out = zeros::<R, f32>(&client, rows * cols);
    let meta = zeros::<R, u32>(&client, 3);
    gather2d::launch(&client, CubeCount::Static(1, 1, 1), arg, &out, &meta);
    let expected: Vec<f32> = (0..rows * cols)
        .map(|i| data[(i % cols) * rows + i / cols])
        .collect();
    assert_same(
        &download::<R, f32>(&client, &out),
        &expected,
        "strided gather",
    );
    assert_same(
        &download::<R, u32>(&client, &meta),
        &[2, 1, 0],
        "rank, stride, shape past rank",
    );
}

/// A plane sum of the unit's index, written by every unit (plane-size independent check: the sum
/// over each plane of `UNIT_POS_PLANE` is `p (p - 1) / 2`).
#[kernel(cube_dim = 64)]
fn plane_total(out: &mut [u32], lanes: &mut [u32]) {
    let i = ABSOLUTE_POS;
    out[i] = plane_sum(UNIT_POS_PLANE) * 1000 + PLANE_DIM;
    // Lane 1's position in the cube, broadcast; each unit's neighbour's lane by shuffle.
    let next = (UNIT_POS_PLANE + 1) % PLANE_DIM;
    lanes[2 * i] = plane_broadcast(UNIT_POS, 1) - (UNIT_POS - UNIT_POS_PLANE);
    lanes[2 * i + 1] = plane_shuffle(UNIT_POS_PLANE, next);
}

/// `plane_sum`, `plane_broadcast`, `plane_shuffle`, `UNIT_POS_PLANE` and `PLANE_DIM` in
/// `#[kernel]`.
pub fn kernel_macro_plane_sum<R: Runtime>(client: ComputeClient<R>) {
    let out = zeros::<R, u32>(&client, 64);
    let lanes = zeros::<R, u32>(&client, 128);
    plane_total::launch(&client, CubeCount::new_1d(1), &out, &lanes);
    if !feature_gate(&client, client.features().plane_ops, "plane operations") {
        return;
    }
    let got = download::<R, u32>(&client, &out);
    let p = got[0] % 1000;
    assert!(p > 0 && 64 % p == 0, "plane size {p} divides the cube");
    let expected = vec![p * (p - 1) / 2 * 1000 + p; 64];
    assert_same(&got, &expected, "plane sums");
    let expected: Vec<u32> = (0..64u32).flat_map(|u| [1, (u % p + 1) % p]).collect();
    assert_same(
        &download::<R, u32>(&client, &lanes),
        &expected,
        "plane broadcast of lane 1, shuffle from the next lane",
    );
}

/// `launch_unchecked` of an in-bounds kernel computes the same as `launch`.
pub fn kernel_macro_unchecked_launch<R: Runtime>(client: ComputeClient<R>) {
    let n = 256usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let out = zeros::<R, f32>(&client, n);
    // SAFETY: the kernel indexes `x` and `out` only below `x.len()` (256, the length of both).
    unsafe {
        axpb::launch_unchecked::<f32, 1>(
            &client,
            CubeCount::new_1d(4),
            upload(&client, &x),
            &out,
            2.0,
            1.0,
        );
    }
    let want: Vec<f32> = x.iter().map(|v| v * 2.0 + 1.0).collect();
    assert_same(
        &download::<R, f32>(&client, &out),
        &want,
        "unchecked launch",
    );
}
