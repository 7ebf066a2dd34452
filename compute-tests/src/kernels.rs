//! The portable kernels the suite, the benchmarks and the example launch.

use compute_core::kernel::{KernelDefinition, kernel};
use compute_core::{ComputeClient, CubeCount, Handle, KernelArguments, Runtime};

/// Units per cube of every kernel here.
pub const CUBE_DIM: u32 = 256;

/// `out[i] = a[i] + b[i]` over f32 vectors of `width`.
#[kernel(cube_dim = CUBE_DIM, name = format!("add_f32x{width}"))]
pub fn add_f32(
    a: &[[f32; width]],
    b: &[[f32; width]],
    out: &mut [[f32; width]],
    #[comptime] width: u8,
) {
    let i = ABSOLUTE_POS;
    out[i] = a[i] + b[i];
}

/// The definition of [`add_f32`](mod@add_f32) at vector `width`.
pub fn add_f32(width: u8) -> KernelDefinition {
    add_f32::definition(width).clone()
}

/// `out[i] = value` for every unit of the launch (bounds are the launch's business).
#[kernel(cube_dim = CUBE_DIM)]
pub fn fill_f32(out: &mut [f32], value: f32) {
    out[ABSOLUTE_POS] = value;
}

/// The definition of [`fill_f32`](mod@fill_f32).
pub fn fill_f32() -> KernelDefinition {
    fill_f32::definition().clone()
}

/// `y[i] = a * x[i] + y[i]`, guarded by the length of `x`.
#[kernel(cube_dim = CUBE_DIM)]
pub fn saxpy(x: &[f32], y: &mut [f32], a: f32) {
    let i = ABSOLUTE_POS;
    if i < x.len() {
        y[i] = a.mul_add(x[i], y[i]);
    }
}

/// The definition of [`saxpy`](mod@saxpy).
pub fn saxpy() -> KernelDefinition {
    saxpy::definition().clone()
}

/// `out[i] = input[i] + iterations`, adding 1.0 in a loop so the kernel takes a while.
#[kernel(cube_dim = CUBE_DIM)]
pub fn slow_add(input: &[f32], out: &mut [f32], iterations: u32) {
    let i = ABSOLUTE_POS;
    let mut acc = input[i];
    for _ in 0..iterations {
        acc += 1.0;
    }
    out[i] = acc;
}

/// The definition of [`slow_add`](mod@slow_add).
pub fn slow_add() -> KernelDefinition {
    slow_add::definition().clone()
}

/// Launch a binary kernel (`add_f32`) over `n` f32 elements at vector `width`.
pub fn launch_binary<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &KernelDefinition,
    a: &Handle,
    b: &Handle,
    out: &Handle,
    n: usize,
    width: u8,
) {
    client.launch(
        kernel.clone().into(),
        CubeCount::cover(n / width as usize, CUBE_DIM),
        KernelArguments::new()
            .buffer(a.clone().binding())
            .buffer(b.clone().binding())
            .buffer(out.clone().binding()),
    );
}

/// Launch [`slow_add`] over `n` elements.
pub fn launch_slow_add<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    out: &Handle,
    n: usize,
    iterations: u32,
) {
    slow_add::launch(
        client,
        CubeCount::cover(n, CUBE_DIM),
        input,
        out,
        iterations,
    );
}

#[cfg(test)]
mod tests {
    //! The kernels above against the builder code they replaced: the same IR, the same id.

    use compute_core::ElemType;
    use compute_core::kernel::{KernelBuilder, KernelDefinition};

    use super::CUBE_DIM;

    fn same(ours: KernelDefinition, twin: KernelBuilder) {
        let twin = twin.build().expect("twin builds");
        assert_eq!(ours, twin);
        assert_eq!(ours.id(), twin.id());
    }

    #[test]
    fn add_f32_matches_the_builder() {
        for width in [1u8, 4] {
            let mut k = KernelBuilder::new(&format!("add_f32x{width}"), [CUBE_DIM, 1, 1]);
            let a = k.input("a", ElemType::F32, width);
            let b = k.input("b", ElemType::F32, width);
            let out = k.output("out", ElemType::F32, width);
            let i = k.absolute_pos();
            let x = k.load(a, i);
            let y = k.load(b, i);
            let sum = k.add(x, y);
            k.store(out, i, sum);
            same(super::add_f32(width), k);
        }
    }

    #[test]
    fn fill_saxpy_and_slow_add_match_the_builder() {
        let mut k = KernelBuilder::new("fill_f32", [CUBE_DIM, 1, 1]);
        let out = k.output("out", ElemType::F32, 1);
        let value = k.scalar("value", ElemType::F32);
        let i = k.absolute_pos();
        k.store(out, i, value);
        same(super::fill_f32(), k);

        let mut k = KernelBuilder::new("saxpy", [CUBE_DIM, 1, 1]);
        let x = k.input("x", ElemType::F32, 1);
        let y = k.output("y", ElemType::F32, 1);
        let a = k.scalar("a", ElemType::F32);
        let i = k.absolute_pos();
        let n = k.len(x);
        let inside = k.lt(i, n);
        k.if_(inside, |k| {
            let xv = k.load(x, i);
            let yv = k.load(y, i);
            let r = k.fma(a, xv, yv);
            k.store(y, i, r);
        });
        same(super::saxpy(), k);

        let mut k = KernelBuilder::new("slow_add", [CUBE_DIM, 1, 1]);
        let input = k.input("input", ElemType::F32, 1);
        let out = k.output("out", ElemType::F32, 1);
        let iterations = k.scalar("iterations", ElemType::U32);
        let i = k.absolute_pos();
        let start = k.load(input, i);
        let acc = k.var_named("acc", start);
        k.range(0u32, iterations, 1u32, |k, _| {
            let v = k.get(acc);
            let v = k.add(v, 1.0f32);
            k.assign(acc, v);
        });
        let v = k.get(acc);
        k.store(out, i, v);
        same(super::slow_add(), k);
    }
}
