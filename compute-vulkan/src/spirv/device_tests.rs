//! End-to-end checks of the emitter on the machine's Vulkan device (lavapipe in CI): the math
//! routines swept over many inputs against the host's `std`, and the integer semantics the IR
//! fixes (division by zero, `MIN / -1`, shifts, saturating casts, bf16 rounding). Skipped with a
//! note when no Vulkan device is available.

use compute_core::kernel::{BinaryOp, KernelBuilder, KernelDefinition, UnaryOp};
use compute_core::{
    Bytes, ComputeClient, CubeCount, Device, DeviceId, Elem, ElemType, Handle, KernelArguments,
    Runtime,
};

use crate::{VULKAN_DEVICE_TYPE, VulkanDevice, VulkanRuntime};

/// A host reference function of one `f64`.
type Host1 = fn(f64) -> f64;
/// A host reference function of two `i32`.
type Host2 = fn(i32, i32) -> i32;

fn client() -> Option<ComputeClient<VulkanRuntime>> {
    if let Err(why) = VulkanRuntime::availability() {
        eprintln!("no Vulkan device ({why}): skipping the device checks of the SPIR-V emitter");
        return None;
    }
    Some(ComputeClient::load(&VulkanDevice::from_id(DeviceId::new(
        VULKAN_DEVICE_TYPE,
        0,
    ))))
}

fn upload<T: Elem>(c: &ComputeClient<VulkanRuntime>, data: &[T]) -> Handle {
    c.create(Bytes::from_elem_slice(data))
}

fn download<T: Elem>(c: &ComputeClient<VulkanRuntime>, h: &Handle) -> Vec<T> {
    c.read_one(h.clone()).expect("read back").to_elems::<T>()
}

/// Run `out[i] = f(a[i], b[i])` over `n` items of `elem` (one unit per item).
fn run2<T: Elem + Copy>(
    c: &ComputeClient<VulkanRuntime>,
    elem: ElemType,
    name: &str,
    a: &[T],
    b: &[T],
    f: impl FnOnce(
        &mut KernelBuilder,
        compute_core::kernel::Value,
        compute_core::kernel::Value,
    ) -> compute_core::kernel::Value,
    out_elem: ElemType,
) -> Handle {
    let mut k = KernelBuilder::new(name, [64, 1, 1]);
    let ha = k.input("a", elem, 1);
    let hb = k.input("b", elem, 1);
    let out = k.output("out", out_elem, 1);
    let i = k.absolute_pos();
    let n = k.len(ha);
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let x = k.load(ha, i);
        let y = k.load(hb, i);
        let r = f(k, x, y);
        k.store(out, i, r);
    });
    let def: KernelDefinition = k.build().expect("builds");
    let h = c.create(Bytes::zeroed(a.len() * out_elem.size()));
    c.launch(
        def.into(),
        CubeCount::Static(a.len().div_ceil(64) as u32, 1, 1),
        KernelArguments::new()
            .buffer(upload(c, a).binding())
            .buffer(upload(c, b).binding())
            .buffer(h.clone().binding()),
    );
    h
}

fn sweep(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| lo + (hi - lo) * (i as f64 + 0.37) / n as f64)
        .collect()
}

fn check_close(name: &str, xs: &[f64], got: &[f64], want: &[f64], rel: f64, abs: f64) {
    let mut worst = (0.0f64, 0usize);
    for (j, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        let tol = abs + rel * w.abs();
        if !(err <= tol || (g.is_nan() && w.is_nan()) || g == w) {
            panic!(
                "{name}({}) = {g:e}, expected {w:e} (error {err:e} > {tol:e})",
                xs[j]
            );
        }
        let r = err / w.abs().max(1e-300);
        if r > worst.0 {
            worst = (r, j);
        }
    }
    eprintln!(
        "{name}: worst relative error {:e} at {}",
        worst.0, xs[worst.1]
    );
}

#[test]
fn f64_math_matches_std_over_sweeps() {
    let Some(c) = client() else { return };
    if !c.features().supports(ElemType::F64) {
        eprintln!("the device has no f64: skipping");
        return;
    }
    let cases: Vec<(UnaryOp, Vec<f64>, Host1)> = vec![
        (UnaryOp::Exp, sweep(-740.0, 709.0, 3000), f64::exp),
        (UnaryOp::Exp, sweep(-2.0, 2.0, 1000), f64::exp),
        (UnaryOp::Log, sweep(1e-300, 10.0, 500), f64::ln),
        (
            UnaryOp::Log,
            (0..600)
                .map(|i| 10f64.powf(i as f64 - 300.0) * 1.7)
                .collect(),
            f64::ln,
        ),
        (UnaryOp::Log, sweep(0.5, 2.0, 1000), f64::ln),
        (UnaryOp::Log1p, sweep(-0.99, 3.0, 1000), f64::ln_1p),
        (
            UnaryOp::Log1p,
            (0..200).map(|i| 10f64.powf(-(i as f64) / 10.0)).collect(),
            f64::ln_1p,
        ),
        (UnaryOp::Sin, sweep(-1000.0, 1000.0, 4000), f64::sin),
        (UnaryOp::Cos, sweep(-1000.0, 1000.0, 4000), f64::cos),
        (UnaryOp::Sin, sweep(-4.0, 4.0, 1000), f64::sin),
        (UnaryOp::Tanh, sweep(-30.0, 30.0, 2000), f64::tanh),
        (UnaryOp::Tanh, sweep(-1.0, 1.0, 1000), f64::tanh),
        (UnaryOp::Erf, sweep(-7.0, 7.0, 2000), libm_erf),
    ];
    for (op, xs, host) in cases {
        let zeros_in = vec![0.0f64; xs.len()];
        let h = run2(
            &c,
            ElemType::F64,
            &format!("sweep_{}", op.name()),
            &xs,
            &zeros_in,
            |k, x, _| k.unary(op, x),
            ElemType::F64,
        );
        let got = download::<f64>(&c, &h);
        let want: Vec<f64> = xs.iter().map(|&x| host(x)).collect();
        // sin/cos near their zeros: absolute error relative to the argument's reduction.
        let abs = match op {
            UnaryOp::Sin | UnaryOp::Cos => 1e-15,
            _ => 1e-300,
        };
        check_close(op.name(), &xs, &got, &want, 1e-13, abs);
    }
    // pow over positive bases and exponents of both signs, and negative bases with integer
    // exponents.
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for i in 0..40 {
        for j in 0..40 {
            xs.push(0.01 + i as f64 * 0.77);
            ys.push(-20.0 + j as f64 * 1.03);
        }
    }
    for i in 0..20 {
        xs.push(-1.5 - i as f64);
        ys.push((i % 7) as f64 - 3.0);
    }
    let h = run2(
        &c,
        ElemType::F64,
        "sweep_pow",
        &xs,
        &ys,
        |k, x, y| k.binary(BinaryOp::Pow, x, y),
        ElemType::F64,
    );
    let got = download::<f64>(&c, &h);
    let want: Vec<f64> = xs.iter().zip(&ys).map(|(x, y)| x.powf(*y)).collect();
    check_close("pow", &xs, &got, &want, 1e-12, 1e-300);
}

/// erf on the host, to double precision (Abramowitz-Stegun-free: the series/continued fraction).
fn libm_erf(x: f64) -> f64 {
    // Series for |x| < 3, continued fraction of erfc beyond.
    let a = x.abs();
    let r = if a < 3.0 {
        let mut term = a;
        let mut sum = a;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -a * a / n;
            let t = term / (2.0 * n + 1.0);
            sum += t;
            if t.abs() < 1e-18 * sum.abs() {
                break;
            }
        }
        sum * core::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc(a) = exp(-a^2)/sqrt(pi) * 1/(a + 1/2/(a + 1/(a + 3/2/(a + ...))))
        let mut f = 0.0;
        for k in (1..200).rev() {
            f = (k as f64 / 2.0) / (a + f);
        }
        1.0 - (-a * a).exp() / core::f64::consts::PI.sqrt() / (a + f)
    };
    if x < 0.0 { -r } else { r }
}

#[test]
fn f32_math_matches_std_over_sweeps() {
    let Some(c) = client() else { return };
    let cases: Vec<(UnaryOp, Vec<f64>, Host1, f64, f64)> = vec![
        (
            UnaryOp::Sin,
            sweep(-2000.0, 2000.0, 4000),
            f64::sin,
            2e-6,
            2e-6,
        ),
        (
            UnaryOp::Cos,
            sweep(-2000.0, 2000.0, 4000),
            f64::cos,
            2e-6,
            2e-6,
        ),
        (
            UnaryOp::Tanh,
            sweep(-20.0, 20.0, 2000),
            f64::tanh,
            2e-6,
            1e-7,
        ),
        (UnaryOp::Erf, sweep(-6.0, 6.0, 2000), libm_erf, 5e-6, 1e-7),
        (
            UnaryOp::Log1p,
            sweep(-0.9, 10.0, 2000),
            f64::ln_1p,
            5e-6,
            1e-7,
        ),
    ];
    for (op, xs, host, rel, abs) in cases {
        let xs32: Vec<f32> = xs.iter().map(|&x| x as f32).collect();
        let xs: Vec<f64> = xs32.iter().map(|&x| x as f64).collect();
        let zeros_in = vec![0.0f32; xs.len()];
        let h = run2(
            &c,
            ElemType::F32,
            &format!("sweep32_{}", op.name()),
            &xs32,
            &zeros_in,
            |k, x, _| k.unary(op, x),
            ElemType::F32,
        );
        let got: Vec<f64> = download::<f32>(&c, &h).into_iter().map(f64::from).collect();
        let want: Vec<f64> = xs.iter().map(|&x| host(x)).collect();
        check_close(&format!("{}(f32)", op.name()), &xs, &got, &want, rel, abs);
    }
}

#[test]
fn integer_semantics_and_casts_match_the_ir() {
    let Some(c) = client() else { return };
    let a: Vec<i32> = vec![7, -7, i32::MIN, i32::MIN, 5, 0, -1, 123_456, i32::MAX, -9];
    let b: Vec<i32> = vec![0, 2, -1, 0, -3, 0, 33, -32, 31, 4];
    let ops: [(BinaryOp, Host2); 5] = [
        (
            BinaryOp::Div,
            |x, y| {
                if y == 0 { x } else { x.wrapping_div(y) }
            },
        ),
        (
            BinaryOp::Rem,
            |x, y| {
                if y == 0 || y == -1 { 0 } else { x % y }
            },
        ),
        (BinaryOp::Shl, |x, y| x.wrapping_shl(y as u32)),
        (BinaryOp::Shr, |x, y| x.wrapping_shr(y as u32)),
        (BinaryOp::Mul, |x, y| x.wrapping_mul(y)),
    ];
    for (op, host) in ops {
        let h = run2(
            &c,
            ElemType::I32,
            &format!("int_{}", op.name()),
            &a,
            &b,
            |k, x, y| k.binary(op, x, y),
            ElemType::I32,
        );
        let got = download::<i32>(&c, &h);
        let want: Vec<i32> = a.iter().zip(&b).map(|(&x, &y)| host(x, y)).collect();
        assert_eq!(got, want, "{}", op.name());
    }
    // Saturating float -> int casts, NaN -> 0.
    let fs: Vec<f32> = vec![
        f32::NAN,
        1e20,
        -1e20,
        300.7,
        -300.7,
        -0.9,
        127.9,
        -128.9,
        2.5,
        f32::INFINITY,
    ];
    let zeros_in = vec![0.0f32; fs.len()];
    for (to, host) in [
        (ElemType::I8, (|x: f32| x as i8 as i64) as fn(f32) -> i64),
        (ElemType::U8, |x| x as u8 as i64),
        (ElemType::I32, |x| x as i32 as i64),
        (ElemType::U32, |x| x as u32 as i64),
        (ElemType::I64, |x| x as i64),
    ] {
        let h = run2(
            &c,
            ElemType::F32,
            &format!("sat_{to}"),
            &fs,
            &zeros_in,
            |k, x, _| {
                let v = k.cast(x, to);
                k.cast(v, ElemType::I64)
            },
            ElemType::I64,
        );
        let got = download::<i64>(&c, &h);
        let want: Vec<i64> = fs.iter().map(|&x| host(x)).collect();
        assert_eq!(got, want, "f32 -> {to}");
    }
    // bf16 rounding: f32 -> bf16 is round to nearest even, NaN stays NaN.
    let vals: Vec<f32> = vec![
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        1.0 + 1.0 / 256.0 + 1e-6,
        -2.718_281_7,
        f32::NAN,
        65504.0,
        3.0e38,
        1e-40,
    ];
    let zeros_in = vec![0.0f32; vals.len()];
    let h = run2(
        &c,
        ElemType::F32,
        "bf16_round",
        &vals,
        &zeros_in,
        |k, x, _| {
            let v = k.cast(x, ElemType::BF16);
            k.cast(v, ElemType::F32)
        },
        ElemType::F32,
    );
    let got = download::<f32>(&c, &h);
    for (g, v) in got.iter().zip(&vals) {
        let w = half::bf16::from_f32(*v).to_f32();
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "bf16({v}) = {g}, expected {w}"
        );
    }
}
