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
        compute_core::env::report_reduced(&format!(
            "no Vulkan device ({why}): the device checks of the SPIR-V emitter did not run"
        ));
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
        compute_core::env::report_reduced("the device has no f64");
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
        (UnaryOp::Exp, sweep(-87.0, 88.0, 3000), f64::exp, 3e-7, 0.0),
        (UnaryOp::Exp, sweep(-1.0, 1.0, 1000), f64::exp, 3e-7, 0.0),
        (UnaryOp::Log, sweep(0.5, 2.0, 2000), f64::ln, 3e-7, 1e-9),
        (UnaryOp::Log, sweep(1e-30, 1e30, 2000), f64::ln, 3e-7, 1e-9),
        (
            UnaryOp::Log1p,
            sweep(-1e-3, 1e-3, 2000),
            f64::ln_1p,
            3e-7,
            1e-12,
        ),
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
    // pow: positive bases, exponents of both signs.
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for i in 0..40 {
        for j in 0..40 {
            xs.push(0.01f32 + i as f32 * 0.77);
            ys.push(-12.0f32 + j as f32 * 0.61);
        }
    }
    let h = run2(
        &c,
        ElemType::F32,
        "sweep32_pow",
        &xs,
        &ys,
        |k, x, y| k.binary(BinaryOp::Pow, x, y),
        ElemType::F32,
    );
    let got: Vec<f64> = download::<f32>(&c, &h).into_iter().map(f64::from).collect();
    let want: Vec<f64> = xs
        .iter()
        .zip(&ys)
        .map(|(&x, &y)| f64::from(x).powf(f64::from(y)))
        .collect();
    let xs64: Vec<f64> = xs.iter().map(|&x| f64::from(x)).collect();
    check_close("pow(f32)", &xs64, &got, &want, 2e-7, 1e-38);
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
    // Float min/max ignore a NaN operand (as Rust's `f32::min`).
    let xs: Vec<f32> = vec![f32::NAN, 1.0, -2.0, f32::NAN];
    let ys: Vec<f32> = vec![3.0, f32::NAN, 5.0, f32::NAN];
    for (op, host) in [
        (BinaryOp::Min, f32::min as fn(f32, f32) -> f32),
        (BinaryOp::Max, f32::max),
    ] {
        let h = run2(
            &c,
            ElemType::F32,
            &format!("nan_{}", op.name()),
            &xs,
            &ys,
            |k, x, y| k.binary(op, x, y),
            ElemType::F32,
        );
        let got = download::<f32>(&c, &h);
        for j in 0..xs.len() {
            let w = host(xs[j], ys[j]);
            assert!(
                got[j] == w || (got[j].is_nan() && w.is_nan()),
                "{}({}, {}) = {}, expected {w}",
                op.name(),
                xs[j],
                ys[j],
                got[j]
            );
        }
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

/// Launch `def` over one cube with the given buffers.
fn launch(c: &ComputeClient<VulkanRuntime>, def: KernelDefinition, buffers: &[&Handle]) {
    let mut args = KernelArguments::new();
    for b in buffers {
        args = args.buffer((*b).clone().binding());
    }
    c.launch(def.into(), CubeCount::Static(1, 1, 1), args);
}

#[test]
fn wide_items_bitcasts_range_overflow_and_shared_packing() {
    let Some(c) = client() else { return };
    // f32x16 and u8x16 items: out[i] = a[i] * 2 + lane.
    let n = 8usize;
    let a: Vec<f32> = (0..n * 16).map(|i| i as f32 * 0.5).collect();
    let mut k = KernelBuilder::new("wide16", [8, 1, 1]);
    let ha = k.input("a", ElemType::F32, 16);
    let out = k.output("out", ElemType::F32, 16);
    let hb = k.input("b", ElemType::U8, 16);
    let outb = k.output("outb", ElemType::U8, 16);
    let i = k.unit_pos();
    let x = k.load(ha, i);
    let two = k.lit_f32(2.0);
    let y = k.mul(x, two);
    let mut lanes = Vec::new();
    for l in 0..16 {
        lanes.push(k.lit_f32(l as f32));
    }
    let lv = k.vector(&lanes);
    let y = k.add(y, lv);
    k.store(out, i, y);
    let xb = k.load(hb, i);
    let yb = k.add(xb, xb);
    k.store(outb, i, yb);
    let def = k.build().expect("builds");
    let b: Vec<u8> = (0..n * 16).map(|i| (i * 7) as u8).collect();
    let (h_a, h_out, h_b, h_outb) = (
        upload(&c, &a),
        c.create(Bytes::zeroed(n * 64)),
        upload(&c, &b),
        c.create(Bytes::zeroed(n * 16)),
    );
    launch(&c, def, &[&h_a, &h_out, &h_b, &h_outb]);
    let got = download::<f32>(&c, &h_out);
    for (j, g) in got.iter().enumerate() {
        assert_eq!(*g, a[j] * 2.0 + (j % 16) as f32, "f32x16 component {j}");
    }
    let gotb = download::<u8>(&c, &h_outb);
    for (j, g) in gotb.iter().enumerate() {
        assert_eq!(*g, b[j].wrapping_add(b[j]), "u8x16 component {j}");
    }

    // Bitcasts that change the width: u32x2 -> u16x4 -> u8x8 -> u64 -> f64.
    let words: Vec<u32> = vec![0x1122_3344, 0x5566_7788, 0xdead_beef, 0x0102_0304];
    let mut k = KernelBuilder::new("bitcasts", [2, 1, 1]);
    let hw = k.input("w", ElemType::U32, 2);
    let o16 = k.output("o16", ElemType::U16, 4);
    let o8 = k.output("o8", ElemType::U8, 8);
    let o64 = k.output("o64", ElemType::U64, 1);
    let i = k.unit_pos();
    let x = k.load(hw, i);
    let h = k.bitcast(x, ElemType::U16);
    k.store(o16, i, h);
    let bytes = k.bitcast(h, ElemType::U8);
    k.store(o8, i, bytes);
    let q = k.bitcast(bytes, ElemType::U64);
    k.store(o64, i, q);
    let def = k.build().expect("builds");
    let (h_w, h16, h8, h64) = (
        upload(&c, &words),
        c.create(Bytes::zeroed(16)),
        c.create(Bytes::zeroed(16)),
        c.create(Bytes::zeroed(16)),
    );
    launch(&c, def, &[&h_w, &h16, &h8, &h64]);
    let raw: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    assert_eq!(download::<u8>(&c, &h8), raw, "u32x2 -> u16x4 -> u8x8");
    let want16: Vec<u16> = raw
        .chunks(2)
        .map(|p| u16::from_le_bytes([p[0], p[1]]))
        .collect();
    assert_eq!(download::<u16>(&c, &h16), want16, "u32x2 -> u16x4");
    let want64: Vec<u64> = raw
        .chunks(8)
        .map(|p| u64::from_le_bytes(p.try_into().expect("8 bytes")))
        .collect();
    assert_eq!(download::<u64>(&c, &h64), want64, "u8x8 -> u64");

    // Range loops stop where `i + step` overflows (and never run for a zero step).
    let mut k = KernelBuilder::new("range_overflow", [1, 1, 1]);
    let out = k.output("out", ElemType::U32, 1);
    let counts: Vec<(ScalarTriple, u32)> = vec![
        (ScalarTriple::U8(250, 255, 3), 2),
        (ScalarTriple::I8(120, 127, 5), 2),
        (ScalarTriple::I8(-120, -128, -5), 2),
        (ScalarTriple::I8(0, 10, 0), 0),
        (ScalarTriple::U32(u32::MAX - 10, u32::MAX, 4), 3),
        (ScalarTriple::I64(i64::MIN + 10, i64::MIN, -4), 3),
    ];
    for (slot, (triple, _)) in counts.iter().enumerate() {
        let acc = k.var(0u32);
        let (s, e, st) = triple.values(&mut k);
        k.range(s, e, st, |k, _| {
            let v = k.get(acc);
            let v = k.add(v, 1u32);
            k.assign(acc, v);
        });
        let v = k.get(acc);
        k.store(out, slot as u32, v);
    }
    let def = k.build().expect("builds");
    let h = c.create(Bytes::zeroed(4 * counts.len()));
    launch(&c, def, &[&h]);
    let want: Vec<u32> = counts.iter().map(|(_, n)| *n).collect();
    assert_eq!(download::<u32>(&c, &h), want, "range iteration counts");

    // Shared bool and bf16 round trip (packed as u8/u16), reversed through a barrier.
    let mut k = KernelBuilder::new("shared_packing", [16, 1, 1]);
    let hx = k.input("x", ElemType::BF16, 1);
    let out = k.output("out", ElemType::BF16, 1);
    let outb = k.output("outb", ElemType::Bool, 1);
    let sh = k.shared("sh", ElemType::BF16, 1, 16);
    let sb = k.shared("sb", ElemType::Bool, 1, 16);
    let i = k.unit_pos();
    let x = k.load(hx, i);
    k.store(sh, i, x);
    let zero = k.lit(compute_core::kernel::ScalarValue::BF16(half::bf16::ZERO));
    let neg = k.lt(x, zero);
    k.store(sb, i, neg);
    k.barrier();
    let j = k.sub(15u32, i);
    let y = k.load(sh, j);
    k.store(out, i, y);
    let nb = k.load(sb, j);
    k.store(outb, i, nb);
    let def = k.build().expect("builds");
    let xs: Vec<half::bf16> = (0..16)
        .map(|v| half::bf16::from_f32(v as f32 * 1.37 - 9.0))
        .collect();
    let (h_x, h_o, h_ob) = (
        upload(&c, &xs),
        c.create(Bytes::zeroed(32)),
        c.create(Bytes::zeroed(16)),
    );
    launch(&c, def, &[&h_x, &h_o, &h_ob]);
    let got = download::<half::bf16>(&c, &h_o);
    let gotb = download::<u8>(&c, &h_ob);
    for t in 0..16 {
        assert_eq!(
            got[t].to_bits(),
            xs[15 - t].to_bits(),
            "bf16 through shared"
        );
        assert_eq!(
            gotb[t],
            u8::from(xs[15 - t].to_f32() < 0.0),
            "bool through shared"
        );
    }
}

/// (start, end, step) of a range loop in one integer type.
enum ScalarTriple {
    U8(u8, u8, u8),
    I8(i8, i8, i8),
    U32(u32, u32, u32),
    I64(i64, i64, i64),
}

impl ScalarTriple {
    fn values(
        &self,
        k: &mut KernelBuilder,
    ) -> (
        compute_core::kernel::Value,
        compute_core::kernel::Value,
        compute_core::kernel::Value,
    ) {
        use compute_core::kernel::ScalarValue as S;
        let (a, b, c) = match *self {
            ScalarTriple::U8(a, b, c) => (S::U8(a), S::U8(b), S::U8(c)),
            ScalarTriple::I8(a, b, c) => (S::I8(a), S::I8(b), S::I8(c)),
            ScalarTriple::U32(a, b, c) => (S::U32(a), S::U32(b), S::U32(c)),
            ScalarTriple::I64(a, b, c) => (S::I64(a), S::I64(b), S::I64(c)),
        };
        (k.lit(a), k.lit(b), k.lit(c))
    }
}

#[test]
fn float_remainder_is_exact() {
    let Some(c) = client() else { return };
    let xs: Vec<f64> = vec![
        7.5,
        -7.5,
        1e10,
        -3.25,
        5.0,
        0.3,
        1e-30,
        123_456.789,
        3.0,
        -0.0,
        1e300,
        2.5,
    ];
    let ys: Vec<f64> = vec![
        0.1,
        0.1,
        3.3,
        2.0,
        -2.5,
        0.1,
        7.0,
        0.001,
        0.0,
        1.0,
        1e-300,
        f64::INFINITY,
    ];
    for elem in [ElemType::F32, ElemType::F64] {
        let got: Vec<f64> = if elem == ElemType::F32 {
            let a: Vec<f32> = xs.iter().map(|&v| v as f32).collect();
            let b: Vec<f32> = ys.iter().map(|&v| v as f32).collect();
            let h = run2(&c, elem, "fmod32", &a, &b, |k, x, y| k.rem(x, y), elem);
            let got = download::<f32>(&c, &h);
            for j in 0..a.len() {
                let w = a[j] % b[j];
                assert!(
                    got[j].to_bits() == w.to_bits() || (got[j].is_nan() && w.is_nan()),
                    "f32 {} % {} = {}, expected {w}",
                    a[j],
                    b[j],
                    got[j]
                );
            }
            got.into_iter().map(f64::from).collect()
        } else {
            if !c.features().supports(ElemType::F64) {
                continue;
            }
            let h = run2(&c, elem, "fmod64", &xs, &ys, |k, x, y| k.rem(x, y), elem);
            let got = download::<f64>(&c, &h);
            for j in 0..xs.len() {
                let w = xs[j] % ys[j];
                assert!(
                    got[j].to_bits() == w.to_bits() || (got[j].is_nan() && w.is_nan()),
                    "f64 {} % {} = {}, expected {w}",
                    xs[j],
                    ys[j],
                    got[j]
                );
            }
            got
        };
        assert_eq!(got.len(), xs.len());
    }
}

#[test]
fn plane_reductions_of_64_bit_integers() {
    let Some(c) = client() else { return };
    if !c.features().supports(ElemType::I64) {
        return;
    }
    // One cube of 32 units; the plane may be smaller (lavapipe: 8 or 16 or 32 lanes), so compare
    // per plane with the host, using the plane size the kernel reports.
    let xs: Vec<i64> = (0..32)
        .map(|i: i64| (i - 13) * 0x0123_4567_89ab_i64 + if i % 3 == 0 { i64::MIN / 2 } else { 7 })
        .collect();
    let mut k = KernelBuilder::new("plane64_values", [32, 1, 1]);
    let a = k.input("a", ElemType::I64, 1);
    let out = k.output("out", ElemType::I64, 4);
    let i = k.unit_pos();
    let x = k.load(a, i);
    let s = k.plane_sum(x);
    let mn = k.plane_min(x);
    let mx = k.plane_max(x);
    let ps = k.plane_size();
    let ps = k.cast(ps, ElemType::I64);
    let v = k.vector(&[s, mn, mx, ps]);
    k.store(out, i, v);
    let def = k.build().expect("builds");
    let (h_a, h_o) = (upload(&c, &xs), c.create(Bytes::zeroed(32 * 32)));
    launch(&c, def, &[&h_a, &h_o]);
    let got = download::<i64>(&c, &h_o);
    let plane = got[3] as usize;
    assert!(plane.is_power_of_two() && plane >= 4, "plane size {plane}");
    for t in 0..32 {
        let base = t / plane * plane;
        let lanes = &xs[base..(base + plane).min(32)];
        let sum = lanes.iter().fold(0i64, |a, b| a.wrapping_add(*b));
        assert_eq!(got[t * 4], sum, "sum at unit {t}");
        assert_eq!(
            got[t * 4 + 1],
            *lanes.iter().min().expect("lanes"),
            "min at {t}"
        );
        assert_eq!(
            got[t * 4 + 2],
            *lanes.iter().max().expect("lanes"),
            "max at {t}"
        );
    }
}
