//! The portable kernels the suite, the benchmarks and the example launch.

use compute_core::kernel::{KernelBuilder, KernelDefinition};
use compute_core::{ComputeClient, CubeCount, ElemType, Handle, KernelArguments, Runtime};

/// Units per cube of every kernel here.
pub const CUBE_DIM: u32 = 256;

/// `out[i] = a[i] + b[i]` over f32 vectors of `width`.
pub fn add_f32(width: u8) -> KernelDefinition {
    let mut k = KernelBuilder::new(&format!("add_f32x{width}"), [CUBE_DIM, 1, 1]);
    let a = k.input("a", ElemType::F32, width);
    let b = k.input("b", ElemType::F32, width);
    let out = k.output("out", ElemType::F32, width);
    let i = k.absolute_pos();
    let x = k.load(a, i);
    let y = k.load(b, i);
    let sum = k.add(x, y);
    k.store(out, i, sum);
    k.build().expect("add_f32 is a valid kernel")
}

/// `out[i] = value` for every unit of the launch (bounds are the launch's business).
pub fn fill_f32() -> KernelDefinition {
    let mut k = KernelBuilder::new("fill_f32", [CUBE_DIM, 1, 1]);
    let out = k.output("out", ElemType::F32, 1);
    let value = k.scalar("value", ElemType::F32);
    let i = k.absolute_pos();
    k.store(out, i, value);
    k.build().expect("fill_f32 is a valid kernel")
}

/// `y[i] = a * x[i] + y[i]`, guarded by the length of `x`.
pub fn saxpy() -> KernelDefinition {
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
    k.build().expect("saxpy is a valid kernel")
}

/// `out[i] = input[i] + iterations`, adding 1.0 in a loop so the kernel takes a while.
pub fn slow_add() -> KernelDefinition {
    let mut k = KernelBuilder::new("slow_add", [CUBE_DIM, 1, 1]);
    let input = k.input("input", ElemType::F32, 1);
    let out = k.output("out", ElemType::F32, 1);
    let iterations = k.scalar("iterations", ElemType::U32);
    let i = k.absolute_pos();
    let start = k.load(input, i);
    let acc = k.var(start);
    k.range(0u32, iterations, 1u32, |k, _| {
        let v = k.get(acc);
        let v = k.add(v, 1.0f32);
        k.assign(acc, v);
    });
    let v = k.get(acc);
    k.store(out, i, v);
    k.build().expect("slow_add is a valid kernel")
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
    client.launch(
        slow_add().into(),
        CubeCount::cover(n, CUBE_DIM),
        KernelArguments::new()
            .buffer(input.clone().binding())
            .buffer(out.clone().binding())
            .scalar(iterations),
    );
}
