//! Kernel IR: integer arithmetic, bitwise operations and comparisons per integer type, with the
//! edge cases `ir.rs` specifies (wrapping, `x / 0 == x`, `x % 0 == 0`, `MIN / -1 == MIN`, shift
//! amounts modulo the bit width, arithmetic right shift of signed types); casts (saturating float
//! to integer, NaN to 0, round-to-nearest integer to float), bit casts and select.
//!
//! Integer results are compared exactly.
//!
//! Size: a test file; each test is one operation family over every integer type.

use compute_core::kernel::{BinaryOp, CmpOp, KernelBuilder, ScalarValue, UnaryOp};
use compute_core::{ComputeClient, Elem, ElemType, KernelArguments, Runtime};
use half::{bf16, f16};

use super::ir_util::{assert_same, build, download, feature_gate, launch, upload, zeros};

/// Host integer semantics of the IR for one integer type.
pub trait HostInt: Elem + Copy + PartialEq + PartialOrd + Into<ScalarValue> {
    /// Whether the type is signed.
    const SIGNED: bool;
    /// The smallest value.
    const MIN_V: Self;
    /// The largest value.
    const MAX_V: Self;
    /// Wrapping conversion from `i64`.
    fn from_i64(v: i64) -> Self;
    /// A binary operation as the IR defines it.
    fn binary(op: BinaryOp, a: Self, b: Self) -> Self;
    /// A unary operation as the IR defines it.
    fn unary(op: UnaryOp, a: Self) -> Self;
}

macro_rules! host_int {
    ($($t:ty => $signed:expr),* $(,)?) => {$(
        impl HostInt for $t {
            const SIGNED: bool = $signed;
            const MIN_V: Self = <$t>::MIN;
            const MAX_V: Self = <$t>::MAX;
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn binary(op: BinaryOp, a: Self, b: Self) -> Self {
                match op {
                    BinaryOp::Add => a.wrapping_add(b),
                    BinaryOp::Sub => a.wrapping_sub(b),
                    BinaryOp::Mul => a.wrapping_mul(b),
                    // x / 0 == x; MIN / -1 == MIN (wrapping_div).
                    BinaryOp::Div => if b == 0 { a } else { a.wrapping_div(b) },
                    // x % 0 == 0; MIN % -1 == 0 (wrapping_rem).
                    BinaryOp::Rem => if b == 0 { 0 } else { a.wrapping_rem(b) },
                    BinaryOp::Min => a.min(b),
                    BinaryOp::Max => a.max(b),
                    BinaryOp::BitAnd => a & b,
                    BinaryOp::BitOr => a | b,
                    BinaryOp::BitXor => a ^ b,
                    // The shift amount modulo the bit width (wrapping_shl masks it).
                    BinaryOp::Shl => a.wrapping_shl(b as u32),
                    // Arithmetic for signed types, logical for unsigned (Rust's `>>`).
                    BinaryOp::Shr => a.wrapping_shr(b as u32),
                    _ => unreachable!("not an integer op: {op:?}"),
                }
            }
            #[allow(unused_comparisons)]
            fn unary(op: UnaryOp, a: Self) -> Self {
                match op {
                    UnaryOp::BitNot => !a,
                    UnaryOp::Neg => (0 as $t).wrapping_sub(a),
                    // abs(MIN) == MIN: arithmetic wraps.
                    UnaryOp::Abs => if a < 0 { (0 as $t).wrapping_sub(a) } else { a },
                    _ => unreachable!("not an integer op: {op:?}"),
                }
            }
        }
    )*};
}

host_int!(
    i8 => true, i16 => true, i32 => true, i64 => true,
    u8 => false, u16 => false, u32 => false, u64 => false,
);

const INT_BINARY: [BinaryOp; 12] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Rem,
    BinaryOp::Min,
    BinaryOp::Max,
    BinaryOp::BitAnd,
    BinaryOp::BitOr,
    BinaryOp::BitXor,
    BinaryOp::Shl,
    BinaryOp::Shr,
];

const CMP: [CmpOp; 6] = [
    CmpOp::Eq,
    CmpOp::Ne,
    CmpOp::Lt,
    CmpOp::Le,
    CmpOp::Gt,
    CmpOp::Ge,
];

/// Edge samples of an integer type: 0, ±1, small values, shift amounts around the width, MIN,
/// MAX and their neighbours.
fn int_samples<T: HostInt>() -> Vec<T> {
    let bits = (T::ELEM.size() * 8) as i64;
    let raw = [
        0,
        1,
        -1,
        2,
        -2,
        3,
        -7,
        bits - 1,
        bits,
        bits + 1,
        2 * bits + 3,
        100,
        -100,
        12_345,
        -98_765_431,
        0x5555_5555_5555_5555,
    ];
    let mut out: Vec<T> = raw.iter().map(|&v| T::from_i64(v)).collect();
    let min1 = T::binary(BinaryOp::Add, T::MIN_V, T::from_i64(1));
    let max1 = T::binary(BinaryOp::Sub, T::MAX_V, T::from_i64(1));
    out.extend([T::MIN_V, T::MAX_V, min1, max1]);
    let mut unique = Vec::new();
    for v in out {
        if !unique.contains(&v) {
            unique.push(v);
        }
    }
    unique
}

fn int_case<R: Runtime, T: HostInt>(client: &ComputeClient<R>) {
    let elem = T::ELEM;
    let samples = int_samples::<T>();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for &x in &samples {
        for &y in &samples {
            a.push(x);
            b.push(y);
        }
    }
    let n = a.len();
    let unary: Vec<UnaryOp> = if T::SIGNED {
        vec![UnaryOp::BitNot, UnaryOp::Neg, UnaryOp::Abs]
    } else {
        vec![UnaryOp::BitNot]
    };
    // Per pair: the binary ops, the unary ops of `a`, clamp(a, -5 or 2, 100), select(a < b, a, b).
    let nv = INT_BINARY.len() + unary.len() + 2;
    let lo = if T::SIGNED {
        T::from_i64(-5)
    } else {
        T::from_i64(2)
    };
    let hi = T::from_i64(100);
    let mut k = KernelBuilder::new(&format!("ir_int_arith_{elem}"), [64, 1, 1]);
    let ha = k.input("a", elem, 1);
    let hb = k.input("b", elem, 1);
    let out = k.output("out", elem, 1);
    let flags = k.output("flags", ElemType::Bool, 1);
    let i = k.absolute_pos();
    let len = k.len(ha);
    let inside = k.lt(i, len);
    k.if_(inside, |k| {
        let x = k.load(ha, i);
        let y = k.load(hb, i);
        let mut results = Vec::new();
        for &op in &INT_BINARY {
            results.push(k.binary(op, x, y));
        }
        for &op in &unary {
            results.push(k.unary(op, x));
        }
        let lo_v: ScalarValue = lo.into();
        let hi_v: ScalarValue = hi.into();
        results.push(k.clamp(x, lo_v, hi_v));
        let less = k.lt(x, y);
        results.push(k.select(less, x, y));
        let base = k.mul(i, nv as u32);
        for (j, r) in results.into_iter().enumerate() {
            let idx = k.add(base, j as u32);
            k.store(out, idx, r);
        }
        let fbase = k.mul(i, CMP.len() as u32);
        for (j, &op) in CMP.iter().enumerate() {
            let r = k.compare(op, x, y);
            let idx = k.add(fbase, j as u32);
            k.store(flags, idx, r);
        }
    });
    let def = build(k);
    let out_h = zeros::<R, T>(client, n * nv);
    let flags_h = zeros::<R, u8>(client, n * CMP.len());
    launch(
        client,
        &def,
        [(n as u32).div_ceil(64), 1, 1],
        KernelArguments::new()
            .buffer(upload(client, &a).binding())
            .buffer(upload(client, &b).binding())
            .buffer(out_h.clone().binding())
            .buffer(flags_h.clone().binding()),
    );
    if !feature_gate(client, client.features().supports(elem), elem.name()) {
        return;
    }
    let got = download::<R, T>(client, &out_h);
    let got_flags = download::<R, u8>(client, &flags_h);
    let mut bad = Vec::new();
    for p in 0..n {
        let (x, y) = (a[p], b[p]);
        let mut expected = Vec::new();
        let mut names = Vec::new();
        for &op in &INT_BINARY {
            expected.push(T::binary(op, x, y));
            names.push(op.name());
        }
        for &op in &unary {
            expected.push(T::unary(op, x));
            names.push(op.name());
        }
        let clamped = if x < lo {
            lo
        } else if x > hi {
            hi
        } else {
            x
        };
        expected.push(clamped);
        names.push("clamp");
        expected.push(if x < y { x } else { y });
        names.push("select(a < b, a, b)");
        for (j, e) in expected.iter().enumerate() {
            let g = got[p * nv + j];
            if g != *e {
                bad.push(format!(
                    "{}({x:?}, {y:?}) = {g:?}, expected {e:?}",
                    names[j]
                ));
            }
        }
        let ef = [x == y, x != y, x < y, x <= y, x > y, x >= y];
        for (j, &e) in ef.iter().enumerate() {
            let g = got_flags[p * CMP.len() + j];
            if g != e as u8 {
                bad.push(format!(
                    "{}({x:?}, {y:?}) = {g}, expected {}",
                    CMP[j].name(),
                    e as u8
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{elem}: {} wrong results, first: {}",
        bad.len(),
        bad.iter().take(10).cloned().collect::<Vec<_>>().join("; ")
    );
}

/// `i8`: every binary, unary, comparison, clamp and select over all pairs of edge samples.
pub fn ir_arith_i8<R: Runtime>(client: ComputeClient<R>) {
    int_case::<R, i8>(&client);
}

/// `i16`, as [`ir_arith_i8`].
pub fn ir_arith_i16<R: Runtime>(client: ComputeClient<R>) {
    int_case::<R, i16>(&client);
}

/// `i32`, as [`ir_arith_i8`].
pub fn ir_arith_i32<R: Runtime>(client: ComputeClient<R>) {
    int_case::<R, i32>(&client);
}

/// `i64`, as [`ir_arith_i8`].
pub fn ir_arith_i64<R: Runtime>(client: ComputeClient<R>) {
    int_case::<R, i64>(&client);
}

/// `u8`, as [`ir_arith_i8`].
pub fn ir_arith_u8<R: Runtime>(client: ComputeClient<R>) {
    int_case::<R, u8>(&client);
}

/// `u16`, as [`ir_arith_i8`].
pub fn ir_arith_u16<R: Runtime>(client: ComputeClient<R>) {
    int_case::<R, u16>(&client);
}

/// `u32`, as [`ir_arith_i8`].
pub fn ir_arith_u32<R: Runtime>(client: ComputeClient<R>) {
    int_case::<R, u32>(&client);
}

/// `u64`, as [`ir_arith_i8`].
pub fn ir_arith_u64<R: Runtime>(client: ComputeClient<R>) {
    int_case::<R, u64>(&client);
}

/// The integer edge cases of `ir.rs` spelled out on `i32` and `u32` with literal operands, so a
/// failure names the rule: wrap, `x / 0 == x`, `x % 0 == 0`, `MIN / -1 == MIN`, shifts modulo 32.
pub fn ir_arith_int_edge_cases<R: Runtime>(client: ComputeClient<R>) {
    type Case = (&'static str, BinaryOp, i32, i32, i32);
    let signed: [Case; 10] = [
        ("MAX + 1 wraps", BinaryOp::Add, i32::MAX, 1, i32::MIN),
        ("MIN - 1 wraps", BinaryOp::Sub, i32::MIN, 1, i32::MAX),
        ("MAX * 2 wraps", BinaryOp::Mul, i32::MAX, 2, -2),
        ("7 / 0 == 7", BinaryOp::Div, 7, 0, 7),
        ("-7 % 0 == 0", BinaryOp::Rem, -7, 0, 0),
        ("MIN / -1 == MIN", BinaryOp::Div, i32::MIN, -1, i32::MIN),
        ("-7 % 3 == -1 (sign of dividend)", BinaryOp::Rem, -7, 3, -1),
        ("1 << 33 == 2", BinaryOp::Shl, 1, 33, 2),
        ("-8 >> 1 == -4 (arithmetic)", BinaryOp::Shr, -8, 1, -4),
        ("-8 >> 34 == -2", BinaryOp::Shr, -8, 34, -2),
    ];
    let unsigned: [(&str, BinaryOp, u32, u32, u32); 6] = [
        ("MAX + 1 wraps", BinaryOp::Add, u32::MAX, 1, 0),
        ("0 - 1 wraps", BinaryOp::Sub, 0, 1, u32::MAX),
        ("9 / 0 == 9", BinaryOp::Div, 9, 0, 9),
        ("9 % 0 == 0", BinaryOp::Rem, 9, 0, 0),
        (
            "0x8000_0000 >> 31 == 1 (logical)",
            BinaryOp::Shr,
            0x8000_0000,
            31,
            1,
        ),
        ("3 << 32 == 3", BinaryOp::Shl, 3, 32, 3),
    ];
    let mut k = KernelBuilder::new("ir_int_edges", [1, 1, 1]);
    let out_s = k.output("out_s", ElemType::I32, 1);
    let out_u = k.output("out_u", ElemType::U32, 1);
    // Operands come from scalars so no backend can fold them at compile time.
    let mut scalars = Vec::new();
    for (j, &(name, op, a, b, _)) in signed.iter().enumerate() {
        let x = k.scalar(&format!("sa{j}"), ElemType::I32);
        let y = k.scalar(&format!("sb{j}"), ElemType::I32);
        let r = k.binary(op, x, y);
        k.store(out_s, j as u32, r);
        scalars.push((ScalarValue::I32(a), ScalarValue::I32(b), name));
    }
    for (j, &(name, op, a, b, _)) in unsigned.iter().enumerate() {
        let x = k.scalar(&format!("ua{j}"), ElemType::U32);
        let y = k.scalar(&format!("ub{j}"), ElemType::U32);
        let r = k.binary(op, x, y);
        k.store(out_u, j as u32, r);
        scalars.push((ScalarValue::U32(a), ScalarValue::U32(b), name));
    }
    let def = build(k);
    let hs = zeros::<R, i32>(&client, signed.len());
    let hu = zeros::<R, u32>(&client, unsigned.len());
    let mut args = KernelArguments::new()
        .buffer(hs.clone().binding())
        .buffer(hu.clone().binding());
    for (a, b, _) in scalars {
        args = args.scalar(a).scalar(b);
    }
    launch(&client, &def, [1, 1, 1], args);
    let gs = download::<R, i32>(&client, &hs);
    let gu = download::<R, u32>(&client, &hu);
    let mut bad = Vec::new();
    for (j, &(name, _, _, _, e)) in signed.iter().enumerate() {
        if gs[j] != e {
            bad.push(format!("i32 {name}: got {}", gs[j]));
        }
    }
    for (j, &(name, _, _, _, e)) in unsigned.iter().enumerate() {
        if gu[j] != e {
            bad.push(format!("u32 {name}: got {}", gu[j]));
        }
    }
    assert!(bad.is_empty(), "integer edge cases: {}", bad.join("; "));
}

/// Float to integer casts saturate and send NaN to 0 (truncating toward zero), for every integer
/// type, from `f32` and from `f64` (gated); Rust's `as` is the reference. Exact.
pub fn ir_arith_cast_float_to_int<R: Runtime>(client: ComputeClient<R>) {
    let samples: Vec<f64> = vec![
        0.0,
        -0.0,
        0.99,
        -0.99,
        3.7,
        -3.7,
        127.5,
        128.0,
        -128.5,
        -129.0,
        255.9,
        256.0,
        32_767.0,
        65_535.5,
        70_000.0,
        -70_000.0,
        2_147_483_520.0,
        3.0e9,
        -3.0e9,
        5.0e9,
        1.0e19,
        2.0e19,
        -1.0e19,
        1.0e30,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    for src in [ElemType::F32, ElemType::F64] {
        let targets = [
            ElemType::I8,
            ElemType::I16,
            ElemType::I32,
            ElemType::I64,
            ElemType::U8,
            ElemType::U16,
            ElemType::U32,
            ElemType::U64,
        ];
        let n = samples.len();
        let mut k = KernelBuilder::new(&format!("ir_cast_{src}_to_int"), [32, 1, 1]);
        let input = k.input("x", src, 1);
        // One i64 output per target: the cast, widened back (sign or zero extension) to i64.
        let out = k.output("out", ElemType::I64, 1);
        let i = k.absolute_pos();
        let len = k.len(input);
        let inside = k.lt(i, len);
        k.if_(inside, |k| {
            let x = k.load(input, i);
            let base = k.mul(i, targets.len() as u32);
            for (j, &t) in targets.iter().enumerate() {
                let c = k.cast(x, t);
                let w = k.cast(c, ElemType::I64);
                let idx = k.add(base, j as u32);
                k.store(out, idx, w);
            }
        });
        let def = build(k);
        let h = zeros::<R, i64>(&client, n * targets.len());
        let input_h = if src == ElemType::F32 {
            let v: Vec<f32> = samples.iter().map(|&x| x as f32).collect();
            upload(&client, &v)
        } else {
            upload(&client, &samples)
        };
        launch(
            &client,
            &def,
            [(n as u32).div_ceil(32), 1, 1],
            KernelArguments::new()
                .buffer(input_h.binding())
                .buffer(h.clone().binding()),
        );
        let supported =
            client.features().supports(src) && client.features().supports(ElemType::I64);
        if !feature_gate(&client, supported, "f64/i64") {
            continue;
        }
        let got = download::<R, i64>(&client, &h);
        let mut bad = Vec::new();
        for (p, &x) in samples.iter().enumerate() {
            let x = if src == ElemType::F32 {
                x as f32 as f64
            } else {
                x
            };
            let expected = [
                x as i8 as i64,
                x as i16 as i64,
                x as i32 as i64,
                x as i64,
                x as u8 as i64,
                x as u16 as i64,
                x as u32 as i64,
                x as u64 as i64,
            ];
            for (j, &e) in expected.iter().enumerate() {
                let g = got[p * targets.len() + j];
                if g != e {
                    bad.push(format!(
                        "cast({x:e} as {src}, {}) gave {g}, expected {e}",
                        targets[j]
                    ));
                }
            }
        }
        assert!(
            bad.is_empty(),
            "{} wrong casts (saturating, NaN -> 0), first: {}",
            bad.len(),
            bad.iter().take(10).cloned().collect::<Vec<_>>().join("; ")
        );
    }
}

/// Integer to float casts round to nearest (even); integer to integer casts wrap (truncate) or
/// extend by sign; float to float casts round to nearest; bool casts are 0/1 and `x != 0`.
/// References are Rust's `as` and `half`'s conversions. Exact.
pub fn ir_arith_cast_conversions<R: Runtime>(client: ComputeClient<R>) {
    // i64 / u32 sources to f32 and f64: round to nearest.
    let ints: Vec<i64> = vec![
        0,
        1,
        -1,
        16_777_217,
        16_777_219,
        -16_777_217,
        (1 << 53) + 1,
        i64::MAX,
        i64::MIN,
        123_456_789_123,
        65_519,
        65_520,
        -300,
    ];
    let n = ints.len();
    let mut k = KernelBuilder::new("ir_cast_conversions", [16, 1, 1]);
    let input = k.input("x", ElemType::I64, 1);
    let to_f32 = k.output("to_f32", ElemType::F32, 1);
    let to_f64 = k.output("to_f64", ElemType::F64, 1);
    let narrow = k.output("narrow", ElemType::I64, 1);
    let halves = k.output("halves", ElemType::F16, 1);
    let flags = k.output("flags", ElemType::U32, 1);
    let i = k.absolute_pos();
    let len = k.len(input);
    let inside = k.lt(i, len);
    const NARROW: usize = 6;
    k.if_(inside, |k| {
        let x = k.load(input, i);
        let f = k.cast(x, ElemType::F32);
        k.store(to_f32, i, f);
        let d = k.cast(x, ElemType::F64);
        k.store(to_f64, i, d);
        // f32 -> f16 rounding; f64 -> bf16 -> f32 rounding checked through f16 of the f32.
        let h = k.cast(f, ElemType::F16);
        k.store(halves, i, h);
        let base = k.mul(i, NARROW as u32);
        let steps = [
            // i64 -> i8 (truncate) -> i64 (sign extend)
            (ElemType::I8, ElemType::I64),
            // i64 -> u8 (truncate) -> i64 (zero extend)
            (ElemType::U8, ElemType::I64),
            (ElemType::I16, ElemType::I64),
            (ElemType::U16, ElemType::I64),
            (ElemType::I32, ElemType::I64),
            (ElemType::U32, ElemType::I64),
        ];
        for (j, (mid, back)) in steps.into_iter().enumerate() {
            let m = k.cast(x, mid);
            let b = k.cast(m, back);
            let idx = k.add(base, j as u32);
            k.store(narrow, idx, b);
        }
        // bool casts: i64 -> bool (x != 0) -> u32 (0/1); f32 -> bool -> u32.
        let bi = k.cast(x, ElemType::Bool);
        let bi = k.cast(bi, ElemType::U32);
        let bf = k.cast(f, ElemType::Bool);
        let bf = k.cast(bf, ElemType::U32);
        let i2 = k.mul(i, 2u32);
        k.store(flags, i2, bi);
        let i2 = k.add(i2, 1u32);
        k.store(flags, i2, bf);
    });
    let def = build(k);
    let hf = zeros::<R, f32>(&client, n);
    let hd = zeros::<R, f64>(&client, n);
    let hn = zeros::<R, i64>(&client, n * NARROW);
    let hh = zeros::<R, f16>(&client, n);
    let hb = zeros::<R, u32>(&client, n * 2);
    launch(
        &client,
        &def,
        [1, 1, 1],
        KernelArguments::new()
            .buffer(upload(&client, &ints).binding())
            .buffer(hf.clone().binding())
            .buffer(hd.clone().binding())
            .buffer(hn.clone().binding())
            .buffer(hh.clone().binding())
            .buffer(hb.clone().binding()),
    );
    let needed = [
        ElemType::I64,
        ElemType::F64,
        ElemType::F16,
        ElemType::I8,
        ElemType::I16,
        ElemType::U8,
        ElemType::U16,
    ];
    if !feature_gate(
        &client,
        super::ir_util::supports_all(&client, &needed),
        "i64/f64/f16/i8/i16",
    ) {
        return;
    }
    let ef: Vec<f32> = ints.iter().map(|&x| x as f32).collect();
    let got_f = download::<R, f32>(&client, &hf);
    assert_same(
        &got_f.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        &ef.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        &format!("i64 -> f32 round to nearest (bits), inputs {ints:?}"),
    );
    let ed: Vec<f64> = ints.iter().map(|&x| x as f64).collect();
    assert_same(
        &download::<R, f64>(&client, &hd),
        &ed,
        "i64 -> f64 round to nearest",
    );
    let eh: Vec<f16> = ef.iter().map(|&x| f16::from_f32(x)).collect();
    assert_same(
        &download::<R, f16>(&client, &hh)
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        &eh.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        "f32 -> f16 round to nearest (overflow to inf), bits",
    );
    let en: Vec<i64> = ints
        .iter()
        .flat_map(|&x| {
            [
                x as i8 as i64,
                x as u8 as i64,
                x as i16 as i64,
                x as u16 as i64,
                x as i32 as i64,
                x as u32 as i64,
            ]
        })
        .collect();
    assert_same(
        &download::<R, i64>(&client, &hn),
        &en,
        "i64 -> [i8, u8, i16, u16, i32, u32] -> i64 (truncate, then sign/zero extend)",
    );
    let eb: Vec<u32> = ints
        .iter()
        .flat_map(|&x| [(x != 0) as u32, (x as f32 != 0.0) as u32])
        .collect();
    assert_same(
        &download::<R, u32>(&client, &hb),
        &eb,
        "[i64 -> bool -> u32, f32 -> bool -> u32]",
    );
}

/// Bit casts reinterpret bits (little-endian component order for width changes): f32 <-> u32,
/// i32 -> f32, u32x2 -> u64, f64 -> u32x2, u8x4 -> u32, f16x2 -> u32, bf16 -> i16. Exact.
pub fn ir_arith_bitcast<R: Runtime>(client: ComputeClient<R>) {
    let f: Vec<f32> = vec![1.0, -2.5, 0.0, -0.0, f32::INFINITY, 1.0e-40, 3.0e38, 0.1];
    let n = f.len();
    let mut k = KernelBuilder::new("ir_bitcast", [8, 1, 1]);
    let hf = k.input("f", ElemType::F32, 1);
    let hpair = k.input("pair", ElemType::U32, 2);
    let hd = k.input("d", ElemType::F64, 1);
    let hbytes = k.input("bytes", ElemType::U8, 4);
    let out = k.output("out", ElemType::U32, 1);
    let out64 = k.output("out64", ElemType::U64, 1);
    let i = k.absolute_pos();
    let x = k.load(hf, i);
    // f32 -> u32 -> f32 -> u32, i32 -> f32 -> u32.
    let bits = k.bitcast(x, ElemType::U32);
    let back = k.bitcast(bits, ElemType::F32);
    let again = k.bitcast(back, ElemType::U32);
    let as_i = k.bitcast(x, ElemType::I32);
    let via_i = k.bitcast(as_i, ElemType::F32);
    let via_i = k.bitcast(via_i, ElemType::U32);
    // u32x2 -> u64.
    let p = k.load(hpair, i);
    let wide = k.bitcast(p, ElemType::U64);
    k.store(out64, i, wide);
    // f64 -> u32x2: low word, high word.
    let d = k.load(hd, i);
    let words = k.bitcast(d, ElemType::U32);
    let lo = k.extract(words, 0);
    let hi = k.extract(words, 1);
    // u8x4 -> u32.
    let b4 = k.load(hbytes, i);
    let packed = k.bitcast(b4, ElemType::U32);
    // f16x2 -> u32: the f32 converted to f16 twice (x, -x).
    let h0 = k.cast(x, ElemType::F16);
    let h1 = k.neg(h0);
    let hv = k.vector(&[h0, h1]);
    let hbits = k.bitcast(hv, ElemType::U32);
    // bf16 -> i16 -> u32 (zero extension of the bits through u16).
    let bf = k.cast(x, ElemType::BF16);
    let bfi = k.bitcast(bf, ElemType::I16);
    let bfu = k.bitcast(bfi, ElemType::U16);
    let bfw = k.cast(bfu, ElemType::U32);
    let results = [again, via_i, lo, hi, packed, hbits, bfw];
    let base = k.mul(i, results.len() as u32);
    for (j, r) in results.into_iter().enumerate() {
        let idx = k.add(base, j as u32);
        k.store(out, idx, r);
    }
    let def = build(k);
    let pairs: Vec<u32> = (0..n as u32 * 2)
        .map(|v| v.wrapping_mul(0x9E37_79B9) ^ 0xDEAD)
        .collect();
    let doubles: Vec<f64> = (0..n).map(|v| v as f64 * -1.75e100 + 0.3).collect();
    let bytes: Vec<u8> = (0..n as u8 * 4)
        .map(|v| v.wrapping_mul(37).wrapping_add(1))
        .collect();
    let h_out = zeros::<R, u32>(&client, n * 7);
    let h_out64 = zeros::<R, u64>(&client, n);
    launch(
        &client,
        &def,
        [1, 1, 1],
        KernelArguments::new()
            .buffer(upload(&client, &f).binding())
            .buffer(upload(&client, &pairs).binding())
            .buffer(upload(&client, &doubles).binding())
            .buffer(upload(&client, &bytes).binding())
            .buffer(h_out.clone().binding())
            .buffer(h_out64.clone().binding()),
    );
    let needed = [
        ElemType::F64,
        ElemType::U64,
        ElemType::F16,
        ElemType::BF16,
        ElemType::I16,
        ElemType::U16,
        ElemType::U8,
    ];
    if !feature_gate(
        &client,
        super::ir_util::supports_all(&client, &needed),
        "f64/u64/f16/bf16/i16/u16/u8",
    ) {
        return;
    }
    let expected: Vec<u32> = (0..n)
        .flat_map(|e| {
            let x = f[e];
            let db = doubles[e].to_bits();
            let b = u32::from_le_bytes([
                bytes[4 * e],
                bytes[4 * e + 1],
                bytes[4 * e + 2],
                bytes[4 * e + 3],
            ]);
            let h0 = f16::from_f32(x);
            let h1 = -h0;
            [
                x.to_bits(),
                x.to_bits(),
                db as u32,
                (db >> 32) as u32,
                b,
                h0.to_bits() as u32 | ((h1.to_bits() as u32) << 16),
                bf16::from_f32(x).to_bits() as u32,
            ]
        })
        .collect();
    assert_same(
        &download::<R, u32>(&client, &h_out),
        &expected,
        "per entry [f32->u32->f32->u32, f32->i32->f32->u32, f64 low word, f64 high word, u8x4->u32, f16x2->u32, bf16->i16->u16->u32]",
    );
    let expected64: Vec<u64> = (0..n)
        .map(|e| pairs[2 * e] as u64 | ((pairs[2 * e + 1] as u64) << 32))
        .collect();
    assert_same(
        &download::<R, u64>(&client, &h_out64),
        &expected64,
        "u32x2 -> u64 (component 0 low)",
    );
}

/// `select` with a per-component bool vector condition and with a scalar condition on `f32x4`;
/// exact.
pub fn ir_arith_select_vector<R: Runtime>(client: ComputeClient<R>) {
    let n = 64usize;
    let a: Vec<f32> = (0..n * 4).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n * 4).map(|i| -(i as f32) - 0.5).collect();
    let mut k = KernelBuilder::new("ir_select_vec", [16, 1, 1]);
    let ha = k.input("a", ElemType::F32, 4);
    let hb = k.input("b", ElemType::F32, 4);
    let per = k.output("per", ElemType::F32, 4);
    let whole = k.output("whole", ElemType::F32, 4);
    let i = k.absolute_pos();
    let x = k.load(ha, i);
    let y = k.load(hb, i);
    // Per component: a where a's component is a multiple of 3 (via float rem).
    let r = k.rem(x, 3.0f32);
    let c = k.eq(r, 0.0f32);
    let s = k.select(c, x, y);
    k.store(per, i, s);
    // Scalar: whole vector of a for odd entries.
    let odd = k.bit_and(i, 1u32);
    let odd = k.eq(odd, 1u32);
    let s = k.select(odd, x, y);
    k.store(whole, i, s);
    let def = build(k);
    let hp = zeros::<R, f32>(&client, n * 4);
    let hw = zeros::<R, f32>(&client, n * 4);
    launch(
        &client,
        &def,
        [(n as u32).div_ceil(16), 1, 1],
        KernelArguments::new()
            .buffer(upload(&client, &a).binding())
            .buffer(upload(&client, &b).binding())
            .buffer(hp.clone().binding())
            .buffer(hw.clone().binding()),
    );
    let ep: Vec<f32> = (0..n * 4)
        .map(|j| if a[j] % 3.0 == 0.0 { a[j] } else { b[j] })
        .collect();
    let ew: Vec<f32> = (0..n * 4)
        .map(|j| if (j / 4) % 2 == 1 { a[j] } else { b[j] })
        .collect();
    assert_same(
        &download::<R, f32>(&client, &hp),
        &ep,
        "select(a % 3 == 0, a, b) per component",
    );
    assert_same(
        &download::<R, f32>(&client, &hw),
        &ew,
        "select(i odd, a, b) whole vector",
    );
}
