//! Kernel IR: float math — abs, min, max, clamp, sqrt, rsqrt, exp, log, log1p, sin, cos, tanh,
//! erf, pow, floor, ceil, round (half to even), fma, recip — per float type, against `f64` host
//! references rounded to the type.
//!
//! Tolerances (`|got - expected| <= abs + rel * |expected|`), per type and class:
//! - exact: abs, min, max, clamp, floor, ceil, round;
//! - arithmetic (sqrt, recip, fma): f32 1e-6 rel, f64 1e-12, f16 1e-3, bf16 8e-3;
//! - transcendental (rsqrt, exp, log, log1p, sin, cos, tanh, erf, pow): f32 1e-5 rel and 1e-6
//!   abs, f64 1e-10 rel and 1e-12 abs, f16 2e-3 rel and 1e-3 abs, bf16 1.6e-2 rel and 8e-3 abs.

use compute_core::kernel::{KernelBuilder, UnaryOp};
use compute_core::{ComputeClient, KernelArguments, Runtime};
use half::{bf16, f16};

use super::ir_util::{
    HostFloat, assert_close_by, build, download, erf, feature_gate, launch, round_half_even,
    upload, zeros,
};

/// The tolerances of one float type.
#[derive(Debug, Clone, Copy)]
struct Tol {
    /// (rel, abs) for correctly rounded or nearly so operations.
    arith: (f64, f64),
    /// (rel, abs) for transcendental functions.
    trans: (f64, f64),
}

#[derive(Clone, Copy, PartialEq)]
enum Class {
    Exact,
    Arith,
    Trans,
}

type HostFn = fn(f64) -> f64;

fn unary_table() -> Vec<(UnaryOp, Class, Vec<f64>, HostFn)> {
    let general = vec![
        -7.25, -3.0, -2.5, -1.5, -1.0, -0.5, -0.3, 0.0, 0.2, 0.5, 1.0, 1.5, 2.5, 3.49, 3.5, 4.5,
        9.75, 100.0,
    ];
    let positive = vec![
        1e-3, 0.01, 0.3, 0.5, 1.0, 2.0, 3.0, 10.0, 123.5, 1000.0, 4096.0,
    ];
    vec![
        (
            UnaryOp::Abs,
            Class::Exact,
            general.clone(),
            f64::abs as HostFn,
        ),
        (UnaryOp::Floor, Class::Exact, general.clone(), f64::floor),
        (UnaryOp::Ceil, Class::Exact, general.clone(), f64::ceil),
        (
            UnaryOp::Round,
            Class::Exact,
            vec![
                -3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 4.5, 2.4, 2.6, -2.6, 0.49, 7.0, 100.5,
            ],
            round_half_even,
        ),
        (UnaryOp::Sqrt, Class::Arith, positive.clone(), f64::sqrt),
        (
            UnaryOp::Recip,
            Class::Arith,
            general.iter().copied().filter(|&x| x != 0.0).collect(),
            |x| 1.0 / x,
        ),
        (UnaryOp::Rsqrt, Class::Trans, positive.clone(), |x| {
            1.0 / x.sqrt()
        }),
        (
            UnaryOp::Exp,
            Class::Trans,
            vec![-10.0, -3.0, -1.0, -0.5, 0.0, 1e-3, 0.5, 1.0, 2.0, 5.0, 10.0],
            f64::exp,
        ),
        (UnaryOp::Log, Class::Trans, positive.clone(), f64::ln),
        (
            UnaryOp::Log1p,
            Class::Trans,
            vec![-0.5, -1e-3, 1e-4, 1e-3, 0.1, 1.0, 10.0, 1000.0],
            f64::ln_1p,
        ),
        (UnaryOp::Sin, Class::Trans, general.clone(), f64::sin),
        (UnaryOp::Cos, Class::Trans, general.clone(), f64::cos),
        (
            UnaryOp::Tanh,
            Class::Trans,
            vec![-5.0, -2.0, -0.7, -0.1, 0.0, 0.05, 0.5, 1.0, 3.0, 9.0],
            f64::tanh,
        ),
        (
            UnaryOp::Erf,
            Class::Trans,
            vec![-3.0, -1.5, -0.8, -0.2, 0.0, 0.1, 0.5, 1.0, 2.0, 2.9],
            erf,
        ),
    ]
}

fn math_case<R: Runtime, T: HostFloat + core::fmt::Debug>(client: &ComputeClient<R>, tol: Tol) {
    let elem = T::ELEM;
    let supported = client.features().supports(elem);
    for (op, class, inputs, host) in unary_table() {
        let xs: Vec<T> = inputs.iter().map(|&x| T::from_f64(x)).collect();
        let n = xs.len();
        let mut k = KernelBuilder::new(&format!("ir_math_{}_{elem}", op.name()), [32, 1, 1]);
        let hx = k.input("x", elem, 1);
        let out = k.output("out", elem, 1);
        let i = k.absolute_pos();
        let len = k.len(hx);
        let inside = k.lt(i, len);
        k.if_(inside, |k| {
            let x = k.load(hx, i);
            let r = k.unary(op, x);
            k.store(out, i, r);
        });
        let def = build(k);
        let h = zeros::<R, T>(client, n);
        launch(
            client,
            &def,
            [1, 1, 1],
            KernelArguments::new()
                .buffer(upload(client, &xs).binding())
                .buffer(h.clone().binding()),
        );
        if !feature_gate(client, supported, elem.name()) {
            return;
        }
        let got: Vec<f64> = download::<R, T>(client, &h)
            .into_iter()
            .map(T::to_f64)
            .collect();
        let xs64: Vec<f64> = xs.iter().map(|x| x.to_f64()).collect();
        let expected: Vec<f64> = xs64
            .iter()
            .map(|&x| T::from_f64(host(x)).to_f64())
            .collect();
        let (rel, abs) = match class {
            Class::Exact => (0.0, 0.0),
            Class::Arith => tol.arith,
            Class::Trans => tol.trans,
        };
        assert_close_by(
            &got,
            &expected,
            rel,
            abs,
            &format!("{}({elem})", op.name()),
            |j| format!("{}({})", op.name(), xs64[j]),
        );
    }

    // Binary and ternary: pow, min, max, fma, clamp.
    let a: Vec<f64> = vec![0.5, 2.0, 3.0, 1.5, 10.0, 0.25, 7.0, 1.1, 4.0, 9.0];
    let b: Vec<f64> = vec![2.0, 10.0, -1.0, 0.5, 0.3, 3.0, 0.0, -2.5, 1.5, 0.5];
    let c: Vec<f64> = vec![-1.0, 3.0, 2.5, 1.0, -4.0, 0.125, 6.0, 2.0, 5.0, 8.0];
    let (ta, tb, tc): (Vec<T>, Vec<T>, Vec<T>) = (
        a.iter().map(|&v| T::from_f64(v)).collect(),
        b.iter().map(|&v| T::from_f64(v)).collect(),
        c.iter().map(|&v| T::from_f64(v)).collect(),
    );
    let n = a.len();
    let mut k = KernelBuilder::new(&format!("ir_math_binary_{elem}"), [16, 1, 1]);
    let ha = k.input("a", elem, 1);
    let hb = k.input("b", elem, 1);
    let hc = k.input("c", elem, 1);
    let out = k.output("out", elem, 1);
    let i = k.absolute_pos();
    let len = k.len(ha);
    let inside = k.lt(i, len);
    k.if_(inside, |k| {
        let x = k.load(ha, i);
        let y = k.load(hb, i);
        let z = k.load(hc, i);
        let lo = k.min(y, z);
        let hi = k.max(y, z);
        let rs = [
            k.pow(x, y),
            k.min(x, y),
            k.max(x, y),
            k.fma(x, y, z),
            k.clamp(x, lo, hi),
        ];
        let base = k.mul(i, 5u32);
        for (j, r) in rs.into_iter().enumerate() {
            let idx = k.add(base, j as u32);
            k.store(out, idx, r);
        }
    });
    let def = build(k);
    let h = zeros::<R, T>(client, n * 5);
    launch(
        client,
        &def,
        [1, 1, 1],
        KernelArguments::new()
            .buffer(upload(client, &ta).binding())
            .buffer(upload(client, &tb).binding())
            .buffer(upload(client, &tc).binding())
            .buffer(h.clone().binding()),
    );
    let got: Vec<f64> = download::<R, T>(client, &h)
        .into_iter()
        .map(T::to_f64)
        .collect();
    let names = ["pow", "min", "max", "fma", "clamp"];
    for (j, name) in names.iter().enumerate() {
        let mut gj = Vec::new();
        let mut ej = Vec::new();
        let mut labels = Vec::new();
        for p in 0..n {
            let (x, y, z) = (ta[p].to_f64(), tb[p].to_f64(), tc[p].to_f64());
            let e = match j {
                0 => x.powf(y),
                1 => x.min(y),
                2 => x.max(y),
                3 => x.mul_add(y, z),
                _ => x.max(y.min(z)).min(y.max(z)),
            };
            gj.push(got[p * 5 + j]);
            ej.push(T::from_f64(e).to_f64());
            labels.push(format!("{name}({x}, {y}, {z})"));
        }
        let (rel, abs) = match j {
            0 => tol.trans,
            3 => tol.arith,
            _ => (0.0, 0.0),
        };
        assert_close_by(&gj, &ej, rel, abs, &format!("{name}({elem})"), |q| {
            labels[q].clone()
        });
    }
}

/// Every math function on `f32` (tolerances in the module docs).
pub fn ir_math_f32<R: Runtime>(client: ComputeClient<R>) {
    math_case::<R, f32>(
        &client,
        Tol {
            arith: (1e-6, 0.0),
            trans: (1e-5, 1e-6),
        },
    );
}

/// Every math function on `f64`, or a clear error where the backend lacks f64.
pub fn ir_math_f64<R: Runtime>(client: ComputeClient<R>) {
    math_case::<R, f64>(
        &client,
        Tol {
            arith: (1e-12, 0.0),
            trans: (1e-10, 1e-12),
        },
    );
}

/// Every math function on `f16`, or a clear error where the backend lacks f16.
pub fn ir_math_f16<R: Runtime>(client: ComputeClient<R>) {
    math_case::<R, f16>(
        &client,
        Tol {
            arith: (1e-3, 0.0),
            trans: (2e-3, 1e-3),
        },
    );
}

/// Every math function on `bf16`, or a clear error where the backend lacks bf16.
pub fn ir_math_bf16<R: Runtime>(client: ComputeClient<R>) {
    math_case::<R, bf16>(
        &client,
        Tol {
            arith: (8e-3, 0.0),
            trans: (1.6e-2, 8e-3),
        },
    );
}
